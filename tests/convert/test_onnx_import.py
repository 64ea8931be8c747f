"""Whole ONNX models as programs: PP-OCRv4's det, cls and rec models (shipped by
rapidocr-onnxruntime) on a real image, PyTorch exports with dynamic sizes, and what users do
next with the program (save, load, passes, the Predictor); bad files get clear errors."""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_cases import make_model, relative_error, run_onnxruntime

import paddlejax as pj
from paddlejax.convert import ConversionError

FIXTURES = pathlib.Path(__file__).with_name("fixtures")
OCR_MODELS = pathlib.Path(importlib.util.find_spec("rapidocr_onnxruntime").submodule_search_locations[0]) / "models"
DET, CLS, REC = (OCR_MODELS / f for f in ("ch_PP-OCRv4_det_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                                         "ch_PP-OCRv4_rec_infer.onnx"))


def text_image(height: int, width: int, text: str = "Hello paddlejax 2026") -> np.ndarray:
    """``text`` rendered black on white in Pillow's scalable font, ``height x width``, as PP-OCR's
    normalised NCHW RGB batch of 1: (pixel / 255 - 0.5) / 0.5."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (448, 96), 255)
    ImageDraw.Draw(image).text((16, 24), text, fill=0, font=ImageFont.load_default(size=36))
    gray = np.asarray(image.resize((width, height), Image.BILINEAR), np.float32)
    return (np.repeat(gray[None, None] / 255.0, 3, axis=1) - 0.5) / 0.5


def ort_outputs(path, **inputs):
    return run_onnxruntime(onnx.load(str(path)), inputs)


def test_ppocr_det_matches_onnxruntime_on_real_text():
    x = text_image(96, 448)
    prog = pj.convert.from_onnx(DET, input_shapes={"x": (None, 3, 96, 448)})
    want = ort_outputs(DET, x=x)[0]
    got = np.asarray(prog(x))
    assert got.shape == want.shape == (1, 1, 96, 448)
    assert want.max() > 0.9  # the image has text: the probability map is not empty
    assert relative_error(got, want) <= 1e-4
    types = {op.type for op in prog.walk()}
    assert {"conv2d", "conv2d_transpose", "batch_norm", "hard_sigmoid", "relu6", "sigmoid"} <= types


def test_ppocr_det_and_rec_with_sizes_in_multiples_run_at_any_such_size():
    """Height and width as multiples of the models' strides (``32*h``, ``8*w``): one program for
    every image and line size, as onnxruntime runs the file."""
    det = pj.convert.from_onnx(DET, input_shapes={"x": (None, 3, "32*h", "32*w")})
    assert str(det.inputs[0].type) == "f32[b,3,32*h,32*w]"
    for height, width in ((64, 96), (96, 224)):
        x = text_image(height, width)
        assert relative_error(det(x), ort_outputs(DET, x=x)[0]) <= 1e-4
    with pytest.raises(ValueError, match=r"expects f32\[b,3,32\*h,32\*w\], got f32\[1,3,70,96\]"):
        det(text_image(70, 96))
    rec = pj.convert.from_onnx(REC, input_shapes={"x": (None, 3, 48, "8*w")})
    x = text_image(48, 160)
    got = np.asarray(rec(x))
    assert got.shape == (1, 20, 6625) and relative_error(got, ort_outputs(REC, x=x)[0]) <= 1e-4


def test_ppocr_cls_and_rec_match_onnxruntime_with_a_symbolic_batch():
    line = text_image(48, 320)
    batch = np.concatenate([line, line[:, :, :, ::-1], 0.5 * line])  # upright, mirrored, faded
    rec = pj.convert.from_onnx(REC, input_shapes={"x": (None, 3, 48, 320)})
    assert rec.inputs[0].type.shape == ("b", 3, 48, 320)
    for n in (1, 3):
        want = ort_outputs(REC, x=batch[:n])[0]
        got = np.asarray(rec(batch[:n]))
        assert got.shape == want.shape == (n, 40, 6625)
        assert relative_error(got, want) <= 1e-4
        assert (got.argmax(-1) == want.argmax(-1)).all()  # the same characters are read
    cls = pj.convert.from_onnx(CLS, input_shapes={"x": (None, 3, 48, 192)})
    crops = batch[:, :, :, :192]
    assert relative_error(cls(crops), ort_outputs(CLS, x=crops)[0]) <= 1e-4


def test_rec_model_keeps_weight_names_and_its_dictionary_metadata_is_readable():
    prog = pj.convert.from_onnx(REC, input_shapes={"x": (None, 3, 48, 320)})
    assert "conv2d_0.w_0" in prog.params or any(n.startswith("conv2d_") for n in prog.params)
    assert all(np.asarray(v).dtype == np.float32 for v in prog.params.values())
    characters = {p.key: p.value for p in onnx.load(str(REC)).metadata_props}["character"].splitlines()
    assert len(characters) == 6623  # the CTC blank and the space make the model's 6625 classes


def test_torch_encoder_with_dynamic_batch_and_sequence():
    prog = pj.convert.from_onnx(FIXTURES / "torch_encoder.onnx")
    ids_type = prog.inputs[0].type
    assert ids_type.dtype == "int32" and ids_type.shape[0] == "b" and isinstance(ids_type.shape[1], str)
    types = {op.type for op in prog.walk()}
    assert {"layer_norm", "linear", "matmul", "softmax"} <= types
    for shape in ((2, 7), (3, 4), (1, 11)):
        ids = np.random.default_rng(sum(shape)).integers(0, 50, shape)
        want = ort_outputs(FIXTURES / "torch_encoder.onnx", ids=ids)[0]
        assert relative_error(prog(ids.astype(np.int32)), want) <= 1e-4


def test_torch_cnn_then_save_load_passes_and_predictor(tmp_path):
    path = FIXTURES / "torch_rescnn.onnx"
    x = np.random.default_rng(1).normal(size=(5, 3, 16, 16)).astype(np.float32)
    want = ort_outputs(path, x=x)[0]
    prog = pj.convert.from_onnx(path, input_shapes={"x": (None, 3, 16, 16)})
    assert relative_error(prog(x), want) <= 1e-4
    pj.save(prog, tmp_path / "cnn")
    loaded = pj.load(tmp_path / "cnn")
    assert str(loaded) == str(prog)
    assert relative_error(loaded(x), want) <= 1e-4
    predictor = pj.inference.Predictor(loaded, pj.inference.Config(max_batch_size=4))
    assert relative_error(predictor(x), want) <= 1e-4


def test_passes_fold_the_imported_batch_norms_and_keep_the_function():
    x = text_image(48, 192)
    prog = pj.convert.from_onnx(CLS, input_shapes={"x": (None, 3, 48, 192)})
    before = sum(op.type == "batch_norm" for op in prog.walk())
    folded = pj.passes.run(prog, ["fold_conv_bn"])
    assert before == 35 and sum(op.type == "batch_norm" for op in folded.walk()) < before
    assert relative_error(folded(x), prog(x)) <= 1e-4


def test_a_weight_returned_as_it_is_stays_a_named_parameter():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["w"], ["w_out"])]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y", "w_out"], initializers={"w": w})
    prog = pj.convert.from_onnx(model)
    assert [op.attrs["name"] for op in prog.param_ops()] == ["w"]
    np.testing.assert_array_equal(prog(np.ones((2, 3), np.float32))[1], w)


def test_a_gemm_transb_weight_is_a_parameter_that_quantization_converts():
    """PyTorch's nn.Linear exports Gemm(transB=1); its weight is stored transposed at import, so
    ``linear`` reads the parameter itself and post-training quantization stores it as int8."""
    rng = np.random.default_rng(0)
    w, c = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    model = make_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)], {"x": x}, ["y"],
                       initializers={"w": w, "c": c}, dynamic={"x": [None, 6]})
    prog = pj.convert.from_onnx(model)
    linear = next(op for op in prog.walk() if op.type == "linear")
    assert linear.operands[1].owner.type == "param" and prog.params["w"].shape == (6, 4)
    assert relative_error(prog(x), x @ w.T + c) <= 1e-5
    int8 = pj.slim.quant_post(prog, [x], progress=False)
    assert "linear" not in {op.type for op in int8.walk()} and int8.params["w.int8"].dtype == np.int8
    assert relative_error(int8(x), x @ w.T + c) <= 0.05


# -- errors ------------------------------------------------------------------------------------
def _relu_model(**kw):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros((2, 3), np.float32)}, ["y"], **kw)


def test_unsupported_ops_are_all_named_with_their_nodes():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("NonMaxSuppression", ["a"], ["b"], name="nms_1"),
             helper.make_node("Loop", ["b"], ["c"], name="loop"),
             helper.make_node("FancyOp", ["c"], ["y"], domain="com.example", name="fancy")]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"])
    with pytest.raises(ConversionError) as info:
        pj.convert.from_onnx(model)
    message = str(info.value)
    assert "NonMaxSuppression: node 'nms_1'" in message and "Loop: node 'loop'" in message
    assert "com.example::FancyOp: node 'fancy'" in message


@pytest.mark.parametrize("data, expected", [
    (b"\x08\x07\x12\x00garbage that is not protobuf \xff\xfe", "the bytes given are not a readable ONNX model"),
    (b"", "imports no version of the default ONNX domain"),
])
def test_garbage_bytes_raise_conversion_errors(data, expected):
    with pytest.raises(ConversionError, match=expected):
        pj.convert.from_onnx(data)


def test_truncated_and_missing_files(tmp_path):
    data = DET.read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError, match="cut.onnx is not a readable ONNX model"):
        pj.convert.from_onnx(tmp_path / "cut.onnx")
    with pytest.raises(ConversionError, match="no such file"):
        pj.convert.from_onnx(tmp_path / "absent.onnx")
    with pytest.raises(TypeError, match="expected a path, bytes or an onnx.ModelProto"):
        pj.convert.from_onnx(42)


@pytest.mark.parametrize("opset", [6, 22])
def test_opsets_outside_the_supported_range_are_refused_by_number(opset):
    with pytest.raises(ConversionError, match=f"opset {opset} is not supported"):
        pj.convert.from_onnx(_relu_model(opset=opset))


def test_input_shapes_are_checked():
    model = _relu_model(dynamic={"x": ["n", 3]})
    with pytest.raises(ConversionError, match=r"names \['y'\], which are not inputs"):
        pj.convert.from_onnx(model, input_shapes={"y": (1, 3)})
    with pytest.raises(ConversionError, match="has 3 dims, the model's input has 2"):
        pj.convert.from_onnx(model, input_shapes={"x": (1, 3, 1)})
    with pytest.raises(ConversionError, match="sets axis 1 to 4, but the model fixes it to 3"):
        pj.convert.from_onnx(model, input_shapes={"x": (None, 4)})
    assert pj.convert.from_onnx(model, input_shapes={"x": (6, None)}).inputs[0].type.shape == (6, 3)


def test_a_shape_computed_from_input_values_is_refused_naming_the_node():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_data")]
    model = make_model(nodes, {"x": np.zeros((2, 3), np.float32), "s": np.array([3, 2], np.int64)}, ["y"])
    with pytest.raises(ConversionError, match="node 'reshape_by_data' \\(Reshape\\): shape .* must be known"):
        pj.convert.from_onnx(model)


def test_a_failing_node_is_named_and_symbolic_sizes_get_a_hint():
    x = np.zeros((1, 3, 8, 8), np.float32)
    nodes = [helper.make_node("Resize", ["x", "", "s"], ["y"], name="up", mode="linear")]
    model = make_model(nodes, {"x": x}, ["y"], initializers={"s": np.array([1, 1, 2, 2], np.float32)},
                       dynamic={"x": [1, 3, "h", "w"]})
    with pytest.raises(ConversionError, match="node 'up' \\(Resize\\).*input_shapes"):
        pj.convert.from_onnx(model)
    prog = pj.convert.from_onnx(model, input_shapes={"x": (1, 3, 8, 8)})
    assert prog(x).shape == (1, 3, 16, 16)
