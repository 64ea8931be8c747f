"""The paddlejax command: inspect, opt, run, export and demo, and clean errors."""
import json

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import COMMANDS, main


def test_inspect_prints_ir_parameters_flops_and_memory(saved, capsys):
    _, path = saved
    assert main(["inspect", str(path), "--size", "b=32"]) == 0
    out = capsys.readouterr().out
    assert "program @f(%x: f32[b,4]) -> (f32[b,8])" in out
    assert "parameters   40 trainable (160 B)\nbuffers      0 (0 B; running statistics, not trained)" in out
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
    assert one_line_error(capsys) == (f"paddlejax run: error: {tmp_path / 'obj.npy'}: holds Python objects (object), "
                                      f"which would need unpickling; save a numeric array")


def one_line_error(capsys) -> str:
    """The command's error message, checked to be one line with nothing on stdout."""
    out, err = capsys.readouterr()
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_run_casts_float64_inputs_and_names_an_input_of_another_dtype(saved, tmp_path, capsys):
    prog, path = saved
    x = np.arange(8.0).reshape(2, 4)  # NumPy's float64: cast to the program's float32
    np.save(tmp_path / "x64.npy", x)
    assert main(["run", str(path), "--input", str(tmp_path / "x64.npy"), "--output", str(tmp_path / "y.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["output0"], prog(x.astype(np.float32)))
    capsys.readouterr()
    np.save(tmp_path / "s.npy", np.full((2, 4), "a"))
    assert main(["run", str(path), "--input", str(tmp_path / "s.npy")]) == 2
    assert one_line_error(capsys) == "paddlejax run: error: f: input 'x' expects f32[b,4], got str32[2,4]"


def test_run_refuses_an_npy_whose_header_claims_more_data_than_the_file_holds(saved, tmp_path, capsys):
    _, path = saved
    with open(tmp_path / "big.npy", "wb") as f:  # 256 TiB declared, none present
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 45, 2)})
    assert main(["run", str(path), "--input", str(tmp_path / "big.npy")]) == 2
    assert one_line_error(capsys).endswith("big.npy: its header declares float32[35184372088832, 2] "
                                           "(281,474,976,710,656 bytes) but 0 bytes of data follow it; "
                                           "the file is damaged or not written by NumPy")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    assert main(["run", str(path), "--input", str(tmp_path / "in.npz")]) == 0


@pytest.mark.parametrize("output, message", [
    ("adir", "--output {d}/adir must end in .npy or .npz"),
    ("sub/", "--output {d}/sub/ names a directory; give a file name"),
])
def test_run_output_must_be_a_npy_or_npz_file(saved, tmp_path, capsys, output, message):
    _, path = saved
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--output", f"{tmp_path}/{output}"]) == 2
    assert one_line_error(capsys) == "paddlejax run: error: " + message.format(d=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.safetensors", "x.npy"]


@pytest.mark.parametrize("command", ["opt", "autotune"])
def test_saving_a_program_to_a_directory_is_refused(saved, tmp_path, capsys, command):
    _, path = saved
    (tmp_path / "adir").mkdir()
    extra = ["--passes", "dce"] if command == "opt" else []
    for target in (f"{tmp_path}/adir/", f"{tmp_path}/adir", f"{tmp_path}/adir/.json"):
        assert main([command, str(path), *extra, "-o", target]) == 2
        stem = target.removesuffix(".json").rstrip("/")
        assert one_line_error(capsys) == (f"paddlejax {command}: error: -o {target} names a directory; give the "
                                          f"program's path inside it, e.g. {stem}/model")
    assert list((tmp_path / "adir").iterdir()) == []


@pytest.mark.parametrize("size, message", [
    ("zz=3", "size 'zz' is not a symbolic size of f; its sizes: b"),
    ("b=" + "9" * 40, "sizes b=" + "9" * 40 + " make a f32[b,4] tensor of 1.6e+41 bytes, more than XLA addresses "
                      "(9.22e+18); give smaller sizes"),
    ("b=0", "size 'b' must be a positive int, got 0"),
    ("b", "--size expects NAME=N, got 'b'"),
])
def test_inspect_checks_sizes_against_the_program(saved, capsys, size, message):
    _, path = saved
    assert main(["inspect", str(path), "--no-ir", "--memory", "--size", size]) == 2
    assert one_line_error(capsys) == "paddlejax inspect: error: " + message


def test_inspect_counts_batch_norm_statistics_as_buffers_apart_from_parameters(tmp_path, capsys):
    pj.nn.seed(0)
    model = pj.nn.Sequential(pj.nn.Conv2D(1, 4, 3), pj.nn.BatchNorm2D(4))
    model.eval()
    pj.save(pj.to_static(model, pj.InputSpec((None, 1, 5, 5))), tmp_path / "bn")
    assert main(["inspect", str(tmp_path / "bn"), "--no-ir"]) == 0
    out = capsys.readouterr().out
    # conv weight 4*1*3*3 and bias 4, BN scale and shift 4 + 4; BN running mean and variance 4 + 4
    assert "parameters   48 trainable (192 B)\nbuffers      8 (32 B; running statistics, not trained)" in out


def test_unknown_pass_error_has_no_stray_quote(saved, tmp_path, capsys):
    _, path = saved
    assert main(["opt", str(path), "--passes", "dcee", "-o", str(tmp_path / "o")]) == 2
    assert one_line_error(capsys) == "paddlejax opt: error: unknown pass 'dcee'; did you mean dce?"


def test_export_writes_an_artifact(saved, tmp_path, capsys):
    _, path = saved
    assert main(["export", str(path), "-o", str(tmp_path / "m.stablehlo")]) == 0
    assert (tmp_path / "m.stablehlo").stat().st_size > 0
    assert "exported f(float32[b,4]) for cpu" in capsys.readouterr().out


def test_export_names_a_static_batch(tmp_path, capsys):
    pj.save(pj.trace(lambda x: x * 2.0, pj.InputSpec((3, 4))), tmp_path / "static")
    assert main(["export", str(tmp_path / "static"), "-o", str(tmp_path / "s.stablehlo"), "--batch", "n"]) == 0
    assert "exported <lambda>(float32[n,4]) for cpu" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--batch", "1x"], "--batch expects the name of a symbolic size (an identifier such as b), got '1x'"),
    (["--batch", "n"], "--batch n: f's inputs already lead with symbolic sizes (b); --batch only names a static "
                       "batch size made symbolic"),
    (["--batch", "n", "--static"], "--batch names a symbolic batch size; --static keeps the traced sizes: give one "
                                   "of them"),
])
def test_export_refuses_a_batch_name_it_cannot_use(saved, tmp_path, capsys, args, message):
    _, path = saved
    assert main(["export", str(path), "-o", str(tmp_path / "m.stablehlo"), *args]) == 2
    assert one_line_error(capsys) == "paddlejax export: error: " + message
    assert not (tmp_path / "m.stablehlo").exists()


def test_export_refuses_an_unknown_platform(saved, tmp_path, capsys):
    _, path = saved
    with pytest.raises(SystemExit) as exit:
        main(["export", str(path), "-o", str(tmp_path / "m.stablehlo"), "--platform", "bogus"])
    assert exit.value.code == 2
    assert "argument --platform: invalid choice: 'bogus' (choose from" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "autotune", "slim", "launch", "opt", "run", "inspect", "export"])
def test_help_keeps_example_lines_apart_from_the_prose(capsys, command):
    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    assert exit.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    examples = [line for line in COMMANDS[command].__doc__.splitlines() if line.startswith("    paddlejax ")]
    assert examples and all(line in lines for line in examples)
    # the prose before the examples is rewrapped, not run into them
    first = lines.index(examples[0])
    assert lines[first - 1] == "" and lines[first + len(examples)] == ""


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




def test_the_shared_helpers_examples_run():
    import doctest

    from paddlejax.cli import common

    assert doctest.testmod(common).failed == 0


def test_run_refuses_npz_files_that_are_damaged_or_hold_other_arrays(saved, tmp_path, capsys):
    import zipfile

    _, path = saved
    (tmp_path / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    np.save(tmp_path / "plain.npy", np.ones((2, 4), np.float32))
    (tmp_path / "plain.npy").rename(tmp_path / "plain.npz")
    np.savez(tmp_path / "extra.npz", x=np.ones((2, 4), np.float32), mask=np.ones(2))
    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as z:
        z.writestr("x", b"bytes")
    for name, message in [("garbage.npz", "not a .npz archive of named arrays (save one with numpy.savez)"),
                          ("plain.npz", "not a .npz archive of named arrays (save one with numpy.savez)"),
                          ("extra.npz", "holds arrays ['mask'] that are not inputs of the program; its inputs are ['x']"),
                          ("raw.npz", "members ['x'] are not .npy arrays; save the inputs with numpy.savez")]:
        assert main(["run", str(path), "--input", str(tmp_path / name)]) == 2
        sep = " " if name == "extra.npz" else ": "
        assert one_line_error(capsys) == f"paddlejax run: error: {tmp_path / name}{sep}{message}"


def test_run_names_an_input_that_is_not_a_npy_file(saved, capsys):
    _, path = saved
    json_path = path.with_suffix(".json")
    assert main(["run", str(path), "--input", str(json_path)]) == 2
    assert one_line_error(capsys).startswith(f"paddlejax run: error: {json_path}: not a .npy array (the magic string")


def test_run_output_may_not_overwrite_an_input_and_goes_into_new_folders(saved, tmp_path, capsys):
    _, path = saved
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    before = (tmp_path / "in.npz").read_bytes()
    assert main(["run", str(path), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "in.npz")]) == 2
    assert one_line_error(capsys) == (f"paddlejax run: error: --output {tmp_path / 'in.npz'} would overwrite the "
                                      f"input {tmp_path / 'in.npz'}; give another path")
    assert (tmp_path / "in.npz").read_bytes() == before
    out = tmp_path / "new dir é" / "y.npy"
    assert main(["run", str(path), "--input", str(tmp_path / "in.npz"), "--output", str(out)]) == 0
    assert np.load(out).shape == (2, 8)


@pytest.mark.parametrize("command, extra, suffix", [
    ("opt", ["--passes", "dce"], ""), ("opt", ["--passes", "dce"], ".safetensors"), ("autotune", [], ".json"),
    ("export", [], ".json"), ("export", [], ".safetensors"),
])
def test_an_output_may_not_overwrite_the_program_read(saved, capsys, command, extra, suffix):
    _, path = saved
    before = path.with_suffix(".json").read_bytes(), path.with_suffix(".safetensors").read_bytes()
    assert main([command, str(path), *extra, "-o", f"{path}{suffix}"]) == 2
    assert one_line_error(capsys) == (f"paddlejax {command}: error: -o {path}{suffix} would overwrite the input "
                                      f"{path}; give another path")
    assert (path.with_suffix(".json").read_bytes(), path.with_suffix(".safetensors").read_bytes()) == before


@pytest.mark.parametrize("plot, message", [("{d}", "--plot {d} names a directory; give a file name"),
                                           ("{d}/live.txt", "--plot {d}/live.txt must end in .png or .svg or .pdf "
                                                            "or .jpg or .jpeg")])
def test_inspect_refuses_a_plot_path_before_printing(saved, tmp_path, capsys, plot, message):
    _, path = saved
    assert main(["inspect", str(path), "--memory", "--plot", plot.format(d=tmp_path)]) == 2
    assert one_line_error(capsys) == "paddlejax inspect: error: " + message.format(d=tmp_path)
    assert not tmp_path.with_suffix(".png").exists()


def test_demo_refuses_zero_epochs_before_writing(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--epochs", "0", "--no-progress"]) == 2
    assert one_line_error(capsys) == "paddlejax demo: error: --epochs must be positive, got 0"
    assert not (tmp_path / "demo").exists()
