"""paddlejax hub: the module store, registries, running and converting from the command line;
every error is one line with exit code 2."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main

_spec = importlib.util.spec_from_file_location("tiny_modules", Path(__file__).parents[1] / "hub" / "tiny_modules.py")
tiny = sys.modules.setdefault("tiny_modules", importlib.util.module_from_spec(_spec))
if not hasattr(tiny, "write_text_module"):
    _spec.loader.exec_module(tiny)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["hub", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_install_list_show_run_uninstall(tmp_path, capsys):
    tiny.write_text_module(tmp_path / "m")
    assert run(capsys, "install", tmp_path / "m")[1] == "installed tiny_text 1.0.0 (text-embedding)\n"
    code, out, _ = run(capsys, "list")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["name", "version", "task"]
    assert out.splitlines()[2].split()[:3] == ["tiny_text", "1.0.0", "text-embedding"]
    shown = json.loads(run(capsys, "show", "tiny_text")[1])
    assert shown["name"] == "tiny_text" and "tokenizer.json" in shown["files"]
    vectors = json.loads(run(capsys, "run", "tiny_text", "--input", "good movie", "--input", "bad")[1])
    assert np.asarray(vectors).shape == (2, 4)
    assert run(capsys, "uninstall", "tiny_text")[1] == "uninstalled tiny_text 1.0.0\n"
    assert run(capsys, "list")[1].endswith("(none)\n")


def test_publish_search_download_and_install_from_a_registry(tmp_path, capsys):
    tiny.write_image_module(tmp_path / "m")
    code, out, _ = run(capsys, "publish", tmp_path / "m", "--registry", tmp_path / "reg")
    assert code == 0 and out.startswith(f"published tiny_cnn 1.0.0 to {tmp_path / 'reg'}: archives/tiny_cnn-1.0.0.tar.gz")
    out = run(capsys, "search", "tiny", "--registry", tmp_path / "reg")[1]
    assert "tiny_cnn" in out and str(tmp_path / "reg") in out
    out = run(capsys, "download", "tiny_cnn", "--registry", tmp_path / "reg", "-o", tmp_path / "dl", "--no-progress")[1]
    assert (tmp_path / "dl" / "tiny_cnn-1.0.0.tar.gz").is_file() and "sha256" in out
    assert run(capsys, "install", "tiny_cnn", "--registry", tmp_path / "reg", "--no-progress")[1] == \
        "installed tiny_cnn 1.0.0 (image-classification)\n"
    image = tmp_path / "x.png"
    image.write_bytes(tiny.png(np.full((4, 4), 200)))
    results = json.loads(run(capsys, "run", "tiny_cnn", "--input", image, "--top-k", "2")[1])
    assert len(results) == 1 and len(results[0]) == 2 and {"label", "score"} <= set(results[0][0])


def test_run_reads_the_text_of_images_with_an_ocr_module(tmp_path, capsys):
    tiny.write_ocr_module(tmp_path / "m")
    assert run(capsys, "install", tmp_path / "m")[1] == "installed tiny_ocr 1.0.0 (ocr)\n"
    pixels = np.full((64, 128), 255)
    pixels[16:48, 16:56] = 0
    (tmp_path / "blocks.png").write_bytes(tiny.png(pixels))
    [lines] = json.loads(run(capsys, "run", "tiny_ocr", "--input", tmp_path / "blocks.png")[1])
    assert [line["text"] for line in lines] == ["a"] and len(lines[0]["box"]) == 4


def test_config_sets_and_unsets_registries_and_home(tmp_path, capsys):
    run(capsys, "config", "registries", "https://a.example/hub", str(tmp_path / "reg"))
    shown = json.loads(run(capsys, "config")[1])
    assert shown["registries"] == ["https://a.example/hub", str(tmp_path / "reg")]
    run(capsys, "config", "home", tmp_path / "elsewhere")
    monkey_home = json.loads(run(capsys, "config")[1])
    assert monkey_home["home"] == str(tmp_path / "elsewhere")  # HUB_HOME in the environment still wins
    run(capsys, "config", "registries", "--unset")
    assert "registries" not in json.loads(run(capsys, "config")[1]) or \
        json.loads(run(capsys, "config")[1])["registries"] == []


def test_convert_makes_a_module_from_a_saved_program(tmp_path, capsys):
    pj.save(tiny.image_program(classes=2), tmp_path / "cnn")
    (tmp_path / "labels.txt").write_text("no\nyes\n")
    code, out, _ = run(capsys, "convert", tmp_path / "cnn", "--task", "image-classification", "--name", "yes_no",
                       "--image-size", "4,4", "--mode", "L", "--labels", tmp_path / "labels.txt", "-o", tmp_path / "mod")
    assert code == 0 and out.startswith("wrote yes_no 1.0.0 (image-classification)")
    module = pj.hub.Module(directory=tmp_path / "mod")
    assert module.labels == ["no", "yes"] and module.classification(np.zeros((4, 4)))[0]["label"] in ("no", "yes")


@pytest.mark.parametrize("args, message", [
    (["install", "./no/such/dir"], "./no/such/dir: no such file or directory"),
    (["install", "nope"], "no module nope in the registries searched"),
    (["show", "nope"], "module nope is not installed"),
    (["uninstall", "nope"], "no installed version of nope to uninstall"),
    (["run", "nope", "--input", "x"], "no module nope"),
    (["config", "colour", "red"], "unknown hub setting 'colour'"),
    (["publish", "/nonexistent", "--registry", "/tmp/r"], "is not a module"),
    (["convert", "/nonexistent", "--task", "ocr", "--name", "x", "-o", "/tmp/x"], "is built in: ppocr_v4"),
    (["convert", "/nonexistent.onnx", "--task", "image-classification", "-o", "/tmp/x"], "no such model file"),
    (["convert", "/nonexistent", "--task", "poetry", "--name", "x", "-o", "/tmp/x"], "--task must be one of"),
    (["install", "Bad Name"], "module name 'Bad' is not"),
])
def test_errors_are_one_line_with_exit_code_2(args, message, capsys):
    code, out, err = run(capsys, *args)
    assert code == 2, out + err
    assert err.startswith("paddlejax hub: error: ") and message in err and err.count("\n") == 1, err


def test_clear_empties_the_cache(tmp_path, capsys):
    tiny.write_text_module(tmp_path / "m")
    run(capsys, "install", tmp_path / "m")
    assert run(capsys, "clear")[0] == 0
    assert "tiny_text" in run(capsys, "list")[1]
    assert "modules" in run(capsys, "clear", "--all")[1]
    assert run(capsys, "list")[1].endswith("(none)\n")


def test_serve_answers_over_http_and_stops_gracefully_on_sigterm(tmp_path, capsys):
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    tiny.write_text_module(tmp_path / "m")
    run(capsys, "install", tmp_path / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "paddlejax.cli.main", "hub", "serve", "-m", "tiny_text",
                               "--port", str(port), "--no-progress"], env=os.environ.copy(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert json.loads(r.read())["modules"]["tiny_text"]["version"] == "1.0.0"
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()[-2000:]
                time.sleep(0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict/tiny_text",
                                         data=json.dumps({"texts": ["good movie", "bad"]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "000" and np.asarray(body["results"]).shape == (2, 4)
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    log = server.stdout.read().decode()
    # uvicorn finishes the requests in flight, shuts the app down, then ends by the signal it got
    assert "Application shutdown complete" in log and code == -signal.SIGTERM, (code, log[-2000:])


def test_serve_refuses_a_module_it_cannot_find(capsys):
    code, _, err = run(capsys, "serve", "-m", "nope", "--no-progress")
    assert code == 2 and "no module nope" in err
