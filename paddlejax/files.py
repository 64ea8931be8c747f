"""Reading and writing files safely: bounded reads of regular files, atomic writes of several
files as one unit, and a directory lock that makes concurrent writers take turns.

A saved program is two files that must change together; these helpers give that:

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_together({d / "a.json": b"{}", d / "a.bin": b"xyz"})
>>> read_regular(d / "a.bin", limit=1024)
b'xyz'
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: writers there do not take turns
    fcntl = None


class FileReadError(OSError):
    """A file that cannot be read as asked: missing, not a regular file, or too large."""


def read_regular(path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refusing devices, FIFOs, sockets, directories,
    files over ``limit`` bytes and files that grow while being read.

    >>> read_regular("/dev/zero", limit=10)
    Traceback (most recent call last):
    ...
    paddlejax.files.FileReadError: /dev/zero is not a regular file
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FileReadError(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileReadError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise FileReadError(f"{path.name} is {info.st_size} bytes; refusing files over {limit}")
        data = f.read(info.st_size + 1)  # not limit + 1: read() allocates what it is asked for
    if len(data) > info.st_size:
        raise FileReadError(f"{path.name} changed while being read")
    return data


@contextlib.contextmanager
def directory_lock(directory, shared: bool = False):
    """Hold an advisory lock on ``directory`` (shared for readers, exclusive for writers), so
    that writers of several files in it take turns and readers never see half a change.
    Where locks are unsupported (no ``fcntl``, a read-only or network file system) it does
    nothing: the pair check on load still refuses a mixed pair.
    """
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(directory, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


def _temp_name(path: Path) -> Path:
    # the writer's pid lets a later writer recognise the leftovers of a killed one
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(path: Path) -> None:
    """Delete the temporary files that writers of ``path`` killed mid-write left behind."""
    prefix = f".{path.name}."
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                entry.unlink()


def _write_synced(path: Path, data: bytes) -> None:
    # 0o666 before the umask, as for any file a program creates (mkstemp would force 0o600)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_together(files: dict) -> None:
    """Write every ``{path: bytes}`` of ``files`` (all in one directory) as one unit: all data
    reaches the disk in temporary files first, and only then are they renamed over the targets,
    in the given order, under the directory's lock. A failure while writing (a full disk, an
    interrupt) leaves the old files untouched and no temporary files; concurrent writers take
    turns, so the last one's files are all that remain.
    """
    paths = [Path(p) for p in files]
    directory = paths[0].parent
    if any(p.parent != directory for p in paths):
        raise ValueError("write_together writes files of one directory")
    directory.mkdir(parents=True, exist_ok=True)
    with directory_lock(directory):
        for p in paths:
            remove_stale_temps(p)
        temps = []
        try:
            for p, data in zip(paths, files.values()):
                tmp = _temp_name(p)
                temps.append(tmp)
                _write_synced(tmp, data)
            for tmp, p in zip(temps, paths):
                os.replace(tmp, p)
        except BaseException:
            for tmp in temps:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            raise
        _sync_directory(directory)
