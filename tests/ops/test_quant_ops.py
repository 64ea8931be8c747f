"""Quantization ops: numerics against numpy (exact for the int32 accumulations), straight-through
gradients, int4 packing, jit/vmap, programs holding int8 parameters, and error messages."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open

import paddlejax as pj
import paddlejax.ops as ops
from paddlejax.ops.quant import (abs_max, asym_grid, dequantize, fake_quantize, fake_quantize_asym,
                                 moving_average_abs_max, pack_int4, qmax, quantize, quantize_asym, quantized_conv2d,
                                 quantized_linear, quantized_matmul, unpack_int4, weight_only_conv2d,
                                 weight_only_linear)

rng = np.random.default_rng(0)


def rand(*shape):
    return np.asarray(rng.normal(size=shape), np.float32)


def randint8(*shape, low=-128):
    return rng.integers(low, 128, size=shape, dtype=np.int8)


def f32(v):
    return np.asarray(v, np.float32)


# Scales of 127 make the rescale factor x_scale * w_scale / 127**2 exactly 1, so the float
# output is the integer accumulator itself.
UNIT = f32(127.0)


def np_quantize(x, scale, bits):
    """The reference formula in float32: clip(round(x * (qmax / scale)), -qmax, qmax)."""
    return np.clip(np.round(x * (np.float32(qmax(bits)) / scale)), -qmax(bits), qmax(bits)).astype(np.int8)


def np_dequantize(q, scale, bits):
    return q.astype(np.float32) * (scale * np.float32(1 / qmax(bits)))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_quantize_and_dequantize_match_numpy(bits, axis):
    x = rand(5, 6) * 3
    scale = f32(2.0) if axis is None else f32(rng.uniform(0.5, 4, x.shape[axis]))
    s = scale if axis is None else scale.reshape([-1 if i == axis % 2 else 1 for i in range(2)])
    q = quantize(x, scale, bits=bits, axis=axis)
    assert q.dtype == jnp.int8
    np.testing.assert_array_equal(q, np_quantize(x, s, bits))
    np.testing.assert_array_equal(dequantize(q, scale, bits=bits, axis=axis), np_dequantize(np.asarray(q), s, bits))


def test_quantize_rounds_half_to_even_and_clips_to_the_scale():
    x = f32([0.5, 1.5, 2.5, -2.5, -0.5, 126.5, 300.0, -300.0])
    assert quantize(x, UNIT).tolist() == [0, 2, 2, -2, 0, 126, 127, -127]
    assert quantize(x, f32(7.0), bits=4).tolist() == [0, 2, 2, -2, 0, 7, 7, -7]


def test_scalar_scale_is_per_tensor_even_with_an_axis():
    x = rand(3, 4)
    np.testing.assert_array_equal(quantize(x, f32(1.0), axis=1), quantize(x, f32(1.0)))


def test_zero_scale_channel_quantizes_to_zero():
    x = rand(3, 2)
    scale = f32([0.0, 1.0])
    q = quantize(x, scale, axis=1)
    assert q[:, 0].tolist() == [0, 0, 0]
    assert np.all(np.isfinite(fake_quantize(x, scale, axis=1)))
    assert fake_quantize(x, scale, axis=1)[:, 0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("jit", [False, True])
def test_a_scale_too_small_to_invert_quantizes_to_zero_not_nan(jit):
    # a channel of denormal weights (seen in PP-OCRv4's rec model): its abs-max scale is a
    # normal float whose reciprocal times 127 overflows, and 0 * inf made the whole channel NaN
    x = f32([[1e-38, -1e-38], [0.5, -1.0]])
    scale = f32([1e-37, 1.0])
    fq = (lambda x, s: fake_quantize(x, s, axis=0))
    np.testing.assert_array_equal((jax.jit(fq) if jit else fq)(x, scale), f32([[0, 0], [64 / 127, -1]]))
    assert quantize(x, scale, axis=0).tolist() == [[0, 0], [64, -127]]
    assert np.asarray(fake_quantize_asym(x, f32(-1e-38), f32(1e-38))).tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("bits,axis", [(8, None), (4, 0), (8, 1)])
def test_fake_quantize_is_dequantize_of_quantize(bits, axis):
    x = rand(4, 3) * 2
    scale = f32(1.5) if axis is None else f32(rng.uniform(0.5, 2, x.shape[axis]))
    want = dequantize(quantize(x, scale, bits=bits, axis=axis), scale, bits=bits, axis=axis)
    np.testing.assert_array_equal(fake_quantize(x, scale, bits=bits, axis=axis), want)


def test_fake_quantize_straight_through_gradient():
    x = f32([-3.0, -2.0, -1.99, 0.0, 0.7, 2.0, 2.5])
    scale = f32(2.0)
    grad_x, grad_s = jax.grad(lambda t, s: (fake_quantize(t, s) * 3).sum(), argnums=(0, 1))(x, scale)
    assert grad_x.tolist() == [0, 3, 3, 3, 3, 3, 0]  # 1 inside [-scale, scale] (inclusive), 0 outside
    assert float(grad_s) == 0.0
    jitted = jax.jit(jax.grad(lambda t: fake_quantize(t, scale).sum()))
    assert jitted(x).tolist() == [0, 1, 1, 1, 1, 1, 0]


def test_fake_quantize_per_channel_gradient_and_dtype():
    x = f32([[0.5, 0.5], [1.5, 1.5]])
    scale = f32([1.0, 2.0])
    assert jax.grad(lambda t: fake_quantize(t, scale, axis=1).sum())(x).tolist() == [[1, 1], [0, 1]]
    assert fake_quantize(x.astype(jnp.bfloat16), scale, axis=1).dtype == jnp.bfloat16


def np_fake_quantize_asym(x, low, high, bits):
    levels = 2 ** bits - 1
    low, high = np.minimum(low, 0), np.maximum(high, 0)
    step = (high - low) * np.float32(1 / levels)
    inverse_step = np.float32(1) / step
    zero_point = np.clip(np.round(-low * inverse_step), 0, levels)
    return (np.clip(np.round(x * inverse_step) + zero_point, 0, levels) - zero_point) * step


@pytest.mark.parametrize("bits", [4, 8])
def test_fake_quantize_asym_matches_numpy(bits):
    x = rand(50) * 2
    low, high = f32(-0.7), f32(2.5)
    np.testing.assert_array_equal(fake_quantize_asym(x, low, high, bits=bits),
                                  np_fake_quantize_asym(x, low, high, bits))


def test_fake_quantize_asym_range_includes_zero_and_gradient_is_straight_through():
    x = f32([-1.0, 0.0, 0.5, 2.0, 5.0])
    # a range [1, 3] is widened to [0, 3], so 0 stays exact and -1 clips to 0
    y = fake_quantize_asym(x, f32(1.0), f32(3.0))
    assert y[:2].tolist() == [0.0, 0.0] and float(y[3]) == pytest.approx(2.0, abs=3 / 255)
    grad = jax.grad(lambda t: fake_quantize_asym(t, f32(1.0), f32(3.0)).sum())(x)
    assert grad.tolist() == [0, 1, 1, 1, 0]
    assert fake_quantize_asym(x, f32(0.0), f32(0.0)).tolist() == [0.0] * 5  # empty range


def test_quantize_asym_is_fake_quantize_asym_shifted_into_int8():
    x = rand(64) * 3 + 1
    low, high = f32(-0.5), f32(4.0)
    v = quantize_asym(x, low, high)
    step, zero_point = asym_grid(low, high)
    assert v.dtype == jnp.int8 and int(v.min()) == -128 and int(v.max()) == 127  # clipped at both ends
    np.testing.assert_allclose((v.astype(np.float32) - (zero_point - 128)) * step, fake_quantize_asym(x, low, high),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="quantize_asym: input 'min' expects rank 0"):
        quantize_asym(x, f32([0.0, 1.0]), high)


def test_quantized_linear_accumulates_exactly_in_int32():
    x_q, w_q = randint8(2, 3, 64), randint8(64, 5)  # includes -128; |sums| exceed int16
    want = np.einsum("bti,io->bto", x_q.astype(np.int64), w_q.astype(np.int64))
    got = quantized_linear(x_q, w_q, UNIT, UNIT)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.abs(want).max() > 2 ** 15


def test_quantized_linear_rescales_once_then_adds_bias_and_activation():
    x_q, w_q = randint8(4, 16, low=-127), randint8(16, 3, low=-127)
    x_scale, w_scale, bias = f32(0.8), f32([0.5, 1.0, 2.0]), rand(3)
    acc = (x_q.astype(np.int64) @ w_q.astype(np.int64)).astype(np.float32)
    want = np.maximum(acc * (x_scale * w_scale * np.float32(1 / 127 ** 2)) + bias, 0)
    got = quantized_linear(x_q, w_q, x_scale, w_scale, bias, act="relu")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_quantized_linear_approximates_float_linear():
    x, w = rand(8, 32), rand(32, 4)
    x_scale, w_scale = f32(np.abs(x).max()), f32(np.abs(w).max(axis=0))
    got = quantized_linear(quantize(x, x_scale), quantize(w, w_scale, axis=1), x_scale, w_scale)
    want = ops.linear(x, w)
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_quantized_linear_lowers_to_an_int8_dot_with_int32_result():
    text = jax.jit(lambda a, b: quantized_linear(a, b, UNIT, UNIT)).lower(randint8(4, 8), randint8(8, 3)).as_text()
    assert "(tensor<4x8xi8>, tensor<8x3xi8>) -> tensor<4x3xi32>" in text


def test_quantized_matmul_batches_transposes_and_per_column_scales():
    x_q, y_q = randint8(2, 1, 6, 4), randint8(3, 5, 6)  # y transposed: [3, 5, 6] -> [3, 6, 5]
    acc = np.einsum("abki,cjk->acij", x_q.astype(np.int64), y_q.astype(np.int64))
    got = quantized_matmul(x_q, y_q, UNIT, UNIT, transpose_x=True, transpose_y=True)
    assert got.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(got, acc.astype(np.float32))
    col_scale = f32(rng.uniform(1, 2, 5)) * UNIT
    got = quantized_matmul(x_q, y_q, UNIT, col_scale, transpose_x=True, transpose_y=True)
    np.testing.assert_allclose(got, acc * (col_scale / UNIT), rtol=1e-6)


CONV_CONFIGS = [
    dict(),
    dict(stride=2, padding=1, groups=2),
    dict(padding="SAME", dilation=2, data_format="NHWC"),
    dict(padding=((1, 0), (2, 1)), stride=(1, 2), groups=4, act="relu"),
]


@pytest.mark.parametrize("attrs", CONV_CONFIGS)
def test_quantized_conv2d_equals_float_conv_on_integer_values(attrs):
    nhwc = attrs.get("data_format") == "NHWC"
    x_q = randint8(2, 6, 7, 4) if nhwc else randint8(2, 4, 6, 7)
    w_q = randint8(8, 4 // attrs.get("groups", 1), 3, 3)
    w_scale, bias = f32(rng.integers(1, 4, 8)) * UNIT, rand(8)  # integral per-channel scales
    got = quantized_conv2d(x_q, w_q, UNIT, w_scale, bias, **attrs)
    channel_scale = w_scale / UNIT
    float_w = w_q.astype(np.float32) * channel_scale[:, None, None, None]
    want = ops.conv2d(x_q.astype(np.float32), float_w, bias, **attrs)  # integers below 2**24: exact
    np.testing.assert_array_equal(got, want)


def test_int4_packing_round_trips_every_value_low_nibble_first():
    q = np.arange(-8, 8, dtype=np.int8).reshape(16, 1).repeat(3, axis=1)[:15]  # odd row count
    packed = pack_int4(q)
    assert packed.dtype == jnp.uint8 and packed.shape == (8, 3)
    assert int(packed[0, 0]) == (0x8 | (0x9 << 4))  # -8 low, -7 high, in two's complement
    np.testing.assert_array_equal(unpack_int4(packed, rows=15), q)
    assert unpack_int4(packed).shape == (16, 3)


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_linear_is_linear_on_the_dequantized_weight(bits):
    x, w, bias = rand(3, 2, 7), rand(7, 5), rand(5)
    w_scale = f32(np.abs(w).max(axis=0))
    q = quantize(w, w_scale, bits=bits, axis=1)
    w_q = q if bits == 8 else pack_int4(q)
    got = weight_only_linear(x, w_q, w_scale, bias, bits=bits, act="gelu")
    want = ops.linear(x, dequantize(q, w_scale, bits=bits, axis=1), bias, act="gelu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits,groups,data_format", [(4, 1, "NCHW"), (8, 1, "NHWC"), (4, 5, "NCHW")])
def test_weight_only_conv2d_is_a_convolution_with_the_dequantized_weight(bits, groups, data_format):
    x = rand(2, 5, 6, 6) if data_format == "NCHW" else rand(2, 6, 6, 5)
    w, bias = rand(5, 5 // groups, 3, 3), rand(5)  # an odd number of output channels: the last byte half full
    w_scale = f32(np.abs(w).max(axis=(1, 2, 3)))
    q = quantize(w, w_scale, bits=bits, axis=0)
    w_q = q if bits == 8 else pack_int4(q)
    assert w_q.shape[0] == (5 if bits == 8 else 3)
    attrs = dict(padding=1, stride=2, groups=groups, data_format=data_format, act="relu")
    got = weight_only_conv2d(x, w_q, w_scale, bias, bits=bits, **attrs)
    want = ops.conv2d(x, dequantize(q, w_scale, bits=bits, axis=0), bias, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ops_work_under_jit_vmap_and_grad():
    x_q, w_q, w_scale, bias = randint8(6, 8), randint8(8, 3), f32([1.0, 2.0, 3.0]), rand(3)
    eager = quantized_linear(x_q, w_q, f32(1.0), w_scale, bias)
    mapped = jax.vmap(lambda row: quantized_linear(row, w_q, f32(1.0), w_scale, bias))(x_q)
    np.testing.assert_allclose(mapped, eager, rtol=1e-6)
    jitted = jax.jit(lambda a: quantized_linear(a, w_q, f32(1.0), w_scale, bias))(x_q)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-6)  # XLA fuses the rescale and bias: 1 ulp
    # int8 operands take no tangent; float ones (bias, scales) differentiate as usual
    assert jax.grad(lambda b: quantized_linear(x_q, w_q, f32(1.0), w_scale, b).sum())(bias).tolist() == [6, 6, 6]
    x, scales = rand(4, 3, 5), f32([[0.5] * 5, [1.0] * 5, [2.0] * 5, [4.0] * 5])
    per_row = jax.vmap(lambda t, s: fake_quantize(t, s, axis=1))(x, scales)
    for i in range(4):
        np.testing.assert_array_equal(per_row[i], fake_quantize(x[i], scales[i], axis=1))
    packed = pack_int4(quantize(rand(6, 2), f32(1.0), bits=4))
    x6 = rand(4, 3, 6)
    batched = jax.vmap(lambda t: weight_only_linear(t, packed, f32(1.0), bits=4))(x6)
    np.testing.assert_allclose(batched, weight_only_linear(x6, packed, f32(1.0), bits=4), rtol=1e-6)


def test_ops_are_registered_documented_and_costed():
    names = ["fake_quantize", "fake_quantize_asym", "quantize", "dequantize", "quantized_linear",
             "quantized_matmul", "quantized_conv2d", "weight_only_linear", "weight_only_conv2d", "abs_max",
             "moving_average_abs_max"]
    for name in names:
        op = ops.get(name)
        assert op.doc and op.primitive.name == name and op.flops is not None
    assert quantized_linear.flops([(4, 8), (8, 3), (), (3,)], [(4, 3)], {}) == 2 * 4 * 8 * 3
    assert weight_only_linear.flops([(4, 8), (4, 3), (3,)], [(4, 3)], {"bits": 4}) == 2 * 4 * 8 * 3
    assert set(quantized_conv2d.attrs) == {*ops.conv2d.attrs, "x_nonnegative"}  # a hint for int8 kernels


def test_abs_max_per_channel_and_per_tensor_without_gradient():
    x = rand(3, 4, 2)
    np.testing.assert_array_equal(abs_max(x, axis=1), np.abs(x).max(axis=(0, 2)))
    np.testing.assert_array_equal(abs_max(x, axis=-1), np.abs(x).max(axis=(0, 1)))
    assert float(abs_max(x)) == np.abs(x).max()
    assert float(jnp.abs(jax.grad(lambda t: abs_max(t, axis=0).sum())(x)).sum()) == 0


def test_moving_average_abs_max_is_paddleslims_observer():
    """state' = rate * state + 1, accum' = rate * accum + max|x|, scale = accum' / state'."""
    batches = [rand(5) * k for k in (1.0, 3.0, 0.5)]
    scale, state, accum, count = f32(0.0), f32(0.0), 0.0, 0.0
    for x in batches:
        scale, state = moving_average_abs_max(x, scale, state, rate=0.9)
        count, accum = 0.9 * count + 1, 0.9 * accum + np.abs(x).max()
        np.testing.assert_allclose([float(scale), float(state)], [accum / count, count], rtol=1e-6)
    grads = jax.grad(lambda t: moving_average_abs_max(t, f32(1.0), f32(1.0))[0])(batches[0])
    assert float(jnp.abs(grads).sum()) == 0


def quantized_model(p, x):
    """float input -> int8 -> quantized_linear -> weight-only int4 linear."""
    h = quantized_linear(quantize(x, p["x_scale"]), p["w1"], p["x_scale"], p["w1_scale"], p["b1"], act="relu")
    return weight_only_linear(h, p["w2"], p["w2_scale"], bits=4)


def test_program_with_int8_parameters_saves_and_loads(tmp_path):
    params = {"x_scale": f32(3.0), "w1": randint8(16, 8, low=-127), "w1_scale": f32(rng.uniform(0.1, 1, 8)),
              "b1": rand(8), "w2": pack_int4(randint8(8, 4, low=-7) % 8), "w2_scale": f32([1.0, 2.0, 3.0, 4.0])}
    prog = pj.trace(quantized_model, pj.InputSpec((None, 16)), params=params)
    assert [op.type for op in prog.walk() if op.type != "param"] == [
        "quantize", "quantized_linear", "weight_only_linear", "return"]
    pj.save(prog, tmp_path / "q")
    loaded = pj.load(tmp_path / "q")
    assert str(loaded) == str(prog)
    assert loaded.params["w1"].dtype == jnp.int8 and loaded.params["w2"].dtype == jnp.uint8
    with safe_open(str(tmp_path / "q.safetensors"), "numpy") as f:
        assert f.get_tensor("params/w1").dtype == np.int8  # one byte per weight on disk
    x = rand(5, 16)
    np.testing.assert_array_equal(loaded(x), prog(x))
    np.testing.assert_allclose(loaded(x), quantized_model(params, x), rtol=1e-5, atol=1e-5)


x_f, x_i8 = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.int8)
w_i8, s0 = np.zeros((4, 3), np.int8), f32(1.0)

BAD_CALLS = [
    (lambda: quantized_linear(x_f, w_i8, s0, s0),
     r"quantized_linear: input 'x_q' expects an int8 array, got 'float32'"),
    (lambda: quantized_linear(x_i8.astype(np.int32), w_i8, s0, s0),
     r"quantized_linear: input 'x_q' expects an int8 array, got 'int32'"),
    (lambda: quantized_linear(x_i8, w_i8.astype(np.uint8), s0, s0), r"quantized_linear: input 'w_q' expects an int8"),
    (lambda: quantized_linear(x_i8, np.zeros((5, 3), np.int8), s0, s0),
     r"quantized_linear: input 'w_q' expects shape \[4, out_features\]"),
    (lambda: quantized_linear(x_i8, w_i8, s0, f32([1.0, 2.0])),
     r"quantized_linear: input 'w_scale' expects shape \(\) or \(3,\)"),
    (lambda: quantized_linear(x_i8, w_i8, f32([1.0, 2.0]), s0), r"quantized_linear: input 'x_scale' expects rank 0"),
    (lambda: quantized_linear(x_i8, w_i8, s0, s0, f32([1.0])), r"quantized_linear: input 'bias' expects shape \(3,\)"),
    (lambda: quantized_linear(x_i8, w_i8, s0, s0, act="swish"), r"quantized_linear: attribute 'act' expects one of"),
    (lambda: quantize(x_f, f32([1.0] * 4)), r"quantize: input 'scale' expects shape \(\) for a per-tensor scale"),
    (lambda: quantize(x_f, f32([1.0] * 3), axis=1), r"quantize: input 'scale' expects shape \(\) or \(4,\)"),
    (lambda: quantize(x_f, f32([1.0] * 4), axis=2), r"quantize: attribute 'axis' expects an axis in \[-2, 2\)"),
    (lambda: quantize(x_f, s0, bits=3), r"quantize: attribute 'bits' expects one of \[4, 8\], got 3"),
    (lambda: quantize(x_i8, s0), r"quantize: input 'x' expects a float array"),
    (lambda: fake_quantize(x_f, np.ones((2, 2), np.float32)), r"fake_quantize: input 'scale' expects rank 0 or 1"),
    (lambda: fake_quantize_asym(x_f, s0, f32([1.0, 2.0]), axis=1),
     r"fake_quantize_asym: input 'max' expects shape \(\) or \(4,\)"),
    (lambda: dequantize(x_f, s0), r"dequantize: input 'q' expects an int8 array, got 'float32'"),
    (lambda: quantized_matmul(x_i8, x_i8, s0, s0), r"quantized_matmul: input 'y_q' expects contracted size 4"),
    (lambda: quantized_matmul(np.zeros((2, 3, 4), np.int8), np.zeros((3, 4, 2), np.int8), s0, s0),
     r"quantized_matmul: batch dimensions of 'x_q' .* do not broadcast"),
    (lambda: quantized_conv2d(np.zeros((1, 4, 5, 5), np.int8), np.zeros((6, 4, 3, 3), np.int8), s0, f32([1.0] * 4)),
     r"quantized_conv2d: input 'w_scale' expects shape \(\) or \(6,\)"),
    (lambda: quantized_conv2d(np.zeros((1, 4, 5, 5), np.int8), np.zeros((6, 3, 3, 3), np.int8), s0, s0),
     r"quantized_conv2d: input 'w_q' expects shape \[out_c, 4, kh, kw\]"),
    (lambda: quantized_conv2d(np.zeros((1, 4, 5, 5), np.float32), np.zeros((6, 4, 3, 3), np.int8), s0, s0),
     r"quantized_conv2d: input 'x_q' expects an int8 array"),
    (lambda: weight_only_linear(x_f, w_i8, s0, bits=4),
     r"weight_only_linear: input 'w_q' expects a uint8 array, got 'int8'"),
    (lambda: weight_only_linear(x_f, np.zeros((4, 3), np.uint8), s0, bits=4),
     r"weight_only_linear: input 'w_q' expects packed int4 shape \[2, out_features\]"),
    (lambda: weight_only_linear(x_i8, w_i8, s0), r"weight_only_linear: input 'x' expects a float array"),
    (lambda: weight_only_conv2d(np.zeros((1, 4, 5, 5), np.float32), np.zeros((3, 4, 3, 3), np.uint8), f32([1.0] * 4),
                                bits=4),
     r"weight_only_conv2d: input 'w_q' expects packed int4 shape \[2, in_c / groups, kh, kw\] \(two output "
     r"channels per byte, 4 by 'w_scale'\)"),
    (lambda: weight_only_conv2d(np.zeros((1, 4, 5, 5), np.float32), np.zeros((6, 4, 3, 3), np.int8), f32([1.0] * 4),
                                bits=8),
     r"weight_only_conv2d: input 'w_scale' expects shape \(6,\) \(one scale per output channel\)"),
    (lambda: pack_int4(np.array([8], np.int8)), r"pack_int4: 'q' expects values in \[-8, 7\], got values in \[8, 8\]"),
    (lambda: pack_int4(np.array([1.0])), r"pack_int4: 'q' expects an int8 array"),
    (lambda: unpack_int4(np.zeros(2, np.uint8), rows=6), r"unpack_int4: 'rows' expects 3 or 4"),
]


@pytest.mark.parametrize("bad,match", BAD_CALLS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD_CALLS)])
def test_bad_calls_raise_naming_op_and_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_kernel_checks_also_raise_under_jit():
    with pytest.raises(ValueError, match=r"quantized_linear: input 'w_scale'"):
        jax.jit(lambda a: quantized_linear(a, w_i8, s0, f32([1.0, 2.0])))(x_i8)


@pytest.mark.parametrize("variant", ["int8_taps", "int8_im2col", "bf16_conv", "bf16_taps", "bf16_im2col"])
@pytest.mark.parametrize("config", [dict(padding=1), dict(stride=2, padding="SAME", data_format="NHWC"),
                                    dict(groups=2, padding=((0, 1), (1, 0)), dilation=2)])
def test_conv_variants_give_the_same_int32_sums_as_the_convolution(variant, config):
    fmt = config.get("data_format", "NCHW")
    x_q = randint8(*((2, 4, 7, 6) if fmt == "NCHW" else (2, 7, 6, 4)))
    w_q = randint8(6, 4 // config.get("groups", 1), 3, 3)
    args = (x_q, w_q, f32(0.5), f32([1.0, 2.0, 3.0, 1.0, 2.0, 3.0]), rand(6))
    reference = quantized_conv2d(*args, act="relu", **config)
    kernel = ops.get("quantized_conv2d").variants[variant]
    attrs = ops.get("quantized_conv2d").check_attrs({"act": "relu", **config})
    np.testing.assert_allclose(kernel(*args, **attrs), reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [16, 1040])
def test_bf16_carriers_sum_int8_products_exactly_up_to_1040_terms(k):
    """bfloat16 holds every int8 value and float32 every sum up to 1040 * 127**2 < 2**24."""
    x_q, w_q = jnp.full((3, k), -127, jnp.int8), randint8(k, 5, low=-127)
    w_q[:, 0] = -127  # the extreme sum, 1040 * 127**2
    linear = ops.get("quantized_linear")
    scale = f32(127.0)
    np.testing.assert_array_equal(linear.variants["bf16_dot"](x_q, w_q, scale, scale, act=None, act_alpha=None),
                                  quantized_linear(x_q, w_q, scale, scale))
    matmul = ops.get("quantized_matmul")
    y_q = jnp.swapaxes(w_q, 0, 1)
    np.testing.assert_array_equal(matmul.variants["bf16_dot"](x_q, y_q, scale, scale, transpose_x=False,
                                                              transpose_y=True),
                                  quantized_matmul(x_q, y_q, scale, scale, transpose_y=True))
