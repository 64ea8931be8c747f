"""fp8 ops: e4m3 quantization bit for bit against ml_dtypes, fp8_linear against a numpy reference
of the same math and against float, bias and activation, dtypes, and error messages."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.ops.fp8 import FP8_MAX, fp8_linear, quantize_fp8

rng = np.random.default_rng(0)


def rand(*shape):
    return np.asarray(rng.normal(size=shape), np.float32)


def f32(v):
    return np.asarray(v, np.float32)


def np_quantize_fp8(x, scale):
    """The reference: e4m3(clip(x * (448 / scale), -448, 448)) in float32, cast by ml_dtypes."""
    return np.clip(x * (np.float32(FP8_MAX) / scale), -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)


def np_fp8_linear(x, w_fp8, w_scale):
    """The reference of fp8_linear's math: x quantized with its abs-max, a float32 dot of the
    e4m3 values, one rescale by x_scale * w_scale / 448**2."""
    x_scale = np.abs(x).max()
    acc = np_quantize_fp8(x, x_scale).astype(np.float32) @ np.asarray(w_fp8).astype(np.float32)
    return acc * (x_scale * w_scale * np.float32(1 / FP8_MAX ** 2))


def fp8_weight(w, channel_wise):
    scale = np.abs(w).max(axis=0 if channel_wise else None).astype(np.float32)
    return quantize_fp8(w, scale, axis=1 if channel_wise else None), scale


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_quantize_fp8_equals_the_ml_dtypes_cast_bit_for_bit(axis):
    x = rand(6, 7) * 5
    scale = f32(3.0) if axis is None else f32(rng.uniform(0.5, 8, x.shape[axis]))
    s = scale if axis is None else scale.reshape([-1 if i == axis % 2 else 1 for i in range(2)])
    q = quantize_fp8(x, scale, axis=axis)
    assert q.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np_quantize_fp8(x, s).view(np.uint8))


@pytest.mark.parametrize("jit", [False, True])
def test_a_scale_too_small_to_invert_quantizes_to_zero_not_nan(jit):
    # denormal weights (a PP-OCRv4 rec channel): 448 / 1e-37 overflows, and 0 * inf was NaN
    w = f32([[1e-38, 0.5], [-1e-38, -1.0]])
    scale = f32([1e-37, 1.0])
    quantize = (lambda w, s: quantize_fp8(w, s, axis=1))
    q = (jax.jit(quantize) if jit else quantize)(w, scale)
    assert np.asarray(q).astype(np.float32).tolist() == [[0.0, 224.0], [0.0, -448.0]]


def test_quantize_fp8_clips_to_the_scale_and_zero_scales_give_zeros():
    q = quantize_fp8(f32([[2.0, -3.0], [0.5, 7.0]]), f32([1.0, 0.0]), axis=1)
    assert q.astype(jnp.float32).tolist() == [[448.0, 0.0], [224.0, 0.0]]


def test_fp8_linear_accumulates_exactly_on_values_of_the_e4m3_grid():
    # x's abs-max is 448, so x quantizes to itself; with a weight scale of 448 the rescale is
    # 448 * 448 / 448**2 = 1 and the output is the float32 accumulator, exact for these integers.
    x = f32(rng.integers(-16, 17, size=(3, 5)))
    x[0, 0] = FP8_MAX
    w = rng.integers(-16, 17, size=(5, 4)).astype(ml_dtypes.float8_e4m3fn)
    y = fp8_linear(x, w, f32(FP8_MAX))
    np.testing.assert_array_equal(y, x @ w.astype(np.float32))


@pytest.mark.parametrize("channel_wise", [True, False])
def test_fp8_linear_matches_the_numpy_reference_and_float_within_fp8_error(channel_wise):
    x, w = rand(2, 8, 64), rand(64, 16)
    w_fp8, scale = fp8_weight(w, channel_wise)
    y = np.asarray(fp8_linear(x, w_fp8, scale))
    # the same math in numpy; only the order of the float32 sums may differ
    np.testing.assert_allclose(y, np_fp8_linear(x, w_fp8, scale), rtol=1e-5, atol=1e-5 * np.abs(y).max())
    exact = x @ w
    error = np.abs(y - exact).max() / np.abs(exact).max()
    assert 0.005 < error < 0.06  # e4m3 keeps 3 mantissa bits: steps of 6.25 % at most


def test_fp8_linear_adds_the_bias_then_the_fused_activation():
    x, w, b = rand(4, 6), rand(6, 3), rand(3)
    w_fp8, scale = fp8_weight(w, True)
    plain = np.asarray(fp8_linear(x, w_fp8, scale))
    np.testing.assert_array_equal(fp8_linear(x, w_fp8, scale, b, act="relu"), np.maximum(plain + b, 0))
    leaky = fp8_linear(x, w_fp8, scale, b, act="leaky_relu", act_alpha=0.5)
    np.testing.assert_allclose(leaky, np.where(plain + b > 0, plain + b, 0.5 * (plain + b)), rtol=1e-6)


def test_fp8_linear_returns_the_dtype_of_x_and_zeros_for_zero_inputs():
    w_fp8, scale = fp8_weight(rand(4, 2), True)
    assert fp8_linear(jnp.ones((3, 4), jnp.bfloat16), w_fp8, scale).dtype == jnp.bfloat16
    assert fp8_linear(np.zeros((3, 4), np.float32), w_fp8, scale).tolist() == [[0.0, 0.0]] * 3


def test_fp8_linear_is_one_equation_under_jit_and_in_programs():
    w_fp8, scale = fp8_weight(rand(4, 2), True)
    x = rand(3, 4)
    assert "fp8_linear" in str(jax.make_jaxpr(lambda x: fp8_linear(x, w_fp8, scale))(x))
    np.testing.assert_array_equal(jax.jit(lambda x: fp8_linear(x, w_fp8, scale))(x), fp8_linear(x, w_fp8, scale))
    prog = pj.trace(lambda p, x: pj.ops.fp8_linear(x, p["w"], p["s"]), pj.InputSpec((None, 4)),
                    params={"w": w_fp8, "s": scale})
    assert [op.type for op in prog.walk() if op.type != "param"] == ["fp8_linear", "return"]


def test_bad_inputs_are_named():
    w_fp8, scale = fp8_weight(rand(4, 2), True)
    x = rand(3, 4)
    with pytest.raises(ValueError, match="fp8_linear: input 'w_fp8' expects a float8_e4m3fn array, got 'float32'"):
        fp8_linear(x, rand(4, 2), scale)
    with pytest.raises(ValueError, match=r"fp8_linear: input 'w_fp8' expects shape \[5, out_features\]"):
        fp8_linear(rand(3, 5), w_fp8, scale)
    with pytest.raises(ValueError, match=r"fp8_linear: input 'bias' expects shape \(2,\), got \(3,\)"):
        fp8_linear(x, w_fp8, scale, rand(3))
    with pytest.raises(ValueError, match=r"fp8_linear: input 'w_scale' expects shape \(\) or \(2,\)"):
        fp8_linear(x, w_fp8, rand(3))
    with pytest.raises(ValueError, match="fp8_linear: input 'x' expects a float array, got int32"):
        fp8_linear(np.ones((3, 4), np.int32), w_fp8, scale)
    with pytest.raises(ValueError, match=r"quantize_fp8: input 'scale' expects shape \(\) for a per-tensor scale"):
        quantize_fp8(x, rand(4))
