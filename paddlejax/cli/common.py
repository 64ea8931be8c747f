"""What the commands share: help that keeps example lines, checked symbolic sizes, arrays read
from files without surprises, and output paths that say what they will write.

>>> import paddlejax as pj
>>> parse_sizes(pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3))), ["b=32"])
{'b': 32}
"""
from __future__ import annotations

import argparse
import math
import os
import re
import textwrap
from pathlib import Path

import numpy as np


class HelpFormatter(argparse.HelpFormatter):
    """Rewraps the prose of a description but keeps indented blocks (command examples) line by
    line, as written in the command module's docstring."""

    def _fill_text(self, text, width, indent):
        blocks = []
        for block in re.split(r"\n\s*\n", text.strip("\n")):
            lines = block.splitlines()
            if all(line[:1].isspace() for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                            initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(blocks)


def parse_sizes(program, items) -> dict[str, int]:
    """``--size NAME=N`` options as ``{NAME: N}``, checked against ``program``
    (:func:`paddlejax.analysis.check_sizes`)."""
    from paddlejax.analysis import check_sizes

    sizes = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not value.isdigit():
            raise ValueError(f"--size expects NAME=N, got {item!r}")
        sizes[name] = int(value)
    return check_sizes(program, sizes)


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
    checked before it is read (no unpickling, no allocation a header merely claims)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a regular file")
    if names is None:
        with open(path, "rb") as f:
            _check_header(f, os.fstat(f.fileno()).st_size, path)
        return [np.load(path, allow_pickle=False)]
    with np.load(path, allow_pickle=False) as data:
        if not hasattr(data, "files"):
            raise ValueError(f"{path}: expected a .npz archive of named arrays")
        missing = [n for n in names if n not in data.files]
        if missing:
            raise ValueError(f"{path} lacks inputs {missing}; it has {sorted(data.files)}")
        for n in names:
            info = data.zip.getinfo(f"{n}.npy")
            with data.zip.open(info) as f:
                _check_header(f, info.file_size, f"{path}[{n}]")
        return [data[n] for n in names]


def program_path(path: str, option: str = "-o") -> str:
    """``path`` if a program can be saved there (as PATH.json and PATH.safetensors), else a
    clear error: it must name a file stem, not a directory.

    >>> program_path("out/model")
    'out/model'
    >>> program_path("out/")
    Traceback (most recent call last):
    ValueError: -o out/ names a directory; give the program's path inside it, e.g. out/model
    """
    stem = re.sub(r"\.(json|safetensors)$", "", path)
    if path.endswith(("/", os.sep)) or Path(stem).name in ("", ".", "..") or Path(stem).is_dir():
        raise ValueError(f"{option} {path} names a directory; give the program's path inside it, "
                         f"e.g. {os.path.join(stem, 'model')}")
    return path


def file_path(path: str, option: str = "-o", suffixes: tuple[str, ...] = ()) -> str:
    """``path`` if a file can be written there (with one of ``suffixes``, when given), else a
    clear error.

    >>> file_path("y.npz", "--output", (".npy", ".npz"))
    'y.npz'
    >>> file_path("y", "--output", (".npy", ".npz"))
    Traceback (most recent call last):
    ValueError: --output y must end in .npy or .npz
    """
    if path.endswith(("/", os.sep)) or Path(path).is_dir():
        raise ValueError(f"{option} {path} names a directory; give a file name")
    if suffixes and not path.endswith(suffixes):
        raise ValueError(f"{option} {path} must end in {' or '.join(suffixes)}")
    return path
