"""Join a multi-process run started by ``paddlejax launch``: read its environment, start JAX's
distributed runtime.

The launcher gives every process these variables:

- ``PADDLEJAX_COORDINATOR``: ``host:port`` of the coordinator (run by process 0);
- ``PADDLEJAX_NUM_PROCESSES``: processes in the whole run (all nodes);
- ``PADDLEJAX_PROCESS_ID``: this process's rank, ``0 .. num_processes - 1``;
- ``PADDLEJAX_LOCAL_RANK``: its rank on this node;
- ``PADDLEJAX_DEVICES_PER_PROC``: devices per process, when asked for: ``K`` host (CPU) devices,
  and on a GPU node the ``K`` GPUs ``local_rank * K .. local_rank * K + K - 1``;
- ``PADDLEJAX_RESTART_COUNT``: how many times an elastic launch has restarted the run (0 at
  first); a Trainer with a ``checkpoint_dir`` resumes by itself whatever it is.

A script outside a launch sees none of them, and :func:`init_from_env` leaves JAX alone:

>>> init_from_env(environ={}) is None
True
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import jax

COORDINATOR = "PADDLEJAX_COORDINATOR"
NUM_PROCESSES = "PADDLEJAX_NUM_PROCESSES"
PROCESS_ID = "PADDLEJAX_PROCESS_ID"
LOCAL_RANK = "PADDLEJAX_LOCAL_RANK"
DEVICES_PER_PROC = "PADDLEJAX_DEVICES_PER_PROC"
RESTART_COUNT = "PADDLEJAX_RESTART_COUNT"

_TOO_LATE = ("init_from_env() must run before JAX starts its backend, but devices are already "
             "initialised (something called jax.devices(), created an array or ran a computation). "
             "Call paddlejax.distributed.env.init_from_env() at the top of the script, right "
             "after the imports and before any JAX work.")


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer (set by paddlejax launch), got {value!r}") from None


def init_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """Join the run ``paddlejax launch`` started; ``(process_id, num_processes)``, or ``None``
    when this process was not launched (no ``PADDLEJAX_COORDINATOR`` in ``environ``, default
    ``os.environ``).

    With ``PADDLEJAX_DEVICES_PER_PROC = K`` it sets ``jax_num_cpu_devices`` to ``K`` and gives
    this process the node's GPUs ``local_rank * K`` to ``local_rank * K + K - 1``
    (``local_device_ids``); then it calls ``jax.distributed.initialize``, after which
    ``jax.devices()`` lists the devices of every process. Must run before JAX starts its
    backend (``RuntimeError`` saying so otherwise); calling it again once joined returns the
    same pair.

    From then on an uncaught exception ends the process right after its traceback is printed
    (exit code 1): JAX's exit-time shutdown would wait for every other rank, and those may be
    blocked in a collective with this one, so the launcher would never see the failure.
    (``sys.exit(code)`` still goes through that shutdown.)

    >>> init_from_env(environ={"PADDLEJAX_COORDINATOR": "127.0.0.1:1234"})
    Traceback (most recent call last):
    ...
    ValueError: PADDLEJAX_NUM_PROCESSES must be an integer (set by paddlejax launch), got None
    """
    env = os.environ if environ is None else environ
    if COORDINATOR not in env:
        return None
    num_processes, process_id = _int_var(env, NUM_PROCESSES), _int_var(env, PROCESS_ID)
    devices = _int_var(env, DEVICES_PER_PROC) if DEVICES_PER_PROC in env else None
    if jax.distributed.is_initialized():
        return process_id, num_processes
    try:
        if devices is not None:
            jax.config.update("jax_num_cpu_devices", devices)
        jax.distributed.initialize(env[COORDINATOR], num_processes=num_processes, process_id=process_id,
                                   local_device_ids=local_device_ids(env))
    except RuntimeError as e:
        # jax's own errors for "config/initialize called after the backend started" say "before"
        if "before" in str(e):
            raise RuntimeError(_TOO_LATE) from e
        raise
    sys.excepthook = _exit_at_once(sys.excepthook)
    return process_id, num_processes


def local_device_ids(environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The node's GPUs this launched process gets: ``K = PADDLEJAX_DEVICES_PER_PROC`` of them
    from ``local_rank * K`` (``None``: no ``--devices-per-proc``, every GPU stays visible).

    >>> local_device_ids({"PADDLEJAX_LOCAL_RANK": "1", "PADDLEJAX_DEVICES_PER_PROC": "4"})
    [4, 5, 6, 7]
    """
    env = os.environ if environ is None else environ
    if DEVICES_PER_PROC not in env:
        return None
    devices = _int_var(env, DEVICES_PER_PROC)
    first = _int_var(env, LOCAL_RANK) * devices
    return list(range(first, first + devices))


def _exit_at_once(report):
    def excepthook(kind, value, traceback):
        report(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    return excepthook
