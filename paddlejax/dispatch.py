"""Where XLA's CPU client runs a call: on the calling thread, or handed to one of its own threads.

JAX hands each single-device CPU call to a worker thread and returns at once (asynchronous
dispatch), so Python can queue the next op while this one runs. That pays off in eager code,
where Python's per-op work overlaps the op before it. For a compiled program called and waited
for, as a ``Predictor`` is, the hand-over is pure cost: on a 2-core CPU a call of a tiny program
took 28-42 us asynchronously and 9-10 us run on the caller, and the digits CNN's Predictor call
(batch 32, 2 threads) went from 0.38 to 0.31 ms. A jitted training step was no slower run on the
caller (ResNet-18, batch 64: 535/518 ms against 553/549 ms); eager SmallCNN was slower (9 against
6 ms), which is why JAX's default stays as it is unless asked.

The client reads the mode once, when JAX creates it for the first computation, so the choice
must be made before that: ``PADDLEJAX_CPU_DISPATCH=sync`` in the environment (read when
paddlejax is imported), or :func:`set_cpu_dispatch` first thing in the program. The inference
commands (``paddlejax run``, ``paddlejax bench``, ``paddlejax hub serve``) run synchronously
unless the variable says ``async``.

>>> cpu_dispatch() in ("sync", "async")
True
"""
from __future__ import annotations

import os
import warnings

import jax

from paddlejax import adapter

ENV = "PADDLEJAX_CPU_DISPATCH"
MODES = ("sync", "async")
_FLAG = "jax_cpu_enable_async_dispatch"


def cpu_dispatch() -> str:
    """The CPU dispatch mode JAX's client uses (or will use, if not created yet): "sync" or "async".

    >>> cpu_dispatch() in MODES
    True
    """
    return "async" if jax.config.values[_FLAG] else "sync"


def set_cpu_dispatch(mode: str) -> None:
    """Run CPU calls on the calling thread (``"sync"``) or hand them over (``"async"``, JAX's default).

    Only possible before JAX's first computation; asking for the mode already in force is a no-op.

    >>> set_cpu_dispatch(cpu_dispatch())  # always allowed: nothing changes
    """
    if mode not in MODES:
        raise ValueError(f"CPU dispatch mode must be one of {MODES}, got {mode!r}")
    if mode == cpu_dispatch():
        return
    if adapter.backends_initialized():
        raise RuntimeError(f"cannot switch CPU dispatch to {mode!r}: JAX's CPU client already exists and runs "
                           f"{cpu_dispatch()!r}; choose before the first JAX computation (call set_cpu_dispatch "
                           f"first, or start Python with {ENV}={mode})")
    jax.config.update(_FLAG, mode == "async")


def dispatch_from_environment(default: str | None = None) -> str:
    """Apply ``PADDLEJAX_CPU_DISPATCH``, else ``default`` where JAX has not run yet; the mode in force.

    A mode the variable asks for too late (JAX already ran) only warns, so that importing paddlejax
    never fails on it; a ``default`` is a preference, dropped silently when too late.

    >>> dispatch_from_environment() in MODES
    True
    """
    mode = os.environ.get(ENV)
    if mode:
        if mode not in MODES:
            raise ValueError(f"{ENV} must be one of {MODES}, got {mode!r}")
        try:
            set_cpu_dispatch(mode)
        except RuntimeError as e:
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)
    elif default is not None and not adapter.backends_initialized():
        set_cpu_dispatch(default)
    return cpu_dispatch()
