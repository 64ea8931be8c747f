"""Freed host memory kept for reuse, so that XLA's CPU buffers come without page faults.

XLA's CPU runtime allocates each call's buffers with ``malloc`` and frees them when the call is
done. glibc gives big blocks back to the system: a block over ``M_MMAP_THRESHOLD`` is mapped on
its own and unmapped when freed, free space over ``M_TRIM_THRESHOLD`` at the top of a heap is
returned, and the arena of a thread other than the main one holds no block over 64 MiB at all.
The next call then faults the same pages back in, each one zeroed by the kernel. Measured on a
2-core CPU: the ResNet-18 train step at batch 64 took 115,000 page faults (450 MiB) a step, and
dropped from 641 to 527 ms without them. ResNet-18 Predictor calls at batch 32 took 8,000 a call,
about 5 % of their time.

:func:`keep_freed_memory` runs when paddlejax is imported. It sets one arena for every thread
(``M_ARENA_MAX``), blocks up to ``KEEP_BYTES`` (2 GiB) taken from it, and up to 2 GiB of free
space kept at its top (1 GiB still let the train step fault 180 MiB a step back in). The process's resident memory then stays near its peak rather than
shrinking between calls, and later allocations reuse it. glibc reads the arena limit when the
first thread beyond the main one allocates, so it only takes effect when paddlejax is imported
before JAX runs its first computation. ``PADDLEJAX_KEEP_HOST_MEMORY=0`` leaves the allocator as
it is. Other C libraries (musl, macOS) are left alone.

>>> keep_freed_memory() in (True, False)   # True on Linux with glibc, unless switched off
True
"""
from __future__ import annotations

import ctypes
import functools
import os

ENV = "PADDLEJAX_KEEP_HOST_MEMORY"
KEEP_BYTES = (1 << 31) - 1  # the most mallopt takes (an int): 2 GiB
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


def _glibc() -> bool:
    """Whether the C library this process runs on is glibc (not the one Python was linked against)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # a platform without the name, or without confstr
        return False


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (once per process); whether it was asked.

    False where ``PADDLEJAX_KEEP_HOST_MEMORY=0``, where the C library is not glibc, or where it has no
    ``mallopt`` or refuses the settings.
    """
    if os.environ.get(ENV, "1") == "0" or not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(M_ARENA_MAX, 1), mallopt(M_MMAP_THRESHOLD, KEEP_BYTES), mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)])
