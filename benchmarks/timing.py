"""What every benchmark here shares: side-by-side timing and a description of the machine.

    from timing import alternate, machine
    ms = alternate({"a": f, "b": g}, warmup=2, repeats=10)   # median ms per call, interleaved
"""
from __future__ import annotations

import math
import os
import platform
import statistics

import jax

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


def machine() -> str:
    """Two lines: the processor, CPU count and devices; the Python, jax and paddlejax versions."""
    cpu = platform.processor() or platform.machine()
    devices = ", ".join(str(d) for d in jax.devices())
    return (f"machine: {cpu}, {os.cpu_count()} CPUs, devices [{devices}]\n"
            f"python {platform.python_version()}, jax {jax.__version__}, paddlejax {pj.__version__}")
