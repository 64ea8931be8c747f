"""paddlejax autotune: a table of every candidate kernel per conv op, the whole-program plans,
the cache, the tuned program."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main
from paddlejax.passes import autotune

MS = {"default": 2.0, "lax_nhwc": 3.0, "im2col": 0.5, "shifted_matmul": 1.0, "winograd": 4.0, "depthwise_shifted": 0.25,
      "lax_bf16": 0.1, "onednn": 5.0}
PLAN_MS = {"NCHW": 9.0, "NCHW, tuned kernels": 7.0, "NHWC": 8.0, "NHWC, tuned kernels": 6.0}


@pytest.fixture
def saved_cnn(tmp_path):
    """A saved conv -> depthwise conv program over a symbolic batch: ``(program, path)``."""
    rng = np.random.default_rng(0)
    p = {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "d": rng.normal(size=(4, 1, 3, 3)).astype(np.float32)}
    prog = pj.trace(lambda p, x: pj.ops.depthwise_conv2d(pj.ops.conv2d(x, p["w"], padding=1), p["d"]),
                    pj.InputSpec((None, 3, 6, 6)), params=p)
    pj.save(prog, tmp_path / "m")
    return prog, tmp_path / "m"


@pytest.fixture(autouse=True)
def fixed_timings(monkeypatch):
    monkeypatch.setattr(autotune, "measure", lambda candidate, *a, **k: MS[candidate] / 1e3)
    monkeypatch.setattr(autotune, "measure_programs", lambda fns, *a, **k: {p: [PLAN_MS[p] / 1e3] for p in fns})


def test_autotune_prints_a_row_per_conv_and_saves_the_choices(saved_cnn, tmp_path, capsys):
    cache, out = tmp_path / "c.json", tmp_path / "tuned"
    assert main(["autotune", str(saved_cnn[1]), "--size", "b=2", "--cache", str(cache), "--top-k", "0",
                 "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("<lambda>: 2 conv ops, ") and lines[0].endswith(f"cache {cache}")
    # the columns: every candidate of either op (the oneDNN variant where it is built)
    columns = list(dict.fromkeys(autotune.candidates("conv2d") + autotune.candidates("depthwise_conv2d")))
    assert {"default", "lax_nhwc", "im2col", "shifted_matmul", "winograd", "depthwise_shifted"} <= set(columns)
    assert lines[2].split() == ["#", "op", "input", "shapes", *columns, "chosen", "from"]
    # the chosen plan is NHWC, so the rows show the ops in NHWC
    # (lax.conv in NHWC is the default itself on an NHWC op: not timed)
    conv_times = ["skip" if c == "lax_nhwc" else f"{MS[c]:.3f}" if c in autotune.candidates("conv2d") else "-"
                  for c in columns]
    assert lines[3].split() == ["0", "conv2d", "2x6x6x3,", "4x3x3x3", *conv_times, "im2col", "measured"]
    assert lines[4].split()[:3] == ["1", "depthwise_conv2d", "2x6x6x4,"] and lines[4].split()[-2:] == [
        "depthwise_shifted", "measured"]
    # the ops are tuned in NHWC; NCHW runs as it is and with those choices
    assert lines[5:10] == ["whole program (argument parameters), low-quartile ms:",
                           "plan                    ms",
                           "NHWC, tuned kernels  6.000",
                           "NCHW, tuned kernels  7.000",
                           "NCHW                 9.000"]
    assert lines[10:] == ["tuned 2, cached 0, annotated 2, plans 3, plans_cached 0", f"saved {out}"]
    tuned = pj.load(out)
    assert [(op.attrs["kernel"], op.attrs["data_format"]) for op in tuned.walk() if "conv" in op.type] == [
        ("im2col", "NHWC"), ("depthwise_shifted", "NHWC")]
    x = np.ones((2, 3, 6, 6), np.float32)
    np.testing.assert_allclose(tuned(x), saved_cnn[0](x), rtol=1e-4, atol=1e-4)


def test_a_second_run_reads_the_cache(saved_cnn, tmp_path, capsys):
    args = ["autotune", str(saved_cnn[1]), "--size", "b=2", "--cache", str(tmp_path / "c.json"), "--top-k", "0"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in lines[3:5]] == ["cache", "cache"]
    assert lines[-1] == "tuned 0, cached 2, annotated 2, plans 3, plans_cached 1"


def test_fixed_layout_without_the_whole_program_check(saved_cnn, tmp_path, capsys):
    args = ["autotune", str(saved_cnn[1]), "--size", "b=2", "--cache", str(tmp_path / "c.json"), "--layout", "keep",
            "--no-check", "--reduced-precision"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "lax_bf16" in lines[2].split() and lines[3].split()[-2:] == ["lax_bf16", "measured"]
    assert lines[-1] == "tuned 2, cached 0, annotated 2, plans 1, plans_cached 0"


@pytest.mark.parametrize("size, message", [
    ("b", "--size expects NAME=N, got 'b'"),
    ("zz=3", "size 'zz' is not a symbolic size of"),
])
def test_bad_size_is_reported(saved_cnn, tmp_path, capsys, size, message):
    assert main(["autotune", str(saved_cnn[1]), "--size", size, "--cache", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err.startswith(f"paddlejax autotune: error: {message}")
