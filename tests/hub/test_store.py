"""Installed modules: atomic installs, versions side by side, uninstall, clear."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from paddlejax.hub import manifest, store
from paddlejax.hub.errors import HubError, ModuleNotFound
from paddlejax.hub.home import hub_home

from tiny_modules import write_text_module


def test_versions_install_side_by_side_and_list_in_order(tmp_path):
    for version in ("2.0", "1.10", "1.9"):
        write_text_module(tmp_path / version, version=version)
        store.install_directory(tmp_path / version)
    assert [m.version for m in store.installed("tiny_text")] == ["1.9", "1.10", "2.0"]
    assert sorted(p.name for p in (hub_home() / "modules" / "tiny_text").iterdir()) == ["1.10", "1.9", "2.0"]


def test_reinstalling_the_same_files_is_a_no_op_and_other_files_need_force(tmp_path):
    write_text_module(tmp_path / "a")
    store.install_directory(tmp_path / "a")
    assert store.install_directory(tmp_path / "a").label == "tiny_text 1.0.0"
    write_text_module(tmp_path / "b", program={"seed": 1})
    with pytest.raises(HubError, match="already installed with other files; uninstall it or install with force"):
        store.install_directory(tmp_path / "b")
    store.install_directory(tmp_path / "b", force=True)
    installed_dir, m = store.find("tiny_text")
    assert m.files == manifest.read(tmp_path / "b").files
    assert not list((hub_home() / "tmp").iterdir())  # nothing left behind


def test_a_tampered_source_is_refused_and_nothing_is_installed(tmp_path):
    write_text_module(tmp_path / "a")
    (tmp_path / "a" / "tokenizer.json").write_text("{}")
    with pytest.raises(HubError, match="tokenizer.json does not match its sha256"):
        store.install_directory(tmp_path / "a")
    assert store.installed() == []


def test_uninstall_removes_matching_versions_only(tmp_path):
    for version in ("1.0", "2.0"):
        write_text_module(tmp_path / version, version=version)
        store.install_directory(tmp_path / version)
    assert [m.version for m in store.uninstall("tiny_text", "<2")] == ["1.0"]
    assert [m.version for m in store.installed()] == ["2.0"]
    store.uninstall("tiny_text")
    assert not (hub_home() / "modules" / "tiny_text").exists()
    with pytest.raises(ModuleNotFound, match="no installed version of tiny_text to uninstall"):
        store.uninstall("tiny_text")


def test_clear_empties_cache_and_work_directories(tmp_path):
    write_text_module(tmp_path / "a")
    store.install_directory(tmp_path / "a")
    (hub_home() / "cache").mkdir()
    (hub_home() / "cache" / "x.tar.gz").write_bytes(b"x")
    store.clear()
    assert not (hub_home() / "cache").exists() and len(store.installed()) == 1
    store.clear(modules=True)
    assert store.installed() == []


@pytest.mark.parametrize("text, want", [("digits_cnn", ("digits_cnn", "")), ("digits_cnn>=1,<2", ("digits_cnn", ">=1,<2")),
                                        ("digits_cnn 1.2", ("digits_cnn", "==1.2")), ("a.b-c==2", ("a.b-c", "==2"))])
def test_requirements_split_into_name_and_range(text, want):
    assert store.split_requirement(text) == want


@pytest.mark.parametrize("text, message", [("", "module name '' is not"), ("Digits", "module name 'Digits' is not"),
                                           ("digits>>1", "'>>1' is not a version range")])
def test_bad_requirements_are_named(text, message):
    with pytest.raises(HubError, match=message):
        store.split_requirement(text)


def test_an_install_killed_half_way_never_shows_in_the_list(tmp_path):
    """A process killed while copying leaves its work in HUB_HOME/tmp, never a module."""
    write_text_module(tmp_path / "a")
    script = textwrap.dedent(f"""
        import os, shutil
        from paddlejax.hub import store
        real = shutil.copytree
        def dying(src, dst, **kw):
            real(src, dst, **kw)
            os.kill(os.getpid(), 9)
        shutil.copytree = dying
        store.install_directory({str(tmp_path / 'a')!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], env=os.environ.copy(), capture_output=True, timeout=120)
    assert result.returncode == -9, result.stderr.decode()[-500:]
    assert store.installed() == []
    assert list((hub_home() / "tmp").iterdir())  # the half-copy sits in tmp ...
    store.clear()
    assert not (hub_home() / "tmp").exists()  # ... until clear removes it
    assert store.install_directory(tmp_path / "a").label == "tiny_text 1.0.0"


def test_concurrent_installers_of_one_module_leave_one_good_copy(tmp_path):
    write_text_module(tmp_path / "a")
    script = f"from paddlejax.hub import store; store.install_directory({str(tmp_path / 'a')!r})"
    procs = [subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy(), stderr=subprocess.PIPE)
             for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()[-500:]
    (installed_dir, m), = [store.find("tiny_text")]
    manifest.read(installed_dir)  # every file verifies
    assert [x.label for x in store.installed()] == ["tiny_text 1.0.0"]
    assert not list((hub_home() / "tmp").iterdir())


def test_clear_keeps_the_work_of_installs_still_running():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = hub_home() / "tmp" / f"install-x-{sleeper.pid}-abcd"
        running.mkdir(parents=True)
        dead = hub_home() / "tmp" / "install-x-999999999-abcd"
        dead.mkdir()
        store.clear()
        assert running.exists() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
