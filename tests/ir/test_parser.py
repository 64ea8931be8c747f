"""pj.parse reads the printed IR back: print -> parse -> print is identical for every kind of
program (the zoo's models, control flow, custom derivative rules, symbolic sizes, quantized
and fp8 programs, pass annotations), parsed attributes are the captured Python values, and
malformed text is refused with one ParseError naming the line, column and what was expected."""
from __future__ import annotations

import math
import random
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import paddlejax as pj
from paddlejax import models, nn
from paddlejax.ir.verifier import VerificationError

sys.path.insert(0, str(Path(__file__).parents[1]))  # the program fuzzer's seed programs
from program_fuzz import seed_programs  # noqa: E402

rng = np.random.default_rng(0)


def normal(*shape):
    return rng.normal(size=shape).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Programs: small, traced on small shapes, never compiled here unless numbers are checked.

def _module(factory, *specs):
    nn.seed(0)
    model = factory()
    model.eval()
    return pj.trace(model, *specs)


def _image(size=32, channels=3):
    return pj.InputSpec((None, channels, size, size))


@jax.custom_jvp
def _safe_norm(x):
    return jnp.sqrt(jnp.sum(x ** 2))


@_safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = _safe_norm(x)
    return y, jnp.vdot(x, t) / jnp.where(y == 0, 1.0, y)


def _indexing(x, i):
    y = x.at[i].add(1.0).at[0, 1].set(jnp.nan)
    return jnp.round(y[i] * jnp.inf), jnp.take_along_axis(x[:2], i[:, None] % 3, axis=1), jax.lax.top_k(x, 2)[1]


def _symbolic(x):
    b = x.shape[0]
    y = jnp.reshape(x, (b * 2, -1))[: b + 1]
    return jnp.concatenate([y, jnp.zeros((b + 1, 5))], axis=1), jnp.full((b // 2 + 1,), 3, jnp.int8)


def _constants(x):
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    return (x @ table + np.float32(1e38) + jnp.float32(-0.0), x.astype(jnp.float16) * 65504.0,
            jnp.uint32(4294967295) + x.astype(jnp.uint32), x > -math.inf, x * 1e-45)


def _complex(x):
    z = jax.lax.complex(x, x * 2.0)
    return jnp.fft.fft(z * (1 + 2j)).real, jnp.abs(z)


def _conv_bn_relu(p, x):
    y = pj.ops.conv2d(x, p["conv.w"], p["conv.b"], padding=1)
    y = pj.ops.batch_norm(y, p["bn.mean"], p["bn.var"], p["bn.scale"], p["bn.bias"])[0]
    return pj.ops.relu(y)


def _conv_bn_params():
    return {"conv.w": normal(4, 3, 3, 3), "conv.b": normal(4), "bn.mean": normal(4),
            "bn.var": np.abs(normal(4)) + 0.5, "bn.scale": normal(4), "bn.bias": normal(4)}


def _quant_net(p, x):
    h = pj.ops.relu(pj.ops.conv2d(x, p["conv.w"], p["conv.b"], padding=1))
    h = pj.ops.depthwise_conv2d(h, p["dw.w"], stride=2, padding=1)
    return pj.ops.linear(pj.ops.reshape(h, shape=(0, -1)), p["fc.w"], p["fc.b"])


def _quant_params():
    return {"conv.w": normal(4, 3, 3, 3), "conv.b": normal(4), "dw.w": normal(4, 1, 3, 3), "fc.w": normal(16, 5),
            "fc.b": normal(5)}


def _quantized(bits):
    prog = pj.trace(_quant_net, pj.InputSpec((None, 3, 4, 4)), params=_quant_params())
    if bits == 4:
        return pj.passes.run(prog, "insert_fake_quant{act_bits=0 weight_bits=4},convert_int8")
    fake = pj.passes.run(prog, "insert_fake_quant")
    pj.slim.calibrate(fake, [normal(3, 3, 4, 4)], algo="abs_max", progress=False)
    return pj.passes.run(fake, "convert_int8")


def _mlp(p, x):
    return pj.ops.linear(pj.ops.relu(pj.ops.linear(x, p["fc1.w"], p["fc1.b"])), p["fc2.w"])


def _fp8():
    params = {"fc1.w": normal(16, 8), "fc1.b": normal(8), "fc2.w": normal(8, 4)}
    prog = pj.trace(_mlp, pj.InputSpec((None, 16)), params=params)
    return pj.passes.run(prog, "convert_fp8{emulate=true}")


def _sgd_step(p, w, g):
    return w - p["lr"] * g, jnp.sum(g * g)


def _cnn(p, x):
    h = pj.ops.relu(pj.ops.conv2d(x, p["w1"], padding=1))
    h = pj.ops.relu(pj.ops.conv2d(h, p["w2"], padding=1))
    return pj.ops.matmul(h.reshape(h.shape[0], -1), p["w3"])


def _cnn_params():
    return {"w1": normal(8, 3, 3, 3), "w2": normal(8, 8, 3, 3), "w3": normal(512, 10)}


def _bert(cls, *args):
    config = models.bert.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, max_position_embeddings=16, type_vocab_size=2)
    nn.seed(0)
    model = cls(config, *args)
    model.eval()
    ids = pj.InputSpec((None, 6), "int32")
    return pj.trace(lambda i, m: model(i, attention_mask=m), ids, ids)


def _transformer(method):
    nn.seed(0)
    model = models.transformer.Transformer(12, 12, 16, num_encoder_layers=1, num_decoder_layers=1, n_head=2,
                                           d_model=16, d_inner_hid=32, dropout=0.0)
    model.eval()
    src = pj.InputSpec((2, 5), "int32")
    if method == "forward":
        return pj.trace(lambda s, t: model(s, t), src, pj.InputSpec((2, 4), "int32"))
    return pj.trace(lambda s: getattr(model, method)(s, max_len=4), src)


def _rnnlm(cell):
    nn.seed(0)
    model = models.rnnlm.RNNLM(vocab_size=23, hidden_size=6, num_steps=8, cell=cell)
    model.eval()
    return pj.trace(model, pj.InputSpec((None, 8), "int32"))


def _minilm():
    config = models.bert.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, max_position_embeddings=16)
    nn.seed(0)
    model = models.bert.SentenceEmbedding(models.bert.BertModel(config))
    model.eval()
    ids = pj.InputSpec((None, 6), "int32")
    return pj.trace(lambda i, m: model(i, attention_mask=m), ids, ids)


PROGRAMS = {
    "relu": lambda: pj.trace(lambda x: pj.ops.relu(x) * 2.0, jnp.ones((2, 3))),
    "no_outputs": lambda: pj.trace(lambda x: (), jnp.ones(2)),
    "conv_bn_relu": lambda: pj.trace(_conv_bn_relu, _image(4), params=_conv_bn_params()),
    "lax_mix": lambda: seed_programs()["lax_mix"],
    "custom_vjp": lambda: seed_programs()["custom_rules"],
    "cnn": lambda: seed_programs()["cnn"],
    "indexing": lambda: pj.trace(_indexing, jnp.ones((4, 3)), jnp.array([2, 0], jnp.int32)),
    "symbolic": lambda: pj.trace(_symbolic, pj.InputSpec((None, 6))),
    "constants": lambda: pj.trace(_constants, jnp.ones((2, 3))),
    "complex": lambda: pj.trace(_complex, jnp.ones(4)),
    "custom_jvp": lambda: pj.trace(lambda x: _safe_norm(x) * 2.0, pj.InputSpec((None, 3))),
    "reduce_with_a_computation": lambda: pj.trace(
        lambda x: jax.lax.reduce(x, 0.0, lambda a, b: a * b + 1.0, (0,)), jnp.ones(3)),
    "linear_solve": lambda: pj.trace(lambda b: jax.scipy.sparse.linalg.cg(lambda v: 2.0 * v, b)[0], jnp.ones(3)),
    "checkpoint": lambda: pj.trace(lambda x: jax.checkpoint(lambda v: jnp.sin(jnp.sin(v)))(x), jnp.ones(3)),
    "prng": lambda: pj.trace(lambda x: x + jax.random.normal(jax.random.key(0), (3,)), jnp.ones(3)),
    "vmapped_while": lambda: pj.trace(jax.vmap(lambda v: jax.lax.while_loop(lambda c: c < 10.0, lambda c: c * 2.0, v)),
                                      jnp.ones(3)),
    "int8": lambda: _quantized(8),
    "int4": lambda: _quantized(4),
    "fp8": _fp8,
    "donate": lambda: pj.passes.run(pj.trace(_sgd_step, pj.InputSpec((8, 4)), pj.InputSpec((8, 4)),
                                             params={"lr": np.float32(0.1)}), "donate"),
    "remat": lambda: pj.passes.run(pj.trace(_cnn, pj.InputSpec((None, 3, 8, 8)), params=_cnn_params()),
                                   "remat{budget=37864,sizes=b=8}"),
    "digits": lambda: _module(models.digits.DigitsCNN, _image(8, 1)),
    "resnet18": lambda: _module(lambda: models.resnet18(num_classes=10), _image()),
    "resnet18_vd_nhwc": lambda: _module(lambda: models.resnet18(variant="vd", num_classes=10, data_format="NHWC"),
                                        pj.InputSpec((None, 32, 32, 3))),
    "resnet34_vc": lambda: _module(lambda: models.resnet34(variant="vc", num_classes=10), _image()),
    "resnet50": lambda: _module(lambda: models.resnet50(num_classes=10), _image()),
    "resnext50_32x4d": lambda: _module(lambda: models.resnext50_32x4d(num_classes=10), _image()),
    "se_resnext50_32x4d": lambda: _module(lambda: models.se_resnext50_32x4d(num_classes=10), _image()),
    "mobilenet_v1": lambda: _module(lambda: models.mobilenet_v1(scale=0.25, num_classes=10), _image()),
    "mobilenet_v2": lambda: _module(lambda: models.mobilenet_v2(scale=0.35, num_classes=10), _image()),
    "vgg11_bn": lambda: _module(lambda: models.vgg11(batch_norm=True, num_classes=0), _image()),
    "bert": lambda: _bert(models.bert.BertModel),
    "bert_classifier": lambda: _bert(models.bert.BertForSequenceClassification, 3),
    "minilm": _minilm,
    "transformer": lambda: _transformer("forward"),
    "transformer_greedy": lambda: _transformer("greedy_search"),
    "transformer_beam": lambda: _transformer("beam_search"),
    "rnnlm_lstm": lambda: _rnnlm("lstm"),
    "rnnlm_gru": lambda: _rnnlm("gru"),
}


def same_attrs(a: dict, b: dict) -> bool:
    """Equal attributes, NaN equal to NaN. The text leaves out None-valued parameters and the
    parser gives back those the installed jax's shape rule takes, so None entries may differ."""
    a, b = ({k: v for k, v in d.items() if v is not None} for d in (a, b))
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])) for k in a)


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    return PROGRAMS[request.param]()


def test_print_parse_print_is_identical(program):
    text = str(program)
    parsed = pj.parse(text, params=program.params, constants=program.constants)
    assert str(parsed) == text
    pairs = list(zip(program.walk(), parsed.walk(), strict=True))
    assert [a.type for a, _ in pairs] == [b.type for _, b in pairs]
    assert all(same_attrs(a.attrs, b.attrs) for a, b in pairs), [
        (a.type, a.attrs, b.attrs) for a, b in pairs if not same_attrs(a.attrs, b.attrs)][:3]
    assert parsed.used_params().keys() == program.used_params().keys()


def test_locations_read_back_from_their_comments():
    prog = PROGRAMS["lax_mix"]()
    text = prog.format(locs=True)
    assert "  # " in text and "(# " in text  # ops with and without blocks
    parsed = pj.parse(text, params=prog.params)
    assert parsed.format(locs=True) == text and str(parsed) == str(prog)


def random_inputs(prog, size=2):
    out = []
    for v in prog.inputs:
        shape = tuple(size if isinstance(d, str) else d for d in v.type.shape)
        dtype = np.dtype(jnp.dtype(v.type.dtype))
        draw = rng.integers(0, 5, shape) if dtype.kind in "iu" else rng.normal(size=shape)
        out.append(draw.astype(dtype))
    return out


@pytest.mark.parametrize("name", ["conv_bn_relu", "lax_mix", "indexing", "symbolic", "complex", "custom_vjp",
                                  "int8", "rnnlm_lstm"])
def test_parsed_program_computes_what_the_captured_one_does(name):
    prog = PROGRAMS[name]()
    parsed = pj.parse(str(prog), params=prog.params, constants=prog.constants)
    x = random_inputs(prog)
    for a, b in zip(jax.tree_util.tree_leaves(prog(*x)), jax.tree_util.tree_leaves(parsed(*x)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_gradients_follow_the_parsed_custom_rule():
    prog = PROGRAMS["custom_vjp"]()
    parsed = pj.parse(str(prog))
    x = normal(2, 3) * 10
    grad = jax.grad(lambda v: parsed(v).sum())(x)
    np.testing.assert_allclose(grad, jax.grad(lambda v: prog(v).sum())(x))
    plain = jax.grad(lambda v: (jax.nn.relu(v) * jax.nn.softplus(v)).sum())(x)
    np.testing.assert_allclose(grad, 0.1 * plain, rtol=1e-5)  # the rule clips the incoming gradient (1) to 0.1


def test_parameters_come_from_a_saved_tensor_file_or_a_plain_one(tmp_path):
    prog = pj.trace(_conv_bn_relu, _image(4), params=_conv_bn_params())
    pj.save(prog, tmp_path / "m")
    x = normal(2, 3, 4, 4)
    from_saved = pj.parse(str(prog), params=tmp_path / "m.safetensors")
    safetensors.numpy.save_file({k: np.asarray(v) for k, v in prog.params.items()}, tmp_path / "w.safetensors")
    from_plain = pj.parse(str(prog), params=str(tmp_path / "w.safetensors"))
    for parsed in (from_saved, from_plain):
        np.testing.assert_array_equal(parsed(x), prog(x))


def test_without_parameters_placeholders_of_the_declared_types_are_used():
    prog = pj.trace(_conv_bn_relu, _image(4), params=_conv_bn_params())
    parsed = pj.parse(str(prog))
    again = pj.parse(str(prog))
    for name, value in parsed.params.items():
        assert pj.ir.TensorType.of(value) == pj.ir.TensorType.of(prog.params[name])
        assert 0.5 <= value.min() and value.max() < 1.5  # valid as a variance or a scale
        np.testing.assert_array_equal(value, again.params[name])  # the same every time
    assert np.isfinite(parsed(normal(2, 3, 4, 4))).all()


def test_missing_or_mistyped_parameters_are_named_by_the_verifier():
    prog = pj.trace(_conv_bn_relu, _image(4), params=_conv_bn_params())
    with pytest.raises(VerificationError, match="parameter 'bn.var' has no value"):
        pj.parse(str(prog), params={k: v for k, v in prog.params.items() if k != "bn.var"})
    with pytest.raises(VerificationError, match=r"parameter 'conv.b' is f32\[5\] but the program says f32\[4\]"):
        pj.parse(str(prog), params={**prog.params, "conv.b": np.zeros(5, np.float32)})


def test_parsed_programs_take_and_return_flat_arrays():
    prog = pj.trace(lambda d: {"sum": d["a"] + d["b"], "diff": d["a"] - d["b"]},
                    {"a": jnp.ones(2), "b": jnp.ones(2)})
    parsed = pj.parse(str(prog))
    a, b = normal(2), normal(2)
    diff, total = parsed(a, b)
    np.testing.assert_allclose(total, a + b)
    np.testing.assert_allclose(diff, a - b)
    one = pj.parse(str(pj.trace(lambda x: (x * 2.0,), jnp.ones(2))))
    np.testing.assert_allclose(one(a), a * 2)


def test_hand_written_text_may_name_values_freely():
    prog = pj.parse("""
# a comment line
program @"my model"(%image: f32[b,3]) -> (f32[b,3], i32[]) {
  %scaled = lax.mul(%image, %two) : f32[b,3]
  return %scaled, %n
}""".replace("  %scaled", "  %two = constant 2.0 : f32[]\n  %n = constant 7 : i32[]\n  %scaled"))
    assert str(prog).splitlines()[:4] == ['program @"my model"(%image: f32[b,3]) -> (f32[b,3], i32[]) {',
                                          "  %0 = constant 2.0 : f32[]", "  %1 = constant 7 : i32[]",
                                          "  %2 = lax.mul(%image, %0) : f32[b,3]"]
    y, n = prog(np.ones((1, 3), np.float32))
    assert y.tolist() == [[2.0, 2.0, 2.0]] and int(n) == 7


@pytest.mark.parametrize("value", [0.1, -0.0, 1e-45, 3.4028234663852886e38, math.inf, -math.inf, math.nan,
                                   2 ** 62, -(2 ** 31), True, False, 1.5 + 2j])
def test_inline_constants_read_back_exactly(value):
    dtype = {bool: "bool", int: "i64" if abs(value) > 2 ** 31 else "i32", float: "f64", complex: "c64"}[type(value)]
    text = f"program @c() -> ({dtype}[]) {{\n  %0 = constant {value!r} : {dtype}[]\n  return %0\n}}"
    parsed = pj.parse(text, verify=False)
    got = parsed.body.ops[0].attrs["value"]
    assert type(got) is type(value) and (got == value or (math.isnan(got) and math.isnan(value)))
    assert math.copysign(1, got.real) == math.copysign(1, value.real) if not isinstance(value, bool) else True
    assert str(parsed) == text


def test_strings_and_names_with_any_character_read_back():
    prog = pj.trace(lambda p, x: pj.ops.conv2d(x, p['odd "name"\n']), _image(4),
                    params={'odd "name"\n': normal(2, 3, 1, 1)})
    text = str(prog)
    assert 'param @"odd \\"name\\"\\n" : f32[2,3,1,1]' in text
    assert str(pj.parse(text, params=prog.params)) == text
    op = pj.ir.Op("pad2d", [], [], {"mode": 'a "quoted"\\ value'})
    assert pj.ir.attrs.format_value(op.attrs["mode"]) == '"a \\"quoted\\"\\\\ value"'


H = "program @f(%x: f32[2]) -> (f32[2]) {\n"


def body(*lines: str) -> str:
    """A program of ``H`` and ``lines`` (line 2 on, indented by two spaces)."""
    return H + "".join(f"  {line}\n" for line in lines) + "}"


@pytest.mark.parametrize("text, message", [
    ("prog @f", "line 1, column 1: expected 'program @name(...) -> (...) {', found 'prog'"),
    (body("return %y"), "line 2, column 10: undefined value %y"),
    (body("%0 = relu(%x) : f32[2]", "%0 = relu(%x) : f32[2]", "return %0"),
     "line 3, column 3: value %0 is defined twice"),
    (body("%0 = relu(%x) : f33[2]", "return %0"), "line 2, column 19: unknown dtype 'f33'"),
    (body("%0 = relu(%x) f32[2]", "return %0"), "line 2, column 17: expected ':' and the result types, found 'f32[2]'"),
    (H + "  %0 = relu(%x) : f32[2]\n", "line 3, column 1: expected an op (%r = name(operands) : types) or return, "
                                       "found the end of the text"),
    (body("%0, %1 = relu(%x) : f32[2]", "return %0"), "line 2, column 3: 2 result names but 1 result type"),
    (body("return %x, %x"), "line 1, column 28: the program declares results (f32[2]) but returns (f32[2], f32[2])"),
    (body("%0 = lax.cumsum(%x) {axis=@} : f32[2]", "return %0"),
     "line 2, column 29: expected an attribute value, found '@}'"),
    (body("%0 = lax.cumsum(%x) {axis=(0)} : f32[2]", "return %0"),
     "line 2, column 32: a tuple of one value is written (x,)"),
    (body("%0 = relu(%x) {a=1, a=2} : f32[2]", "return %0"), "line 2, column 22: attribute 'a' given twice"),
    (body("%0 = lax.dot_general(%x, %x) {precision=Precision.FASTEST} : f32[]", "return %x"),
     "line 2, column 43: unknown enum Precision.FASTEST"),
    (body('%0 = pad2d(%x) {mode="abc} : f32[2]', "return %0"), "line 2, column 24: expected a string, found '\"abc}'"),
    (body("%0 = lax.cumsum(%x) {axis=(1e+-j)} : f32[2]", "return %0"), "line 2, column 29: bad number '(1e+-j)'"),
    ("program @f(%x: f32[floor(b)]) -> () {\n  return\n}",
     "line 1, column 20: unknown function 'floor' in a dimension"),
    (body("return %x") + "\n}",
     "line 4, column 1: expected the end of the text after the program's closing '}', found '}'"),
    (body("%0 = constant 1" + "0" * 200 + " : f32[]", "return %x"),
     "line 2, column 17: number of 201 characters (at most 100)"),
    (body("%0 = lax.cumsum(%x) {axis=" + "(" * 100_000 + "} : f32[2]", "return %0"), "attribute nested too deeply"),
    ("program @f(%x: f32[" + "-" * 100_000 + "b]) -> () {\n  return\n}", "dimension expression nested too deeply"),
    ("program @f(%x: f32[" + "b+" * 1000 + "1]) -> () {\n  return\n}",
     "line 1, column 20: dimension expression of more than 200 characters"),
    (body("%0 = lax.cumsum(%x) {axis=(" + "1, " * 100_000 + ")} : f32[2]", "return %0"),
     "line 2, column 3102: more than 1024 values in one tuple or list"),
    ("x" * 1_000_000, "line 1, column 1: expected 'program @name(...) -> (...) {', found 'xxxxxxxxxxxxxxxxxxxx'"),
    ("program @f() -> () {\n" + "  cond() : (\n  b() {\n" * 100 + "}", "blocks nested too deeply"),
])
def test_malformed_text_is_one_parse_error_with_line_and_column(text, message):
    with pytest.raises(pj.ParseError) as error:
        pj.parse(text)
    assert str(error.value).startswith(message) or message in str(error.value)
    assert isinstance(error.value, pj.ProgramFormatError) and error.value.line >= 1


@pytest.mark.parametrize("text, message", [
    ("  %0 = frobnicate(%x) : f32[2]\n  return %0", "op #0 'frobnicate': unknown op type 'frobnicate'"),
    ("  %0 = relu(%x) : f32[3]\n  return %x", "op #0 'relu': results are (f32[3]) but the inputs give (f32[2])"),
    ("  %0 = constant 0 : i32[]\n  %1 = cond(%0) : f32[2] (\n    branch0() {\n      return %x\n    }\n  )\n"
     "  return %1", "operand 0 is used before it is defined (or comes from another block)"),
])
def test_well_formed_but_wrong_programs_are_named_by_the_verifier(text, message):
    with pytest.raises(VerificationError, match=re.escape(message)):
        pj.parse(H + text + "\n}")


def test_mutated_text_is_refused_with_a_parse_or_verification_error_or_parses():
    texts = [str(PROGRAMS[name]()) for name in ("lax_mix", "symbolic", "custom_vjp", "indexing", "int4")]
    draw = random.Random(0)
    pieces = ["(", ")", "%0", "f32[", "{", "}", "-", "1e999", "nan", "Precision.HIGHEST", "int32", "b*b", '"', "(1,)",
              "# x\n", "@", "1j", "(1e+-j)"]
    for _ in range(300):
        text = draw.choice(texts)
        i = draw.randrange(len(text))
        text = text[:i] + draw.choice(pieces) + text[i + draw.randrange(0, 8):]
        try:
            pj.parse(text)
        except (pj.ParseError, VerificationError):
            pass
