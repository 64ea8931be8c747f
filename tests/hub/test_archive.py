"""Module archives: create writes deterministic archives; extract refuses every hostile or damaged
archive before it writes a byte, and never leaves anything behind."""
import gzip
import io
import os
import stat
import struct
import tarfile
import zipfile

import pytest

from paddlejax.hub.archive import ArchiveLimits, create, extract, sha256_file
from paddlejax.hub.errors import ArchiveError

MODULE_JSON = b'{"name": "digits_cnn", "version": "1.0.0"}'


# --- building archives by hand ----------------------------------------------------------------


def member(name, data=b"", type=tarfile.REGTYPE, linkname="", mode=0o644):
    """A tar member: its header, and its data for regular files."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type, linkname, mode
    if type in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(data)
    return info, data


def write_tar(path, members, gz=True, format=tarfile.PAX_FORMAT):
    """A tar (gzipped unless gz=False) of members: (name, data) pairs or :func:`member` results."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=format) as tar:
        for m in members:
            info, data = m if isinstance(m[0], tarfile.TarInfo) else member(*m)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buf.getvalue()
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path


def write_zip(path, members, compression=zipfile.ZIP_DEFLATED):
    """A zip of (name or ZipInfo, data) pairs."""
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return path


def zip_special(name, file_type, data=b""):
    """A zip member whose Unix mode says it is a link, a device, a FIFO ..."""
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (file_type | 0o777) << 16
    return info, data


# Offsets in a zip's records: flags at 8 (central) and 6 (local), CRC and then the compressed and
# uncompressed sizes from 16 (central) and 14 (local).
EOCD = struct.Struct("<4s4H2LH")  # the end of central directory record


def patch_zip(path, patch_central=None, patch_local=None, extra_central=None):
    """Rewrites a zip's single member's records in place: the tests' way to build lying zips."""
    data = bytearray(path.read_bytes())
    eocd = EOCD.unpack_from(data, len(data) - EOCD.size)
    cd_offset, cd_size = eocd[6], eocd[5]
    record = bytearray(data[cd_offset:cd_offset + cd_size])
    if patch_central:
        patch_central(record)
    if patch_local:
        patch_local(data)
    records = bytes(record) + (extra_central(bytes(record)) if extra_central else b"")
    count = 2 if extra_central else eocd[4]
    tail = EOCD.pack(b"PK\x05\x06", 0, 0, count, count, len(records), cd_offset, 0)
    path.write_bytes(bytes(data[:cd_offset]) + records + tail)
    return path


def set_sizes(buf, offset_of_sizes, size):
    """Writes compressed and uncompressed size (two little-endian uint32 after the CRC)."""
    struct.pack_into("<LL", buf, offset_of_sizes, size, size)


# --- the hostile archives ---------------------------------------------------------------------


def tar_traversal(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("module.json", MODULE_JSON), ("../../evil.txt", b"pwned")])


def tar_traversal_inside_path(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("weights/../../../evil.txt", b"pwned")])


def zip_traversal(tmp):
    return write_zip(tmp / "hostile.zip", [("module.json", MODULE_JSON), ("../../evil.txt", b"pwned")])


def tar_absolute(tmp):
    return write_tar(tmp / "hostile.tar.gz", [(str(tmp / "evil.txt"), b"pwned")])


def zip_absolute(tmp):
    return write_zip(tmp / "hostile.zip", [(str(tmp / "evil.txt"), b"pwned")])


def tar_drive_letter(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("C:/evil.txt", b"pwned")])


def tar_symlink_outside(tmp):
    # The classic: a link to a directory outside, then a file written "into" the link.
    return write_tar(tmp / "hostile.tar.gz", [member("weights", type=tarfile.SYMTYPE, linkname="../.."),
                                              ("weights/evil.txt", b"pwned")])


def tar_symlink_inside(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("module.json", MODULE_JSON),
                                              member("alias.json", type=tarfile.SYMTYPE,
                                                     linkname="module.json")])


def zip_symlink(tmp):
    return write_zip(tmp / "hostile.zip", [zip_special("weights", stat.S_IFLNK, b"../../etc")])


def tar_hard_link(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("module.json", MODULE_JSON),
                                              member("copy.json", type=tarfile.LNKTYPE, linkname="module.json")])


def tar_hard_link_outside(tmp):
    return write_tar(tmp / "hostile.tar.gz", [member("passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")])


def tar_char_device(tmp):
    info, _ = member("null", type=tarfile.CHRTYPE)
    info.devmajor, info.devminor = 1, 3
    return write_tar(tmp / "hostile.tar.gz", [(info, b"")])


def tar_block_device(tmp):
    info, _ = member("sda", type=tarfile.BLKTYPE)
    info.devmajor, info.devminor = 8, 0
    return write_tar(tmp / "hostile.tar.gz", [(info, b"")])


def tar_fifo(tmp):
    return write_tar(tmp / "hostile.tar.gz", [member("pipe", type=tarfile.FIFOTYPE)])


def tar_unknown_type(tmp):
    return write_tar(tmp / "hostile.tar.gz", [member("odd", type=b"Z")])


def zip_char_device(tmp):
    return write_zip(tmp / "hostile.zip", [zip_special("null", stat.S_IFCHR)])


def zip_fifo(tmp):
    return write_zip(tmp / "hostile.zip", [zip_special("pipe", stat.S_IFIFO)])


def tar_duplicate(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("module.json", MODULE_JSON), ("module.json", b"{}")])


def zip_duplicate(tmp):
    with pytest.warns(UserWarning, match="Duplicate name"):
        return write_zip(tmp / "hostile.zip", [("module.json", MODULE_JSON), ("module.json", b"{}")])


def tar_duplicate_after_normalization(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("weights/a.json", b"{}"), ("weights/./a.json", b"{}")])


def zip_duplicate_after_normalization(tmp):
    return write_zip(tmp / "hostile.zip", [("weights/a.json", b"{}"), ("weights//a.json", b"{}")])


def tar_case_duplicate(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("Module.json", b"{}"), ("module.json", MODULE_JSON)])


def zip_case_duplicate_directory(tmp):
    return write_zip(tmp / "hostile.zip", [("Weights/a.json", b"{}"), ("weights/b.json", b"{}")])


def tar_file_then_directory(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("weights", b"x"), ("weights/a.json", b"{}")])


def tar_directory_then_file(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("weights/a.json", b"{}"), ("weights", b"x")])


def zip_file_then_directory_entry(tmp):
    return write_zip(tmp / "hostile.zip", [("weights", b"x"), ("weights/", b"")])


def tar_big_member(tmp):
    return write_tar(tmp / "big.tar.gz", [("module.json", MODULE_JSON), ("w.bin", b"x" * 101)])


def zip_big_total(tmp):
    return write_zip(tmp / "big.zip", [("a.bin", b"a" * 100), ("b.bin", b"b" * 100)])


def tar_many_members(tmp):
    return write_tar(tmp / "many.tar.gz", [(f"{i}.json", b"{}") for i in range(4)])


def zip_bomb(tmp):
    return write_zip(tmp / "bomb.zip", [("module.json", MODULE_JSON), ("zeros.bin", bytes(4 << 20))])


def tar_gz_bomb(tmp):
    return write_tar(tmp / "bomb.tar.gz", [("module.json", MODULE_JSON), ("zeros.bin", bytes(4 << 20))])


def good_tar_gz(tmp, name="module.tar.gz"):
    return write_tar(tmp / name, [("module.json", MODULE_JSON), ("weights/w.bin", os.urandom(20_000))])


def truncated_tar_gz(tmp):
    path = good_tar_gz(tmp, "truncated.tar.gz")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def truncated_tar_gz_trailer(tmp):
    # Cut only the gzip trailer (CRC and length): all members still list.
    path = good_tar_gz(tmp, "truncated.tar.gz")
    path.write_bytes(path.read_bytes()[:-4])
    return path


def truncated_tar_at_member_boundary(tmp):
    # tarfile alone takes the end of the data after a member's data for the end of the archive.
    path = write_tar(tmp / "truncated.tar", [("module.json", MODULE_JSON), ("w.bin", b"w" * 600)], gz=False)
    path.write_bytes(path.read_bytes()[: 512 + 512])
    return path


def truncated_zip(tmp):
    path = write_zip(tmp / "truncated.zip", [("module.json", MODULE_JSON), ("w.bin", os.urandom(20_000))])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def corrupt_zip_crc(tmp):
    # One flipped byte in the second member's stored data: only the CRC can tell.
    path = write_zip(tmp / "corrupt.zip", [("module.json", MODULE_JSON), ("w.bin", b"w" * 1000)],
                     compression=zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("w.bin")
    data[info.header_offset + 30 + len("w.bin") + 500] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def corrupt_zip_deflate(tmp):
    path = write_zip(tmp / "corrupt.zip", [("module.json", MODULE_JSON), ("w.bin", b"weights " * 1000)])
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("w.bin")
    start = info.header_offset + 30 + len("w.bin")
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def tar_header_smaller_than_data(tmp):
    # The header says 10 bytes; 1000 follow, so the next "header" is data and fails its checksum.
    info, _ = member("module.json")
    info.size = 10
    raw = info.tobuf(tarfile.PAX_FORMAT) + (b"x" * 1000).ljust(1024, b"\0") + tarfile.NUL * 1024
    path = tmp / "lying.tar.gz"
    path.write_bytes(gzip.compress(raw))
    return path


def tar_header_larger_than_data(tmp):
    info, _ = member("w.bin")
    info.size = 100_000
    raw = info.tobuf(tarfile.PAX_FORMAT) + b"w" * 1024
    path = tmp / "lying.tar"
    path.write_bytes(raw)
    return path


def zip_size_smaller_than_data(tmp):
    # Both the central directory and the local header claim 100 bytes of 1000 stored bytes.
    path = write_zip(tmp / "lying.zip", [("w.bin", b"w" * 1000)], compression=zipfile.ZIP_STORED)
    return patch_zip(path, patch_central=lambda rec: set_sizes(rec, 20, 100),
                     patch_local=lambda data: set_sizes(data, 18, 100))


def zip_central_disagrees_with_local(tmp):
    path = write_zip(tmp / "lying.zip", [("w.bin", b"w" * 1000)], compression=zipfile.ZIP_STORED)
    return patch_zip(path, patch_central=lambda rec: struct.pack_into("<L", rec, 24, 10))


def zip_overlapping_members(tmp):
    # Two central directory records pointing at the same data: the overlapping-files bomb.
    path = write_zip(tmp / "overlap.zip", [("a.bin", bytes(1000))])
    return patch_zip(path, extra_central=lambda rec: rec.replace(b"a.bin", b"b.bin"))


def zip_encrypted(tmp):
    path = write_zip(tmp / "encrypted.zip", [("module.json", MODULE_JSON)])
    return patch_zip(path, patch_central=lambda rec: struct.pack_into("<H", rec, 8, 0x1))


def not_an_archive(tmp):
    path = tmp / "module.tar.gz"
    path.write_text("<html>404 Not Found</html>\n" * 40)
    return path


def gzip_not_tar(tmp):
    path = tmp / "module.tar.gz"
    path.write_bytes(gzip.compress(MODULE_JSON * 100))
    return path


def tar_backslash(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("..\\evil.txt", b"pwned")])


def zip_backslash(tmp):
    return write_zip(tmp / "hostile.zip", [("weights\\a.json", b"{}")])


def tar_nul_in_name(tmp):
    # A ustar name field ends at a NUL; a pax 'path' record carries one through.
    info, data = member("module.json", b"{}")
    info.pax_headers = {"path": "module.json\0.txt"}
    return write_tar(tmp / "hostile.tar.gz", [(info, data)])


def zip_nul_in_name(tmp):
    path = write_zip(tmp / "hostile.zip", [("module.json_.txt", b"{}")])
    path.write_bytes(path.read_bytes().replace(b"module.json_.txt", b"module.json\0.txt"))
    return path


def zip_newline_in_name(tmp):
    return write_zip(tmp / "hostile.zip", [("module\n.json", b"{}")])


def tar_empty_name(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("", b"{}")])


def zip_empty_name(tmp):
    return write_zip(tmp / "hostile.zip", [(zipfile.ZipInfo(""), b"{}")])


def tar_long_name(tmp):
    return write_tar(tmp / "hostile.tar.gz", [("a" * 256, b"{}")])


def tar_empty(tmp):
    return write_tar(tmp / "empty.tar.gz", [])


def zip_only_directories(tmp):
    return write_zip(tmp / "empty.zip", [("weights/", b"")])


HOSTILE = [
    # (builder, expected fragment of the message, limits)
    (tar_traversal, "member '../../evil.txt' leaves the module (a '..' component)", None),
    (tar_traversal_inside_path, "leaves the module (a '..' component)", None),
    (zip_traversal, "member '../../evil.txt' leaves the module (a '..' component)", None),
    (tar_absolute, "is an absolute path", None),
    (zip_absolute, "is an absolute path", None),
    (tar_drive_letter, "member 'C:/evil.txt' starts with a drive letter", None),
    (tar_symlink_outside, "member 'weights' is a symbolic link to '../..'; links are not allowed", None),
    (tar_symlink_inside, "member 'alias.json' is a symbolic link to 'module.json'; links are not allowed",
     None),
    (zip_symlink, "member 'weights' is a symbolic link to '../../etc'; links are not allowed", None),
    (tar_hard_link, "member 'copy.json' is a hard link to 'module.json'; links are not allowed", None),
    (tar_hard_link_outside, "member 'passwd' is a hard link to '/etc/passwd'; links are not allowed", None),
    (tar_char_device, "member 'null' is a character device; only regular files and directories", None),
    (tar_block_device, "member 'sda' is a block device", None),
    (tar_fifo, "member 'pipe' is a FIFO", None),
    (tar_unknown_type, "member 'odd' has the unsupported tar type b'Z'", None),
    (zip_char_device, "member 'null' is a character device", None),
    (zip_fifo, "member 'pipe' is a FIFO", None),
    (tar_duplicate, "member 'module.json' appears twice", None),
    (zip_duplicate, "member 'module.json' appears twice", None),
    (tar_duplicate_after_normalization, "member 'weights/./a.json' appears twice (also as 'weights/a.json')",
     None),
    (zip_duplicate_after_normalization, "member 'weights//a.json' appears twice", None),
    (tar_case_duplicate, "members 'Module.json' and 'module.json' differ only in case", None),
    (zip_case_duplicate_directory, "members 'Weights' and 'weights' differ only in case", None),
    (tar_file_then_directory, "member 'weights' is both a file and a directory", None),
    (tar_directory_then_file, "member 'weights' is both a file and a directory", None),
    (zip_file_then_directory_entry, "member 'weights/' is both a file and a directory", None),
    (tar_big_member, "member 'w.bin' declares 101 bytes, over the limit of 100 bytes per member",
     ArchiveLimits(max_member_bytes=100)),
    (zip_big_total, "member 'b.bin' brings the members' declared size over the limit of 150 bytes in all",
     ArchiveLimits(max_total_bytes=150)),
    (tar_many_members, "has more than 3 members, over the limit (at member '3.json')", ArchiveLimits(max_members=3)),
    (zip_bomb, "member 'zeros.bin' brings the members' declared size to 4.0 MiB", None),
    (tar_gz_bomb, "a compression ratio over the limit of 100 (a compression bomb?)", None),
    (truncated_tar_gz, "truncated.tar.gz: the archive is damaged or truncated", None),
    (truncated_tar_gz_trailer, "the archive is damaged or truncated", None),
    (truncated_tar_at_member_boundary, "damaged or truncated after member 'module.json'", None),
    (truncated_zip, "truncated.zip: the archive is damaged or truncated", None),
    (corrupt_zip_crc, "member 'w.bin' could not be extracted (Bad CRC-32", None),
    (corrupt_zip_deflate, "member 'w.bin' could not be extracted", None),
    (tar_header_smaller_than_data, "damaged or truncated after member 'module.json'", None),
    (tar_header_larger_than_data, "damaged or truncated", None),
    (zip_size_smaller_than_data, "member 'w.bin' could not be extracted (Bad CRC-32", None),
    (zip_central_disagrees_with_local, "its local header and the central directory disagree", None),
    (zip_overlapping_members, "members 'a.bin' and 'b.bin' overlap in the archive", None),
    (zip_encrypted, "member 'module.json' is encrypted", None),
    (not_an_archive, "module.tar.gz: not a .tar.gz, .tar or .zip archive", None),
    (gzip_not_tar, "module.tar.gz: the archive is damaged or truncated", None),
    (tar_backslash, "has a backslash in its name", None),
    (zip_backslash, "member 'weights\\\\a.json' has a backslash in its name", None),
    (tar_nul_in_name, "member 'module.json\\x00.txt' has a control character", None),
    (zip_nul_in_name, "member 'module.json\\x00.txt' has a control character", None),
    (zip_newline_in_name, "member 'module\\n.json' has a control character", None),
    (tar_empty_name, "member '' has an empty name", None),
    (zip_empty_name, "member '' has an empty name", None),
    (tar_long_name, "...' (256 characters) has a path component over 255 bytes", None),
    (tar_empty, "empty.tar.gz: the archive contains no files", None),
    (zip_only_directories, "empty.zip: the archive contains no files", None),
]


def tree(root):
    """Everything under root: relative path -> file contents (None for directories)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = open(path, "rb").read()
    return found


@pytest.mark.parametrize("build, fragment, limits", HOSTILE, ids=[case[0].__name__ for case in HOSTILE])
def test_hostile_or_damaged_archives_are_refused_and_nothing_is_written(tmp_path, build, fragment, limits):
    archive = build(tmp_path)
    parent = tmp_path / "install"  # dest's parent, holding something of its own
    parent.mkdir()
    (parent / "keep.txt").write_text("untouched")
    dest = parent / "module"
    before = tree(tmp_path)

    with pytest.raises(ArchiveError) as refused:
        extract(archive, dest, limits=limits or ArchiveLimits())

    message = str(refused.value)
    assert fragment in message
    assert message.startswith(f"{archive.name}: ") and "\n" not in message
    assert not dest.exists()
    assert tree(tmp_path) == before  # nothing in dest's parent, next to the archive, or above
    assert not (tmp_path / "evil.txt").exists() and not (parent / "evil.txt").exists()


def test_sha256_is_checked_before_anything_is_read(tmp_path):
    archive = good_tar_gz(tmp_path)
    with pytest.raises(ArchiveError, match=r"module.tar.gz: sha256 mismatch: expected 0{64}, the archive has"):
        extract(archive, tmp_path / "module", sha256="0" * 64)
    with pytest.raises(ArchiveError, match="is not 64 hex digits"):
        extract(archive, tmp_path / "module", sha256="abc")
    assert sorted(os.listdir(tmp_path)) == ["module.tar.gz"]


def test_the_right_sha256_passes_in_any_case(tmp_path):
    archive = good_tar_gz(tmp_path)
    digest = sha256_file(archive)
    assert extract(archive, tmp_path / "a", sha256=digest) == ["module.json", "weights/w.bin"]
    assert extract(archive, tmp_path / "b", sha256=digest.upper()) == ["module.json", "weights/w.bin"]


def test_an_existing_destination_is_refused_and_left_alone(tmp_path):
    archive = good_tar_gz(tmp_path)
    dest = tmp_path / "module"
    dest.mkdir()
    (dest / "mine.txt").write_text("mine")
    with pytest.raises(ArchiveError, match="the destination .* already exists"):
        extract(archive, dest)
    assert tree(dest) == {"mine.txt": b"mine"}


def test_an_empty_archive_is_refused_since_a_module_has_at_least_one_file(tmp_path):
    archive = write_zip(tmp_path / "empty.zip", [])
    with pytest.raises(ArchiveError, match="empty.zip: the archive contains no files"):
        extract(archive, tmp_path / "module")
    assert not (tmp_path / "module").exists()


def test_a_missing_archive_is_an_archive_error(tmp_path):
    with pytest.raises(ArchiveError, match="missing.tar.gz: cannot open the archive"):
        extract(tmp_path / "missing.tar.gz", tmp_path / "module")


# --- what extract accepts ---------------------------------------------------------------------


def test_the_format_is_told_by_content_not_by_name(tmp_path):
    archive = write_zip(tmp_path / "module.tar.gz", [("module.json", MODULE_JSON)])
    assert extract(archive, tmp_path / "module") == ["module.json"]
    assert (tmp_path / "module" / "module.json").read_bytes() == MODULE_JSON


def test_plain_tar_and_tar_style_dot_slash_names_are_fine(tmp_path):
    # `tar -C dir -cf x.tar .` names the root './' and every member './name'.
    archive = write_tar(tmp_path / "module.tar", [member("./", type=tarfile.DIRTYPE, mode=0o755),
                                                 ("./module.json", MODULE_JSON),
                                                 member("./weights", type=tarfile.DIRTYPE, mode=0o755),
                                                 ("./weights/w.bin", b"w")], gz=False)
    assert extract(archive, tmp_path / "module") == ["module.json", "weights/w.bin"]


def test_modes_from_the_archive_are_not_applied(tmp_path):
    archive = write_tar(tmp_path / "module.tar.gz", [member("run.sh", b"#!/bin/sh\n", mode=0o6777)])
    extract(archive, tmp_path / "module")
    mode = (tmp_path / "module" / "run.sh").stat().st_mode
    assert mode & (stat.S_ISUID | stat.S_ISGID | 0o111 | 0o022) == 0


def test_small_archives_of_text_may_compress_beyond_the_ratio(tmp_path):
    # 512 KiB of zeros compresses about 1000:1 but stays under ratio_floor_bytes (1 MiB).
    archive = write_zip(tmp_path / "module.zip", [("module.json", MODULE_JSON), ("zeros.bin", bytes(512 << 10))])
    assert extract(archive, tmp_path / "module") == ["module.json", "zeros.bin"]
    with pytest.raises(ArchiveError, match="compression ratio"):
        extract(archive, tmp_path / "strict", limits=ArchiveLimits(ratio_floor_bytes=1000))


def test_a_member_yielding_more_than_it_declares_is_stopped(tmp_path, monkeypatch):
    # tarfile and zipfile never hand out more than the declared size; extract does not rely on it.
    from paddlejax.hub import archive as archive_module

    archive = write_zip(tmp_path / "module.zip", [("module.json", MODULE_JSON)])
    monkeypatch.setattr(archive_module._ZipReader, "open", lambda self, m: io.BytesIO(MODULE_JSON + b" "))
    with pytest.raises(ArchiveError, match=f"member 'module.json' holds more than the {len(MODULE_JSON)} bytes"):
        extract(archive, tmp_path / "module")
    assert not (tmp_path / "module").exists()


def test_progress_shows_a_bar_over_the_bytes_written(tmp_path, capsys):
    archive = good_tar_gz(tmp_path)
    assert extract(archive, tmp_path / "module", progress=True) == ["module.json", "weights/w.bin"]
    assert "module.tar.gz" in capsys.readouterr().err


# --- create -----------------------------------------------------------------------------------


@pytest.fixture
def module_dir(tmp_path):
    """A small module: description, nested weights, an empty directory."""
    src = tmp_path / "digits_cnn"
    (src / "weights" / "conv").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "module.json").write_bytes(MODULE_JSON)
    (src / "weights" / "conv" / "w1.safetensors").write_bytes(os.urandom(30_000))
    (src / "weights" / "dense.safetensors").write_bytes(bytes(1000))
    (src / "README.md").write_text("# digits_cnn\n")
    return src


@pytest.mark.parametrize("format", ["tar.gz", "zip"])
def test_create_then_extract_gives_back_the_same_tree(tmp_path, module_dir, format):
    archive = tmp_path / f"digits_cnn.{format}"
    digest = create(module_dir, archive, format=format)
    assert digest == sha256_file(archive)
    files = extract(archive, tmp_path / "installed", sha256=digest)
    assert files == ["README.md", "module.json", "weights/conv/w1.safetensors", "weights/dense.safetensors"]
    assert tree(tmp_path / "installed") == tree(module_dir)  # the empty directory too


@pytest.mark.parametrize("format", ["tar.gz", "zip"])
def test_create_is_byte_deterministic(tmp_path, module_dir, format):
    first = create(module_dir, tmp_path / f"a.{format}", format=format)
    # Times and modes are not part of the archive: touching files changes nothing.
    os.utime(module_dir / "module.json", (1e9, 1e9))
    os.chmod(module_dir / "README.md", 0o755)
    second = create(module_dir, tmp_path / f"b.{format}", format=format)
    assert first == second
    assert (tmp_path / f"a.{format}").read_bytes() == (tmp_path / f"b.{format}").read_bytes()


def test_create_writes_sorted_names_with_no_owner_time_or_exec_bits(tmp_path, module_dir):
    create(module_dir, tmp_path / "m.tar.gz")
    with tarfile.open(tmp_path / "m.tar.gz") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == ["README.md", "empty", "module.json", "weights", "weights/conv",
                                       "weights/conv/w1.safetensors", "weights/dense.safetensors"]
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname) for i in infos} == {(0, 0, 0, "", "")}
    assert {i.mode for i in infos if i.isdir()} == {0o755} and {i.mode for i in infos if i.isfile()} == {0o644}
    assert gzip.open(tmp_path / "m.tar.gz").read(1) and (tmp_path / "m.tar.gz").read_bytes()[4:8] == bytes(4)

    create(module_dir, tmp_path / "m.zip", format="zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_create_refuses_links_and_special_files_and_leaves_no_file(tmp_path, module_dir):
    os.symlink("module.json", module_dir / "alias.json")
    with pytest.raises(ArchiveError, match="'alias.json' in .* is a symbolic link; links are not allowed"):
        create(module_dir, tmp_path / "m.tar.gz")
    os.remove(module_dir / "alias.json")
    os.mkfifo(module_dir / "weights" / "pipe")
    with pytest.raises(ArchiveError, match="'weights/pipe' in .* is a special file"):
        create(module_dir, tmp_path / "m.zip", format="zip")
    assert sorted(os.listdir(tmp_path)) == ["digits_cnn"]  # no archive, no temporary file


def test_create_refuses_names_extract_would_refuse(tmp_path, module_dir):
    (module_dir / "Module.json").write_bytes(b"{}")
    with pytest.raises(ArchiveError, match="'Module.json' and 'module.json' differ only in case"):
        create(module_dir, tmp_path / "m.tar.gz")


def test_create_refuses_an_empty_directory_an_unknown_format_and_writing_into_its_source(tmp_path, module_dir):
    (tmp_path / "nothing" / "sub").mkdir(parents=True)
    with pytest.raises(ArchiveError, match="holds no files"):
        create(tmp_path / "nothing", tmp_path / "m.tar.gz")
    with pytest.raises(ArchiveError, match="unknown archive format '7z'"):
        create(module_dir, tmp_path / "m.7z", format="7z")
    with pytest.raises(ArchiveError, match="inside its source"):
        create(module_dir, module_dir / "self.tar.gz")
    assert not (tmp_path / "m.tar.gz").exists() and not (module_dir / "self.tar.gz").exists()


def test_create_replaces_an_existing_archive(tmp_path, module_dir):
    out = tmp_path / "m.tar.gz"
    out.write_bytes(b"old")
    digest = create(module_dir, out)
    assert sha256_file(out) == digest and sorted(os.listdir(tmp_path)) == ["digits_cnn", "m.tar.gz"]
