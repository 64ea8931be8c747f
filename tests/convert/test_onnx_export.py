"""pj.convert.to_onnx: programs as ONNX models, run in onnxruntime on fresh random inputs and
compared with the program's own outputs — the model zoo's CNNs and BERT encoder, one case per
op (registry and generic lax ops, both layouts), symbolic sizes, opsets, float16/bfloat16
parameters, the way back through from_onnx, and the errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from flax import nnx
from onnx import TensorProto
from onnx_cases import relative_error, run_onnxruntime

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax import ops
from paddlejax.convert import ConversionError
from paddlejax.convert.onnx_export import to_onnx
from paddlejax.models import DigitsCNN, mobilenet_v2, resnet18
from paddlejax.models.bert import BertConfig, BertModel

rng = np.random.default_rng(0)


def normal(*shape, dtype=np.float32):
    return rng.normal(size=shape).astype(dtype)


def outputs(prog, *inputs) -> list[np.ndarray]:
    return [np.asarray(y) for y in jax.tree.leaves(prog(*inputs))]


def check_export(prog, *inputs, opset: int = 17, tol: float = 1e-4, model=None):
    """Export ``prog`` (unless ``model`` is given) and check that onnxruntime computes its outputs
    on ``inputs`` (structured as the program's: the graph takes their leaves)."""
    model = model or to_onnx(prog, opset=opset)
    got = run_onnxruntime(model, {i.name: np.asarray(x) for i, x in zip(model.graph.input, jax.tree.leaves(inputs))})
    want = outputs(prog, *inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert relative_error(g, w) <= tol
    return model


def randomised(prog):
    """``prog`` with random per-channel parameters (batch norm statistics, norm weights, biases):
    fresh models hold zeros and ones there, which would hide a mix-up of those inputs."""
    for name, value in prog.params.items():
        if np.ndim(value) == 1:
            positive = name.endswith(("variance", "weight"))
            values = rng.uniform(0.5, 1.5, np.shape(value)) if positive else rng.normal(0, 0.2, np.shape(value))
            prog.params[name] = jnp.asarray(values, np.asarray(value).dtype)
    return prog


def digits_program():
    """The digits CNN (conv, batch norm, ReLU, max pooling, linear) with a symbolic batch."""
    nn.seed(0)
    cnn = DigitsCNN()
    cnn.eval()
    return randomised(pj.to_static(cnn, pj.InputSpec((None, 1, 8, 8))))


def op_types(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# -- the model zoo --------------------------------------------------------------------------------

def _digits():
    return DigitsCNN(num_classes=4), (1, 8, 8)


def _resnet_vd():  # the deep stem and the average-pooled shortcuts (ceil_mode)
    return resnet18(variant="vd", num_classes=4), (3, 32, 32)


def _mobilenet_v2_nhwc():  # depthwise convolutions, relu6, in NHWC
    return mobilenet_v2(scale=0.25, num_classes=4, data_format="NHWC"), (32, 32, 3)


@pytest.mark.parametrize("build", [_digits, pytest.param(_resnet_vd, marks=pytest.mark.slow),
                                   pytest.param(_mobilenet_v2_nhwc, marks=pytest.mark.slow)],
                         ids=["digits_cnn", "resnet18_vd", "mobilenet_v2_nhwc"])
def test_zoo_cnns_match_at_two_batch_sizes(build):
    nn.seed(0)
    model, shape = build()
    model.eval()
    prog = randomised(pj.to_static(model, pj.InputSpec((None, *shape))))
    exported = to_onnx(prog)
    assert dims(exported.graph.input[0]) == ["b", *shape] and dims(exported.graph.output[0]) == ["b", 4]
    for batch in (1, 3):
        check_export(prog, normal(batch, *shape), model=exported)
    initializers = {t.name for t in exported.graph.initializer}
    assert set(prog.used_params()) <= initializers  # under their program names
    assert "BatchNormalization" in op_types(exported)


def test_resnet_keeps_parameter_names_and_maps_ops_naturally():
    nn.seed(0)
    model = resnet18(num_classes=4)
    model.eval()
    exported = to_onnx(pj.to_static(model, pj.InputSpec((None, 3, 32, 32))))
    weights = {t.name: t for t in exported.graph.initializer}
    assert list(weights["layer1.0.conv1.weight"].dims) == [64, 64, 3, 3]
    assert weights["layer1.0.bn1.mean"].data_type == TensorProto.FLOAT
    counts = {t: op_types(exported).count(t) for t in set(op_types(exported))}
    assert counts == {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "Add": 8, "MaxPool": 1,
                      "GlobalAveragePool": 1, "Reshape": 1, "Gemm": 1}


class _MobileBlock(nn.Layer):
    """A MobileNetV3-style block: expand, depthwise 3x3 with hard_swish, squeeze-and-excite with
    hard_sigmoid, project, residual."""

    def __init__(self, channels: int = 8, expand: int = 16):
        self.expand = nn.Conv2D(channels, expand, 1, bias_attr=False)
        self.bn1 = nn.BatchNorm2D(expand)
        self.depthwise = nn.Conv2D(expand, expand, 3, padding=1, groups=expand, bias_attr=False)
        self.bn2 = nn.BatchNorm2D(expand)
        self.pool = nn.AdaptiveAvgPool2D(1)
        self.squeeze = nn.Conv2D(expand, 4, 1)
        self.excite = nn.Conv2D(4, expand, 1)
        self.project = nn.Conv2D(expand, channels, 1, bias_attr=False)
        self.bn3 = nn.BatchNorm2D(channels)

    def forward(self, x):
        y = ops.hard_swish(self.bn1(self.expand(x)))
        y = ops.hard_swish(self.bn2(self.depthwise(y)))
        y = y * ops.hard_sigmoid(self.excite(ops.relu(self.squeeze(self.pool(y)))))
        return x + self.bn3(self.project(y))


def test_mobilenet_v3_style_block_with_depthwise_conv_and_hard_swish():
    nn.seed(0)
    block = _MobileBlock()
    block.eval()
    prog = randomised(pj.to_static(block, pj.InputSpec((None, 8, 6, 6))))
    exported = check_export(prog, normal(2, 8, 6, 6))
    assert {"HardSwish", "HardSigmoid", "GlobalAveragePool"} <= set(op_types(exported))
    depthwise = [n for n in exported.graph.node if n.op_type == "Conv" and
                 any(a.name == "group" and a.i == 16 for a in n.attribute)]
    assert len(depthwise) == 1


TINY_BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12)


@pytest.fixture(scope="module")
def bert_program():
    """A tiny BERT encoder taking ids and an attention mask of any batch size and length."""
    nn.seed(0)
    model = BertModel(BertConfig(**TINY_BERT))
    model.eval()
    spec = pj.InputSpec((None, "seq"), "int32")
    return randomised(pj.to_static(model, spec, None, None, spec))


def _bert_inputs(batch: int, seq: int):
    """``(input_ids, token_type_ids, position_ids, attention_mask)``, padded rows included."""
    ids = rng.integers(1, 100, (batch, seq)).astype(np.int32)
    mask = (np.arange(seq) < rng.integers(1, seq + 1, (batch, 1))).astype(np.int32)
    return ids, None, None, mask


def test_bert_encoder_matches_at_two_batch_sizes_and_lengths(bert_program):
    exported = to_onnx(bert_program)
    assert [dims(i) for i in exported.graph.input] == [["b", "seq"], ["b", "seq"]]
    for batch, seq in ((1, 5), (3, 9)):
        check_export(bert_program, *_bert_inputs(batch, seq), model=exported)
    assert {"Gather", "LayerNormalization", "MatMul", "Softmax", "Erf", "Where"} <= set(op_types(exported))


@pytest.mark.parametrize("opset", [17, 18, 20, 21])
def test_bert_encoder_in_each_opset(bert_program, opset):
    exported = check_export(bert_program, *_bert_inputs(2, 6), opset=opset)
    assert ("Gelu" in op_types(exported)) == (opset >= 20)
    assert exported.opset_import[0].version == opset


def test_from_onnx_of_to_onnx_gives_the_same_outputs(bert_program, tmp_path):
    prog = digits_program()
    to_onnx(prog, tmp_path / "digits.onnx")
    back = pj.convert.from_onnx(tmp_path / "digits.onnx")
    x = normal(3, 1, 8, 8)
    assert relative_error(back(x), prog(x)) <= 1e-5
    assert {"conv2d", "batch_norm", "pool2d", "linear"} <= {op.type for op in back.walk()}
    back = pj.convert.from_onnx(to_onnx(bert_program))
    inputs = _bert_inputs(2, 7)
    for got, want in zip(outputs(back, *jax.tree.leaves(inputs)), outputs(bert_program, *inputs)):
        assert relative_error(got, want) <= 1e-5


def test_a_saved_program_exports_to_a_file(tmp_path):
    pj.save(digits_program(), tmp_path / "digits")
    prog = pj.load(tmp_path / "digits")
    returned = to_onnx(prog, tmp_path / "digits.onnx", name="digits")
    written = onnx.load(str(tmp_path / "digits.onnx"))
    assert written == returned and written.graph.name == "digits"
    check_export(prog, normal(2, 1, 8, 8), model=written)


# -- one case per op ------------------------------------------------------------------------------

def _case(fn, *inputs, params=None, symbolic=True, opset=17, tol=1e-4):
    return dict(fn=fn, inputs=inputs, params=params, symbolic=symbolic, opset=opset, tol=tol)


CASES = {
    "conv2d_nhwc_same_stride_bias_relu6": _case(
        lambda p, x: ops.conv2d(x, p["w"], p["b"], stride=2, padding="SAME", data_format="NHWC", act="relu6"),
        normal(2, 7, 7, 3), params={"w": normal(4, 3, 3, 3), "b": normal(4)}),
    "conv2d_groups_dilation_leaky": _case(
        lambda p, x: ops.conv2d(x, p["w"], padding=((2, 1), (0, 2)), dilation=2, groups=2, act="leaky_relu",
                                act_alpha=0.2), normal(2, 4, 9, 9), params={"w": normal(6, 2, 3, 3)}),
    "depthwise_conv2d_multiplier_hard_swish": _case(
        lambda p, x: ops.depthwise_conv2d(x, p["w"], padding=1, act="hard_swish"), normal(2, 3, 6, 6),
        params={"w": normal(6, 1, 3, 3)}),
    "conv1d_nlc_and_conv3d": _case(
        lambda p, x, v: (ops.conv1d(x, p["w1"], data_format="NLC"), ops.conv3d(v, p["w3"], padding=1, stride=2)),
        normal(2, 9, 3), normal(2, 2, 5, 5, 5), params={"w1": normal(4, 3, 3), "w3": normal(3, 2, 3, 3, 3)}),
    "conv2d_transpose_nhwc_groups_output_padding": _case(
        lambda p, x: ops.conv2d_transpose(x, p["w"], p["b"], stride=2, padding=1, output_padding=(1, 0), groups=2,
                                          data_format="NHWC"), normal(2, 5, 5, 4),
        params={"w": normal(4, 3, 3, 3), "b": normal(6)}),
    "batch_norm_nhwc_without_affine_and_rank_2": _case(
        lambda p, x, v: (ops.batch_norm(x, p["m"], p["v"], data_format="NHWC", epsilon=1e-3)[0],
                         ops.batch_norm(v, p["m"], p["v"], p["m"], p["v"], data_format="NC")[0]),
        normal(2, 4, 4, 3), normal(2, 3), params={"m": normal(3), "v": np.abs(normal(3)) + 0.5}),
    "layer_norm_flat_weights_and_none": _case(
        lambda p, x: (ops.layer_norm(x, p["w"], p["b"], begin_norm_axis=1), ops.layer_norm(x, epsilon=1e-3)),
        normal(2, 3, 4), params={"w": normal(12), "b": normal(12)}),
    "group_norm_both_layouts": _case(
        lambda p, x: (ops.group_norm(x, p["w"], p["b"], groups=2),
                      ops.group_norm(jnp.transpose(x, (0, 2, 3, 1)), p["w"], groups=4, data_format="NHWC")),
        normal(2, 4, 3, 3), params={"w": normal(4), "b": normal(4)}),
    "pool2d_max_ceil_same_and_global": _case(
        lambda x: (ops.pool2d(x, kernel_size=3, stride=2, padding="SAME", ceil_mode=True),
                   ops.pool2d(x, pooling_type="max", global_pooling=True, data_format="NHWC")),
        normal(2, 3, 7, 7)),
    "pool2d_avg_exclusive_and_inclusive": _case(
        lambda x: (ops.pool2d(x, pooling_type="avg", kernel_size=2, stride=2, ceil_mode=True),
                   ops.pool2d(x, pooling_type="avg", kernel_size=3, stride=2, padding=1, exclusive=False,
                              data_format="NHWC")),
        normal(2, 7, 7, 3)),
    "adaptive_pool2d_uneven_bins": _case(
        lambda x: (ops.adaptive_pool2d(x, output_size=(3, 2)),
                   ops.adaptive_pool2d(x, output_size=(None, 2), pooling_type="max", data_format="NHWC"),
                   ops.adaptive_pool2d(x, output_size=1, pooling_type="max")),
        normal(2, 5, 7, 4)),
    "interpolate_nearest_and_linear": _case(
        lambda x: (ops.interpolate(x, scale_factor=2.0), ops.interpolate(x, size=(7, 3), mode="bilinear"),
                   ops.interpolate(x, size=(1, 9), mode="bilinear", align_corners=True),
                   ops.interpolate(x, scale_factor=1.5, mode="bilinear", align_mode=1, data_format="NHWC")),
        normal(2, 3, 4, 5)),
    "interpolate_linear_ncw": _case(lambda x: ops.interpolate(x, size=9, mode="linear", data_format="NCW"),
                                    normal(2, 3, 4)),
    "activations": _case(
        lambda x: (ops.gelu(x), ops.gelu(x, approximate=True), ops.silu(x), ops.leaky_relu(x, negative_slope=0.3),
                   ops.hard_sigmoid(x), ops.sigmoid(x), ops.tanh(x), ops.relu6(x * 4), ops.softmax(x, axis=1),
                   ops.log_softmax(x)), normal(2, 3, 4)),
    "prelu_both_layouts": _case(
        lambda p, x: (ops.prelu(x, p["a"]), ops.prelu(jnp.transpose(x, (0, 2, 3, 1)), p["a"], data_format="NHWC"),
                      ops.prelu(x, p["one"])),
        normal(2, 3, 2, 2), params={"a": normal(3), "one": normal(1)}),
    "elementwise_broadcast_and_fused_act": _case(
        lambda p, x: (ops.elementwise_add(x, p["y"], act="gelu_tanh"), ops.elementwise_div(x, p["y"]),
                      ops.elementwise_max(x, p["y"], act="sigmoid"), ops.elementwise_min(x, p["y"]),
                      ops.elementwise_pow(jnp.abs(x), p["y"]), ops.elementwise_sub(x, p["y"], act="silu"),
                      ops.elementwise_mul(x, p["y"], act="relu")),
        normal(2, 3, 4), params={"y": normal(4)}),
    "elementwise_div_of_integers_is_a_float": _case(
        lambda x, y: ops.elementwise_div(x, y), rng.integers(-9, 9, (2, 3)).astype(np.int32),
        rng.integers(1, 5, (2, 3)).astype(np.int32)),
    "linear_and_matmul": _case(
        lambda p, x: (ops.linear(x, p["w"], p["b"], act="tanh"), ops.linear(x[0, 0], p["w"]),
                      ops.matmul(x, x, transpose_y=True), ops.matmul(x, x, transpose_x=True),
                      ops.matmul(x[0, 0], p["w"])),
        normal(2, 3, 4), params={"w": normal(4, 5), "b": normal(5)}),
    "embedding_with_padding_idx": _case(
        lambda p, ids: (ops.embedding(ids, p["w"], padding_idx=-1), ops.embedding(ids, p["w"])),
        rng.integers(0, 6, (2, 5)).astype(np.int32), params={"w": normal(6, 3)}),
    "shapes": _case(
        lambda x: (ops.reshape(x, shape=(0, -1)), ops.transpose(x, perm=(2, 0, 1)),
                   ops.concat(x, x * 2, axis=-1), *ops.split(x, num_or_sections=(1, -1), axis=2),
                   ops.slice(x, axes=(1, 2), starts=(-2, 1), ends=(99, 3)), ops.cast(x, dtype="int32"),
                   ops.reduce_sum(x, axis=(1,), keepdim=True), ops.reduce_mean(x), ops.reduce_max(x, axis=-1)),
        normal(2, 3, 4)),
    "pad_modes": _case(
        lambda x: (ops.pad(x, paddings=(0, 0, 1, 2, 2, 1), value=0.5), ops.pad(x, paddings=(0, 0, 1, 1, 2, 0),
                                                                              mode="reflect"),
                   ops.pad(x, paddings=(0, 0, 0, 2, 1, 1), mode="replicate"),
                   ops.pad(x, paddings=(0, 0, 2, 1, 0, 3), mode="circular")),
        normal(2, 3, 4), opset=19),
    "dropout_in_inference": _case(
        lambda p, x: (ops.dropout(x, p["key"], p=0.3, training=False),
                      ops.dropout(x, p["key"], p=0.3, training=False, mode="downscale_in_infer")),
        normal(2, 3), params={"key": np.array([0, 1], np.uint32)}),
    "attention_causal_grouped_float_mask": _case(
        lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, m, is_causal=True),
        normal(2, 5, 4, 8), normal(2, 6, 2, 8), normal(2, 6, 2, 8), normal(2, 1, 5, 6)),
    "attention_bool_mask_and_scale": _case(
        lambda q, m: ops.scaled_dot_product_attention(q, q, q, m, scale=0.5),
        normal(2, 5, 2, 4), rng.random((2, 1, 1, 5)) < 0.7),
    "lax_math": _case(
        lambda x: (jax.lax.rsqrt(jnp.abs(x) + 1), x ** 3, jnp.square(x), jnp.exp(x), jnp.log(jnp.abs(x) + 1),
                   jnp.sqrt(jnp.abs(x)), jnp.sign(x), jnp.floor(x), jnp.ceil(x), jax.lax.erf(x), jnp.sin(x),
                   jnp.round(x), jnp.clip(x, -0.5, 0.5), jnp.where(x > 0, x, -2 * x), jnp.fmod(x, 0.7),
                   jnp.maximum(x, 0.1), jnp.minimum(x, 0.1), -x, jnp.arctan(x), jnp.cosh(x), jnp.tan(x), jnp.cos(x),
                   jnp.tanh(x), jax.nn.sigmoid(x), x - 1, jnp.power(jnp.abs(x), x), jax.lax.clamp(-0.5, x, 0.5),
                   jnp.copy(x)),
        normal(2, 3, 4)),
    "lax_comparisons_and_logic": _case(
        lambda x, i: (x > 0, x <= 0.5, x >= 0.5, x == x, x != 0, (x > 0) & (x < 1), (x > 0) | ~(x < 1),
                      (x > 0) ^ (x < 1), i & 6, i | 1, i ^ 3, ~i, jnp.where(i % 3 == 0, x, 0.0)),
        normal(2, 5), rng.integers(-9, 9, (2, 5)).astype(np.int32), opset=18),
    "lax_reductions_and_scans": _case(
        lambda x: (jnp.sum(x, 1), jnp.max(x, 2), jnp.min(x, (1, 2)), jnp.prod(x, 2), jnp.argmax(x, 1),
                   jnp.argmin(x, 2), jnp.cumsum(x, 2), jax.lax.cumsum(x, 1, reverse=True), jnp.flip(x, (1, 2)),
                   jnp.mean(x, -1)),
        normal(2, 3, 4)),
    "lax_shapes": _case(
        lambda x: (x.reshape(-1, 4), x.T, jax.lax.slice(x, (0, 1, 0), (x.shape[0], 3, 4), (1, 1, 2)),
                   jnp.concatenate([x, x], 1), jnp.squeeze(x[:, :1], 1),
                   jnp.broadcast_to(x[:, :, :1], x.shape), *jnp.split(x, [1], axis=1),
                   jax.lax.pad(x, 0.5, ((0, 0, 0), (1, -1, 0), (2, 0, 0))), x.astype(jnp.float16),
                   jax.lax.broadcasted_iota(jnp.int32, x.shape, 2) + x.shape[0], x[-1, 1:], x[:, -1]),
        normal(2, 3, 4)),
    "lax_gathers": _case(
        lambda x, i: (x[:, 0], jnp.take(x, i, axis=1), x[:, 1, 2], jnp.take(x, jnp.array([[0, 2], [1, 1]]), axis=2),
                      jnp.take(x, i + 1, axis=1, mode="clip")),
        normal(2, 3, 4), np.array([2, 0, 1], np.int32), symbolic=False),
    "lax_dot_general_and_conv": _case(
        lambda p, x: (jnp.einsum("bij,bkj->bki", x, x), jnp.einsum("bij,jk->kbi", x, p["w"][0, 0]),
                      jax.lax.conv_general_dilated(x[..., None], p["w"], (2, 1), "SAME", rhs_dilation=(1, 2),
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC")),
                      jax.lax.conv_general_dilated(x[:, None], jnp.transpose(p["w"], (3, 2, 0, 1)), (1, 1),
                                                   ((1, 0), (0, 1)))),
        normal(2, 5, 4), params={"w": normal(3, 3, 1, 4)}),
}


@pytest.mark.parametrize("name", CASES)
def test_op(name):
    case = CASES[name]
    inputs = [np.asarray(x) for x in case["inputs"]]
    specs = [pj.InputSpec((None, *x.shape[1:]), x.dtype.name) if case["symbolic"] else x for x in inputs]
    if case["params"] is None:
        prog = pj.trace(case["fn"], *specs)
    else:
        prog = pj.trace(case["fn"], *specs, params=case["params"])
    check_export(prog, *inputs, opset=case["opset"], tol=case["tol"])


def test_fused_activation_and_conv_bn_folding_survive_passes():
    fused = pj.passes.run(digits_program(), "fold_conv_bn,fuse_bias_act,dce")
    assert [op.attrs.get("act") for op in fused.walk() if op.type == "conv2d"] == ["relu"] * 3
    exported = check_export(fused, normal(2, 1, 8, 8))
    assert op_types(exported).count("Relu") == 3 and "BatchNormalization" not in op_types(exported)


# -- symbolic sizes ---------------------------------------------------------------------------------

def test_symbolic_sizes_as_expressions_of_the_batch():
    prog = pj.trace(lambda x: (jnp.concatenate([x, x]).reshape(-1, 2), jnp.zeros((x.shape[0] * 2 + 1, 3))),
                    pj.InputSpec((None, 3, 4)))
    rows = prog.outputs[0].type.shape[0]
    assert isinstance(rows, str) and rows != "b"  # an expression of b
    exported = to_onnx(prog)
    assert dims(exported.graph.output[0]) == [rows, 2]
    for batch in (1, 4):
        check_export(prog, normal(batch, 3, 4), model=exported)


def test_symbolic_sequence_length_in_attention_masks():
    prog = pj.trace(lambda q: ops.scaled_dot_product_attention(q, q, q, is_causal=True),
                    pj.InputSpec((None, None, 2, 4)))
    exported = to_onnx(prog)
    assert dims(exported.graph.input[0]) == ["b", "d1", 2, 4]
    for shape in ((1, 3, 2, 4), (2, 6, 2, 4)):
        check_export(prog, normal(*shape), model=exported)


# -- dtypes -----------------------------------------------------------------------------------------

def test_float16_program_runs_in_float16():
    params = {"w": normal(4, 3, 3, 3, dtype=np.float16), "fc": normal(4, 5, dtype=np.float16)}
    prog = pj.trace(lambda p, x: ops.linear(ops.pool2d(ops.conv2d(x, p["w"], padding=1, act="relu"),
                                                       global_pooling=True).reshape(-1, 4), p["fc"]),
                    pj.InputSpec((None, 3, 6, 6), "float16"), params=params)
    exported = check_export(prog, normal(2, 3, 6, 6, dtype=np.float16), tol=1e-2)
    assert {t.data_type for t in exported.graph.initializer if t.name in params} == {TensorProto.FLOAT16}
    assert exported.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_bfloat16_parameters_stay_bfloat16():
    params = {"w": jnp.asarray(normal(4, 3), jnp.bfloat16), "g": jnp.asarray(normal(3), jnp.bfloat16)}
    # weights stored in bfloat16, computed in float32: runs wherever the model goes
    weight_only = pj.trace(lambda p, x: ops.linear(x, p["w"].astype(jnp.float32)), pj.InputSpec((None, 4)),
                           params=params)
    exported = check_export(weight_only, normal(3, 4))
    assert next(t for t in exported.graph.initializer if t.name == "w").data_type == TensorProto.BFLOAT16
    # all in bfloat16: a valid model (onnxruntime's CPU kernels do not take bfloat16)
    prog = pj.trace(lambda p, x: ops.layer_norm(ops.linear(x, p["w"]), p["g"]), pj.InputSpec((None, 4), "bfloat16"),
                    params=params)
    model = to_onnx(prog)
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    assert "LayerNormalization" in op_types(model)


# -- parameters -------------------------------------------------------------------------------------

def test_params_replace_the_programs_arrays():
    params = {"w": normal(3, 2), "b": normal(2)}
    prog = pj.trace(lambda p, x: ops.linear(x, p["w"], p["b"]), pj.InputSpec((None, 3)), params=params)
    new = {"w": normal(3, 2)}
    x = normal(4, 3)
    got = run_onnxruntime(to_onnx(prog, params=new), {"x": x})[0]
    assert relative_error(got, prog.apply({**params, **new}, x)) <= 1e-5
    with pytest.raises(ConversionError, match=r"'w' is float32\[2, 3\], but the program reads it as f32\[3,2\]"):
        to_onnx(prog, params={"w": normal(2, 3)})
    with pytest.raises(ConversionError, match=r"params names \['v'\]"):
        to_onnx(prog, params={"v": normal(2)})


# -- errors -----------------------------------------------------------------------------------------

def test_unsupported_ops_are_all_named_in_one_error(tmp_path):
    def fn(x):
        y = jnp.cumprod(x, axis=1) + jnp.sort(x, axis=1) + jax.lax.round(x)
        return jax.lax.while_loop(lambda v: v.sum() < 100, lambda v: v * 2, y) + jnp.cumprod(y, axis=0)

    prog = pj.trace(fn, pj.InputSpec((None, 4)))
    with pytest.raises(ConversionError) as error:
        to_onnx(prog, tmp_path / "model.onnx")
    lines = str(error.value).splitlines()
    assert lines[0] == "to_onnx: program 'fn' has ops that cannot be exported to ONNX:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["lax.cumprod", "lax.sort", "lax.round", "while"]
    assert lines[1].startswith("  lax.cumprod: no ONNX exporter: %0 at ") and lines[1].count("%") == 2
    assert "lax.round: rounding half away from zero has no ONNX op" in lines[3]
    assert "(control flow is not exported)" in lines[4]
    assert not (tmp_path / "model.onnx").exists()


def test_training_mode_ops_are_refused():
    nn.seed(0)
    cnn = DigitsCNN()
    cnn.train()
    prog = pj.to_static(cnn, pj.InputSpec((None, 1, 8, 8)), train=True)
    with pytest.raises(ConversionError, match=r"batch_norm: training=True normalises with batch statistics.*: %"):
        to_onnx(prog)
    drop = pj.trace(lambda p, x: ops.dropout(x, p["key"], p=0.5), pj.InputSpec((None, 3)),
                    params={"key": np.array([0, 1], np.uint32)})
    with pytest.raises(ConversionError, match="dropout: training=True draws random masks"):
        to_onnx(drop)


def test_bad_arguments():
    prog = pj.trace(lambda x: x + 1.0, pj.InputSpec((None, 3)))
    with pytest.raises(ConversionError, match="opset 13 is not supported"):
        to_onnx(prog, opset=13)
    with pytest.raises(TypeError, match="expected a Program"):
        to_onnx(nnx.Linear)


def test_what_onnx_cannot_express_is_refused():
    with pytest.raises(ConversionError, match="mode='circular' needs ONNX's wrap padding, from opset 19"):
        to_onnx(pj.trace(lambda x: ops.pad(x, paddings=(0, 0, 1, 1), mode="circular"), jnp.ones((2, 3))))
    # 3 * 2.3333333333 is 6.99... in float64 but 7.0 in float32
    with pytest.raises(ConversionError, match=r"scale_factor \(2.3333333333,\) sizes the output \(7, 7\) in ONNX's "
                                              r"float32, not \(6, 6\)"):
        to_onnx(pj.trace(lambda x: ops.interpolate(x, scale_factor=2.3333333333), pj.InputSpec((None, 1, 3, 3))))
    with pytest.raises(ConversionError, match="padding='SAME' needs static spatial sizes"):
        to_onnx(pj.trace(lambda p, x: ops.conv2d(x, p["w"], padding="SAME"), pj.InputSpec((None, 1, None, 4)),
                         params={"w": jnp.ones((2, 1, 3, 3))}))
