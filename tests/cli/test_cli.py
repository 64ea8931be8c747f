"""The paddlejax command: inspect, opt, run, export and demo, and clean errors."""
import json

import numpy as np

import paddlejax as pj
from paddlejax.cli.main import main


def test_inspect_prints_ir_parameters_flops_and_memory(saved, capsys):
    _, path = saved
    assert main(["inspect", str(path), "--size", "b=32"]) == 0
    out = capsys.readouterr().out
    assert "program @f(%x: f32[b,4]) -> (f32[b,8])" in out
    assert "parameters   40 (160 B)" in out
    # linear 2*32*4*8 (multiply-adds), then mul and relu one per element
    assert f"FLOPs        {(2 * 32 * 4 * 8 + 2 * 32 * 8) / 1000:.3g} KFLOP per call (b=32)" in out
    assert "activations" in out and "memory" in out


def test_inspect_memory_reports_peak_inplace_xla_and_plots(saved, tmp_path, capsys):
    _, path = saved
    png = tmp_path / "live.png"
    assert main(["inspect", str(path), "--no-ir", "--memory", "--size", "b=32", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    # linear's and mul's outputs (32x8 floats each) are live together during the mul ...
    assert "peak         2.05 KB live during op #4 (lax.mul)" in out
    assert "  %2            1.02 KB  f32[b,8]\n  %4            1.02 KB  f32[b,8]" in out
    # ... unless mul and relu write over their input: then x with linear's output is the peak
    assert "in-place     2 reuses, peak 1.54 KB (saves 512 B)" in out
    assert "XLA          " in out and "temp" in out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_inspect_plot_needs_memory(saved, tmp_path, capsys):
    _, path = saved
    assert main(["inspect", str(path), "--plot", str(tmp_path / "a.png")]) == 2
    assert "--plot needs --memory" in capsys.readouterr().err


def test_opt_runs_a_pipeline_and_saves(saved, tmp_path, capsys):
    _, path = saved
    assert main(["opt", str(path), "--passes", "eliminate_identity,fold_constants{max_elements=16},dce",
                 "-o", str(tmp_path / "opt")]) == 0
    out = capsys.readouterr().out
    assert "identities=1" in out and "erased=1" in out
    assert [op.type for op in pj.load(tmp_path / "opt").walk()] == ["param", "param", "linear", "relu", "return"]


def test_run_reads_npy_and_writes_outputs(saved, tmp_path, capsys):
    prog, path = saved
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 6
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), prog(x))
    assert "output 0: float32[3, 8]" in capsys.readouterr().out


def test_run_refuses_pickled_npy(saved, tmp_path, capsys):
    _, path = saved
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert main(["run", str(path), "--input", str(tmp_path / "obj.npy")]) == 2
    assert "allow_pickle" in capsys.readouterr().err


def test_export_writes_an_artifact(saved, tmp_path, capsys):
    _, path = saved
    assert main(["export", str(path), "-o", str(tmp_path / "m.stablehlo")]) == 0
    assert (tmp_path / "m.stablehlo").stat().st_size > 0
    assert "exported f(float32[b,4]) for cpu" in capsys.readouterr().out


def test_bad_file_gives_a_one_line_error(saved, capsys):
    _, path = saved
    doc = json.loads(path.with_suffix(".json").read_text())
    doc["format_version"] = 42
    path.with_suffix(".json").write_text(json.dumps(doc))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paddlejax inspect: error: format_version 42 is newer")


def test_demo_trains_saves_plots_and_exports(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--epochs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1,437 train / 360 test" not in out and "1437 train / 360 test" in out
    assert "program @DigitsCNN(%x: f32[b,1,8,8])" in out
    assert "outputs match" in out
    for name in ("digits_cnn.json", "digits_cnn.safetensors", "digits_cnn.stablehlo", "curves.png"):
        assert (tmp_path / name).exists(), name
    assert any((tmp_path / "checkpoints").iterdir()) and any((tmp_path / "logs").iterdir())


