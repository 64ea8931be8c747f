"""Registries: publish into a static directory, serve it with any file server, install from it."""
import functools
import http.server
import json
import tarfile
import threading

import pytest

from paddlejax.hub import archive, registry, store
from paddlejax.hub.errors import ArchiveError, HubError, ModuleNotFound, RegistryError
from paddlejax.hub.home import hub_home, set_setting
from paddlejax.hub.installer import install, search

from tiny_modules import write_image_module, write_text_module


@pytest.fixture
def static_server(tmp_path):
    """A stdlib HTTP file server on 127.0.0.1 over ``tmp_path / "www"``; yields (url, folder, request log)."""
    root = tmp_path / "www"
    root.mkdir()
    seen = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            seen.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/registry", root / "registry", seen
    server.shutdown()
    thread.join(timeout=10)


def _publish(tmp_path, folder, versions=("1.0", "1.1", "2.0")):
    for version in versions:
        write_text_module(tmp_path / f"src-{version}", version=version)
        registry.publish(tmp_path / f"src-{version}", folder)
    write_image_module(tmp_path / "img")
    registry.publish(tmp_path / "img", folder, format="zip")


def test_publish_writes_an_index_and_archives_a_file_server_can_host(tmp_path, static_server):
    url, folder, seen = static_server
    _publish(tmp_path, folder)
    index = json.loads((folder / "index.json").read_text())
    assert sorted(index["modules"]) == ["tiny_cnn", "tiny_text"]
    assert sorted(index["modules"]["tiny_text"]["versions"]) == ["1.0", "1.1", "2.0"]
    release = index["modules"]["tiny_text"]["versions"]["2.0"]
    assert release["sha256"] == archive.sha256_file(folder / release["archive"])
    assert index["modules"]["tiny_cnn"]["versions"]["1.0.0"]["archive"].endswith(".zip")
    assert registry.open_index(url) == index


def test_install_from_a_registry_resolves_the_range_downloads_and_checks(tmp_path, static_server):
    url, folder, seen = static_server
    _publish(tmp_path, folder)
    assert install("tiny_text>=1,<2", registries=[url], progress=False).version == "1.1"
    # as pip does, an installed match is kept; a range asks for more
    assert install("tiny_text", registries=[url], progress=False).version == "1.1"
    assert install("tiny_text>=2", registries=[url], progress=False).version == "2.0"
    assert install("tiny_cnn", registries=[url], progress=False).label == "tiny_cnn 1.0.0"
    assert [m.label for m in store.installed()] == ["tiny_cnn 1.0.0", "tiny_text 1.1", "tiny_text 2.0"]
    assert any(p.endswith("tiny_text-2.0.tar.gz") for p in seen)
    # installed names are kept: no download the second time
    before = len(seen)
    install("tiny_text", registries=[url], progress=False)
    assert len(seen) == before


def test_configured_registries_are_searched_in_order(tmp_path, static_server):
    url, folder, _ = static_server
    _publish(tmp_path, folder, versions=("1.0",))
    set_setting("registries", [str(tmp_path / "missing"), url])
    assert install("tiny_text", progress=False).version == "1.0"
    rows = search("tiny")
    assert {(r["name"], r["source"]) for r in rows if r["source"] in (url, "installed")} == \
        {("tiny_text", url), ("tiny_cnn", url), ("tiny_text", "installed")}
    assert any(r["source"] == str(tmp_path / "missing") and "is not a registry" in r["summary"] for r in rows)


def test_a_tampered_archive_on_the_server_is_refused_before_extraction(tmp_path, static_server):
    url, folder, _ = static_server
    _publish(tmp_path, folder, versions=("1.0",))
    path = folder / "archives" / "tiny_text-1.0.tar.gz"
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RegistryError, match="sha256 mismatch"):
        install("tiny_text", registries=[url], progress=False)
    assert store.installed() == [] and not list((hub_home() / "cache").glob("*.tar.gz"))


def test_a_truncated_download_is_refused(tmp_path, static_server):
    url, folder, _ = static_server
    _publish(tmp_path, folder, versions=("1.0",))
    path = folder / "archives" / "tiny_text-1.0.tar.gz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RegistryError, match="truncated download"):
        install("tiny_text", registries=[url], progress=False)


def test_a_hostile_archive_in_a_registry_installs_nothing(tmp_path, static_server):
    url, folder, _ = static_server
    (folder / "archives").mkdir(parents=True)
    evil = folder / "archives" / "evil-1.0.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 0
        tar.addfile(info)
    index = {"format": "paddlejax.registry", "format_version": 1, "modules": {"evil": {"versions": {"1.0": {
        "archive": "archives/evil-1.0.tar.gz", "sha256": archive.sha256_file(evil), "size": evil.stat().st_size}}}}}
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ArchiveError, match="leaves the module"):
        install("evil", registries=[url], progress=False)
    assert store.installed() == [] and not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize("index, message", [
    ("not json", "not valid JSON"), ("[]", "not a paddlejax registry index"),
    ('{"format": "paddlejax.registry", "format_version": 9, "modules": {}}', "registry format version 9"),
    ('{"format": "paddlejax.registry", "format_version": 1, "modules": {"x": {}}}', 'module x has no "versions"'),
    ('{"format": "paddlejax.registry", "format_version": 1, "modules": {"x": {"versions": {"1": {"archive": '
     '"../../etc/passwd", "sha256": "0", "size": 1}}}}}', "is not a plain relative path"),
])
def test_malformed_indexes_are_refused(tmp_path, index, message):
    (tmp_path / "index.json").write_text(index)
    with pytest.raises(HubError, match=message):
        registry.open_index(str(tmp_path))


def test_republishing_a_version_with_other_contents_is_refused(tmp_path):
    write_text_module(tmp_path / "a")
    registry.publish(tmp_path / "a", tmp_path / "reg")
    registry.publish(tmp_path / "a", tmp_path / "reg")  # same contents: fine
    write_text_module(tmp_path / "b", program={"seed": 3})
    with pytest.raises(RegistryError, match="already published with other contents"):
        registry.publish(tmp_path / "b", tmp_path / "reg")
    registry.publish(tmp_path / "b", tmp_path / "reg", force=True)


def test_missing_names_and_versions_say_what_the_registry_has(tmp_path):
    write_text_module(tmp_path / "a")
    registry.publish(tmp_path / "a", tmp_path / "reg")
    with pytest.raises(ModuleNotFound, match="has no version of tiny_text matching >=2; it has 1.0.0"):
        registry.resolve(str(tmp_path / "reg"), "tiny_text", ">=2")
    with pytest.raises(ModuleNotFound, match="no module nothing_here"):
        install("nothing_here", registries=[str(tmp_path / "reg")], progress=False)


def test_install_from_an_archive_url_and_a_file(tmp_path, static_server):
    url, folder, _ = static_server
    write_text_module(tmp_path / "a")
    folder.mkdir(parents=True)
    digest = archive.create(tmp_path / "a", folder / "tiny.zip", format="zip")
    assert install(f"{url}/tiny.zip", sha256=digest, progress=False).label == "tiny_text 1.0.0"
    with pytest.raises(HubError, match="must name an archive"):
        install(url, progress=False)
    store.uninstall("tiny_text")
    assert install(str(folder / "tiny.zip"), progress=False).label == "tiny_text 1.0.0"
    with pytest.raises(ArchiveError, match="sha256"):
        install(str(folder / "tiny.zip"), sha256="0" * 64, force=True, progress=False)


def test_a_cached_archive_is_reused_after_uninstall(tmp_path, static_server):
    url, folder, seen = static_server
    _publish(tmp_path, folder, versions=("1.0",))
    install("tiny_text", registries=[url], progress=False)
    store.uninstall("tiny_text")
    downloads = sum(p.endswith(".tar.gz") for p in seen)
    assert install("tiny_text", registries=[url], progress=False).version == "1.0"
    assert sum(p.endswith(".tar.gz") for p in seen) == downloads  # the checked cached copy was used


def test_concurrent_publishers_to_one_registry_keep_every_module(tmp_path):
    import os
    import subprocess
    import sys

    for i in range(3):
        write_text_module(tmp_path / f"m{i}", name=f"tiny_{i}")
    script = "import sys; from paddlejax.hub import registry; registry.publish(sys.argv[1], sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"m{i}"), str(tmp_path / "reg")],
                              env=os.environ.copy(), stderr=subprocess.PIPE) for i in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()[-500:]
    index = registry.open_index(str(tmp_path / "reg"))
    assert sorted(index["modules"]) == ["tiny_0", "tiny_1", "tiny_2"]
    for name, entry in index["modules"].items():
        release = entry["versions"]["1.0.0"]
        assert archive.sha256_file(tmp_path / "reg" / release["archive"]) == release["sha256"]
    assert sorted(p.name for p in (tmp_path / "reg" / "archives").iterdir()) == \
        ["tiny_0-1.0.0.tar.gz", "tiny_1-1.0.0.tar.gz", "tiny_2-1.0.0.tar.gz"]  # no staging left behind
