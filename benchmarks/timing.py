"""What every benchmark here shares: side-by-side timing, a description of the machine and its peaks.

    from timing import alternate, machine
    ms = alternate({"a": f, "b": g}, warmup=2, repeats=10)   # median ms per call, interleaved
    rows = run_worker(torch_python, ["worker.py"], {"batch": 64})  # another framework's process
    with StepWorker(torch_python, ["worker.py"], {"batch": 64}) as peer:  # ... called step by step
        seconds, loss = peer.step()
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess

import jax
import jax.numpy as jnp

import paddlejax as pj
from paddlejax.passes.autotune import measure_programs


def alternate(fns: dict, warmup: int, repeats: int, rounds: bool = False) -> dict:
    """Median milliseconds per call of each function, calls interleaved to share the noise;
    with ``rounds``, every call's seconds, round by round (for paired ratios)."""
    times = measure_programs(fns, (), warmup=warmup, repeats=repeats, deadline=math.inf)
    return times if rounds else {k: 1e3 * statistics.median(v) for k, v in times.items()}


def paired_ratio(times: dict, slow: str, fast: str) -> float:
    """The median over rounds of ``slow``'s time divided by ``fast``'s in the same round."""
    return statistics.median(a / b for a, b in zip(times[slow], times[fast]))


def run_worker(python: str, script: list[str], args: dict, threads: int | None = None) -> list[dict]:
    """Run ``python script... json(args)`` (another framework's environment, or this one pinned),
    on the first ``threads`` CPUs (all: None), and return the rows it prints on a ``ROWS
    <json>`` line; its error output on failure."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus))}
    out = subprocess.run(["taskset", "-c", ",".join(map(str, cpus)), python, *script, json.dumps(args)], env=env,
                         capture_output=True, text=True, timeout=3600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ROWS ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{python} {' '.join(script[:1])} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][5:])


class StepWorker:
    """Another framework's process that runs one step each time it is asked, so that its steps
    interleave with this process's and machine noise hits both alike (only one of the two runs
    at a time). ``python script... json(args)`` runs pinned as :func:`run_worker` runs it; the
    script sets up, prints ``READY``, then for each ``step`` line it reads runs one step and
    prints ``STEP <seconds> <loss>``. Its ``name`` is what it printed after ``READY``."""

    def __init__(self, python: str, script: list[str], args: dict, threads: int | None = None):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus))}
        self.process = subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus)), python, *script, json.dumps(args)],
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.name = self._expect("READY")

    def _expect(self, tag: str) -> str:
        line = self.process.stdout.readline()
        if not line.startswith(tag):
            self.process.kill()
            raise RuntimeError(f"the worker answered {line!r} (exit code {self.process.wait()}), not {tag}")
        return line[len(tag):].strip()

    def step(self) -> tuple[float, float]:
        """Run one step there: its seconds and loss."""
        self.process.stdin.write("step\n")
        self.process.stdin.flush()
        seconds, loss = self._expect("STEP").split()
        return float(seconds), float(loss)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def machine() -> str:
    """Two lines: the processor, CPU count and devices; the Python, jax and paddlejax versions."""
    cpu = platform.processor() or platform.machine()
    devices = ", ".join(str(d) for d in jax.devices())
    return (f"machine: {cpu}, {os.cpu_count()} CPUs, devices [{devices}]\n"
            f"python {platform.python_version()}, jax {jax.__version__}, paddlejax {pj.__version__}")


# Peak dense bf16 FLOP/s (without sparsity) from the vendors' data sheets, by device kind prefix.
GPU_PEAK_BF16 = {"NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12, "NVIDIA L4": 121e12}


def peak_bf16() -> tuple[float | None, str]:
    """The device's data-sheet dense bf16 FLOP/s (None off the GPUs listed) and its kind."""
    kind = jax.devices()[0].device_kind
    return next((v for k, v in GPU_PEAK_BF16.items() if kind.startswith(k)), None), kind


def dense_rate(amp: str | None, n: int) -> float:
    """FLOP/s of an ``n x n`` matmul: the machine's practical dense peak for this dtype."""
    dtype = jnp.bfloat16 if amp else jnp.float32
    a = jnp.ones((n, n), dtype)
    dot = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32))
    ms = alternate({"dot": lambda: dot(a)}, 2, 10)["dot"]
    return 2 * n ** 3 / (ms / 1e3)
