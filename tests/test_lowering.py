"""Lowering: a traced program computes what the original function does, and differentiates."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def mlp(p, x):
    h = pj.ops.gelu(pj.ops.linear(x, p["w1"], p["b1"]))
    return pj.ops.log_softmax(h @ p["w2"])


def params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w1": jax.random.normal(k1, (4, 8)), "b1": jnp.zeros(8), "w2": jax.random.normal(k2, (8, 3))}


def test_apply_and_call_match_the_function():
    p, x = params(), jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    prog = pj.trace(mlp, x, params=p)
    np.testing.assert_allclose(prog(x), mlp(p, x), atol=1e-6)
    np.testing.assert_allclose(prog.apply(p, x), mlp(p, x), atol=1e-6)


def test_grad_through_apply_matches_grad_of_the_function():
    p, x = params(), jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    prog = pj.trace(mlp, x, params=p)
    got = jax.grad(lambda q: prog.apply(q, x).sum())(prog.params)
    want = jax.grad(lambda q: mlp(q, x).sum())(p)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-5)


def test_call_recompiles_after_a_rewrite():
    prog = pj.trace(lambda x: x + 1.0, jnp.ones(2))
    assert prog(jnp.zeros(2)).tolist() == [1.0, 1.0]
    const = prog.body.ops[0]
    pj.ir.Rewriter(prog).set_attr(const, "value", 5.0)
    assert prog(jnp.zeros(2)).tolist() == [5.0, 5.0]


def test_wrong_inputs_are_reported_clearly():
    prog = pj.trace(lambda x: x * 2, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"input 'x' expects f32\[2,3\], got f32\[3,2\]"):
        prog(jnp.ones((3, 2)))
    with pytest.raises(TypeError, match="expects inputs structured as"):
        prog(jnp.ones((2, 3)), jnp.ones(1))


def test_64_bit_twins_of_the_input_dtypes_are_cast_and_other_dtypes_refused():
    prog = pj.trace(lambda x, i: x * 2.0 + i, jnp.ones((2,)), jnp.ones((2,), jnp.int32))
    out = prog(np.array([1.0, 2.0]), np.array([1, 2]))  # NumPy's float64 and int64
    assert out.dtype == jnp.float32 and out.tolist() == [3.0, 6.0]
    assert prog.apply(prog.params, np.array([1.0, 2.0]), np.array([1, 2])).tolist() == [3.0, 6.0]
    scalar = pj.trace(lambda x: x * 2.0, jnp.float32(1.0))
    assert scalar(1.5).tolist() == 3.0  # a Python float is NumPy's float64
    with pytest.raises(ValueError, match=r"input 'i' expects i32\[2\], got f32\[2\]"):
        prog(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match=r"input 'x' expects f32\[2\], got str32\[2\]"):
        prog.apply(prog.params, np.array(["a", "b"]), jnp.ones(2, jnp.int32))
    half = pj.trace(lambda x: x * 2, jnp.ones(2, jnp.bfloat16))
    with pytest.raises(ValueError, match=r"input 'x' expects bf16\[2\], got f64\[2\]"):
        half.apply(half.params, np.ones(2))
    with pytest.raises(ValueError, match=r"input 'x' expects bf16\[2\]"):
        half(np.ones(2))


def test_missing_parameter_is_named():
    prog = pj.trace(mlp, jnp.ones((1, 4)), params=params())
    with pytest.raises(KeyError, match="parameter 'w2' is missing"):
        prog.apply({"w1": jnp.ones((4, 8)), "b1": jnp.zeros(8)}, jnp.ones((1, 4)))


def conv_program():
    w = jax.random.normal(jax.random.PRNGKey(2), (4, 3, 3, 3))
    return pj.trace(lambda p, x: pj.ops.conv2d(x, p["w"], padding=1), pj.InputSpec((2, 3, 6, 6)), params={"w": w})


def test_kernel_annotation_runs_that_variant():
    prog, x = conv_program(), jax.random.normal(jax.random.PRNGKey(3), (2, 3, 6, 6))
    want = prog(x)
    conv = next(op for op in prog.walk() if op.type == "conv2d")
    pj.ir.Rewriter(prog).set_attr(conv, "kernel", "shifted_matmul")
    jaxpr = str(jax.make_jaxpr(lambda p, x: prog.apply(p, x))(prog.params, x))
    assert "conv_general_dilated" not in jaxpr and "conv2d" not in jaxpr and "dot_general" in jaxpr
    np.testing.assert_allclose(prog(x), want, rtol=1e-4, atol=1e-4)
    grad = jax.grad(lambda q: prog.apply(q, x).sum())(prog.params)["w"]
    assert grad.shape == (4, 3, 3, 3) and bool(jnp.all(jnp.isfinite(grad)))


def test_unknown_kernel_variant_is_named():
    prog = conv_program()
    conv = next(op for op in prog.walk() if op.type == "conv2d")
    pj.ir.Rewriter(prog).set_attr(conv, "kernel", "fft")
    with pytest.raises(ValueError, match="op conv2d: unknown kernel variant 'fft'; known: im2col, lax_bf16, lax_nhwc"):
        prog(jnp.ones((2, 3, 6, 6)))


def test_an_empty_batch_runs_through_flatten():
    # reshape(shape=(0, -1)) on zero rows once could not infer the -1
    from paddlejax import nn

    nn.seed(0)
    model = nn.Sequential(nn.Conv2D(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 10))
    prog = pj.trace(model, pj.InputSpec((None, 1, 4, 4)))
    assert prog(jnp.zeros((0, 1, 4, 4))).shape == (0, 10)
    x = jnp.ones((3, 1, 4, 4))
    np.testing.assert_allclose(prog(x), model(x), rtol=1e-6)


def test_input_sizes_written_as_multiples_are_solved_when_called():
    """``2*n`` binds n from the input's size; a size that is no multiple is refused by name."""
    prog = pj.trace(lambda x: pj.ops.conv2d_transpose(x, jnp.ones((3, 2, 2, 2)), stride=(2, 2)),
                    pj.InputSpec((None, 3, "2*n", "2*n")))
    assert str(prog.outputs[0].type) == "f32[b,2,4*n,4*n]"
    assert np.asarray(prog(np.ones((1, 3, 6, 6), np.float32))).shape == (1, 2, 12, 12)
    with pytest.raises(ValueError, match=r"expects f32\[b,3,2\*n,2\*n\], got f32\[1,3,6,8\]"):
        prog(np.ones((1, 3, 6, 8), np.float32))
    with pytest.raises(ValueError, match=r"got f32\[1,3,5,5\]"):
        prog(np.ones((1, 3, 5, 5), np.float32))
