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
import zipfile
import zlib
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
    from paddlejax.passes.options import parse_sizes as parse

    return check_sizes(program, {k: v for item in items for k, v in parse(item, "--size").items()})


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


def check_not_input(output: str, programs=(), files=(), option: str = "-o", program: bool = True) -> None:
    """Refuse an output that would overwrite a file read: a saved program of ``programs``
    (``PATH``, ``PATH.json`` or ``PATH.safetensors``) or a plain file of ``files``. ``program``
    says whether ``output`` names a saved program (its two files) or one file.

    >>> check_not_input("out/model.int8", programs=["out/model"])
    >>> check_not_input("out/model.json", programs=["out/model"])
    Traceback (most recent call last):
    ValueError: -o out/model.json would overwrite the input out/model; give another path
    """
    def paths(path, pair: bool) -> set[str]:
        if not pair:
            return {os.path.realpath(path)}
        stem = re.sub(r"\.(json|safetensors)$", "", str(path))
        return {os.path.realpath(stem + suffix) for suffix in (".json", ".safetensors")}

    written = paths(output, program)
    for path, pair in [(p, True) for p in programs] + [(f, False) for f in files]:
        if written & paths(path, pair):
            raise ValueError(f"{option} {output} would overwrite the input {path}; give another path")


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


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def plot_path(path: str, option: str) -> str:
    """``path`` if a plot can be written there (a file named with an image suffix), else a
    clear error, given before any work so that nothing is written half-way.

    >>> plot_path("errors.png", "--report")
    'errors.png'
    >>> plot_path("errors.txt", "--report")
    Traceback (most recent call last):
    ValueError: --report errors.txt must end in .png or .svg or .pdf or .jpg or .jpeg
    """
    return file_path(path, option, PLOT_SUFFIXES)
