"""``module.json``: what a hub module is (name, version, task, programs, processor, schema) and
the sha256 of every file it ships, read strictly and checked against the files.

A module is a directory; its ``module.json`` is the only file trusted before checking, and it
lists every other file with its digest, so a tampered, truncated or added file is refused
before anything is loaded.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "labels.txt").write_text("cat\\ndog\\n")
>>> m = Manifest(name="pets", version="1.0", task="image-classification", summary="Cats or dogs")
>>> _ = write(d, m)
>>> read(d).files
{'labels.txt': 'f641fdcd8af73b2f6334ab63c13d2eb857cd16f2aa4ea0ba20ba0eb9627918b5'}
>>> _ = (d / "labels.txt").write_text("cat\\nwolf\\n")
>>> read(d)
Traceback (most recent call last):
...
paddlejax.hub.errors.ModuleFormatError: pets 1.0: labels.txt does not match its sha256 in module.json (the file was changed or damaged)
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from paddlejax.files import FileReadError, read_regular
from paddlejax.hub.errors import ModuleFormatError

FORMAT = "paddlejax.module"
FORMAT_VERSION = 1
MANIFEST = "module.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 4096
# The tasks a module can declare; each has its post-processing and its methods on Module.
TASKS = ("text-embedding", "text-classification", "text-multilabel", "image-classification",
         "image-multilabel", "detection", "ocr")
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def check_name(name) -> str:
    """``name`` if it is a module name (lower case letters, digits, ``_ . -``; at most 64).

    >>> check_name("all_minilm_l6_v2")
    'all_minilm_l6_v2'
    >>> check_name("../etc")
    Traceback (most recent call last):
    ...
    paddlejax.hub.errors.ModuleFormatError: module name '../etc' is not lower case letters, digits and _ . - (at most 64, starting with a letter or digit)
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ModuleFormatError(f"module name {name!r:.80} is not lower case letters, digits and _ . - "
                                f"(at most 64, starting with a letter or digit)")
    return name


def check_version(version) -> str:
    """``version`` in its normal PEP 440 form; an error otherwise.

    >>> check_version("1.02")
    '1.2'
    """
    try:
        return str(Version(version))
    except (InvalidVersion, TypeError):
        raise ModuleFormatError(f"module version {version!r:.80} is not a version (PEP 440: 1.0, 2.1.3, ...)") from None


def check_specifier(spec) -> SpecifierSet:
    """A version range (``">=1,<2"``, ``"==1.2"``) as a SpecifierSet; an error naming it otherwise."""
    try:
        return SpecifierSet(spec or "")
    except (InvalidSpecifier, TypeError):
        raise ModuleFormatError(f"{spec!r:.80} is not a version range (e.g. '==1.2' or '>=1,<2')") from None


@dataclasses.dataclass
class Manifest:
    """The contents of ``module.json``.

    - ``programs``: role → saved program stem in the module (``{"model": "model"}`` names
      ``model.json`` + ``model.safetensors``); the role ``model`` is the one task methods run.
    - ``processor``: the declarative pre- and post-processing
      (:mod:`paddlejax.hub.processor`); ``inputs`` / ``outputs``: JSON schemas of a request's
      fields and of a result.
    - ``predictor``: how the program is compiled for serving: ``max_batch_size``,
      ``batch_buckets``, ``length_buckets`` (sequence lengths of text programs).
    - ``requires``: the paddlejax versions the module runs on (a range, ``">=0.1,<0.2"``).
    - ``code``: a Python file the module ships, run only with ``trust_code=True``.
    - ``files``: relative path → sha256 of every file but ``module.json`` (filled by :func:`write`).
    """

    name: str
    version: str
    task: str
    summary: str = ""
    license: str = ""
    author: str = ""
    keywords: list[str] = dataclasses.field(default_factory=list)
    requires: str = ""
    programs: dict[str, str] = dataclasses.field(default_factory=dict)
    processor: dict = dataclasses.field(default_factory=dict)
    predictor: dict = dataclasses.field(default_factory=dict)
    inputs: dict = dataclasses.field(default_factory=dict)
    outputs: dict = dataclasses.field(default_factory=dict)
    code: str | None = None
    files: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.name = check_name(self.name)
        self.version = check_version(self.version)
        if self.task not in TASKS:
            raise ModuleFormatError(f"{self.label}: task {self.task!r:.40} is not one of {', '.join(TASKS)}")
        for field, kind in (("summary", str), ("license", str), ("author", str), ("requires", str),
                            ("programs", dict), ("processor", dict), ("predictor", dict), ("inputs", dict), ("outputs", dict),
                            ("files", dict), ("keywords", list)):
            if not isinstance(getattr(self, field), kind):
                raise ModuleFormatError(f"{self.label}: '{field}' must be a {kind.__name__}, "
                                        f"got {type(getattr(self, field)).__name__}")
        if not all(isinstance(k, str) for k in self.keywords):
            raise ModuleFormatError(f"{self.label}: 'keywords' must be strings")
        check_specifier(self.requires)
        for role, stem in self.programs.items():
            if not isinstance(stem, str):
                raise ModuleFormatError(f"{self.label}: program '{role}' must name a file stem, got {stem!r:.40}")
            check_path(f"{stem}.json", self.label)
        if self.code is not None:
            check_path(self.code, self.label)
        if len(self.files) > MAX_FILES:
            raise ModuleFormatError(f"{self.label}: lists {len(self.files)} files; at most {MAX_FILES}")
        for path, digest in self.files.items():
            check_path(path, self.label)
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ModuleFormatError(f"{self.label}: the sha256 of {path} is not 64 hex digits")

    @property
    def label(self) -> str:
        """``name version``, as errors and listings show a module."""
        return f"{self.name} {self.version}"

    def to_json(self) -> dict:
        """The ``module.json`` document."""
        body = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **body}


def check_path(path, label: str) -> str:
    """``path`` if it is a plain relative path inside a module (no ``..``, not absolute, not
    ``module.json``); errors start with ``label``."""
    parts = path.split("/") if isinstance(path, str) else None
    if (not parts or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts)
            or any(ord(c) < 32 for c in path) or path == MANIFEST):
        raise ModuleFormatError(f"{label}: {path!r:.80} is not a plain relative path inside the module")
    return path


def _no_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ModuleFormatError(f"{MANIFEST}: a key appears twice in one object")
    return out


def _parse(directory: Path) -> dict:
    try:
        raw = read_regular(directory / MANIFEST, MAX_MANIFEST_BYTES)
    except FileReadError as e:
        raise ModuleFormatError(f"{directory} is not a module: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModuleFormatError(f"{directory / MANIFEST}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModuleFormatError(f"{directory / MANIFEST}: not a paddlejax module manifest (no \"format\": \"{FORMAT}\")")
    version = doc.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModuleFormatError(f"{directory / MANIFEST}: format_version must be a positive int")
    if version > FORMAT_VERSION:
        raise ModuleFormatError(f"{directory / MANIFEST}: format version {version} is newer than this paddlejax "
                                f"reads ({FORMAT_VERSION}); upgrade paddlejax")
    return doc


def read(directory, verify: bool = True) -> Manifest:
    """The manifest of the module in ``directory``; with ``verify``, also checks that the
    directory holds exactly the files it lists (regular files, no links), each with its sha256."""
    directory = Path(directory)
    doc = _parse(directory)
    fields = {f.name for f in dataclasses.fields(Manifest)}
    unknown = sorted(set(doc) - fields - {"format", "format_version"})
    if unknown:
        raise ModuleFormatError(f"{directory / MANIFEST}: unknown fields {unknown}")
    missing = sorted({"name", "version", "task"} - set(doc))
    if missing:
        raise ModuleFormatError(f"{directory / MANIFEST}: lacks {missing}")
    try:
        manifest = Manifest(**{k: v for k, v in doc.items() if k in fields})
    except TypeError as e:
        raise ModuleFormatError(f"{directory / MANIFEST}: {e}") from None
    if verify:
        verify_files(directory, manifest)
    return manifest


def listing(directory: Path) -> dict[str, Path]:
    """Every entry under ``directory`` but ``module.json``, by relative path; a clear error for
    links and anything that is not a regular file or a directory."""
    found = {}
    for root, dirs, names in os.walk(directory):
        for name in dirs + names:
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink():
                raise ModuleFormatError(f"{directory}: {rel} is a link; modules hold plain files only")
            if name in names and rel != MANIFEST:
                if not path.is_file():
                    raise ModuleFormatError(f"{directory}: {rel} is not a regular file")
                found[rel] = path
    return found


def verify_files(directory: Path, manifest: Manifest) -> None:
    """A :class:`ModuleFormatError` unless ``directory`` holds exactly ``manifest.files``, each
    matching its sha256."""
    from paddlejax.hub.archive import sha256_file

    present = listing(directory)
    extra = sorted(set(present) - set(manifest.files))
    if extra:
        raise ModuleFormatError(f"{manifest.label}: {', '.join(extra[:5])} {'is' if len(extra) == 1 else 'are'} "
                                f"not listed in module.json (added after the module was built?)")
    for path, digest in manifest.files.items():
        if path not in present:
            raise ModuleFormatError(f"{manifest.label}: {path}, listed in module.json, is missing")
        if sha256_file(present[path]) != digest:
            raise ModuleFormatError(f"{manifest.label}: {path} does not match its sha256 in module.json "
                                    f"(the file was changed or damaged)")
    for role, stem in manifest.programs.items():
        for suffix in (".json", ".safetensors"):
            if f"{stem}{suffix}" not in manifest.files:
                raise ModuleFormatError(f"{manifest.label}: program '{role}' lacks {stem}{suffix}")
    if manifest.code is not None and manifest.code not in manifest.files:
        raise ModuleFormatError(f"{manifest.label}: code file {manifest.code} is missing")


def write(directory, manifest: Manifest) -> Manifest:
    """Fill ``manifest.files`` with the sha256 of every file in ``directory`` and write its
    ``module.json`` there; returns the manifest."""
    from paddlejax.hub.archive import sha256_file

    directory = Path(directory)
    manifest.files = {rel: sha256_file(path) for rel, path in sorted(listing(directory).items())}
    verify_files(directory, manifest)
    (directory / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n")
    return manifest
