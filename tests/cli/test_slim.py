"""paddlejax slim quantize: an int8 program from a saved one and a .npy calibration file, with
the per-layer error table and chart; bad calibration files are refused by name. paddlejax slim
prune: a program with fewer channels, to a FLOPs target or by ratios."""
import re

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main


@pytest.fixture
def mlp(tmp_path):
    rng = np.random.default_rng(0)
    params = {"l1.w": rng.normal(size=(6, 8)).astype(np.float32), "l2.w": rng.normal(size=(8, 3)).astype(np.float32)}
    prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.relu(pj.ops.linear(x, p["l1.w"])), p["l2.w"]),
                    pj.InputSpec((None, 6)), params=params)
    pj.save(prog, tmp_path / "mlp")
    np.save(tmp_path / "calib.npy", rng.normal(size=(40, 6)).astype(np.float32))
    return prog, tmp_path


def test_quantize_writes_the_int8_program_the_table_and_the_chart(mlp, capsys):
    prog, tmp = mlp
    args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / "calib.npy"), "--algo", "abs_max",
            "--batch-size", "16", "-o", str(tmp / "int8"), "--report", str(tmp / "errors.png")]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "<lambda>: 2 layers quantized (abs_max, 40 calibration samples); error on the first batch:"
    assert lines[1].split()[:3] == ["layer", "op", "shape"]
    assert [line.split()[:3] for line in lines[2:4]] == [["l1.w", "quantized_linear", "16x8"],
                                                         ["l2.w", "quantized_linear", "16x3"]]
    assert all(float(line.split()[-1]) > 0.999 for line in lines[2:4])  # cosine to the float layer
    assert (tmp / "errors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    int8 = pj.load(tmp / "int8")
    x = np.load(tmp / "calib.npy")[:5]
    assert np.abs(np.asarray(int8(x)) - np.asarray(prog(x))).max() < 0.05 * np.abs(np.asarray(prog(x))).max()


def test_bias_correction_gives_the_layers_a_corrected_bias(mlp, capsys):
    _, tmp = mlp
    args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / "calib.npy"), "--weight-bits", "4",
            "--bias-correction", "-o", str(tmp / "int4")]
    assert main(args) == 0
    assert sorted(k for k in pj.load(tmp / "int4").params if "bias" in k) == ["l1.w.bias_correction",
                                                                              "l2.w.bias_correction"]


def test_bad_calibration_files_are_refused(mlp, capsys):
    _, tmp = mlp
    np.save(tmp / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp / "empty.npy", np.zeros((0, 6), np.float32))
    np.save(tmp / "wrong.npy", np.zeros((4, 5), np.float32))
    with open(tmp / "forged.npy", "wb") as f:  # a header claiming far more data than follows it
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (9999999, 6)})
    for name, message in [("objects.npy", "objects.npy: holds Python objects (object), which would need unpickling"),
                          ("forged.npy", "its header declares float32[9999999, 6] (239,999,976 bytes) but 0 bytes"),
                          ("mlp.json", "mlp.json: not a .npy array (the magic string is not correct"),
                          ("", "not a regular file"),
                          ("empty.npy", "the calibration array is empty"),
                          ("wrong.npy", "calibrate: batch 0 does not fit")]:
        args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / name), "-o", str(tmp / "out")]
        assert main(args) == 2
        assert message in capsys.readouterr().err
    assert not (tmp / "out.json").exists()


def test_asymmetric_activations_from_the_command_line(mlp, capsys):
    prog, tmp = mlp
    args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / "calib.npy"), "--algo", "min_max",
            "--asymmetric", "-o", str(tmp / "asym")]
    assert main(args) == 0
    int8 = pj.load(tmp / "asym")
    assert [op.type for op in int8.walk() if op.type.startswith("quantize")] == ["quantize_asym", "quantized_linear"] * 2
    x = np.load(tmp / "calib.npy")[:5]
    assert np.abs(np.asarray(int8(x)) - np.asarray(prog(x))).max() < 0.05 * np.abs(np.asarray(prog(x))).max()


@pytest.fixture
def cnn(tmp_path):
    """A saved conv (padded) -> relu -> linear program big enough for its weights to outweigh the file headers."""
    rng = np.random.default_rng(0)
    params = {"conv.w": rng.normal(size=(16, 8, 3, 3)).astype(np.float32),
              "fc.w": rng.normal(size=(16 * 4 * 4, 32)).astype(np.float32)}

    def net(p, x):
        h = pj.ops.relu(pj.ops.conv2d(x, p["conv.w"], padding=1))
        return pj.ops.linear(pj.ops.reshape(h, shape=(0, -1)), p["fc.w"])

    prog = pj.trace(net, pj.InputSpec((None, 8, 4, 4)), params=params)
    pj.save(prog, tmp_path / "cnn")
    np.save(tmp_path / "calib.npy", rng.normal(size=(16, 8, 4, 4)).astype(np.float32))
    return prog, tmp_path


def test_int4_weights_are_packed_and_the_saved_file_is_about_eight_times_smaller(cnn, capsys):
    prog, tmp = cnn
    args = ["slim", "quantize", str(tmp / "cnn"), "--calib", str(tmp / "calib.npy"), "--weight-bits", "4",
            "-o", str(tmp / "int4")]
    assert main(args) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == "net: 2 layers quantized (int4 weight-only, 16 calibration samples); error on the first batch:"
    assert [line.split()[:2] for line in lines[2:4]] == [["conv.w", "weight_only_conv2d"],
                                                         ["fc.w", "weight_only_linear"]]
    assert lines[4] == "weights: 36.5 KiB -> 4.8 KiB (7.7x smaller)"  # 4-bit values and a float32 scale per channel
    assert "warning" not in out.err
    int4 = pj.load(tmp / "int4")
    assert {k: (v.dtype.name, v.shape) for k, v in int4.params.items() if k.endswith(".int4")} == {
        "conv.w.int4": ("uint8", (8, 8, 3, 3)), "fc.w.int4": ("uint8", (128, 32))}  # two weights per byte
    ratio = (tmp / "cnn.safetensors").stat().st_size / (tmp / "int4.safetensors").stat().st_size
    assert ratio > 7
    x = np.load(tmp / "calib.npy")[:4]
    want = np.asarray(prog(x))
    assert np.abs(np.asarray(int4(x)) - want).max() < 0.2 * np.abs(want).max()


def test_asymmetric_activations_quantize_padded_convolutions_too(cnn, capsys):
    prog, tmp = cnn
    args = ["slim", "quantize", str(tmp / "cnn"), "--calib", str(tmp / "calib.npy"), "--algo", "min_max",
            "--asymmetric", "-o", str(tmp / "asym")]
    assert main(args) == 0
    out = capsys.readouterr()
    assert out.out.startswith("net: 2 layers quantized (min_max,") and "warning" not in out.err
    asym = pj.load(tmp / "asym")
    assert [op.type for op in asym.walk() if op.type.startswith(("quantize", "pad"))] == [
        "quantize_asym", "pad", "quantized_conv2d", "quantize_asym", "quantized_linear"]
    x = np.load(tmp / "calib.npy")[:4]
    want = np.asarray(prog(x))
    assert np.abs(np.asarray(asym(x)) - want).max() < 0.05 * np.abs(want).max()


def test_quantize_help_describes_the_command_and_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["slim", "quantize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Post-training quantization of a saved program: int8 weights and activations" in text
    assert "--weight-bits {8,4} 8: int8 weights and activations (default); 4: int4 weights packed" in text
    assert "moving_average_abs_max, min_max (default hist; min_max for --asymmetric)" in text
    assert set(pj.slim.quant.OBSERVERS) - {"channel_wise_abs_max"} == set(text.split("calibrated: ")[1]
                                                                           .split(" (default")[0].split(", "))


def test_asymmetric_without_algo_calibrates_by_the_range(mlp, capsys):
    prog, tmp = mlp
    args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / "calib.npy"), "--asymmetric", "-o", str(tmp / "asym")]
    assert main(args) == 0
    assert "(min_max, 40 calibration samples)" in capsys.readouterr().out
    assert "quantize_asym" in [op.type for op in pj.load(tmp / "asym").walk()]


@pytest.mark.parametrize("extra, message", [
    (["-o", "{d}/mlp"], "-o {d}/mlp would overwrite the input {d}/mlp; give another path"),
    (["-o", "{d}/mlp.json"], "-o {d}/mlp.json would overwrite the input {d}/mlp; give another path"),
    (["-o", "{d}/sub/"], "-o {d}/sub/ names a directory; give the program's path inside it, e.g. {d}/sub/model"),
    (["-o", "{d}/out", "--report", "{d}/errors.txt"],
     "--report {d}/errors.txt must end in .png or .svg or .pdf or .jpg or .jpeg"),
    (["-o", "{d}/out", "--report", "{d}"], "--report {d} names a directory; give a file name"),
])
def test_bad_output_paths_are_refused_before_anything_is_written(mlp, capsys, extra, message):
    prog, tmp = mlp
    before = (tmp / "mlp.json").read_bytes(), (tmp / "mlp.safetensors").read_bytes()
    args = ["slim", "quantize", str(tmp / "mlp"), "--calib", str(tmp / "calib.npy"), *(a.format(d=tmp) for a in extra)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"paddlejax slim: error: {message.format(d=tmp)}\n"
    assert sorted(p.name for p in tmp.iterdir()) == ["calib.npy", "mlp.json", "mlp.safetensors"]
    assert ((tmp / "mlp.json").read_bytes(), (tmp / "mlp.safetensors").read_bytes()) == before


@pytest.fixture
def digits_cnn(tmp_path):
    from paddlejax.models.digits import DigitsCNN

    pj.nn.seed(0)
    model = DigitsCNN()
    model.eval()
    prog = pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))
    pj.save(prog, tmp_path / "cnn")
    return prog, tmp_path


def test_prune_to_a_flops_target_prints_the_groups_and_saves_smaller_weights(digits_cnn, capsys):
    prog, tmp = digits_cnn
    assert main(["slim", "prune", str(tmp / "cnn"), "--flops", "0.5", "-o", str(tmp / "small")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "DigitsCNN: 3 prunable groups (l1_norm)"
    assert [line.split() for line in lines[2:5]] == [["features.0.weight", "32", "22"],
                                                     ["features.3.weight", "64", "44"],
                                                     ["features.7.weight", "128", "88"]]
    removed = float(re.search(r"\((\d+\.\d)% removed\)", lines[5]).group(1))
    assert 50.0 <= removed < 60.0
    small = pj.load(tmp / "small")
    assert small.params["fc.weight"].shape == (88 * 4, 10)
    assert np.asarray(small(np.zeros((2, 1, 8, 8), np.float32))).shape == (2, 10)


def test_prune_by_named_ratios(digits_cnn, capsys):
    _, tmp = digits_cnn
    assert main(["slim", "prune", str(tmp / "cnn"), "--ratios", "features.3.weight=0.5", "--criterion", "bn_scale",
                 "-o", str(tmp / "small")]) == 0
    small = pj.load(tmp / "small")
    assert small.params["features.3.weight"].shape == (32, 32, 3, 3)
    assert small.params["features.0.weight"].shape == (32, 1, 3, 3)


@pytest.mark.parametrize("args, message", [
    (["--ratios", "nope=0.5"], r"\['nope'\] produce no prunable channels"),
    (["--ratios", "features.0.weight"], "--ratios expects NAME=RATIO"),
    (["--ratio", "0.5", "--criterion", "vibes"], "criterion must be one of"),
    (["--flops", "2"], r"in \(0, 1\)"),
])
def test_prune_errors_are_one_line(digits_cnn, capsys, args, message):
    _, tmp = digits_cnn
    assert main(["slim", "prune", str(tmp / "cnn"), *args, "-o", str(tmp / "small")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not (tmp / "small.json").exists()


def test_sparsify_2_4_prints_the_densities_and_saves_the_program_sparse(digits_cnn, capsys):
    from paddlejax.slim.sparsity import check_sparsity

    _, tmp = digits_cnn
    assert main(["slim", "sparsify", str(tmp / "cnn"), "-o", str(tmp / "sparse")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "DigitsCNN: 3 of 4 weights sparse, 2:4 (mask_1d)"
    assert [line.split() for line in lines[2:6]] == [["features.0.weight", "32x1x3x3", "1.000", "1.000"],
                                                     ["features.3.weight", "64x32x3x3", "1.000", "0.500"],
                                                     ["features.7.weight", "128x64x3x3", "1.000", "0.500"],
                                                     ["fc.weight", "512x10", "1.000", "0.500"]]
    assert re.fullmatch(r"tensors: 385\.4 KiB dense -> \d+\.\d KiB stored \(0\.5\d of dense\)", lines[6]), lines[6]
    sparse = pj.load(tmp / "sparse")
    assert check_sparsity(sparse.params["features.7.weight"], 2, 4, axis=1)
    assert (tmp / "sparse.safetensors").stat().st_size < 0.6 * (tmp / "cnn.safetensors").stat().st_size


def test_sparsify_by_magnitude_globally_with_excluded_weights(digits_cnn, capsys):
    from paddlejax.slim.sparsity import sparsity

    _, tmp = digits_cnn
    args = ["slim", "sparsify", str(tmp / "cnn"), "--ratio", "0.75", "--scope", "global", "--exclude", "fc.weight",
            "--min-size", "0", "-o", str(tmp / "sparse")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("DigitsCNN: 3 of 4 weights sparse, 75% by magnitude (global)\n")
    density = sparsity(pj.load(tmp / "sparse"))
    assert density["fc.weight"] == 1.0
    sizes = {"features.0.weight": 288, "features.3.weight": 18432, "features.7.weight": 73728}
    assert sum(density[k] * n for k, n in sizes.items()) == pytest.approx(0.25 * sum(sizes.values()), abs=1)


@pytest.mark.parametrize("args, message", [
    (["--ratio", "0.5", "--n", "2"], r"give --ratio \(unstructured\) or --n and --m \(N:M\), not both"),
    (["--ratio", "1.5"], r"ratio is the fraction of weights to zero, in \[0, 1\)"),
    (["--n", "4", "--m", "4"], "0 < n < m"),
    (["--exclude", "fc.bias"], r"exclude names \['fc.bias'\], which no op reads as a weight"),
])
def test_sparsify_errors_are_one_line(digits_cnn, capsys, args, message):
    _, tmp = digits_cnn
    assert main(["slim", "sparsify", str(tmp / "cnn"), *args, "-o", str(tmp / "sparse")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not (tmp / "sparse.json").exists()


def test_compress_times_candidates_and_saves_the_chosen_one(mlp, capsys):
    prog, tmp = mlp
    np.savez(tmp / "samples.npz", x=np.load(tmp / "calib.npy"))
    args = ["slim", "compress", str(tmp / "mlp"), "--data", str(tmp / "samples.npz"), "--target-speedup", "0.01",
            "--strategies", "ptq", "--batch-size", "8", "--plot", str(tmp / "act.png"), "-o", str(tmp / "small")]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "<lambda>: auto-compression, target 0.01x"
    assert [line.split()[0] for line in lines[2:4]] == ["original", "ptq"]
    assert lines[3].endswith("<- chosen") and lines[4] == "target: 0.01x speed-up, met"
    assert lines[5] == f"saved {tmp / 'small'} (ptq)"
    assert any(op.type == "quantized_linear" for op in pj.load(tmp / "small").walk())
    assert (tmp / "act.png").read_bytes()[:4] == b"\x89PNG"


COMPRESS_YAML = """\
version: 1.0
pruners:
    pruner_1:
        class: 'StructurePruner'
        pruning_axis: {'*': 0}
        criterions: {'*': 'l1_norm'}
distillers:
    l2_distiller:
        class: 'L2Distiller'
        teacher_feature_map: 'output'
        student_feature_map: 'output'
        distillation_loss_weight: 1
strategies:
    uniform_pruning_strategy:
        class: 'UniformPruneStrategy'
        pruner: 'pruner_1'
        start_epoch: 0
        target_ratio: 0.5
        pruned_params: 'features\\.[037]\\.weight'
        metric_name: 'acc_top1'
    distillation_strategy:
        class: 'DistillationStrategy'
        distillers: ['l2_distiller']
        start_epoch: 0
        end_epoch: 1
compressor:
    epoch: 1
    checkpoint_path: './checkpoints/'
    strategies:
        - uniform_pruning_strategy
        - distillation_strategy
"""


def test_compress_runs_a_paddleslim_1x_config(digits_cnn, capsys):
    prog, tmp = digits_cnn
    (tmp / "compress.yaml").write_text(COMPRESS_YAML)
    np.save(tmp / "x.npy", pj.data.Digits("train").arrays()[0][:48])
    args = ["slim", "compress", str(tmp / "cnn"), "--data", str(tmp / "x.npy"), "--config", str(tmp / "compress.yaml"),
            "--batch-size", "16", "-o", str(tmp / "small")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"DigitsCNN: compression config {tmp / 'compress.yaml'} (uniform_pruning_strategy, "
                          "distillation_strategy)\nread but without meaning here: compressor.checkpoint_path, "
                          "strategies.uniform_pruning_strategy.start_epoch, strategies.distillation_strategy.end_epoch, "
                          "strategies.distillation_strategy.start_epoch\n")
    assert re.search(r"^config\s+\d+\.\d{3}\s+\d+\.\d\dx", out, re.M), out
    small = pj.load(tmp / "small")
    assert small.params["features.0.weight"].shape[0] < prog.params["features.0.weight"].shape[0]


@pytest.mark.parametrize("config, message", [
    ("strategies: {s: {class: 'UniformPruneStrategy', pruner: 'p9'}}", "names 'p9', which pruners does not define"),
    ("strategies: {s: {class: 'MagicStrategy'}}", "has class 'MagicStrategy'"),
    ("strategies: {s: {class: 'QuantizationStrategy', weight_bitz: 8}}", "unknown key 'weight_bitz'"),
    ("strategies: {s: {class: 'QuantizationStrategy', weight_bits: 4}}", "8-bit quantization only"),
    ("!!python/object/apply:os.system ['echo hacked']", "not valid YAML"),
    ("strategies: [1, 2", "not valid YAML"),
])
def test_compress_config_errors_are_one_line_and_nothing_trains(mlp, capsys, config, message):
    _, tmp = mlp
    (tmp / "bad.yaml").write_text(config)
    args = ["slim", "compress", str(tmp / "mlp"), "--data", str(tmp / "calib.npy"), "--config", str(tmp / "bad.yaml"),
            "-o", str(tmp / "small")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not (tmp / "small.json").exists()


def test_compress_refuses_samples_that_do_not_fit(mlp, capsys):
    _, tmp = mlp
    np.save(tmp / "wide.npy", np.zeros((10, 7), np.float32))
    assert main(["slim", "compress", str(tmp / "mlp"), "--data", str(tmp / "wide.npy"), "-o", str(tmp / "s")]) == 2
    assert "samples for input 'x' have shape (10, 7), the program takes f32[b,6]" in capsys.readouterr().err
