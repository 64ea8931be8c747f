"""``pj.convert.from_paddle``: PaddlePaddle inference models, legacy and PIR, as programs.

The fixtures are a residual CNN, a MobileNetV3-small, a BERT-style encoder and a small U-Net, each saved by
paddlepaddle in the legacy format (2.6) and in PIR (3.3) with Paddle Inference's outputs beside
them (``fixtures/export_paddle.py``). Both formats hold the same weights.
"""
import pathlib

import numpy as np
import pytest
from paddle_cases import pdiparams, program

import paddlejax as pj
from paddlejax.convert import ConversionError, from_paddle

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
FORMATS = ["legacy", "pir"]


def fixture(model, fmt):
    return FIXTURES / f"paddle_{model}_{fmt}"


def reference(model, fmt):
    data = np.load(fixture(model, fmt).with_suffix(".npz"))
    return [data[k] for k in sorted(k for k in data.files if k.startswith("input"))], data["output"]


def op_types(prog):
    return {op.type for op in prog.walk()}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model, ops", [
    ("resnet", {"conv2d", "batch_norm", "relu", "pool2d", "linear", "softmax"}),
    ("mobilenet", {"conv2d", "batch_norm", "hard_swish", "hard_sigmoid", "relu", "pool2d", "linear"}),
    ("bert", {"embedding", "layer_norm", "linear", "matmul", "softmax", "gelu", "tanh"}),
    ("unet", {"conv2d_transpose", "interpolate", "group_norm", "prelu", "concat", "leaky_relu", "silu", "relu6",
              "sigmoid", "pool2d"}),
])
def test_imported_model_matches_paddle_inference(model, ops, fmt):
    prog = from_paddle(fixture(model, fmt))
    inputs, expected = reference(model, fmt)
    got = np.asarray(prog(*inputs))
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    assert ops <= op_types(prog), ops - op_types(prog)
    assert prog.name == f"paddle_{model}_{fmt}"


def test_parameters_keep_paddle_names_and_dynamic_sizes_are_symbolic():
    prog = from_paddle(fixture("bert", "pir"))
    assert [str(v.type) for v in prog.inputs] == ["i32[b,d1]", "i32[b,d1]"]
    names = set(prog.params)
    assert {"embedding_0.w_0", "layer_norm_0.w_0", "linear_12.w_0"} <= names


@pytest.mark.parametrize("fmt", FORMATS)
def test_symbolic_sequence_length_runs_at_other_sizes(fmt):
    """One program serves any batch and sequence length; each row is computed on its own."""
    prog = from_paddle(fixture("bert", fmt))
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 60, (3, 5)).astype(np.int64)
    segments = np.zeros_like(ids)
    batch = np.asarray(prog(ids, segments))
    rows = np.concatenate([np.asarray(prog(ids[i:i + 1], segments[i:i + 1])) for i in range(3)])
    assert batch.shape == (3, 3)
    np.testing.assert_allclose(batch, rows, rtol=1e-5, atol=1e-6)


def test_legacy_and_pir_programs_compute_the_same_function():
    legacy, pir = from_paddle(fixture("mobilenet", "legacy")), from_paddle(fixture("mobilenet", "pir"))
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(legacy(x)), np.asarray(pir(x)), rtol=1e-5, atol=1e-6)


def test_input_shapes_fix_and_name_sizes():
    prog = from_paddle(fixture("resnet", "pir"), input_shapes={"x": (4, None, None, None)})
    assert str(prog.inputs[0].type) == "f32[4,3,32,32]"
    named = from_paddle(fixture("bert", "legacy"), input_shapes={"ids": (None, "seq"), "segments": (None, "seq")})
    assert [str(v.type) for v in named.inputs] == ["i32[b,seq]", "i32[b,seq]"]


@pytest.mark.parametrize("shapes, message", [
    ({"y": (1, 3, 32, 32)}, "input_shapes names ['y'], which are not inputs of the model (['x'])"),
    ({"x": (1, 3)}, "input_shapes['x'] has 2 dims, the model's input has 4"),
    ({"x": (1, 4, 32, 32)}, "input_shapes['x'] sets axis 1 to 4, but the model fixes it to 3"),
])
def test_bad_input_shapes_are_refused(shapes, message):
    with pytest.raises(ConversionError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        from_paddle(fixture("resnet", "legacy"), input_shapes=shapes)


def test_a_directory_with_one_model_is_read(tmp_path):
    """PaddleOCR ships each model as a directory: inference.pdmodel (or .json) + inference.pdiparams."""
    import shutil

    for suffix in (".json", ".pdiparams"):
        shutil.copy(fixture("resnet", "pir").with_suffix(suffix), tmp_path / f"inference{suffix}")
    inputs, expected = reference("resnet", "pir")
    prog = from_paddle(tmp_path)
    assert prog.name == "inference"
    np.testing.assert_allclose(np.asarray(prog(*inputs)), expected, rtol=1e-4, atol=1e-6)
    shutil.copy(fixture("bert", "legacy").with_suffix(".pdmodel"), tmp_path / "other.pdmodel")
    shutil.copy(fixture("bert", "legacy").with_suffix(".pdiparams"), tmp_path / "other.pdiparams")
    with pytest.raises(ConversionError, match="holds 2 programs with parameters beside them .inference, other.; "
                                              "name one"):
        from_paddle(tmp_path)


def test_imported_program_saves_loads_and_takes_passes(tmp_path):
    prog = from_paddle(fixture("resnet", "legacy"))
    inputs, expected = reference("resnet", "legacy")
    pj.save(prog, tmp_path / "resnet")
    loaded = pj.load(tmp_path / "resnet")
    assert str(loaded) == str(prog)
    folded = pj.passes.PassManager(["fold_conv_bn"]).run(loaded)
    assert "batch_norm" not in op_types(folded)
    np.testing.assert_allclose(np.asarray(folded(*inputs)), expected, rtol=1e-4, atol=1e-6)


# -- ops, on programs built by hand --------------------------------------------------------------
def run_legacy(ops, inputs, params=None, outputs=("out",)):
    desc = program({n: (list(a.shape), a.dtype) for n, a in inputs.items()}, ops, list(outputs), params)
    prog = from_paddle(desc, pdiparams(params or {}))
    return np.asarray(prog(*inputs.values()))


def test_legacy_elementwise_axis_broadcasts_from_that_axis():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    bias = np.arange(3, dtype=np.float32)
    got = run_legacy([("elementwise_add", {"X": ["x"], "Y": ["bias"]}, {"Out": ["out"]}, {"axis": 1})],
                     {"x": x}, {"bias": bias})
    np.testing.assert_allclose(got, x + bias[None, :, None, None])


def test_legacy_scale_and_slices_with_tensor_lists():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ops = [("fill_constant", {}, {"Out": ["start"]}, {"shape": [1], "value": 1.0, "dtype": 2}),
           ("slice", {"Input": ["x"], "StartsTensorList": ["start"]}, {"Out": ["s"]},
            {"axes": [2], "starts": [-1], "ends": [1000000], "decrease_axis": []}),
           ("scale", {"X": ["s"]}, {"Out": ["out"]}, {"scale": 2.0, "bias": 1.0, "bias_after_scale": False})]
    np.testing.assert_allclose(run_legacy(ops, {"x": x}), (x[:, :, 1:] + 1.0) * 2.0)


def test_legacy_mul_flattens_by_num_col_dims():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((12, 5)).astype(np.float32)
    got = run_legacy([("mul", {"X": ["x"], "Y": ["w"]}, {"Out": ["out"]}, {"x_num_col_dims": 1, "y_num_col_dims": 1})],
                     {"x": x}, {"w": w})
    np.testing.assert_allclose(got, x.reshape(2, 12) @ w, rtol=1e-5)


def test_parameters_of_other_dtypes_are_read():
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    x = np.ones((4, 2), np.float16)
    got = run_legacy([("matmul_v2", {"X": ["x"], "Y": ["w"]}, {"Out": ["out"]}, {})], {"x": x}, {"w": w})
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, x @ w)


# -- errors ----------------------------------------------------------------------------------------
def test_unsupported_ops_are_all_listed_before_any_work():
    desc = program({"x": ([2, 3], np.float32)},
                   [("yolo_box", {"X": ["x"]}, {"Boxes": ["a"]}, {}),
                    ("multiclass_nms3", {"BBoxes": ["a"]}, {"Out": ["b"]}, {}),
                    ("yolo_box", {"X": ["x"]}, {"Boxes": ["c"]}, {})], ["b"])
    with pytest.raises(ConversionError) as info:
        from_paddle(desc, b"")
    message = str(info.value)
    assert "ops that have no conversion" in message
    assert "multiclass_nms3: op 2 (multiclass_nms3 → b)" in message
    assert "yolo_box: op 1 (yolo_box → a), op 3 (yolo_box → c)" in message


def test_control_flow_is_named():
    desc = program({"x": ([2], np.float32)}, [], ["x"])
    from paddlejax.convert import paddle_format

    parsed = paddle_format.message_class("ProgramDesc").FromString(desc)
    op = parsed.blocks[0].ops.add(type="conditional_block")
    attr = op.attrs.add(name="sub_block")
    attr.type, attr.block_idx = 8, 1
    with pytest.raises(ConversionError, match=r"conditional_block \(control flow\)"):
        from_paddle(parsed.SerializeToString(), b"")


def test_corrupt_and_mismatched_files_are_refused(tmp_path):
    model = fixture("resnet", "legacy")
    params = model.with_suffix(".pdiparams").read_bytes()
    desc = model.with_suffix(".pdmodel").read_bytes()
    with pytest.raises(ConversionError, match="is truncated or not a .pdiparams file"):
        from_paddle(desc, params[:-100])
    with pytest.raises(ConversionError, match="has 3 bytes after the 47 parameters"):
        from_paddle(desc, params + b"\x00\x00\x00")
    other = fixture("bert", "legacy").with_suffix(".pdiparams").read_bytes()
    with pytest.raises(ConversionError, match="the files belong to different models|is truncated"):
        from_paddle(desc, other)
    with pytest.raises(ConversionError, match="is not a Paddle ProgramDesc"):
        from_paddle(b"\xff\xff\xff garbage", params)
    (tmp_path / "m.json").write_text('{"program": {}}')
    (tmp_path / "m.pdiparams").write_bytes(b"")
    with pytest.raises(ConversionError, match="is JSON but not a Paddle PIR program"):
        from_paddle(tmp_path / "m.json")
    (tmp_path / "m.json").write_text('{"base_code": {"magic": "pir", "version": 9}, "program": {}}')
    with pytest.raises(ConversionError, match="PIR program version 9 is not one this importer reads"):
        from_paddle(tmp_path / "m")
    (tmp_path / "m.json").write_text('{"base_code": {"magic": "pir", "version": 4}, "program": {"regions": [{"blocks"'
                                     ': [{"ops": [{"#": "1.relu", "I": [{"id": 1}]}]}]}]}}')
    with pytest.raises(ConversionError, match="PIR op 0 is malformed"):
        from_paddle(tmp_path / "m.json")
    with pytest.raises(ConversionError, match="no program at .*nothing"):
        from_paddle(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="holds 0 programs with parameters beside them"):
        from_paddle(tmp_path / "empty")
    (tmp_path / "lonely.pdmodel").write_bytes(desc)
    with pytest.raises(ConversionError, match=r"lonely.pdiparams is missing\); pass params="):
        from_paddle(tmp_path / "lonely.pdmodel")


def test_hostile_parameter_headers_and_json_are_refused():
    """Sizes that would overflow or nest without end end in a ConversionError, not a crash."""
    import struct

    from paddlejax.convert import paddle_format

    desc = paddle_format.message_class("TensorDesc")(data_type=5, dims=[2 ** 40, 2 ** 40]).SerializeToString()
    huge = struct.pack("<IQI", 0, 0, 0) + struct.pack("<i", len(desc)) + desc + b"\x00" * 16
    with pytest.raises(ConversionError, match="ends inside parameter 'w'"):
        paddle_format.read_params(huge, ["w"])
    negative = struct.pack("<IQI", 0, 0, 0) + struct.pack("<i", -5)
    with pytest.raises(ConversionError, match="ends inside parameter 'w'"):
        paddle_format.read_params(negative, ["w"])
    with pytest.raises(ConversionError, match="is not PIR JSON"):
        paddle_format.read_pir(b"[" * 100_000 + b"]" * 100_000)
