"""Safe creation and extraction of module archives (``.tar.gz``, ``.tar`` and ``.zip``).

A module travels as one archive of JSON and safetensors files. :func:`extract` treats every
archive as hostile: it checks the archive's digest, reads the whole archive and checks every
member (names, types, sizes, compression ratio) before it writes anything, writes only regular
files and directories inside ``dest``, and removes ``dest`` again if anything goes wrong.
:func:`create` writes deterministic archives: the same files give the same bytes, so a digest
published for a module can be checked by rebuilding it.

>>> import os, shutil, tempfile
>>> from paddlejax.hub.archive import create, extract
>>> tmp = tempfile.mkdtemp()
>>> src = os.path.join(tmp, "digits_cnn")
>>> os.makedirs(os.path.join(src, "weights"))
>>> for name, text in [("module.json", '{"name": "digits_cnn"}'), ("weights/conv1.safetensors", "...")]:
...     with open(os.path.join(src, name), "w") as f:
...         _ = f.write(text)
>>> digest = create(src, os.path.join(tmp, "digits_cnn.tar.gz"))
>>> extract(os.path.join(tmp, "digits_cnn.tar.gz"), os.path.join(tmp, "installed"), sha256=digest)
['module.json', 'weights/conv1.safetensors']
>>> create(src, os.path.join(tmp, "again.tar.gz")) == digest
True
>>> shutil.rmtree(tmp)
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import os
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import unicodedata
import zipfile
import zlib
from typing import BinaryIO

from paddlejax.hub.errors import ArchiveError

__all__ = ["ArchiveLimits", "create", "extract", "sha256_file"]

_KiB = 1 << 10
_MiB = 1 << 20
_GiB = 1 << 30
_CHUNK = 1 * _MiB
# tar writers pad the end of an archive to their record size (10 KiB by default, 1 MiB for
# the largest blocking factors in use); anything past that is not padding.
_MAX_TRAILING = 1 * _MiB
# No single read tarfile makes while listing (a header, a long name, a pax record set) is
# legitimately this large; a header claiming gigabytes of extended data must not be buffered.
_MAX_TAR_READ = 16 * _MiB
_MAX_LINK_TARGET = 4 * _KiB
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_ZIP_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_ZIP_DATA_DESCRIPTOR = 0x08
_ZIP_ENCRYPTED = 0x01
_DRIVE = re.compile(r"[A-Za-z]:")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_NOT_ALLOWED = "only regular files and directories are allowed in a module"
_LINKS = "links are not allowed in a module"


@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    """What :func:`extract` accepts; anything over a limit is refused before a byte is written.

    ``max_ratio`` bounds the members' declared size over the archive file's size (zip and tar
    bombs); it applies only once the declared total is over ``ratio_floor_bytes``, so small
    archives of text, which compress very well, are fine. ``max_name_length`` bounds each
    path component and ``max_path_length`` a whole path, both in UTF-8 bytes.

    >>> ArchiveLimits(max_members=10).max_member_bytes == 2 * 1024 ** 3
    True
    """

    max_members: int = 10_000
    max_member_bytes: int = 2 * _GiB
    max_total_bytes: int = 4 * _GiB
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 1 * _MiB
    max_name_length: int = 255
    max_path_length: int = 1024


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes as 64 lowercase hex digits, read in chunks.

    >>> import os, tempfile
    >>> fd, name = tempfile.mkstemp(); os.close(fd)
    >>> sha256_file(name)  # an empty file
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
    >>> os.remove(name)
    """
    with open(path, "rb") as f:
        return _sha256_stream(f)


def _sha256_stream(f: BinaryIO) -> str:
    digest = hashlib.sha256()
    f.seek(0)
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    f.seek(0)
    return digest.hexdigest()


def _quote(name: str) -> str:
    # Messages stay one readable line even for a hostile 10 000-character name.
    return repr(name) if len(name) <= 100 else repr(name[:80] + "...") + f" ({len(name)} characters)"


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --- checks on names, types and sizes --------------------------------------------------------


@dataclasses.dataclass
class _Member:
    raw: str  # the name as the archive spells it, for messages
    path: str  # normalized, relative, '/'-separated; '' for the archive's root directory
    is_dir: bool
    size: int
    handle: object  # the TarInfo or ZipInfo it came from


def _fold(path: str) -> str:
    # macOS stores names in a decomposed form and compares them without case; Windows ignores case.
    return unicodedata.normalize("NFC", path).casefold()


class _Checker:
    """Checks members one by one as they are listed, so a hostile archive is refused as early as
    possible (a tar.gz member declaring 100 GB is refused before tarfile skips over its data)."""

    def __init__(self, label: str, limits: ArchiveLimits, archive_bytes: int | None):
        self.label = label
        self.limits = limits
        self.archive_bytes = archive_bytes  # None: sizes are not checked (create)
        self.count = 0
        self.total = 0
        # Folded path -> (path, 'file' | 'dir', raw name of an explicit entry or None if implied).
        self.names: dict[str, tuple[str, str, str | None]] = {}

    def fail(self, raw: str, problem: str) -> ArchiveError:
        return ArchiveError(f"{self.label}: member {_quote(raw)} {problem}")

    def count_member(self, raw: str) -> None:
        self.count += 1
        if self.archive_bytes is not None and self.count > self.limits.max_members:
            raise ArchiveError(f"{self.label}: has more than {self.limits.max_members} members, "
                               f"over the limit (at member {_quote(raw)})")

    def normalize(self, raw: str) -> str:
        """The member's relative path with '.' components and repeated or trailing slashes removed."""
        if raw == "":
            raise self.fail(raw, "has an empty name")
        if any(unicodedata.category(c) == "Cc" for c in raw):
            raise self.fail(raw, "has a control character (NUL, newline ...) in its name")
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(raw, "has a name that is not valid UTF-8") from None
        if "\\" in raw:
            raise self.fail(raw, "has a backslash in its name (a Windows path separator)")
        if raw.startswith("/"):
            raise self.fail(raw, "is an absolute path")
        if _DRIVE.match(raw):
            raise self.fail(raw, "starts with a drive letter (an absolute Windows path)")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self.fail(raw, "leaves the module (a '..' component)")
        for part in parts:
            if len(part.encode("utf-8")) > self.limits.max_name_length:
                raise self.fail(raw, f"has a path component over {self.limits.max_name_length} bytes")
        path = "/".join(parts)
        if len(path.encode("utf-8")) > self.limits.max_path_length:
            raise self.fail(raw, f"has a path over {self.limits.max_path_length} bytes")
        return path

    def add(self, raw: str, path: str, is_dir: bool, size: int) -> None:
        """Records a member whose name and type are fine: refuses clashes and sizes over the limits."""
        if path == "":
            if is_dir:
                return  # the archive's root ('./'): that is dest itself
            raise self.fail(raw, "is a file with no name (only '.' and '/')")
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            seen = self.names.get(_fold(parent))
            if seen is None:
                self.names[_fold(parent)] = (parent, "dir", None)
            elif seen[1] == "file":
                raise self.fail(seen[0], f"is both a file and a directory (of {_quote(raw)})")
            elif seen[0] != parent:
                raise self._case(seen[0], parent)
        kind = "dir" if is_dir else "file"
        seen = self.names.get(_fold(path))
        if seen is not None:
            other, other_kind, other_raw = seen
            if other != path:
                raise self._case(other, path)
            if other_kind != kind:  # 'other' may also be a directory implied by earlier members
                raise self.fail(raw, "is both a file and a directory")
            if other_raw is not None:
                also = f" (also as {_quote(other_raw)})" if other_raw != raw else ""
                raise self.fail(raw, f"appears twice{also}")
        self.names[_fold(path)] = (path, kind, raw)
        if is_dir or self.archive_bytes is None:
            return
        limits = self.limits
        if size > limits.max_member_bytes:
            raise self.fail(raw, f"declares {_size(size)}, over the limit of "
                                 f"{_size(limits.max_member_bytes)} per member")
        self.total += size
        if self.total > limits.max_total_bytes:
            raise self.fail(raw, f"brings the members' declared size over the limit of "
                                 f"{_size(limits.max_total_bytes)} in all")
        if self.total > limits.ratio_floor_bytes and self.total > limits.max_ratio * self.archive_bytes:
            raise self.fail(raw, f"brings the members' declared size to {_size(self.total)} from "
                                 f"{_size(self.archive_bytes)} of archive, a compression ratio over "
                                 f"the limit of {limits.max_ratio:g} (a compression bomb?)")

    def _case(self, a: str, b: str) -> ArchiveError:
        return ArchiveError(f"{self.label}: members {_quote(a)} and {_quote(b)} differ only in case "
                            f"(they would collide on macOS and Windows)")


# --- readers: list and check everything, then hand out members' data --------------------------


class _Tap:
    """The tar stream as tarfile reads it, remembering the last block read (so that the listing
    can tell an end-of-archive marker from a damaged header, which tarfile takes as the end)."""

    def __init__(self, raw: BinaryIO, label: str):
        self.raw = raw
        self.label = label
        self.last: tuple[int, bytes] = (-1, b"")

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > _MAX_TAR_READ:
            raise ArchiveError(f"{self.label}: a tar header declares more than "
                               f"{_size(_MAX_TAR_READ)} of extended header data")
        pos = self.raw.tell()
        data = self.raw.read(n)
        self.last = (pos, data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.raw.seek(pos, whence)

    def tell(self) -> int:
        return self.raw.tell()


class _TarReader:
    def __init__(self, f: BinaryIO, compressed: bool, checker: _Checker):
        self.label = checker.label
        self.gz = gzip.GzipFile(fileobj=f, mode="rb") if compressed else None
        self.stream: BinaryIO = self.gz if self.gz is not None else f
        self.tap = _Tap(self.stream, self.label)
        self.members: list[_Member] = []
        last = None
        try:
            self.tar = tarfile.TarFile(fileobj=self.tap, mode="r", encoding="utf-8",
                                       errors="surrogateescape")
            # Lazily: each member is checked before tarfile moves past its data.
            for info in self.tar:
                self.members.append(self._member(info, checker))
                last = info.name
            self._check_end(last)
        except ArchiveError:
            raise
        except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError, struct.error) as e:
            after = f" after member {_quote(last)}" if last is not None else ""
            raise ArchiveError(f"{self.label}: the archive is damaged or truncated{after} ({e})") from None

    def _member(self, info: tarfile.TarInfo, checker: _Checker) -> _Member:
        raw = info.name
        checker.count_member(raw)
        path = checker.normalize(raw)
        if info.issym():
            raise checker.fail(raw, f"is a symbolic link to {_quote(info.linkname)}; {_LINKS}")
        if info.islnk():
            raise checker.fail(raw, f"is a hard link to {_quote(info.linkname)}; {_LINKS}")
        if info.ischr():
            raise checker.fail(raw, f"is a character device; {_NOT_ALLOWED}")
        if info.isblk():
            raise checker.fail(raw, f"is a block device; {_NOT_ALLOWED}")
        if info.isfifo():
            raise checker.fail(raw, f"is a FIFO; {_NOT_ALLOWED}")
        if info.type == tarfile.GNUTYPE_SPARSE or info.sparse is not None:
            raise checker.fail(raw, f"is a sparse file; {_NOT_ALLOWED}")
        if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            is_dir = False
        elif info.type == tarfile.DIRTYPE:
            is_dir = True
        else:
            raise checker.fail(raw, f"has the unsupported tar type {info.type!r}; {_NOT_ALLOWED}")
        checker.add(raw, path, is_dir, info.size)
        return _Member(raw, path, is_dir, 0 if is_dir else info.size, info)

    def _check_end(self, last: str | None) -> None:
        # tarfile ends its listing quietly at a damaged header or at the end of the data; only
        # a zero block where the next header belongs is a real end-of-archive marker.
        pos, block = self.tap.last
        if pos != self.tar.offset or block != tarfile.NUL * tarfile.BLOCKSIZE:
            after = f"after member {_quote(last)}" if last is not None else "at its start"
            raise ArchiveError(f"{self.label}: the archive is damaged or truncated {after} "
                               f"(no valid header and no end-of-archive marker)")
        # Reading to the end checks the gzip trailer (CRC and length) and finds truncation.
        trailing = 0
        while chunk := self.stream.read(64 * _KiB):
            trailing += len(chunk)
            if trailing > _MAX_TRAILING:
                raise ArchiveError(f"{self.label}: holds more than {_size(_MAX_TRAILING)} after "
                                   f"its end-of-archive marker")

    def open(self, member: _Member) -> BinaryIO:
        # Members are written in archive order, so a gzip stream is read forward once more.
        return self.tar.extractfile(member.handle)

    def close(self) -> None:
        if self.gz is not None:
            self.gz.close()


class _ZipReader:
    def __init__(self, f: BinaryIO, checker: _Checker):
        self.label = checker.label
        self.f = f
        try:
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
                NotImplementedError, struct.error) as e:
            raise ArchiveError(f"{self.label}: the archive is damaged or truncated ({e})") from None
        self.members = [self._member(info, checker) for info in infos]
        self._check_layout(infos)

    def _member(self, info: zipfile.ZipInfo, checker: _Checker) -> _Member:
        raw = info.orig_filename  # zipfile cuts 'filename' at a NUL; the original shows it
        checker.count_member(raw)
        path = checker.normalize(raw)
        kind = stat.S_IFMT(info.external_attr >> 16)
        is_dir = info.is_dir()
        if kind == stat.S_IFLNK:
            raise checker.fail(raw, f"is a symbolic link to {_quote(self._link_target(info))}; {_LINKS}")
        for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                           (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
            if test(kind):
                raise checker.fail(raw, f"is {what}; {_NOT_ALLOWED}")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise checker.fail(raw, f"has the unsupported file type {kind:#o}; {_NOT_ALLOWED}")
        if kind == stat.S_IFDIR and not is_dir:
            raise checker.fail(raw, "is marked as a directory but its name does not end in '/'")
        if info.flag_bits & _ZIP_ENCRYPTED:
            raise checker.fail(raw, "is encrypted")
        checker.add(raw, path, is_dir, info.file_size)
        return _Member(raw, path, is_dir, 0 if is_dir else info.file_size, info)

    def _link_target(self, info: zipfile.ZipInfo) -> str:
        try:
            with self.zip.open(info) as fh:
                return fh.read(_MAX_LINK_TARGET).decode("utf-8", "replace")
        except Exception:  # the member is refused either way; its target only helps the message
            return "?"

    def _check_layout(self, infos: list[zipfile.ZipInfo]) -> None:
        # zipfile trusts the central directory; the local headers must agree with it and the
        # members' data must not overlap (overlapping members are the classic zip bomb).
        spans = []
        for info in infos:
            self.f.seek(info.header_offset)
            head = self.f.read(_ZIP_LOCAL.size)
            if len(head) < _ZIP_LOCAL.size or head[:4] != b"PK\x03\x04":
                raise ArchiveError(f"{self.label}: member {_quote(info.orig_filename)} has no local header "
                                   f"where the central directory says (the archive is damaged)")
            _, _, flags, _, _, _, crc, csize, usize, nlen, elen = _ZIP_LOCAL.unpack(head)
            end = info.header_offset + _ZIP_LOCAL.size + nlen + elen + info.compress_size
            if end > self.zip.start_dir:
                raise ArchiveError(f"{self.label}: member {_quote(info.orig_filename)} runs past the start "
                                   f"of the central directory (the archive is damaged)")
            if not flags & _ZIP_DATA_DESCRIPTOR and 0xFFFFFFFF not in (csize, usize) and \
                    (crc, csize, usize) != (info.CRC, info.compress_size, info.file_size):
                raise ArchiveError(f"{self.label}: member {_quote(info.orig_filename)}: its local header and "
                                   f"the central directory disagree about its size or CRC")
            spans.append((info.header_offset, end, info.orig_filename))
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                raise ArchiveError(f"{self.label}: members {_quote(a)} and {_quote(b)} overlap in the archive "
                                   f"(a zip bomb?)")
        self.f.seek(0)

    def open(self, member: _Member) -> BinaryIO:
        return self.zip.open(member.handle)  # checks the CRC once the data is read to its end

    def close(self) -> None:
        self.zip.close()


def _reader(f: BinaryIO, checker: _Checker) -> _TarReader | _ZipReader:
    f.seek(0)
    head = f.read(tarfile.BLOCKSIZE)
    f.seek(0)
    if head[:2] == b"\x1f\x8b":
        return _TarReader(f, True, checker)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _ZipReader(f, checker)
    if len(head) == tarfile.BLOCKSIZE and (head[257:262] == b"ustar" or head == tarfile.NUL * len(head)):
        return _TarReader(f, False, checker)
    raise ArchiveError(f"{checker.label}: not a .tar.gz, .tar or .zip archive (unrecognised content)")


# --- extract ----------------------------------------------------------------------------------


def extract(archive: str | os.PathLike, dest: str | os.PathLike, *, sha256: str | None = None,
            limits: ArchiveLimits = ArchiveLimits(), progress: bool = False) -> list[str]:
    """Extracts a ``.tar.gz``/``.tgz``/``.tar`` or ``.zip`` archive into ``dest`` (created here; it
    must not exist) and returns the sorted relative paths of the files written.

    The format is told by the archive's content, not its name. Before anything is written, the
    archive's SHA-256 is checked against ``sha256`` (when given) and the whole archive is read:
    every member must have a relative name inside the module, be a regular file or a directory
    (no links, devices or FIFOs), keep within ``limits``, and not clash with another member
    (also not by case alone). Data is then copied in chunks, never trusting declared sizes; file
    modes from the archive are not applied. Any problem raises :class:`ArchiveError` naming the
    archive and the member, and leaves nothing behind: ``dest`` is removed again.
    An archive with no files in it is refused (a module has at least its description).

    >>> import io, os, tarfile, tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> with tarfile.open(os.path.join(tmp, "hostile.tar.gz"), "w:gz") as tar:
    ...     tar.addfile(tarfile.TarInfo("../evil.txt"), io.BytesIO())
    >>> extract(os.path.join(tmp, "hostile.tar.gz"), os.path.join(tmp, "module"))
    Traceback (most recent call last):
    paddlejax.hub.errors.ArchiveError: hostile.tar.gz: member '../evil.txt' leaves the module (a '..' component)
    >>> sorted(os.listdir(tmp))
    ['hostile.tar.gz']
    >>> import shutil; shutil.rmtree(tmp)
    """
    archive, dest = os.fspath(archive), os.fspath(dest)
    label = os.path.basename(archive) or archive
    if os.path.lexists(dest):
        raise ArchiveError(f"{label}: the destination {dest!r} already exists; "
                           f"extract into a new directory")
    try:
        # One open file for every step, so the bytes checked are the bytes extracted.
        f = open(archive, "rb")
    except OSError as e:
        raise ArchiveError(f"{label}: cannot open the archive ({e.strerror or e})") from None
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ArchiveError(f"{label}: not a regular file")
        archive_bytes = st.st_size
        if sha256 is not None:
            _check_sha256(f, sha256, label)
        checker = _Checker(label, limits, archive_bytes)
        reader = _reader(f, checker)
        try:
            files = [m for m in reader.members if not m.is_dir and m.path]
            if not files:
                raise ArchiveError(f"{label}: the archive contains no files")
            _write(reader, dest, files, label, progress)
        finally:
            reader.close()
    return sorted(m.path for m in files)


def _check_sha256(f: BinaryIO, expected: str, label: str) -> None:
    want = expected.strip().lower()
    if not _HEX64.fullmatch(want):
        raise ArchiveError(f"{label}: the expected sha256 {expected!r} is not 64 hex digits")
    got = _sha256_stream(f)
    if got != want:
        raise ArchiveError(f"{label}: sha256 mismatch: expected {want}, the archive has {got} "
                           f"(a damaged or tampered download?)")


def _write(reader: _TarReader | _ZipReader, dest: str, files: list[_Member], label: str,
           progress: bool) -> None:
    dirs = {m.path for m in reader.members if m.is_dir and m.path}
    for m in files:
        parts = m.path.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    try:
        os.mkdir(dest, 0o755)
    except OSError as e:
        raise ArchiveError(f"{label}: cannot create the destination {dest!r} ({e.strerror or e})") from None
    member = None
    bar = None
    try:
        for d in sorted(dirs):  # a parent sorts before its children
            os.mkdir(os.path.join(dest, *d.split("/")), 0o755)
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=sum(m.size for m in files), unit="B", unit_scale=True, unit_divisor=1024,
                       desc=label)
        for member in files:  # in archive order: a gzip stream is read forward only
            target = os.path.join(dest, *member.path.split("/"))
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY, 0o644)
            with os.fdopen(fd, "wb") as out, reader.open(member) as src:
                _copy(src, out, member, label, bar)
    except BaseException as e:
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(e, ArchiveError) or not isinstance(e, Exception):
            raise
        what = f"member {_quote(member.raw)}" if member is not None else "a directory"
        raise ArchiveError(f"{label}: {what} could not be extracted ({e})") from None
    finally:
        if bar is not None:
            bar.close()


def _copy(src: BinaryIO, out: BinaryIO, member: _Member, label: str, bar) -> None:
    written = 0
    while chunk := src.read(_CHUNK):
        written += len(chunk)
        if written > member.size:
            raise ArchiveError(f"{label}: member {_quote(member.raw)} holds more than the "
                               f"{member.size} bytes it declares")
        out.write(chunk)
        if bar is not None:
            bar.update(len(chunk))
    if written != member.size:
        raise ArchiveError(f"{label}: member {_quote(member.raw)} holds {written} bytes but declares "
                           f"{member.size} (the archive is damaged or truncated)")


# --- create -----------------------------------------------------------------------------------


def create(src_dir: str | os.PathLike, out_path: str | os.PathLike, *, format: str = "tar.gz") -> str:
    """Writes the files under ``src_dir`` to a deterministic ``"tar.gz"`` or ``"zip"`` archive at
    ``out_path`` and returns its SHA-256 (hex).

    Names are sorted and relative; times are fixed (0, or 1980-01-01 in a zip, the earliest it
    can hold), owners are 0 with no user names, modes are 0o644 for files and 0o755 for
    directories, and the gzip header holds no name or time: the same files always give the same
    bytes. Symbolic links, special files and names :func:`extract` would refuse raise
    :class:`ArchiveError`. The archive is written to a temporary file next to ``out_path`` and
    moved into place, so ``out_path`` is never half-written. See the module's example.
    """
    src_dir, out_path = os.fspath(src_dir), os.fspath(out_path)
    label = os.path.basename(out_path) or out_path
    if format not in ("tar.gz", "zip"):
        raise ArchiveError(f"{label}: unknown archive format {format!r}; use 'tar.gz' or 'zip'")
    if not os.path.isdir(src_dir):
        raise ArchiveError(f"{label}: the source {src_dir!r} is not a directory")
    src_real, out_real = os.path.realpath(src_dir), os.path.realpath(out_path)
    if out_real == src_real or out_real.startswith(src_real.rstrip(os.sep) + os.sep):
        raise ArchiveError(f"{label}: the archive would be written inside its source {src_dir!r}")
    entries = _scan(src_dir, label)
    checker = _Checker(label, ArchiveLimits(), None)
    for rel, is_dir in entries:
        checker.add(rel, checker.normalize(rel), is_dir, 0)
    if not any(not is_dir for _, is_dir in entries):
        raise ArchiveError(f"{label}: the source {src_dir!r} holds no files")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out_real), prefix=f".{os.path.basename(out_real)}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            (_write_zip if format == "zip" else _write_tar_gz)(raw, src_dir, entries, label)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        digest = sha256_file(tmp)
        os.replace(tmp, out_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return digest


def _scan(root: str, label: str) -> list[tuple[str, bool]]:
    """(relative path, is a directory) for everything under root, parents first, sorted by name."""
    found: list[tuple[str, bool]] = []

    def walk(folder: str, rel: str) -> None:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"{label}: {_quote(path)} in {root!r} is a symbolic link; {_LINKS}")
            if stat.S_ISDIR(mode):
                found.append((path, True))
                walk(entry.path, path)
            elif stat.S_ISREG(mode):
                found.append((path, False))
            else:
                raise ArchiveError(f"{label}: {_quote(path)} in {root!r} is a special file; {_NOT_ALLOWED}")

    walk(root, "")
    return found


@contextlib.contextmanager
def _open_source(root: str, rel: str, label: str):
    # O_NOFOLLOW: a file swapped for a link after the scan is refused, not followed.
    path = os.path.join(root, *rel.split("/"))
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_BINARY)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ArchiveError(f"{label}: {_quote(rel)} in {root!r} is not a regular file; {_NOT_ALLOWED}")
        yield fh, st.st_size


def _write_tar_gz(raw: BinaryIO, root: str, entries: list[tuple[str, bool]], label: str) -> None:
    # filename='' and mtime=0 keep the gzip header free of anything that varies between runs.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.TarFile(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for rel, is_dir in entries:
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if is_dir:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            with _open_source(root, rel, label) as (fh, size):
                info.type, info.mode, info.size = tarfile.REGTYPE, 0o644, size
                tar.addfile(info, fh)


def _write_zip(raw: BinaryIO, root: str, entries: list[tuple[str, bool]], label: str) -> None:
    with zipfile.ZipFile(raw, "w", allowZip64=True) as zf:
        for rel, is_dir in entries:
            info = zipfile.ZipInfo(rel + "/" if is_dir else rel, date_time=_ZIP_EPOCH)
            info.create_system = 3  # Unix, so the modes below are read back (and alike on every OS)
            if is_dir:
                info.external_attr = ((stat.S_IFDIR | 0o755) << 16) | 0x10  # 0x10: MS-DOS directory
                info.compress_type = zipfile.ZIP_STORED
                zf.writestr(info, b"")
                continue
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with _open_source(root, rel, label) as (fh, size):
                info.file_size = size  # lets zipfile choose zip64 up front for large files
                with zf.open(info, "w") as out:
                    shutil.copyfileobj(fh, out, _CHUNK)
