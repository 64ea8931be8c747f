"""Quantization ops: fake quantization for training, quantize/dequantize, and linear, matmul and
conv2d computed on int8 with int32 accumulation, plus weight-only int8/int4 linear and conv2d.

Conventions (Paddle's):

- Symmetric quantization to ``bits`` bits uses ``qmax = 2**(bits - 1) - 1`` levels each side
  of zero, and a **scale is the absolute maximum** of the range, not the step:
  ``q = clip(round(x / scale * qmax), -qmax, qmax)`` and ``x ~ q * scale / qmax``.
  ``round`` is round-half-to-even (``jnp.round``). A scale that is not positive (an all-zero
  channel), or too small for its reciprocal to be finite, quantizes everything to 0.
- A scale of shape ``()`` is per tensor; a scale of shape ``(C,)`` is per channel along the
  ``axis`` attribute (``C`` must be the size of that axis). The quantized ops take the weight's
  per-output-channel scale directly.
- Quantized values are stored as int8 whatever ``bits`` is; 4-bit weights are packed two to a
  byte by :func:`pack_int4`.
- The int8 ops' ``bf16_*`` variants compute the same products on bfloat16 carriers, summed
  in float32: bfloat16 holds every int8 value exactly, so each product is exact, and so is the
  float32 sum of up to 1040 of them (``1040 * 127**2 < 2**24``); longer sums round like any
  float32 sum (relative 6e-8). CPUs with AVX-512 BF16 run such dots about twice as fast as
  float32, and faster than XLA's int8 dot with its int32 rescale; ``autotune`` chooses.
- Divisions are written as multiplications by reciprocals (``x * (qmax / scale)``,
  ``q * (scale * (1 / qmax))``): XLA's CPU backend computes a division by a broadcast value that
  way anyway, so spelling it out gives the same bits on every backend and in numpy.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.quant import dequantize, quantize
>>> x = jnp.array([-1.0, 0.25, 0.5, 2.0])
>>> q = quantize(x, jnp.float32(1.0))   # scale 1.0: [-1, 1] maps to [-127, 127]
>>> q.tolist(), q.dtype.name
([-127, 32, 64, 127], 'int8')
>>> [round(v, 4) for v in dequantize(q, jnp.float32(1.0)).tolist()]   # 2.0 was clipped to the scale
[-1.0, 0.252, 0.5039, 1.0]
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from paddlejax.ops import onednn
from paddlejax.ops.activation import fused_activation, fused_activation_attrs, nonnegative_act
from paddlejax.ops.common import channel_axis, from_channels_last, input_error, norm_axis
from paddlejax.ops.conv import _add_bias, _check_conv, _conv_flops, _lax_conv, _taps, conv2d
from paddlejax.ops.math import _matmul_flops, matmul_operands
from paddlejax.ops.registry import Attr, Input, define, elementwise_flops
from paddlejax.ops.traits import Traits

_BITS = (4, 8)
_INT8_QMAX = 127


def qmax(bits: int) -> int:
    """The largest quantized magnitude of symmetric ``bits``-bit quantization.

    >>> qmax(8), qmax(4)
    (127, 7)
    """
    return 2 ** (bits - 1) - 1


def _bits_attr():
    return Attr("int", 8, choices=_BITS, doc="quantization bit width")


def _axis_attr():
    return Attr("int", None, optional=True, doc="channel axis of a per-channel (1-D) scale")


def _require_dtype(op: str, name: str, x, dtype: str) -> None:
    if jnp.dtype(x.dtype) != jnp.dtype(dtype):
        article = "an" if dtype.startswith("int") else "a"
        raise input_error(op, name, f"{article} {dtype} array", jnp.dtype(x.dtype).name)


def _scale_along(op: str, name: str, scale, shape, axis):
    """``scale`` shaped to broadcast against an array of ``shape``: a 0-d scale as it is, a
    ``(C,)`` scale along ``axis`` (which must then be given, with ``shape[axis] == C``)."""
    if scale.ndim == 0:
        return scale
    if axis is None:
        raise input_error(op, name, "shape () for a per-tensor scale (set 'axis' for per-channel scales)",
                          tuple(scale.shape))
    axis = norm_axis(op, "axis", axis, len(shape))
    if tuple(scale.shape) != (shape[axis],):
        raise input_error(op, name, f"shape () or ({shape[axis]},) (one scale per channel along axis {axis})",
                          tuple(scale.shape))
    return scale.reshape([-1 if i == axis else 1 for i in range(len(shape))])


def inverse_scale(scale, levels):
    """``levels / scale``, or 0 where that is no finite positive number: a scale that is not
    positive (an all-zero channel), or so small that the quotient overflows (a channel of
    denormal weights), quantizes everything to 0 instead of to NaN.

    >>> inverse_scale(jnp.array([2.0, 0.0, 1e-38]), 127.0).tolist()
    [63.5, 0.0, 0.0]
    """
    usable = scale > levels / jnp.finfo(jnp.result_type(scale)).max
    return jnp.where(usable, levels / jnp.where(usable, scale, 1), 0)


def _quantize_values(x, scale, levels: int):
    """``clip(round(x * (levels / scale)), -levels, levels)`` as floats; 0 where the scale is
    not usable (see :func:`inverse_scale`)."""
    return jnp.clip(jnp.round(x * inverse_scale(scale, levels)), -levels, levels)


def _dequantize_values(q, scale, levels: int):
    """``q * (scale * (1 / levels))``."""
    return q * (scale * (1 / levels))


def _fake_quantize(x, scale, *, bits, axis):
    """Quantize then dequantize in float (QAT): ``clip(round(x / scale * qmax), -qmax, qmax)
    * scale / qmax``, with straight-through gradients.

    The gradient with respect to ``x`` is 1 where ``|x| <= scale`` and 0 outside (the
    clipped values); ``scale`` gets no gradient (it comes from an observer, as in PaddleSlim).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([0.1, 0.3, 1.5])
    >>> fake_quantize(x, jnp.float32(1.0), bits=4).tolist()   # steps of 1/7
    [0.1428571492433548, 0.2857142984867096, 1.0]
    >>> jax.grad(lambda t: fake_quantize(t, jnp.float32(1.0)).sum())(x).tolist()
    [1.0, 1.0, 0.0]
    """
    s = lax.stop_gradient(_scale_along("fake_quantize", "scale", scale, x.shape, axis))
    frozen = lax.stop_gradient(x)
    dtype = jnp.result_type(x, s)
    levels = qmax(bits)
    out = _dequantize_values(_quantize_values(frozen.astype(dtype), s.astype(dtype), levels), s.astype(dtype),
                             levels).astype(x.dtype)
    # x - frozen is exactly zero but has derivative one: the straight-through estimator.
    return out + jnp.where(jnp.abs(frozen) <= s, x - frozen, jnp.zeros((), x.dtype))


def _fake_quantize_asym(x, min_value, max_value, *, bits, axis):
    """Asymmetric (unsigned, zero-pointed) quantize-then-dequantize for activations.

    The range ``[min, max]`` is widened to include 0 (so that 0 is exact), split into
    ``2**bits - 1`` steps of ``(max - min) / (2**bits - 1)``, and the zero point is
    ``round(-min / step)``: ``q = clip(round(x / step) + zero_point, 0, 2**bits - 1)`` and the
    result is ``(q - zero_point) * step``. Gradients are straight-through: 1 for ``x`` inside
    ``[min, max]``, 0 outside; ``min`` and ``max`` get none. An empty range gives zeros.

    >>> import jax.numpy as jnp
    >>> y = fake_quantize_asym(jnp.array([-0.45, 0.25, 1.0, 9.0]), jnp.float32(-1.0), jnp.float32(2.0), bits=4)
    >>> [round(v, 4) for v in y.tolist()]   # steps of 0.2 from -1.0; 9.0 clips to 2.0
    [-0.4, 0.2, 1.0, 2.0]
    """
    op = "fake_quantize_asym"
    low = lax.stop_gradient(_scale_along(op, "min", min_value, x.shape, axis))
    high = lax.stop_gradient(_scale_along(op, "max", max_value, x.shape, axis))
    frozen = lax.stop_gradient(x)
    dtype = jnp.result_type(x, low, high)
    step, zero_point, q = _asym_quantize(frozen.astype(dtype), low.astype(dtype), high.astype(dtype), bits)
    out = jnp.where(step > 0, (q - zero_point) * step, 0).astype(x.dtype)
    inside = (frozen >= jnp.minimum(low, 0)) & (frozen <= jnp.maximum(high, 0))
    return out + jnp.where(inside, x - frozen, jnp.zeros((), x.dtype))


def asym_grid(low, high, bits: int = 8):
    """``(step, zero_point)`` of asymmetric ``bits``-bit quantization of the range ``[low,
    high]`` widened to include 0 (see :func:`fake_quantize_asym`); a step of 0 for an empty
    range.

    >>> import jax.numpy as jnp
    >>> [round(float(v), 4) for v in asym_grid(jnp.float32(-1.0), jnp.float32(2.0), bits=4)]
    [0.2, 5.0]
    """
    levels = 2 ** bits - 1
    low, high = jnp.minimum(low, 0), jnp.maximum(high, 0)
    step = (high - low) * (1 / levels)
    zero_point = jnp.clip(jnp.round(-low / jnp.where(step > 0, step, 1)), 0, levels)
    return step, zero_point


def _asym_quantize(x, low, high, bits: int):
    """``(step, zero_point, q)`` of asymmetric quantization, ``q`` unsigned in
    ``[0, 2**bits - 1]`` as floats."""
    step, zero_point = asym_grid(low, high, bits)
    return step, zero_point, jnp.clip(jnp.round(x * inverse_scale(step, 1)) + zero_point, 0, 2 ** bits - 1)


def _quantize_asym(x, min_value, max_value, *, bits):
    """Asymmetric quantization of an activation (per tensor) for the int8 kernels: the unsigned
    values ``q`` of :func:`fake_quantize_asym`, shifted by ``2**(bits - 1)`` to fit int8. The
    int8 value ``v`` stands for ``(v - (zero_point - 2**(bits - 1))) * step``; conversion folds
    the zero point into the layer's bias (``convert_int8``).

    >>> import jax.numpy as jnp
    >>> quantize_asym(jnp.array([-1.0, 0.0, 2.0]), jnp.float32(-1.0), jnp.float32(2.0)).tolist()  # zero point 85
    [-128, -43, 127]
    """
    dtype = jnp.result_type(x, min_value, max_value)
    _, _, q = _asym_quantize(x.astype(dtype), min_value.astype(dtype), max_value.astype(dtype), bits)
    return (q - 2 ** (bits - 1)).astype(jnp.int8)


def _abs_max(x, *, axis):
    """The absolute maximum of ``x``: one per channel along ``axis`` (shape
    ``(x.shape[axis],)``), or of the whole array (shape ``()``) when ``axis`` is None. It is a
    quantization scale, so it has no gradient: QAT computes its weight scales with it.

    >>> import jax.numpy as jnp
    >>> abs_max(jnp.array([[1.0, -3.0], [-2.0, 0.5]]), axis=0).tolist(), float(abs_max(jnp.array([-4.0, 2.0])))
    ([3.0, 2.0], 4.0)
    """
    keep = None if axis is None else norm_axis("abs_max", "axis", axis, x.ndim)
    reduce = tuple(d for d in range(x.ndim) if d != keep)
    return lax.stop_gradient(jnp.max(jnp.abs(x), axis=reduce))


def _moving_average_abs_max(x, scale, state, *, rate):
    """One training step of PaddleSlim's ``moving_average_abs_max`` activation observer:
    ``state' = rate * state + 1``, ``accum' = rate * accum + max|x|`` and ``scale' = accum' /
    state'``, with the accumulator kept as ``scale * state``. Returns ``(scale', state')``,
    without gradients. From ``state = 0`` the first step gives ``scale' = max|x|``.

    >>> import jax.numpy as jnp
    >>> s, n = moving_average_abs_max(jnp.array([1.0, -2.0]), jnp.float32(0.0), jnp.float32(0.0), rate=0.9)
    >>> float(s), float(n)
    (2.0, 1.0)
    >>> s, n = moving_average_abs_max(jnp.array([4.0]), s, n, rate=0.9)
    >>> round(float(s), 4), float(n)   # (0.9 * 2 + 4) / (0.9 + 1)
    (3.0526, 1.899999976158142)
    """
    current = jnp.max(jnp.abs(lax.stop_gradient(x))).astype(jnp.float32)
    state = lax.stop_gradient(state).astype(jnp.float32)
    new_state = rate * state + 1
    accum = rate * lax.stop_gradient(scale).astype(jnp.float32) * state + current
    return accum / new_state, new_state


def _quantize(x, scale, *, bits, axis):
    """Symmetric quantization to int8 values in ``[-qmax, qmax]``:
    ``clip(round(x / scale * qmax), -qmax, qmax)`` (round half to even).

    >>> import jax.numpy as jnp
    >>> quantize(jnp.array([[0.5, -0.5], [0.5, -0.5]]), jnp.array([1.0, 0.5]), axis=1).tolist()
    [[64, -127], [64, -127]]
    """
    s = _scale_along("quantize", "scale", scale, x.shape, axis)
    dtype = jnp.result_type(x, s)
    return _quantize_values(x.astype(dtype), s.astype(dtype), qmax(bits)).astype(jnp.int8)


def _dequantize(q, scale, *, bits, axis):
    """int8 quantized values back to float32: ``q * scale / qmax``.

    >>> import jax.numpy as jnp
    >>> [round(v, 4) for v in dequantize(jnp.array([7, -3], jnp.int8), jnp.float32(2.0), bits=4).tolist()]
    [2.0, -0.8571]
    """
    _require_dtype("dequantize", "q", q, "int8")
    s = _scale_along("dequantize", "scale", scale, q.shape, axis).astype(jnp.float32)
    return _dequantize_values(q.astype(jnp.float32), s, qmax(bits))


def _rescale(acc, scales):
    """int32 accumulators to float32 with one multiply by ``scales / qmax**2``."""
    return acc.astype(jnp.float32) * (scales.astype(jnp.float32) * (1 / _INT8_QMAX ** 2))


def _check_bias(op: str, bias, out_features: int) -> None:
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise input_error(op, "bias", f"shape ({out_features},)", tuple(bias.shape))


def _sum_dtype(carrier) -> jnp.dtype:
    return jnp.int32 if carrier == jnp.int8 else jnp.float32


def _quantized_linear(x_q, w_q, x_scale, w_scale, bias=None, *, act=None, act_alpha=None, carrier=jnp.int8):
    """``act(x @ w + bias)`` on int8 ``x_q`` and int8 weight ``w_q`` ``[in, out]``: one int8
    dot accumulating in int32, then one rescale by ``x_scale * w_scale / 127**2`` to float32.

    ``x_scale`` is per tensor; ``w_scale`` per tensor or per output channel ``(out,)``.
    Variant ``bf16_dot``: on bfloat16 carriers (see the module doc).

    >>> import jax.numpy as jnp
    >>> x_q, w_q = jnp.array([[127, -64]], jnp.int8), jnp.array([[127, 0], [127, 127]], jnp.int8)
    >>> y = quantized_linear(x_q, w_q, jnp.float32(1.0), jnp.array([1.0, 2.0]))   # [[63 * 127, -64 * 127]]
    >>> [round(v, 4) for v in y[0].tolist()]
    [0.4961, -1.0079]
    """
    op = "quantized_linear"
    _require_dtype(op, "x_q", x_q, "int8")
    _require_dtype(op, "w_q", w_q, "int8")
    if x_q.shape[-1] != w_q.shape[0]:
        raise input_error(op, "w_q", f"shape [{x_q.shape[-1]}, out_features]", tuple(w_q.shape))
    out_features = w_q.shape[1]
    _check_bias(op, bias, out_features)
    acc = lax.dot_general(x_q.astype(carrier), w_q.astype(carrier), (((x_q.ndim - 1,), (0,)), ((), ())),
                          preferred_element_type=_sum_dtype(carrier))
    y = _rescale(acc, x_scale * _scale_along(op, "w_scale", w_scale, (out_features,), 0))
    return fused_activation(y if bias is None else y + bias, act, act_alpha)


def _quantized_matmul(x_q, y_q, x_scale, y_scale, *, transpose_x, transpose_y, carrier=jnp.int8):
    """Batched ``x @ y`` of two int8 tensors (numpy broadcasting of batch dimensions, optional
    transposes of the last two axes, as in ``matmul``), accumulated in int32 and rescaled once by
    ``x_scale * y_scale / 127**2`` to float32. ``y_scale`` may be per output column.
    Variant ``bf16_dot``: on bfloat16 carriers (see the module doc).

    >>> import jax.numpy as jnp
    >>> a = jnp.full((2, 1, 3), 127, jnp.int8)
    >>> quantized_matmul(a, a, jnp.float32(1.0), jnp.float32(0.5), transpose_y=True).tolist()
    [[[1.5]], [[1.5]]]
    """
    op = "quantized_matmul"
    _require_dtype(op, "x_q", x_q, "int8")
    _require_dtype(op, "y_q", y_q, "int8")
    x_q, y_q = matmul_operands(op, x_q, y_q, transpose_x, transpose_y, names=("x_q", "y_q"))
    acc = jnp.matmul(x_q.astype(carrier), y_q.astype(carrier), preferred_element_type=_sum_dtype(carrier))
    axis = -1 if y_q.ndim >= 2 else None
    return _rescale(acc, x_scale * _scale_along(op, "y_scale", y_scale, acc.shape, axis))


def _lax_int32(x_q, w_q, stride, pads, dil, groups, fmt, carrier=jnp.int8):
    """The int32 accumulator of an int8 convolution by lax.conv_general_dilated."""
    return _lax_conv(x_q.astype(carrier), w_q.astype(carrier), stride, pads, dil, groups, fmt,
                     preferred_element_type=_sum_dtype(carrier))


def _int8_taps(x_q, w_q, stride, pads, dil, groups, fmt, carrier=jnp.int8):
    """The int32 accumulator as a sum over kernel taps of int8 x int8 matmuls (on XLA's CPU
    backend an int8 dot is fast and an int8 convolution is not)."""
    x_q, w_q = x_q.astype(carrier), w_q.astype(carrier)
    acc = None
    for (i, j), tap in _taps(x_q, w_q.shape[2:], stride, pads, dil, fmt):
        n, ho, wo, _ = tap.shape
        w = w_q[:, :, i, j].reshape(groups, w_q.shape[0] // groups, -1)
        y = jnp.einsum("nhwgk,gok->nhwgo", tap.reshape(n, ho, wo, groups, -1), w,
                       preferred_element_type=_sum_dtype(carrier)).reshape(n, ho, wo, -1)
        acc = y if acc is None else acc + y
    return from_channels_last(acc, fmt)


def _int8_im2col(x_q, w_q, stride, pads, dil, groups, fmt, carrier=jnp.int8):
    """The int32 accumulator as one int8 x int8 matmul of the taps side by side (one filter
    group; several groups take the per-tap matmuls)."""
    if groups != 1:
        return _int8_taps(x_q, w_q, stride, pads, dil, groups, fmt, carrier)
    x_q, w_q = x_q.astype(carrier), w_q.astype(carrier)
    cols = jnp.concatenate([tap for _, tap in _taps(x_q, w_q.shape[2:], stride, pads, dil, fmt)], axis=-1)
    w = jnp.transpose(w_q, (2, 3, 1, 0)).reshape(-1, w_q.shape[0])  # rows ordered (i, j, channel) as cols
    return from_channels_last(jnp.matmul(cols, w, preferred_element_type=_sum_dtype(carrier)), fmt)


def _quantized_conv_kernel(accumulate, doc=None):
    """A quantized_conv2d kernel around ``accumulate`` (the int32 accumulator): validation,
    the rescale, bias and the fused activation are common to all."""

    def kernel(x_q, w_q, x_scale, w_scale, bias=None, out_scale=None, residual=None, residual_scale=None, *,
               stride, padding, dilation, groups, data_format, act=None, act_alpha=None, x_nonnegative=None):
        op = "quantized_conv2d"
        _require_dtype(op, "x_q", x_q, "int8")
        _require_dtype(op, "w_q", w_q, "int8")
        cin, groups_in = x_q.shape[channel_axis(data_format, 4)], w_q.shape[1] * groups
        if cin != groups_in and cin % groups == 0:  # conv's own check would call w_q 'weight'
            raise input_error(op, "w_q", f"shape [out_c, {cin // groups}, kh, kw]", tuple(w_q.shape))
        pads, dil, _ = _check_conv(op, x_q, w_q, bias, stride, padding, dilation, groups, data_format)
        acc = accumulate(x_q, w_q, stride, pads, dil, groups, data_format)
        channels = channel_axis(data_format, acc.ndim)
        y = _rescale(acc, x_scale * _scale_along(op, "w_scale", w_scale, acc.shape, channels))
        y = _add_residual(_add_bias(y, bias, data_format), residual, residual_scale)
        return _requantize(fused_activation(y, act, act_alpha), out_scale)

    kernel.__doc__ = doc or accumulate.__doc__
    return kernel


def _add_residual(y, residual, residual_scale):
    """``y`` plus a residual of its shape: int8 with its per-tensor ``residual_scale`` (dequantized
    first), or float without one; ``y`` unchanged for None."""
    op = "quantized_conv2d"
    if residual is None:
        if residual_scale is not None:
            raise ValueError(f"{op}: 'residual_scale' is given without a 'residual'")
        return y
    if tuple(residual.shape) != tuple(y.shape):
        raise input_error(op, "residual", f"the output's shape {tuple(y.shape)}", tuple(residual.shape))
    if residual.dtype == jnp.int8:
        if residual_scale is None:
            raise ValueError(f"{op}: an int8 'residual' needs its 'residual_scale'")
        _scale_along(op, "residual_scale", residual_scale, residual.shape, None)
        return y + _dequantize_values(residual.astype(jnp.float32), residual_scale.astype(jnp.float32), _INT8_QMAX)
    if residual_scale is not None:
        raise ValueError(f"{op}: a {residual.dtype} 'residual' takes no 'residual_scale' (only an int8 one does)")
    return y + residual


def _requantize(y, out_scale):
    """``y`` quantized to int8 by the per-tensor ``out_scale`` (unchanged for None): the int8
    dataflow's output of a convolution read only by the next quantized op."""
    if out_scale is None:
        return y
    _scale_along("quantized_conv2d", "out_scale", out_scale, y.shape, 0)
    return _quantize_values(y, out_scale, _INT8_QMAX).astype(jnp.int8)


def _onednn_quantized_conv2d(x_q, w_q, x_scale, w_scale, bias=None, out_scale=None, residual=None,
                             residual_scale=None, *, stride, padding, dilation, groups, data_format, act=None,
                             act_alpha=None, x_nonnegative=None):
    """quantized_conv2d by oneDNN's int8 convolution (:mod:`paddlejax.ops.onednn`: the rescale,
    bias, an int8 residual, activation and requantize fused; a non-negative ``x_q`` read as
    uint8, which spares oneDNN the signed input's compensation); where oneDNN is unavailable or
    does not fit, the reference."""
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, data_format=data_format,
                 act=act, act_alpha=act_alpha)
    if not (onednn.quantized_conv2d_fits(x_q, w_q, w_scale, data_format, act) and onednn.available()):
        return _quantized_conv2d(x_q, w_q, x_scale, w_scale, bias, out_scale, residual, residual_scale, **attrs)
    operands = (x_q, w_q, x_scale, w_scale, bias, out_scale, residual, residual_scale)
    jax.eval_shape(lambda *a: _quantized_conv2d(*a, **attrs), *operands)  # the reference's checks
    pads, dil, _ = _check_conv("quantized_conv2d", x_q, w_q, bias, stride, padding, dilation, groups, data_format)
    attrs.update(pads=pads, dilation=dil)
    del attrs["padding"]
    if out_scale is not None and (residual is None or residual.dtype == jnp.int8):
        return onednn.quantized_conv2d(x_q, w_q, x_scale, w_scale, bias, out_scale=out_scale, residual=residual,
                                       residual_scale=residual_scale, x_unsigned=x_nonnegative, **attrs)
    fused_act = act if residual is None else None
    y = onednn.quantized_conv2d(x_q, w_q, x_scale, w_scale, bias, x_unsigned=x_nonnegative,
                                **{**attrs, "act": fused_act})
    if residual is not None:
        y = fused_activation(_add_residual(y, residual, residual_scale), act, act_alpha)
    return _requantize(y, out_scale)


_quantized_conv2d = _quantized_conv_kernel(_lax_int32, """2-D convolution of int8 ``x_q`` with int8 OIHW weight ``w_q`` (same attributes as
    ``conv2d``), accumulated in int32 and rescaled once by ``x_scale * w_scale / 127**2`` to
    float32; ``w_scale`` is per tensor or per output channel ``(out_c,)``. A ``residual`` of
    the output's shape (int8 with its per-tensor ``residual_scale``, or float) is added before
    the activation, and ``out_scale`` requantizes the result to int8 (the ``int8_dataflow``
    pass writes both). Variants:
    ``int8_taps`` and ``int8_im2col`` (int8 matmuls; exact, the same int32 sums), and
    ``bf16_conv``, ``bf16_taps``, ``bf16_im2col``, the same on bfloat16 carriers
    (see the module doc).

    >>> import jax.numpy as jnp
    >>> x_q, w_q = jnp.full((1, 2, 3, 3), 127, jnp.int8), jnp.full((1, 2, 3, 3), 127, jnp.int8)
    >>> quantized_conv2d(x_q, w_q, jnp.float32(1.0), jnp.float32(1.0), padding=1)[0, 0].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """)


def pack_int4(q):
    """Pack signed 4-bit values two per byte along axis 0.

    ``q`` is int8 with values in ``[-8, 7]`` and shape ``[rows, ...]``; the result is uint8
    ``[ceil(rows / 2), ...]`` whose byte ``i`` holds row ``2 i`` in its low nibble and row
    ``2 i + 1`` in its high nibble, each as 4-bit two's complement. An odd last row is paired
    with zeros. :func:`unpack_int4` inverts it.

    >>> import jax.numpy as jnp
    >>> pack_int4(jnp.array([[1], [-2], [7]], jnp.int8)).tolist()   # 0xE1, 0x07
    [[225], [7]]
    """
    q = jnp.asarray(q)
    if q.dtype != jnp.int8 or q.ndim == 0:
        raise ValueError(f"pack_int4: 'q' expects an int8 array of rank >= 1, got {q.dtype.name}{list(q.shape)}")
    if not isinstance(q, jax.core.Tracer) and bool(jnp.any((q < -8) | (q > 7))):
        raise ValueError(f"pack_int4: 'q' expects values in [-8, 7], got values in "
                         f"[{int(q.min())}, {int(q.max())}]")
    if q.shape[0] % 2:
        q = jnp.concatenate([q, jnp.zeros((1, *q.shape[1:]), jnp.int8)])
    nibbles = q.astype(jnp.uint8) & 0xF
    return nibbles[0::2] | (nibbles[1::2] << 4)


def unpack_int4(packed, rows: int | None = None):
    """The int8 values of :func:`pack_int4`'s bytes: ``[2 * packed_rows, ...]``, or the first
    ``rows`` of them.

    >>> import jax.numpy as jnp
    >>> unpack_int4(jnp.array([[225], [7]], jnp.uint8), rows=3).tolist()
    [[1], [-2], [7]]
    """
    packed = jnp.asarray(packed)
    if packed.dtype != jnp.uint8 or packed.ndim == 0:
        raise ValueError(f"unpack_int4: 'packed' expects a uint8 array of rank >= 1, "
                         f"got {packed.dtype.name}{list(packed.shape)}")
    full = 2 * packed.shape[0]
    if rows is not None and not full - 1 <= rows <= full:
        raise ValueError(f"unpack_int4: 'rows' expects {full - 1} or {full} for {packed.shape[0]} packed rows, "
                         f"got {rows}")
    nibbles = jnp.stack([packed & 0xF, packed >> 4], axis=1).reshape(full, *packed.shape[1:]).astype(jnp.int8)
    values = jnp.where(nibbles > 7, nibbles - 16, nibbles).astype(jnp.int8)
    return values if rows is None else values[:rows]


def _weight_values(op: str, w_q, bits: int, in_features: int):
    """The int8 ``[in, out]`` weight values of an int8 or packed-int4 weight."""
    if bits == 8:
        _require_dtype(op, "w_q", w_q, "int8")
        if w_q.shape[0] != in_features:
            raise input_error(op, "w_q", f"shape [{in_features}, out_features]", tuple(w_q.shape))
        return w_q
    _require_dtype(op, "w_q", w_q, "uint8")
    if w_q.shape[0] != -(-in_features // 2):
        raise input_error(op, "w_q", f"packed int4 shape [{-(-in_features // 2)}, out_features] "
                          f"(two rows per byte, {in_features} rows)", tuple(w_q.shape))
    return unpack_int4(w_q, in_features)


def _weight_only_linear(x, w_q, w_scale, bias=None, *, bits, act=None, act_alpha=None):
    """``act(x @ w + bias)`` for a float ``x`` and a quantized weight: int8 ``[in, out]``
    (``bits=8``) or int4 packed by :func:`pack_int4` into uint8 ``[ceil(in / 2), out]``
    (``bits=4``), with ``w = w_q * w_scale / qmax(bits)``.

    The weight values are converted to ``x``'s dtype in the kernel and the scale is applied to
    the product's columns (``(x @ w_q) * w_scale / qmax``, the same function with ``out``
    instead of ``in * out`` multiplies).

    >>> import jax.numpy as jnp
    >>> w_q = pack_int4(jnp.array([[7, -7], [0, 7]], jnp.int8))
    >>> weight_only_linear(jnp.array([[1.0, 2.0]]), w_q, jnp.array([1.0, 0.5]), bits=4).tolist()
    [[1.0, 0.5]]
    """
    op = "weight_only_linear"
    q = _weight_values(op, w_q, bits, x.shape[-1])
    out_features = q.shape[1]
    _check_bias(op, bias, out_features)
    s = _scale_along(op, "w_scale", w_scale, (out_features,), 0)
    y = jnp.matmul(x, q.astype(x.dtype)) * (s * (1 / qmax(bits))).astype(x.dtype)
    return fused_activation(y if bias is None else y + bias, act, act_alpha)


def _weight_only_conv2d(x, w_q, w_scale, bias=None, *, bits, stride, padding, dilation, groups, data_format,
                        act=None, act_alpha=None):
    """2-D convolution of a float ``x`` with a quantized OIHW weight (same attributes as
    ``conv2d``): int8 ``[out_c, in_c / groups, kh, kw]`` (``bits=8``) or int4 packed by
    :func:`pack_int4` along the output channels into uint8 ``[ceil(out_c / 2), in_c / groups,
    kh, kw]`` (``bits=4``), with ``w = w_q * w_scale / qmax(bits)`` and ``w_scale`` one scale
    per output channel, ``(out_c,)`` (which also says how many rows the packed weight has).

    As in ``weight_only_linear``, the weight values are converted to ``x``'s dtype in the kernel
    and the scale is applied to the output channels.

    >>> import jax.numpy as jnp
    >>> w_q = pack_int4(jnp.array([[[[7]]], [[[-7]]], [[[2]]]], jnp.int8))   # 3 output channels, 1x1
    >>> w_q.shape, w_q.dtype.name
    ((2, 1, 1, 1), 'uint8')
    >>> y = weight_only_conv2d(jnp.ones((1, 1, 2, 2)), w_q, jnp.array([1.0, 0.5, 3.5]), bits=4)
    >>> y[0, :, 0, 0].tolist()
    [1.0, -0.5, 1.0]
    """
    op = "weight_only_conv2d"
    out_c = w_scale.shape[0]
    if bits == 8:
        _require_dtype(op, "w_q", w_q, "int8")
        q = w_q
    else:
        _require_dtype(op, "w_q", w_q, "uint8")
        if w_q.shape[0] != -(-out_c // 2):
            raise input_error(op, "w_q", f"packed int4 shape [{-(-out_c // 2)}, in_c / groups, kh, kw] (two output "
                              f"channels per byte, {out_c} by 'w_scale')", tuple(w_q.shape))
        q = unpack_int4(w_q, out_c)
    if q.shape[0] != out_c:
        raise input_error(op, "w_scale", f"shape ({q.shape[0]},) (one scale per output channel)", (out_c,))
    w = q.astype(x.dtype)
    pads, dil, _ = _check_conv(op, x, w, bias, stride, padding, dilation, groups, data_format)
    y = _lax_conv(x, w, stride, pads, dil, groups, data_format)
    y = y * _scale_along(op, "w_scale", (w_scale * (1 / qmax(bits))).astype(x.dtype), y.shape,
                         channel_axis(data_format, y.ndim))
    return fused_activation(_add_bias(y, bias, data_format), act, act_alpha)


def _linear_flops(in_shapes, out_shapes, attrs):
    """2 * (elements of x) * out_features."""
    return 2 * math.prod(in_shapes[0]) * out_shapes[0][-1]


_ANY_RANK = tuple(range(1, 9))
# observers (and quantizers, below) work along one axis, so they keep the channels where they are
_PER_AXIS = Traits(channels="identity")
# a quantizer with one scale for the tensor maps each element alone: transposes (a layout
# change) move through it; one scaling along an axis would have to move that axis too
_QUANTIZER = Traits(channels="identity", pointwise=lambda attrs: attrs.get("axis") is None, keeps_sign=True)
# an asymmetric quantize shifts zero to its zero point: a non-negative input may give negative codes
_SHIFTING_QUANTIZER = Traits(channels="identity", pointwise=True)
_SCALE_RANK = (0, 1)

fake_quantize = define("fake_quantize", _fake_quantize,
                       inputs=[Input("x", dtype="float"), Input("scale", rank=_SCALE_RANK, dtype="float")],
                       attrs={"bits": _bits_attr(), "axis": _axis_attr()}, flops=elementwise_flops, traits=_QUANTIZER)
fake_quantize_asym = define("fake_quantize_asym", _fake_quantize_asym,
                            inputs=[Input("x", dtype="float"), Input("min", rank=_SCALE_RANK, dtype="float"),
                                    Input("max", rank=_SCALE_RANK, dtype="float")],
                            attrs={"bits": _bits_attr(), "axis": _axis_attr()}, flops=elementwise_flops, traits=_QUANTIZER)
abs_max = define("abs_max", _abs_max, inputs=[Input("x", dtype="float")], attrs={"axis": _axis_attr()},
                 flops=elementwise_flops, traits=_PER_AXIS)
moving_average_abs_max = define(
    "moving_average_abs_max", _moving_average_abs_max,
    inputs=[Input("x", dtype="float"), Input("scale", rank=0, dtype="float"), Input("state", rank=0, dtype="float")],
    attrs={"rate": Attr("float", 0.9, doc="weight of the past in the moving average")},
    outputs=("scale", "state"), flops=elementwise_flops, traits=_PER_AXIS)
quantize_asym = define("quantize_asym", _quantize_asym,
                       inputs=[Input("x", dtype="float"), Input("min", rank=0, dtype="float"),
                               Input("max", rank=0, dtype="float")],
                       attrs={"bits": _bits_attr()}, flops=elementwise_flops, traits=_SHIFTING_QUANTIZER)
quantize = define("quantize", _quantize,
                  inputs=[Input("x", dtype="float"), Input("scale", rank=_SCALE_RANK, dtype="float")],
                  attrs={"bits": _bits_attr(), "axis": _axis_attr()}, flops=elementwise_flops, traits=_QUANTIZER)
dequantize = define("dequantize", _dequantize,
                    inputs=[Input("q"), Input("scale", rank=_SCALE_RANK, dtype="float")],
                    attrs={"bits": _bits_attr(), "axis": _axis_attr()}, flops=elementwise_flops, traits=_QUANTIZER)
quantized_linear = define("quantized_linear", _quantized_linear,
                          inputs=[Input("x_q", rank=_ANY_RANK), Input("w_q", rank=2),
                                  Input("x_scale", rank=0, dtype="float"),
                                  Input("w_scale", rank=_SCALE_RANK, dtype="float"),
                                  Input("bias", rank=1, dtype="float", optional=True)],
                          attrs=fused_activation_attrs(), flops=_linear_flops,
                          variants={"bf16_dot": functools.partial(_quantized_linear, carrier=jnp.bfloat16)},
                          traits=Traits(channels="consumed"))
quantized_matmul = define("quantized_matmul", _quantized_matmul,
                          inputs=[Input("x_q", rank=_ANY_RANK), Input("y_q", rank=_ANY_RANK),
                                  Input("x_scale", rank=0, dtype="float"),
                                  Input("y_scale", rank=_SCALE_RANK, dtype="float")],
                          attrs={"transpose_x": Attr("bool", False), "transpose_y": Attr("bool", False)},
                          flops=_matmul_flops,
                          variants={"bf16_dot": functools.partial(_quantized_matmul, carrier=jnp.bfloat16)},
                          traits=Traits(channels="consumed"))
quantized_conv2d = define("quantized_conv2d", _quantized_conv2d,
                          inputs=[Input("x_q", rank=4), Input("w_q", rank=4), Input("x_scale", rank=0, dtype="float"),
                                  Input("w_scale", rank=_SCALE_RANK, dtype="float"),
                                  Input("bias", rank=1, dtype="float", optional=True),
                                  Input("out_scale", rank=0, dtype="float", optional=True),
                                  Input("residual", rank=4, optional=True, image=True),
                                  Input("residual_scale", rank=0, dtype="float", optional=True)],
                          attrs={**conv2d.attrs, "x_nonnegative": Attr(
                              "bool", None, optional=True, doc="x_q holds no negative value (the int8_dataflow pass "
                                                               "proves it): a kernel may read it as unsigned")},
                          flops=_conv_flops,
                          variants={"int8_taps": _quantized_conv_kernel(_int8_taps),
                                    "int8_im2col": _quantized_conv_kernel(_int8_im2col),
                                    **{f"bf16_{name}": _quantized_conv_kernel(
                                        functools.partial(accumulate, carrier=jnp.bfloat16), accumulate.__doc__)
                                       for name, accumulate in (("conv", _lax_int32), ("taps", _int8_taps),
                                                                ("im2col", _int8_im2col))},
                                    "onednn": _onednn_quantized_conv2d},
                          requires={"onednn": onednn.available},
                          traits=Traits(layout_sensitive=True, channels=conv2d.traits.channels,
                                        nonnegative=nonnegative_act))
weight_only_linear = define("weight_only_linear", _weight_only_linear,
                            inputs=[Input("x", rank=_ANY_RANK, dtype="float"), Input("w_q", rank=2),
                                    Input("w_scale", rank=_SCALE_RANK, dtype="float"),
                                    Input("bias", rank=1, dtype="float", optional=True)],
                            attrs={"bits": _bits_attr(), **fused_activation_attrs()}, flops=_linear_flops,
                            traits=Traits(channels="consumed"))
weight_only_conv2d = define("weight_only_conv2d", _weight_only_conv2d,
                            inputs=[Input("x", rank=4, dtype="float"), Input("w_q", rank=4),
                                    Input("w_scale", rank=1, dtype="float"),
                                    Input("bias", rank=1, dtype="float", optional=True)],
                            attrs={"bits": _bits_attr(), **conv2d.attrs},
                            flops=_conv_flops, traits=Traits(layout_sensitive=True, channels=conv2d.traits.channels))
