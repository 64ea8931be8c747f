"""Freed host memory stays with the process, so XLA's CPU buffers are reused without page faults."""
import os
import subprocess
import sys

import pytest

from paddlejax.host_memory import _glibc

# an 80 MiB output each call: over glibc's mmap threshold and over what a thread's arena holds
CALLS = """
import resource, sys
import paddlejax
import jax, jax.numpy as jnp
from paddlejax.host_memory import keep_freed_memory
double = jax.jit(lambda x: x * 2.0)
x = jnp.ones(20 << 20, jnp.float32)
faults = []
for _ in range(25):  # the median of the last 15: the heap settles in over the first calls
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    double(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(keep_freed_memory(), sorted(faults[10:])[7])
"""


def page_faults_per_call(keep: str) -> tuple[str, int]:
    env = {**os.environ, "PADDLEJAX_KEEP_HOST_MEMORY": keep, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", CALLS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kept, faults = out.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(not _glibc(), reason="glibc's allocator")
def test_a_call_reuses_the_last_calls_freed_buffers_instead_of_faulting_fresh_pages_in():
    assert page_faults_per_call("1") == ("True", pytest.approx(0, abs=100))
    kept, faults = page_faults_per_call("0")  # glibc's own policy: the 80 MiB mapped afresh every call
    assert kept == "False" and faults > 15_000
