"""A registry: a static directory (``index.json`` + ``archives/``) that any file server hosts.

``index.json`` lists every module with its versions, and per version its archive's relative
path, size and sha256. :func:`publish` writes into a registry directory; :func:`open_index`
reads one from a path or an ``http(s)://`` / ``file://`` URL, :func:`download` fetches an
archive into the cache with a progress bar and checks its size and sha256 before anyone
extracts it. No server of ours is needed: ``python -m http.server`` in the directory will do.

>>> import tempfile, pathlib, paddlejax as pj
>>> from paddlejax.hub.writer import write_module
>>> module_dir, registry = pathlib.Path(tempfile.mkdtemp()) / "doubler", pathlib.Path(tempfile.mkdtemp())
>>> _ = write_module(module_dir, name="doubler", version="1.0", task="text-embedding",
...                  programs={"model": pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))})
>>> publish(module_dir, registry)["archive"]
'archives/doubler-1.0.tar.gz'
>>> resolve(str(registry), "doubler", ">=1")[0]
'1.0'
"""
from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.version import Version

from paddlejax.files import FileReadError, directory_lock, read_regular, write_together
from paddlejax.hub import archive, manifest
from paddlejax.hub.errors import ModuleNotFound, RegistryError
from paddlejax.hub.home import hub_home

FORMAT = "paddlejax.registry"
FORMAT_VERSION = 1
INDEX = "index.json"
MAX_INDEX_BYTES = 16 << 20
TIMEOUT_S = 30


def _empty() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "modules": {}}


def _check_index(doc, where: str) -> dict:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RegistryError(f"{where}: not a paddlejax registry index (no \"format\": \"{FORMAT}\")")
    if not isinstance(doc.get("format_version"), int) or doc["format_version"] > FORMAT_VERSION:
        raise RegistryError(f"{where}: registry format version {doc.get('format_version')!r} is not one this "
                            f"paddlejax reads ({FORMAT_VERSION})")
    modules = doc.get("modules")
    if not isinstance(modules, dict):
        raise RegistryError(f"{where}: \"modules\" must be an object")
    for name, entry in modules.items():
        manifest.check_name(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("versions"), dict):
            raise RegistryError(f"{where}: module {name} has no \"versions\" object")
        for version, release in entry["versions"].items():
            manifest.check_version(version)
            if (not isinstance(release, dict) or not isinstance(release.get("archive"), str)
                    or not isinstance(release.get("sha256"), str) or not isinstance(release.get("size"), int)):
                raise RegistryError(f"{where}: {name} {version} needs \"archive\", \"sha256\" and \"size\"")
            manifest.check_path(release["archive"], f"{where}: {name} {version}")
    return doc


def is_url(location: str) -> bool:
    """Whether ``location`` is an ``http(s)://`` or ``file://`` URL (else a path)."""
    return urllib.parse.urlsplit(str(location)).scheme in ("http", "https", "file")


def _join(location: str, relative: str) -> str:
    if is_url(location):
        return location.rstrip("/") + "/" + urllib.parse.quote(relative)
    return str(Path(location) / relative)


def _fetch(location: str, limit: int):
    """An open binary stream of a URL or path, and its declared length (or None)."""
    if is_url(location):
        try:
            response = urllib.request.urlopen(location, timeout=TIMEOUT_S)  # noqa: S310 (schemes checked above)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise RegistryError(f"cannot fetch {location}: {getattr(e, 'reason', e)}") from None
        length = response.headers.get("Content-Length")
        return response, int(length) if length and length.isdigit() else None
    path = Path(location)
    try:
        return open(path, "rb"), path.stat().st_size
    except OSError as e:
        raise RegistryError(f"cannot read {location}: {e.strerror}") from None


def open_index(location: str) -> dict:
    """The index of the registry at ``location`` (a directory path or a URL of one)."""
    where = _join(location, INDEX)
    if not is_url(location):
        try:
            raw = read_regular(where, MAX_INDEX_BYTES)
        except FileReadError as e:
            raise RegistryError(f"{location} is not a registry: {e}") from None
    else:
        stream, _ = _fetch(where, MAX_INDEX_BYTES)
        with stream:
            raw = stream.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            raise RegistryError(f"{where} is over {MAX_INDEX_BYTES >> 20} MiB; not a registry index")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise RegistryError(f"{where}: not valid JSON ({e})") from None
    return _check_index(doc, where)


def resolve(location: str, name: str, spec: str = "", index: dict | None = None) -> tuple[str, dict]:
    """The newest version of ``name`` in ``spec`` that the registry has, and its entry."""
    index = index if index is not None else open_index(location)
    entry = index["modules"].get(name)
    if entry is None:
        raise ModuleNotFound(f"registry {location} has no module {name}")
    versions = sorted((v for v in entry["versions"] if manifest.check_specifier(spec).contains(v, prereleases=True)),
                      key=Version)
    if not versions:
        raise ModuleNotFound(f"registry {location} has no version of {name} matching {spec}; it has "
                             f"{', '.join(sorted(entry['versions'], key=Version))}")
    return versions[-1], entry["versions"][versions[-1]]


def download(url: str, *, sha256: str | None = None, size: int | None = None, progress: bool = True,
             limit: int = archive.ArchiveLimits().max_total_bytes) -> Path:
    """The file at ``url`` in the download cache (``HUB_HOME/cache``): reused when a cached
    copy has the expected ``sha256``, else fetched with a progress bar into a temporary file,
    checked (``size``, ``sha256``, never over ``limit`` bytes) and renamed into place."""
    from tqdm.auto import tqdm

    cache = hub_home() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    name = Path(urllib.parse.urlsplit(url).path).name or "download"
    target = cache / (f"{sha256[:16]}-{name}" if sha256 else name)
    if sha256 and target.is_file() and archive.sha256_file(target) == sha256:
        return target
    stream, length = _fetch(url, limit)
    expected = size if size is not None else length
    if expected is not None and expected > limit:
        raise RegistryError(f"{url} is {expected:,} bytes, over the limit of {limit:,}")
    temp = cache / f".{name}.{os.getpid()}.part"
    received = 0
    try:
        with stream, open(temp, "wb") as out, tqdm(total=expected, unit="B", unit_scale=True, desc=name,
                                                   leave=False, disable=not progress) as bar:
            while chunk := stream.read(1 << 16):
                received += len(chunk)
                if received > limit or (size is not None and received > size):
                    raise RegistryError(f"{url} sends more than its declared {size or limit:,} bytes")
                out.write(chunk)
                bar.update(len(chunk))
        if size is not None and received != size:
            raise RegistryError(f"{url}: received {received:,} bytes of {size:,} (truncated download)")
        if sha256 and archive.sha256_file(temp) != sha256:
            raise RegistryError(f"{url}: sha256 mismatch (the archive was changed or damaged in transit)")
        os.replace(temp, target)
    except OSError as e:
        raise RegistryError(f"downloading {url} failed: {e}") from None
    finally:
        if temp.exists():
            temp.unlink()
    return target


def publish(module_dir, registry_dir, *, format: str = "tar.gz", force: bool = False) -> dict:
    """Add the module in ``module_dir`` (verified) to the registry directory ``registry_dir``
    (created if new): its archive under ``archives/`` and its entry in ``index.json``. A
    version already published with other contents is refused unless ``force`` (published
    versions are meant to be immutable). Returns the version's entry."""
    m = manifest.read(module_dir)
    registry_dir = Path(registry_dir)
    (registry_dir / "archives").mkdir(parents=True, exist_ok=True)
    relative = f"archives/{m.name}-{m.version}.{'zip' if format == 'zip' else 'tar.gz'}"
    # the archives folder's lock: write_together takes the registry folder's own
    with directory_lock(registry_dir / "archives"):
        index = open_index(str(registry_dir)) if (registry_dir / INDEX).exists() else _empty()
        entry = index["modules"].setdefault(m.name, {"versions": {}})
        old = entry["versions"].get(m.version)
        staging = registry_dir / "archives" / f".{m.name}-{m.version}.{os.getpid()}.tmp"
        staging.mkdir()
        try:
            path = staging / Path(relative).name
            digest = archive.create(module_dir, path, format=format)
            if old is not None and old["sha256"] != digest and not force:
                raise RegistryError(f"{m.label} is already published with other contents; publish a new version "
                                    f"(or force)")
            os.replace(path, registry_dir / relative)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        entry.update({"summary": m.summary, "task": m.task, "keywords": m.keywords, "license": m.license})
        entry["versions"][m.version] = {"archive": relative, "sha256": digest,
                                        "size": (registry_dir / relative).stat().st_size, "requires": m.requires}
        index["modules"] = dict(sorted(index["modules"].items()))
        write_together({registry_dir / INDEX: (json.dumps(index, indent=2) + "\n").encode()})
    return entry["versions"][m.version]


def archive_url(location: str, release: dict) -> str:
    """Where a version's archive is, for a registry at ``location``."""
    return _join(location, release["archive"])
