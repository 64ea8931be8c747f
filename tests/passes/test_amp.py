"""The mixed-precision pass: Paddle's white/black/gray lists decided on the program."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.passes.amp import AutoMixedPrecision


def mlp(p, x):
    h = pj.ops.linear(x, p["w1"], p["b1"])
    h = pj.ops.layer_norm(pj.ops.relu(h), p["g"], p["beta"], begin_norm_axis=1)
    return pj.ops.log_softmax(pj.ops.matmul(h, p["w2"]))


def params(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    return {"w1": f(4, 8), "b1": f(8), "g": np.ones(8, np.float32), "beta": np.zeros(8, np.float32), "w2": f(8, 3)}


def test_printed_program_shows_the_casts():
    prog = pj.trace(mlp, pj.InputSpec((None, 4)), params=params())
    amp = pj.passes.run(prog, "amp")
    assert str(amp) == """\
program @mlp(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @b1 : f32[8]
  %1 = param @beta : f32[8]
  %2 = param @g : f32[8]
  %3 = param @w1 : f32[4,8]
  %4 = param @w2 : f32[8,3]
  %5 = cast(%x) {dtype=bfloat16} : bf16[b,4]
  %6 = cast(%3) {dtype=bfloat16} : bf16[4,8]
  %7 = cast(%0) {dtype=bfloat16} : bf16[8]
  %8 = linear(%5, %6, %7) : bf16[b,8]
  %9 = relu(%8) : bf16[b,8]
  %10 = layer_norm(%9, %2, %1) {epsilon=1e-05, begin_norm_axis=1} : bf16[b,8]
  %11 = cast(%4) {dtype=bfloat16} : bf16[8,3]
  %12 = matmul(%10, %11) {transpose_x=False, transpose_y=False} : bf16[b,3]
  %13 = cast(%12) {dtype=float32} : f32[b,3]
  %14 = log_softmax(%13) {axis=-1} : f32[b,3]
  return %14
}"""


def test_low_precision_program_matches_fp32_within_bf16_tolerance_and_keeps_fp32_gradients():
    prog = pj.trace(mlp, pj.InputSpec((None, 4)), params=params())
    amp = pj.passes.run(prog, "amp")
    x = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_allclose(amp(x), prog(x), atol=0.1, rtol=0.05)
    grads = jax.grad(lambda p: amp.apply(p, x).sum())(amp.params)
    ref = jax.grad(lambda p: prog.apply(p, x).sum())(prog.params)
    for name in ref:
        assert grads[name].dtype == jnp.float32
        np.testing.assert_allclose(grads[name], ref[name], atol=0.15, rtol=0.1)


def test_gray_ops_stay_fp32_when_no_input_was_lowered():
    prog = pj.trace(lambda x: pj.ops.relu(x) * 2.0, jnp.ones(3))
    result = AutoMixedPrecision().apply(prog, None)
    assert not result.changed and result.stats == {"low_precision_ops": 0, "casts": 0}
    assert [op.type for op in prog.walk()] == ["relu", "constant", "lax.mul", "return"]


def test_custom_lists_and_float16():
    prog = pj.trace(mlp, pj.InputSpec((None, 4)), params=params())
    amp = pj.passes.run(prog, "amp{dtype=float16,black=linear}")
    linear = next(op for op in amp.walk() if op.type == "linear")
    matmul = next(op for op in amp.walk() if op.type == "matmul")
    assert linear.result.type.dtype == "float32" and matmul.result.type.dtype == "float16"


def test_lists_name_only_ops_that_exist_and_not_both_ways():
    prog = pj.trace(mlp, pj.InputSpec((None, 4)), params=params())
    with pytest.raises(pj.passes.PassError, match=r"unknown op types \['gelux'\]"):
        pj.passes.run(prog, "amp{black=gelux}")
    with pytest.raises(pj.passes.PassError, match="'linear' is in both 'white' and 'black'"):
        pj.passes.run(prog, "amp{white=linear:relu,black=linear}")
    with pytest.raises(pj.passes.PassError, match="'return' is part of the program's structure"):
        pj.passes.run(prog, "amp{white=return}")
    low = pj.passes.run(prog, "amp{white=lax.add:log_softmax}")
    assert next(op for op in low.walk() if op.type == "log_softmax").result.type.dtype == "bfloat16"


def test_unknown_dtype_is_refused():
    prog = pj.trace(mlp, pj.InputSpec((None, 4)), params=params())
    with pytest.raises(pj.passes.PassError, match="amp: dtype expects one of"):
        pj.passes.run(prog, "amp{dtype=int8}")


# One function per black-list op, applied to the output of a matmul (a white op, so in bfloat16).
BLACK_OPS = {
    "softmax": lambda h: pj.ops.softmax(h),
    "log_softmax": lambda h: pj.ops.log_softmax(h),
    "reduce_sum": lambda h: pj.ops.reduce_sum(h, axis=1),
    "reduce_mean": lambda h: pj.ops.reduce_mean(h, axis=1),
    "lax.exp": jnp.exp,
    "lax.log": lambda h: jnp.log(jnp.abs(h) + 1.0),
    "lax.pow": lambda h: jnp.abs(h) ** 1.5,
    "lax.sqrt": lambda h: jnp.sqrt(jnp.abs(h)),
    "lax.div": lambda h: h / (jnp.abs(h) + 1.0),
    "lax.reduce_sum": lambda h: jnp.sum(h, axis=1),
}


@pytest.mark.parametrize("op_type", sorted(BLACK_OPS))
def test_black_list_ops_run_in_float32_after_a_low_precision_op(op_type):
    prog = pj.trace(lambda p, x: BLACK_OPS[op_type](pj.ops.matmul(x, p["w"])), pj.InputSpec((None, 4)),
                    params={"w": np.full((4, 3), 0.25, np.float32)})
    amp = pj.passes.run(prog, "amp")
    assert next(op for op in amp.walk() if op.type == "matmul").result.type.dtype == "bfloat16"
    black = [op for op in amp.walk() if op.type == op_type]
    assert black and all(v.type.dtype == "float32" for op in black for v in (*op.operands, *op.results)), str(amp)
