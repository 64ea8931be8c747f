"""What every benchmark here shares: side-by-side timing and a description of the machine.

    from timing import alternate, machine
    ms = alternate({"a": f, "b": g}, warmup=2, repeats=10)   # median ms per call, interleaved
"""
from __future__ import annotations

import os
import platform
import statistics
import time

import jax

import paddlejax as pj


def alternate(fns: dict, warmup: int, repeats: int) -> dict:
    """Median milliseconds per call of each function, calls interleaved to share the noise."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def machine() -> str:
    """Two lines: the processor, CPU count and devices; the Python, jax and paddlejax versions."""
    cpu = platform.processor() or platform.machine()
    devices = ", ".join(str(d) for d in jax.devices())
    return (f"machine: {cpu}, {os.cpu_count()} CPUs, devices [{devices}]\n"
            f"python {platform.python_version()}, jax {jax.__version__}, paddlejax {pj.__version__}")
