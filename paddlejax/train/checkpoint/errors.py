"""What reading and writing checkpoints reports: errors, the warning for a skipped damaged
checkpoint, and a restored checkpoint.

>>> Restored(step=1, state={"w": 0}, meta=None).state
{'w': 0}
"""
from __future__ import annotations

from typing import Any, NamedTuple


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a ``like`` tree that does not fit the stored one; for the
    latter, ``step`` and ``meta`` are those of the checkpoint that did not fit (else None).

    >>> e = CheckpointError("no usable checkpoint")
    >>> isinstance(e, RuntimeError), e.step, e.meta
    (True, None, None)
    """

    def __init__(self, message: str, step: int | None = None, meta: Any = None):
        super().__init__(message)
        self.step, self.meta = step, meta


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint failed to read or verify and was skipped in favour of an earlier one.

    >>> issubclass(CorruptCheckpointWarning, UserWarning)
    True
    """


class Restored(NamedTuple):
    """A restored checkpoint: its step, the state tree and the ``meta`` dict saved with it.

    >>> Restored(step=3, state={}, meta=None).step
    3
    """

    step: int
    state: Any
    meta: Any


class Corrupt(Exception):
    """A checkpoint that cannot be read back as it was written; the message says why."""
