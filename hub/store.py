"""Installed modules under ``HUB_HOME/modules/<name>/<version>/``: list, find, install, remove.

An install copies (or extracts) the module into ``HUB_HOME/tmp``, verifies every file against
``module.json`` there, and only then renames the directory into place, under a lock: a
half-installed module never appears in :func:`installed`, and two installers take turns.

>>> import os, tempfile, pathlib
>>> os.environ["HUB_HOME"] = tempfile.mkdtemp()
>>> src = pathlib.Path(tempfile.mkdtemp())
>>> _ = (src / "labels.txt").write_text("a\\nb\\n")
>>> _ = manifest.write(src, manifest.Manifest(name="toy", version="1.0", task="text-classification"))
>>> install_directory(src).label
'toy 1.0'
>>> [m.label for m in installed()]
['toy 1.0']
>>> find("toy", ">=2")
Traceback (most recent call last):
...
paddlejax.hub.errors.ModuleNotFound: no installed version of toy matches >=2; installed: 1.0
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path

from packaging.version import Version

from paddlejax.files import directory_lock, pid_alive
from paddlejax.hub import manifest
from paddlejax.hub.errors import HubError, ModuleFormatError, ModuleNotFound
from paddlejax.hub.home import hub_home


def modules_dir() -> Path:
    path = hub_home() / "modules"
    path.mkdir(parents=True, exist_ok=True)
    return path


def temp_dir(prefix: str) -> Path:
    """A fresh directory under ``HUB_HOME/tmp`` (same file system as the modules, so the final
    rename is atomic); :func:`clear` removes what killed installs leave there."""
    root = hub_home() / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    return path


def split_requirement(text: str, version: str | None = None) -> tuple[str, str]:
    """``"name>=1,<2"`` → ``("name", ">=1,<2")``; a bare version (``"1.2"``) means ``==1.2``.

    >>> split_requirement("digits_cnn==1.0"), split_requirement("digits_cnn", "1.0")
    (('digits_cnn', '==1.0'), ('digits_cnn', '==1.0'))
    """
    if not isinstance(text, str):
        raise HubError(f"a module is named by a string, got {type(text).__name__}")
    name, spec = re.match(r"\s*([^=<>!~\s]*)\s*(.*)", text).groups()
    if spec and version:
        raise HubError(f"{text!r}: give the version in the name or as version=, not both")
    manifest.check_name(name)
    spec = (spec or version or "").strip()
    if spec and spec[0].isdigit():
        spec = f"=={spec}"
    manifest.check_specifier(spec)
    return name, spec


def installed(name: str | None = None) -> list[manifest.Manifest]:
    """The installed modules (of ``name``, when given), by name then version; an unreadable
    one is skipped (``paddlejax hub show`` explains it)."""
    found = []
    for module_dir in sorted(modules_dir().iterdir()):
        if name is not None and module_dir.name != name:
            continue
        for version_dir in module_dir.iterdir() if module_dir.is_dir() else ():
            with contextlib.suppress(ModuleFormatError):
                found.append(manifest.read(version_dir, verify=False))
    return sorted(found, key=lambda m: (m.name, Version(m.version)))


def find(name: str, spec: str = "") -> tuple[Path, manifest.Manifest]:
    """The directory and manifest of the newest installed version of ``name`` in ``spec``."""
    versions = installed(name)
    matching = [m for m in versions if manifest.check_specifier(spec).contains(m.version, prereleases=True)]
    if not matching:
        if versions:
            raise ModuleNotFound(f"no installed version of {name} matches {spec}; installed: "
                                 f"{', '.join(m.version for m in versions)}")
        raise ModuleNotFound(f"module {name} is not installed (paddlejax hub install {name})")
    best = matching[-1]
    return modules_dir() / best.name / best.version, best


def _check_requires(m: manifest.Manifest) -> None:
    from paddlejax import __version__

    if m.requires and not manifest.check_specifier(m.requires).contains(__version__, prereleases=True):
        raise HubError(f"{m.label} needs paddlejax {m.requires}; this is paddlejax {__version__}")


def install_directory(source, *, force: bool = False, move: bool = False) -> manifest.Manifest:
    """Install the module in directory ``source`` (verified first); ``move`` takes the directory
    itself (it must be under ``HUB_HOME/tmp``) instead of a copy. Installing a version already
    there with the same files does nothing; with different files it is refused unless ``force``."""
    source = Path(source)
    m = manifest.read(source)
    _check_requires(m)
    target = modules_dir() / m.name / m.version
    staged = source if move else temp_dir(f"install-{m.name}")
    try:
        if not move:
            shutil.copytree(source, staged, dirs_exist_ok=True, symlinks=True)
            manifest.read(staged)  # the copy, not only the source, is what gets installed
        with directory_lock(modules_dir()):
            if target.exists():
                current = manifest.read(target, verify=False)
                if current.files == m.files:
                    return current
                if not force:
                    raise HubError(f"{m.label} is already installed with other files; uninstall it or "
                                   f"install with force")
                trash = temp_dir(f"old-{m.name}")
                os.replace(target, trash / "module")
                shutil.rmtree(trash, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)
    return m


def uninstall(name: str, spec: str = "") -> list[manifest.Manifest]:
    """Remove every installed version of ``name`` in ``spec``; returns what was removed."""
    versions = [m for m in installed(name) if manifest.check_specifier(spec).contains(m.version, prereleases=True)]
    if not versions:
        raise ModuleNotFound(f"no installed version of {name}{' ' + spec if spec else ''} to uninstall")
    with directory_lock(modules_dir()):
        for m in versions:
            trash = temp_dir(f"uninstall-{m.name}")
            # renamed away first, so that no reader sees a half-deleted module
            os.replace(modules_dir() / m.name / m.version, trash / "module")
            shutil.rmtree(trash, ignore_errors=True)
        with contextlib.suppress(OSError):
            (modules_dir() / name).rmdir()
    return versions


def clear(modules: bool = False) -> list[str]:
    """Empty the download cache and the work directory (but for the work of installs running
    now), and with ``modules`` uninstall everything; returns the directories emptied."""
    emptied = []
    for sub in ("cache", "tmp") + (("modules",) if modules else ()):
        path = hub_home() / sub
        if not path.exists():
            continue
        if sub == "tmp":
            # the work of installs still running stays; what killed ones left goes
            for entry in path.iterdir():
                pid = entry.name.rsplit("-", 2)[-2] if entry.name.count("-") >= 2 else ""
                if not (pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid))):
                    shutil.rmtree(entry, ignore_errors=True)
            with contextlib.suppress(OSError):
                path.rmdir()
        else:
            with directory_lock(modules_dir()) if sub == "modules" else contextlib.nullcontext():
                shutil.rmtree(path, ignore_errors=True)
        emptied.append(str(path))
    return emptied

