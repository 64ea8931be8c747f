"""Arrays read from ``.npy`` and ``.npz`` files without surprises: nothing is unpickled, and no
allocation happens that a header merely claims (a forged header is refused before reading).

>>> import numpy as np, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
>>> np.save(path, np.arange(3))
>>> read_arrays(path)[0].tolist()
[0, 1, 2]
"""
from __future__ import annotations

import math
import os
import zipfile
import zlib

import numpy as np


def _check_header(f, available: int, label: str) -> None:
    """Refuse a ``.npy`` stream whose header declares Python objects (they would need
    unpickling) or more or fewer bytes than follow it (a forged header would allocate them)."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f"{label}: .npy format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
    shape, _, dtype = read(f)
    if dtype.hasobject:
        raise ValueError(f"{label}: holds Python objects ({dtype}), which would need unpickling; "
                         f"save a numeric array")
    need, have = math.prod(shape) * dtype.itemsize, available - f.tell()
    if need != have:
        raise ValueError(f"{label}: its header declares {dtype}{list(shape)} ({need:,} bytes) but {have:,} bytes "
                         f"of data follow it; the file is damaged or not written by NumPy")


def read_arrays(path: str, names: list[str] | None = None) -> list[np.ndarray]:
    """The array of a ``.npy`` file, or the arrays called ``names`` in a ``.npz`` file, each
    checked before it is read (no unpickling, no allocation a header merely claims). The
    archive holds exactly those arrays: a missing or an unexpected one is an error naming it."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a regular file")
    if names is None:
        with open(path, "rb") as f:
            try:
                _check_header(f, os.fstat(f.fileno()).st_size, path)
            except ValueError as e:
                raise ValueError(e if str(e).startswith(path) else f"{path}: not a .npy array ({e})") from None
        return [np.load(path, allow_pickle=False)]
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a .npz archive of named arrays (save one with numpy.savez)")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {m.filename: m for m in archive.infolist()}
            others = sorted(n for n in members if not n.endswith(".npy"))
            if others:
                raise ValueError(f"{path}: members {others} are not .npy arrays; save the inputs with numpy.savez")
            stored = sorted(n[:-len(".npy")] for n in members)
            missing = [n for n in names if f"{n}.npy" not in members]
            if missing:
                raise ValueError(f"{path} lacks inputs {missing}; it has {stored}")
            extra = [n for n in stored if n not in names]
            if extra:
                raise ValueError(f"{path} holds arrays {extra} that are not inputs of the program; "
                                 f"its inputs are {list(names)}")
            for n in names:
                with archive.open(members[f"{n}.npy"]) as f:
                    _check_header(f, members[f"{n}.npy"].file_size, f"{path}[{n}]")
        with np.load(path, allow_pickle=False) as data:
            return [data[n] for n in names]
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ValueError(f"{path}: damaged .npz archive ({e})") from None


def npz_names(path: str) -> list[str]:
    """The names of the arrays in the ``.npz`` archive at ``path`` (its members without ``.npy``),
    in stored order; an error naming the file if it is not such an archive."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a .npz archive of named arrays (save one with numpy.savez)")
    try:
        with zipfile.ZipFile(path) as archive:
            return [n[:-len(".npy")] if n.endswith(".npy") else n for n in archive.namelist()]
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ValueError(f"{path}: damaged .npz archive ({e})") from None
