"""Op traits: every op says what it means, the declarations are true, and passes name only real ops."""
import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import adapter, models
from paddlejax.ir.core import TensorType
from paddlejax.ops import lax_params, registry
from paddlejax.ops.lax_traits import LAX_TRAITS
from paddlejax.ops.traits import OPAQUE, STRUCTURAL, Traits, canonical_form, declared_traits, traits_of

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_an_op_cannot_be_defined_without_traits():
    with pytest.raises(TypeError, match="traits"):
        registry.define("no_traits_example", lambda x: x, inputs=[registry.Input("x")])
    assert registry.lookup("no_traits_example") is None


def test_traits_that_name_a_missing_weight_input_are_refused():
    with pytest.raises(ValueError, match="weight input 'w'"):
        registry.define("bad_weight_example", lambda x: x, inputs=[registry.Input("x")], traits=Traits(weight="w"))


def test_trait_values_are_checked():
    with pytest.raises(ValueError, match="amp class"):
        Traits(amp="grey")
    with pytest.raises(ValueError, match="channel rule"):
        Traits(channels="merged")
    with pytest.raises(ValueError, match="unknown trait"):
        Traits().has("pointwize")


def test_every_lax_primitive_with_declared_parameters_has_traits():
    missing = sorted(p for p in lax_params.PARAMS if p not in LAX_TRAITS)
    assert missing == []


def test_every_declared_lax_primitive_exists_in_jax():
    absent = sorted(p for p in LAX_TRAITS if adapter.lax_primitive(p) is None)
    assert set(absent) <= {"log2"}  # jax 0.11's; 0.10 computes log2 as log(x) / log(2)


@pytest.fixture(scope="module")
def captured_programs():
    """Programs of everyday JAX code and of models: their op types must all declare traits."""
    def layer_norm(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    fns = [
        (lambda x: jax.nn.softmax(x @ x.T / 3.0), jnp.ones((3, 4))),
        (lambda x: jnp.cumsum(jnp.sort(x)) + jnp.argmax(x), jnp.ones((5,))),
        (lambda x: jax.nn.gelu(x) * jax.nn.sigmoid(x) - jnp.tanh(x) ** 3, jnp.ones((2, 3))),
        (lambda x: jnp.where(x > 0, jnp.exp(x), jnp.log1p(jnp.abs(x))).clip(-1, 1), jnp.ones((4,))),
        (lambda x: jnp.concatenate([x, x[::-1]]).reshape(2, -1).transpose().max(0), jnp.ones((6,))),
        (lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2,), (1,), "VALID"), jnp.ones((5,))),
        (lambda x: jnp.pad(x, 1)[jnp.array([0, 2])] + x.astype(jnp.int32).sum(), jnp.ones((3,))),
        (layer_norm, jnp.ones((2, 8))),
        (lambda x: jax.lax.conv_general_dilated(x, jnp.ones((2, 1, 3, 3)), (1, 1), "SAME"), jnp.ones((1, 1, 5, 5))),
        (lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + jnp.sin(c), x), jnp.ones((2,))),
    ]
    progs = [pj.trace(f, x) for f, x in fns]
    net = models.mobilenet_v2(scale=0.25, num_classes=4)
    net.eval()
    progs.append(pj.to_static(net, pj.InputSpec((None, 3, 16, 16))))
    bert = models.BertModel(models.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                              num_attention_heads=2, intermediate_size=32))
    bert.eval()
    progs.append(pj.to_static(bert, pj.InputSpec((None, 6), "int32")))
    return progs


def test_every_op_in_captured_programs_declares_traits(captured_programs):
    undeclared = sorted({op.type for prog in captured_programs for op in prog.walk()
                         if declared_traits(op.type) is None})
    assert undeclared == []


def test_every_structural_op_the_verifier_knows_declares_traits():
    from paddlejax.ir.verifier import STRUCTURAL as VERIFIED

    assert set(VERIFIED) == set(STRUCTURAL)


def test_an_undeclared_op_is_opaque_to_passes():
    assert traits_of("lax.made_up") is OPAQUE and not OPAQUE.pure and OPAQUE.amp == "gray"
    assert traits_of("return") is STRUCTURAL["return"]


# -- the declarations are true: checked by running the ops --------------------------------------


def _lax_unary_inputs():
    return np.linspace(0.1, 0.9, 6, dtype=np.float32).reshape(2, 3)


_SKIP_NUMERIC = {"log2", "igamma_grad_a", "polygamma", "zeta", "shift_left",
                 "shift_right_arithmetic", "shift_right_logical", "clz", "population_count", "not", "and", "or",
                 "xor", "complex", "real", "imag", "conj", "rem", "nextafter", "mulhi", "regularized_incomplete_beta",
                 "is_finite", "add_any", "igamma", "igammac", "clamp", "select_n", "bitcast_convert_type",
                 "convert_element_type", "reduce_precision", "integer_pow", "round", "copy"}


@pytest.mark.parametrize("name", sorted(n for n, t in LAX_TRAITS.items() if t.pointwise and n not in _SKIP_NUMERIC))
def test_declared_pointwise_lax_ops_commute_with_transposes(name):
    prim = adapter.lax_primitive(name)
    if prim is None:
        pytest.skip(f"lax.{name} does not exist in jax {jax.__version__}")
    x = _lax_unary_inputs()
    args = [x] * (2 if name in ("add", "sub", "mul", "div", "max", "min", "pow", "atan2", "eq", "ne", "lt", "le",
                                "gt", "ge", "lt_to", "le_to", "eq_to") else 1)
    params = {"accuracy": None} if "accuracy" in lax_params.PARAMS.get(name, {}) else {}
    f = lambda *a: prim.bind(*a, **params)  # noqa: E731
    np.testing.assert_allclose(f(*(a.T for a in args)), np.asarray(f(*args)).T, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(n for n, t in LAX_TRAITS.items() if t.commutative and n not in _SKIP_NUMERIC))
def test_declared_commutative_lax_ops_commute(name):
    a, b = _lax_unary_inputs(), _lax_unary_inputs()[::-1] * 2
    prim = adapter.lax_primitive(name)
    np.testing.assert_array_equal(prim.bind(a, b), prim.bind(b, a))


@pytest.mark.parametrize("name", sorted(n for n, t in {**LAX_TRAITS, **{k: o.traits for k, o in
                                                                         registry.all_ops().items()}}.items()
                                        if t.unit is not None and n not in _SKIP_NUMERIC))
def test_declared_units_give_the_other_operand_back(name):
    x = _lax_unary_inputs()
    unit = np.full_like(x, traits_of(name).unit if name in registry.all_ops() else LAX_TRAITS[name].unit)
    if name in registry.all_ops():
        f = registry.get(name)
    else:
        f = adapter.lax_primitive(name).bind
    np.testing.assert_array_equal(f(x, unit), x)
    if traits_of(name).commutative or (name in LAX_TRAITS and LAX_TRAITS[name].commutative):
        np.testing.assert_array_equal(f(unit, x), x)


_REGISTRY_POINTWISE = sorted(n for n, o in registry.all_ops().items() if o.traits.pointwise)


@pytest.mark.parametrize("name", _REGISTRY_POINTWISE)
def test_declared_pointwise_registry_ops_commute_with_transposes(name):
    # inputs that take no matrix get a scalar (a quantizer's per-tensor scale, or range)
    opdef = registry.get(name)
    attrs = {"cast": {"dtype": "float32"}, "hash_bucket": {"buckets": 97}}.get(name, {})
    assert opdef.traits.has("pointwise", attrs)
    x = _lax_unary_inputs() - 0.5
    if name == "dequantize":
        x = (100 * x).astype(np.int8)
    elif opdef.inputs[0].dtype == "int":
        x = (100 * x).astype(np.int32)
    scalars = iter([np.float32(0.7), np.float32(0.9)])
    inputs = [i for i in opdef.inputs if not i.optional]
    args = [x if i.rank is None or 2 in np.atleast_1d(i.rank) else next(scalars) for i in inputs]
    np.testing.assert_allclose(opdef(*(np.transpose(a) for a in args), **attrs),
                               np.asarray(opdef(*args, **attrs)).T, rtol=1e-6)


def test_a_quantizer_scaling_along_an_axis_is_not_pointwise():
    # a transpose moving through it would have to move its axis too
    assert registry.get("quantize").traits.has("pointwise", {"axis": None})
    assert not registry.get("quantize").traits.has("pointwise", {"axis": 1})


def test_registry_commutative_ops_commute():
    a, b = _lax_unary_inputs(), np.arange(3, dtype=np.float32)
    for name, opdef in registry.all_ops().items():
        if opdef.traits.commutative:
            np.testing.assert_array_equal(opdef(a, b), opdef(b, a), err_msg=name)


def test_layout_sensitive_ops_are_those_with_a_data_format():
    sensitive = {n for n, o in registry.all_ops().items() if o.traits.layout_sensitive}
    with_format = {n for n, o in registry.all_ops().items() if "data_format" in o.attrs}
    assert sensitive == with_format


def test_amp_classes_follow_paddles_lists():
    assert {n for n, o in registry.all_ops().items() if o.traits.amp == "white"} >= {
        "conv2d", "depthwise_conv2d", "conv2d_transpose", "linear", "matmul", "scaled_dot_product_attention"}
    assert traits_of("softmax").amp == traits_of("cross_entropy").amp == traits_of("lax.exp").amp == "black"
    assert traits_of("batch_norm").amp == traits_of("layer_norm").amp == "norm"
    assert traits_of("cast").amp == traits_of("lax.convert_element_type").amp == "cast"


def test_channel_rules_describe_how_channels_flow():
    assert traits_of("relu").channel_rule({}) == "identity"
    assert traits_of("batch_norm").channel_rule({}) == "identity"
    assert traits_of("linear").channel_rule({}) == "consumed"
    assert traits_of("depthwise_conv2d").channel_rule({}) == "grouped"
    assert traits_of("conv2d").channel_rule({"groups": 2}) == "grouped"
    assert traits_of("concat").channel_rule({}) == "concatenated"
    assert traits_of("reshape").channel_rule({}) == "reshaped"
    assert traits_of("lax.conv_general_dilated").channel_rule({"feature_group_count": 3}) == "grouped"
    assert traits_of("softmax").channel_rule({}) is None


def test_quantizable_ops_name_their_weight_and_its_output_axis():
    assert {n: o.traits.weight for n, o in registry.all_ops().items() if o.traits.weight} == {
        "conv2d": "weight", "depthwise_conv2d": "weight", "linear": "weight", "matmul": "y"}
    assert traits_of("linear").weight_out_axis({}, 2) == 1
    assert traits_of("matmul").weight_out_axis({"transpose_y": True}, 2) is None


def test_batch_norm_couples_the_batch_only_in_training():
    prog = pj.trace(lambda x, m, v: pj.ops.batch_norm(x, m, v, training=True)[0], jnp.ones((2, 3)), jnp.zeros(3),
                    jnp.ones(3))
    bn = prog.body.ops[0]
    assert bn.has_trait("batch_coupled")
    assert not registry.get("batch_norm").couples_batch({"training": False})


# -- canonical forms ------------------------------------------------------------------------------


def test_canonical_forms_read_generic_ops_in_the_registry_vocabulary():
    prog = pj.trace(lambda x, y: (x + y, x * 2.0, x / y, x.T, x.reshape(6), jnp.concatenate([x, y]),
                                  x.astype(jnp.int32), jnp.tanh(x), jax.nn.sigmoid(x), x @ y.T),
                    jnp.ones((2, 3)), jnp.ones((2, 3)))
    kinds = [op.canonical[0] for op in prog.walk() if op.type.startswith("lax.") or op.type == "matmul"]
    assert set(kinds) >= {"elementwise_add", "elementwise_mul", "elementwise_div", "transpose", "reshape",
                          "concat", "cast", "tanh", "sigmoid", "matmul"}


def test_uses_without_an_exact_twin_keep_their_generic_form():
    i32 = TensorType((2,), "int32")
    assert canonical_form("lax.div", {}, (i32, i32))[0] == "lax.div"  # integer division truncates
    assert canonical_form("lax.reshape", {"new_sizes": (0, 3), "dimensions": None})[0] == "lax.reshape"
    assert canonical_form("lax.mul", {"out_dtype": np.dtype("float32")}, (i32, i32))[0] == "lax.mul"
    f32 = TensorType((2, 3), "float32")
    contract_first = {"dimension_numbers": (((0,), (0,)), ((), ())), "precision": None,
                      "preferred_element_type": None}
    assert canonical_form("lax.dot_general", contract_first, (f32, f32))[0] == "lax.dot_general"
    contract_last = {**contract_first, "dimension_numbers": (((1,), (1,)), ((), ()))}
    assert canonical_form("lax.dot_general", contract_last, (f32, f32)) == (
        "matmul", {"transpose_x": False, "transpose_y": True})


# -- passes name only ops that exist -----------------------------------------------------------------


def _names_an_op_type(node: ast.AST) -> bool:
    """``op.type``, ``op.canonical[0]`` or ``canonical_type(op)``."""
    return (isinstance(node, ast.Attribute) and node.attr == "type"
            or isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "canonical"
            or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "canonical_type")


def _compared_op_names(path: pathlib.Path):
    """String constants compared with an op's type (as it is, or canonical) in ``path``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(_names_an_op_type(s) for s in sides):
            continue
        for side in sides:
            for const in ast.walk(side):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    yield const.value, node.lineno


def test_passes_and_slim_name_only_op_types_that_exist():
    unknown = []
    for path in [*ROOT.joinpath("passes").rglob("*.py"), *ROOT.joinpath("slim").rglob("*.py")]:
        for name, line in _compared_op_names(path):
            if declared_traits(name) is None:
                unknown.append(f"{path.relative_to(ROOT)}:{line}: {name!r}")
    assert unknown == []


def test_the_scan_finds_op_names_compared_with_op_type(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(op):\n    return op.type == 'lax.copy_p' or op.type in ('relu', 'flatten') \\\n"
                     "        or canonical_type(op) == 'elementwise_sum' or op.canonical[0] != 'matmul'\n")
    found = {name for name, _ in _compared_op_names(probe)}
    assert found == {"lax.copy_p", "relu", "flatten", "elementwise_sum", "matmul"}
    assert [n for n in found if declared_traits(n) is None] != []


# a case of each op that declares it, with its attributes
_COMMUTES_WITH_QUANTIZE = {
    "transpose": ({"perm": (0, 2, 3, 1)},), "reshape": ({"shape": (2, -1)},),
    "pool2d": ({"pooling_type": "max", "kernel_size": (2, 2), "stride": (1, 1), "padding": ((1, 0), (0, 1))},),
}


def test_ops_that_commute_with_quantize_are_the_cases_checked():
    declared = sorted(n for n, o in registry.all_ops().items() if o.traits.commutes_with_quantize)
    assert declared == sorted(_COMMUTES_WITH_QUANTIZE)
    pool = registry.get("pool2d")
    assert pool.traits.has("commutes_with_quantize", {"pooling_type": "max"})
    assert not pool.traits.has("commutes_with_quantize", {"pooling_type": "avg"})


@pytest.mark.parametrize("name", sorted(_COMMUTES_WITH_QUANTIZE))
def test_declared_ops_commute_with_per_tensor_quantize(name):
    from paddlejax.ops.quant import quantize

    op = registry.get(name)
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 4)).astype(np.float32)
    scale = np.float32(1.5)
    for attrs in _COMMUTES_WITH_QUANTIZE[name]:
        np.testing.assert_array_equal(op(quantize(x, scale), **attrs), quantize(op(x, **attrs), scale))


@pytest.mark.parametrize("name", sorted(n for n, t in LAX_TRAITS.items() if t.commutes_with_quantize))
def test_declared_lax_ops_commute_with_per_tensor_quantize(name):
    from paddlejax.ops.quant import quantize

    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    f = {"transpose": lambda a: jax.lax.transpose(a, (1, 0)), "reshape": lambda a: jax.lax.reshape(a, (3, 2)),
         "squeeze": lambda a: jax.lax.squeeze(a[None], (0,)),
         "broadcast_in_dim": lambda a: jax.lax.broadcast_in_dim(a, (4, 2, 3), (1, 2))}[name]
    np.testing.assert_array_equal(f(quantize(x, np.float32(2.0))), quantize(f(x), np.float32(2.0)))


# ops declaring `nonnegative` unconditionally, and those whose fused `act` decides it
_NONNEGATIVE = {"relu", "relu6", "sigmoid", "hard_sigmoid"}


def test_ops_declared_nonnegative_are_the_activations_checked_and_fused_ones_follow_act():
    declared = {n for n, o in registry.all_ops().items() if o.traits.nonnegative is True}
    assert declared == _NONNEGATIVE
    conv = registry.get("quantized_conv2d")
    assert conv.traits.has("nonnegative", {"act": "relu"}) and not conv.traits.has("nonnegative", {"act": "gelu"})
    assert registry.get("elementwise_add").traits.has("nonnegative", {"act": "relu6"})
    assert not registry.get("elementwise_add").traits.has("nonnegative", {})


@pytest.mark.parametrize("name", sorted(_NONNEGATIVE))
def test_declared_nonnegative_ops_give_no_negative_value(name):
    x = np.random.default_rng(0).normal(size=(64,)).astype(np.float32) * 10
    assert np.asarray(registry.get(name)(x)).min() >= 0


@pytest.mark.parametrize("act", ["relu", "relu6", "sigmoid"])
def test_a_fused_activation_declared_nonnegative_gives_no_negative_value(act):
    x = np.random.default_rng(1).normal(size=(2, 3, 5, 5)).astype(np.float32)
    w = np.random.default_rng(2).normal(size=(4, 3, 3, 3)).astype(np.float32)
    assert registry.get("conv2d").traits.has("nonnegative", {"act": act})
    assert np.asarray(registry.get("conv2d")(x, w, act=act)).min() >= 0


def test_ops_that_keep_the_sign_are_the_quantizers_and_map_nonnegative_to_nonnegative():
    from paddlejax.ops.quant import dequantize, fake_quantize, quantize, quantize_asym

    declared = sorted(n for n, o in registry.all_ops().items() if o.traits.keeps_sign)
    assert declared == ["dequantize", "fake_quantize", "fake_quantize_asym", "quantize"]
    assert np.asarray(quantize_asym(np.zeros(2, np.float32), np.float32(-1.0), np.float32(2.0))).min() < 0  # why not

    x = np.abs(np.random.default_rng(3).normal(size=(100,)).astype(np.float32))
    x[:5] = 0.0
    s = np.float32(1.3)
    for y in (quantize(x, s), dequantize(quantize(x, s), s), fake_quantize(x, s)):
        assert np.asarray(y).min() >= 0
