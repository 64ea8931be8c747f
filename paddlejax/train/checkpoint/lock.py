"""One writer process per checkpoint directory: an advisory lock file that ``CheckpointManager.save``
takes and ``close`` releases.

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> acquire_writer_lock(folder), release_writer_lock(folder)
(True, None)
"""
from __future__ import annotations

import atexit
import os
import socket

import jax

from paddlejax.train.checkpoint.errors import CheckpointError

try:
    import fcntl
except ImportError:  # not on Windows: there, two writers are not detected
    fcntl = None


# One writer process per directory: two runs saving into one directory would replace and delete
# each other's checkpoints, and Orbax's temporary directories of a step collide. The lock is an
# advisory flock on a file in the directory, held by the process from its first save until its
# managers there close; the kernel drops it when the process dies, so a killed run can resume.
LOCK_NAME = ".paddlejax-writer.lock"
_WRITER_LOCKS: dict[str, list] = {}  # directory -> [open lock file, managers of this process holding it]


@atexit.register
def _close_writer_locks() -> None:
    """Closes the lock files a Trainer's never-closed manager holds (no unclosed-file warning at exit)."""
    for held in _WRITER_LOCKS.values():
        held[0].close()


def acquire_writer_lock(directory: str) -> bool:
    """Marks ``directory`` as written by this process; False where nothing is locked (no flock,
    or a multi-process run, whose processes all save into one directory by design)."""
    if fcntl is None or jax.process_count() > 1:
        return False
    held = _WRITER_LOCKS.get(directory)
    if held is not None:
        held[1] += 1
        return True
    f = open(os.path.join(directory, LOCK_NAME), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise CheckpointError(f"CheckpointManager.save: {directory} is being written by {holder}; two runs "
                              "saving into one directory would replace and delete each other's checkpoints, "
                              "so give each run its own directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"process {os.getpid()} on {socket.gethostname()}")
    f.flush()
    _WRITER_LOCKS[directory] = [f, 1]
    return True


def release_writer_lock(directory: str) -> None:
    """Drops one manager's hold on ``directory``; the last one to let go unlocks it."""
    held = _WRITER_LOCKS.get(directory)
    if held is not None:
        held[1] -= 1
        if held[1] == 0:
            del _WRITER_LOCKS[directory]
            held[0].close()  # closing the file drops the flock
