"""What the commands share: help that keeps example lines, checked symbolic sizes, arrays read
from files without surprises (:func:`paddlejax.arrays.read_arrays`), and output paths that say
what they will write.

>>> import paddlejax as pj
>>> parse_sizes(pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3))), ["b=32"])
{'b': 32}
"""
from __future__ import annotations

import argparse
import os
import re
import textwrap
from pathlib import Path

from paddlejax.arrays import read_arrays  # noqa: F401  (the commands' reader of .npy/.npz files)


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


def parse_input_shape(item: str, *, name_required: bool = True) -> tuple[str | None, tuple]:
    """An ``--input-shape NAME=DIMS`` value as ``(NAME, dims)``, ``None`` for a ``?`` size; with
    ``name_required=False`` the name may be left out (``None``).

    >>> parse_input_shape("x=?,3,48,320")
    ('x', (None, 3, 48, 320))
    >>> parse_input_shape("?,3,48,320", name_required=False)
    (None, (None, 3, 48, 320))
    >>> parse_input_shape("x=3,a")
    Traceback (most recent call last):
    ValueError: --input-shape x=3,a: each size must be an integer >= 1 or ?, got 'a'
    """
    name, sep, dims = item.rpartition("=")
    if not dims or (sep and not name) or (name_required and not name):
        form = "NAME=DIMS" if name_required else "[NAME=]DIMS"
        raise ValueError(f"--input-shape expects {form} such as x=?,3,224,224, got {item!r}")
    out = []
    for d in dims.split(","):
        d = d.strip()
        if d == "?":
            out.append(None)
        elif d.isdigit() and int(d) >= 1:
            out.append(int(d))
        else:
            raise ValueError(f"--input-shape {item}: each size must be an integer >= 1 or ?, got {d!r}")
    return name or None, tuple(out)


def parse_sizes(program, items) -> dict[str, int]:
    """``--size NAME=N`` options as ``{NAME: N}``, checked against ``program``
    (:func:`paddlejax.analysis.check_sizes`)."""
    from paddlejax.analysis import check_sizes
    from paddlejax.passes.options import parse_sizes as parse

    return check_sizes(program, {k: v for item in items for k, v in parse(item, "--size").items()})


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
