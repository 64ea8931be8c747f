"""``install``: one entry point for every source of a module, and ``search`` over all of them.

A target is a module directory, an archive file (``.tar.gz`` / ``.zip``), an archive URL, or
a name with an optional version range (``digits_cnn``, ``digits_cnn>=1,<2``), looked up in the
registries (given, then configured) and then among the built-in recipes. Archives are checked
before extraction (:mod:`paddlejax.hub.archive`) and every install is atomic
(:mod:`paddlejax.hub.store`).

>>> install("no_such_module", registries=[])
Traceback (most recent call last):
...
paddlejax.hub.errors.ModuleNotFound: no module no_such_module in the registries searched (none) nor among the built-in modules (all_minilm_l6_v2, digits_cnn, fer_emotion, minilm_bbc_news, ppocr_v4)
"""
from __future__ import annotations

import shutil
from pathlib import Path

from packaging.version import Version

from paddlejax.hub import archive, builtin, home, manifest, registry, store
from paddlejax.hub.errors import HubError, ModuleNotFound, RegistryError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def _module_root(extracted: Path) -> Path:
    """The module directory inside an extracted archive: its root, or its one top folder."""
    if (extracted / manifest.MANIFEST).is_file():
        return extracted
    entries = list(extracted.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / manifest.MANIFEST).is_file():
        return entries[0]
    raise HubError("the archive holds no module.json at its root or in a single top folder")


def install_archive(path, *, sha256: str | None = None, force: bool = False, progress: bool = True
                    ) -> manifest.Manifest:
    """Install the module in an archive file, checked (``sha256`` too, if given) before anything
    is extracted, extracted in ``HUB_HOME/tmp`` and moved into place verified."""
    work = store.temp_dir("extract")
    try:
        archive.extract(path, work / "files", sha256=sha256, progress=progress)
        root = _module_root(work / "files")
        staged = store.temp_dir("install")
        shutil.rmtree(staged)
        root.rename(staged)
        return store.install_directory(staged, force=force, move=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install_builtin(name: str, *, force: bool = False, progress: bool = True, **options) -> manifest.Manifest:
    """Build the built-in module ``name`` (see :mod:`paddlejax.hub.builtin`) and install it."""
    work = store.temp_dir(f"build-{name}")
    try:
        builtin.build(name, work / "module", progress=progress, **options)
        staged = store.temp_dir("install")
        shutil.rmtree(staged)
        (work / "module").rename(staged)
        return store.install_directory(staged, force=force, move=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _from_registries(name: str, spec: str, locations: list[str], progress: bool, force: bool):
    errors = []
    for location in locations:
        try:
            version, release = registry.resolve(location, name, spec)
        except (ModuleNotFound, RegistryError) as e:
            errors.append(str(e))
            continue
        path = registry.download(registry.archive_url(location, release), sha256=release["sha256"],
                                 size=release["size"], progress=progress)
        return install_archive(path, sha256=release["sha256"], force=force, progress=progress), errors
    return None, errors


def install(target: str, *, version: str | None = None, registries: list[str] | None = None,
            sha256: str | None = None, force: bool = False, progress: bool = True) -> manifest.Manifest:
    """Install ``target`` (a directory, an archive, an archive URL, or a name with an optional
    range) and return its manifest; an already installed match of a name is kept as it is."""
    path = Path(target) if not registry.is_url(target) else None
    if path is not None and path.is_dir():
        return store.install_directory(path, force=force)
    if path is not None and path.is_file():
        return install_archive(path, sha256=sha256, force=force, progress=progress)
    if registry.is_url(target):
        if not target.lower().endswith(ARCHIVE_SUFFIXES):
            raise HubError(f"{target}: a URL to install must name an archive (.tar.gz or .zip); for a registry, "
                           f"install NAME with --registry {target}")
        return install_archive(registry.download(target, sha256=sha256, progress=progress), sha256=sha256,
                               force=force, progress=progress)
    if target.lower().endswith(ARCHIVE_SUFFIXES) or "/" in target:
        raise HubError(f"{target}: no such file or directory")
    name, spec = store.split_requirement(target, version)
    if not force:
        try:
            return store.find(name, spec)[1]
        except ModuleNotFound:
            pass
    locations = home.registries() if registries is None else list(registries)
    found, errors = _from_registries(name, spec, locations, progress, force)
    if found is not None:
        return found
    recipe = builtin.RECIPES.get(name)
    if recipe is not None and manifest.check_specifier(spec).contains(recipe.version, prereleases=True):
        return install_builtin(name, force=force, progress=progress)
    searched = "; ".join(errors) if errors else "none"
    raise ModuleNotFound(f"no module {name}{spec} in the registries searched ({searched}) nor among the built-in "
                         f"modules ({', '.join(sorted(builtin.RECIPES))})")


def search(words: str = "", registries: list[str] | None = None) -> list[dict]:
    """Modules whose name, summary, task or keywords contain every word (case-insensitive):
    installed ones, those of the registries and the built-in recipes, one row per name and
    source with its newest version."""
    wanted = words.lower().split()

    def matches(*texts) -> bool:
        text = " ".join(str(t) for t in texts).lower()
        return all(w in text for w in wanted)

    rows = []
    for m in store.installed():
        if matches(m.name, m.summary, m.task, *m.keywords):
            rows.append({"name": m.name, "version": m.version, "task": m.task, "summary": m.summary,
                         "source": "installed"})
    for location in home.registries() if registries is None else registries:
        try:
            index = registry.open_index(location)
        except RegistryError as e:
            rows.append({"name": "?", "version": "", "task": "", "summary": str(e), "source": location})
            continue
        for name, entry in index["modules"].items():
            if matches(name, entry.get("summary", ""), entry.get("task", ""), *entry.get("keywords", [])):
                newest = max(entry["versions"], key=Version)
                rows.append({"name": name, "version": newest, "task": entry.get("task", ""),
                             "summary": entry.get("summary", ""), "source": location})
    for recipe in builtin.RECIPES.values():
        if matches(recipe.name, recipe.summary, recipe.task, *recipe.keywords):
            rows.append({"name": recipe.name, "version": recipe.version, "task": recipe.task,
                         "summary": recipe.summary, "source": "built-in"})
    return rows
