"""Writing a module directory: programs saved, files copied, ``module.json`` with every sha256.

>>> import tempfile, pathlib, jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
>>> out = pathlib.Path(tempfile.mkdtemp()) / "doubler"
>>> m = write_module(out, name="doubler", version="0.1", task="text-embedding", programs={"model": prog},
...                  processor={"postprocess": {"kind": "embedding"}})
>>> sorted(m.files)
['model.json', 'model.safetensors']
"""
from __future__ import annotations

import shutil
from pathlib import Path

from paddlejax.hub import manifest
from paddlejax.hub.errors import HubError
from paddlejax.io import save


def write_module(directory, *, programs: dict, files: dict | None = None, **fields) -> manifest.Manifest:
    """Write a module into the new directory ``directory``: each program of ``programs``
    (role → Program) saved as ``<role>.json`` + ``<role>.safetensors``, each of ``files``
    (relative path → bytes, text or a path to copy) written, and the manifest built from
    ``fields`` (see :class:`~paddlejax.hub.manifest.Manifest`) and checked before anything is
    written."""
    directory = Path(directory)
    m = manifest.Manifest(programs={role: role for role in programs}, **fields)
    if directory.exists() and any(directory.iterdir()):
        raise HubError(f"{directory} is not empty; give a new directory for the module")
    directory.mkdir(parents=True, exist_ok=True)
    for role, program in programs.items():
        save(program, directory / role)
    for rel, content in (files or {}).items():
        path = directory / manifest.check_path(rel, m.label)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            shutil.copyfile(content, path)
    return manifest.write(directory, m)
