"""fp8 ops: float8 (e4m3) quantization and a linear layer computed on e4m3 operands.

Conventions (the same as the int8 ops of :mod:`paddlejax.ops.quant`, so that a stored scale
means the same thing whatever the format):

- A **scale is the absolute maximum** of the range, not the step. e4m3's largest finite value
  is ``FP8_MAX = 448``, so ``q = e4m3(clip(x * (448 / scale), -448, 448))`` and
  ``x ~ q * (scale / 448)``. (Paddle's and TransformerEngine's fp8 ``scale`` is the step
  ``amax / 448``; multiply ours by ``1 / 448`` to get theirs.) The cast rounds to the nearest
  e4m3 value, ties to even. A scale that is not positive (an all-zero channel) gives zeros.
- A scale of shape ``()`` is per tensor; a scale of shape ``(C,)`` is per channel along the
  ``axis`` attribute.
- Activations are quantized at run time with a per-tensor dynamic scale, their absolute
  maximum; weights are quantized once (by the ``convert_fp8`` pass) and stored as e4m3.
- Products are accumulated in float32 (``preferred_element_type``) and rescaled once. GPUs of
  compute capability 8.9 and newer (Ada, Hopper) run such dots in fp8; other backends (XLA's
  CPU) upcast the operands, which gives the same numbers, slowly.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.fp8 import quantize_fp8
>>> q = quantize_fp8(jnp.array([1.0, -0.5, 0.3, 5.0]), jnp.float32(1.0))  # [-1, 1] maps to [-448, 448]
>>> q.dtype.name, q.astype(jnp.float32).tolist()   # 134.4 rounds to 128 (steps of 16 there); 5.0 clips
('float8_e4m3fn', [448.0, -224.0, 128.0, 448.0])
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from paddlejax.ops.activation import fused_activation, fused_activation_attrs
from paddlejax.ops.common import input_error
from paddlejax.ops.quant import (_ANY_RANK, _SCALE_RANK, _axis_attr, _check_bias, _linear_flops, _require_dtype,
                                 _scale_along, inverse_scale)
from paddlejax.ops.registry import Input, define, elementwise_flops
from paddlejax.ops.traits import Traits

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value


def _to_fp8(x, scale):
    """``e4m3(clip(x * (448 / scale), -448, 448))`` with ``scale`` broadcast against ``x``;
    0 where the scale is not usable (see :func:`~paddlejax.ops.quant.inverse_scale`)."""
    return jnp.clip(x * inverse_scale(scale, FP8_MAX), -FP8_MAX, FP8_MAX).astype(FP8)


def _quantize_fp8(x, scale, *, axis):
    """float8 e4m3 values of ``x`` for the absolute maximum ``scale``:
    ``e4m3(clip(x * (448 / scale), -448, 448))`` (the cast rounds to nearest, ties to even).

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[0.5, -2.0], [1.0, 1.0]])
    >>> quantize_fp8(w, jnp.array([1.0, 2.0]), axis=1).astype(jnp.float32).tolist()   # per column
    [[224.0, -448.0], [448.0, 224.0]]
    """
    s = _scale_along("quantize_fp8", "scale", scale, x.shape, axis)
    dtype = jnp.result_type(x, s)
    return _to_fp8(x.astype(dtype), s.astype(dtype))


def _fp8_linear(x, w_fp8, w_scale, bias=None, *, act=None, act_alpha=None):
    """``act(x @ w + bias)`` for a float ``x`` and an e4m3 weight ``w_fp8`` ``[in, out]``
    (``w = w_fp8 * w_scale / 448``).

    ``x`` is quantized to e4m3 with its absolute maximum as a per-tensor scale, the dot of the
    two e4m3 operands accumulates in float32, and one multiply by
    ``x_scale * w_scale / 448**2`` rescales it; the bias and the activation follow in float32
    and the result has ``x``'s dtype. ``w_scale`` is per tensor or per output channel ``(out,)``.

    >>> import jax.numpy as jnp
    >>> w_fp8 = jnp.array([[448.0, 0.0], [224.0, 448.0]], jnp.float8_e4m3fn)
    >>> fp8_linear(jnp.array([[2.0, -1.0]]), w_fp8, jnp.array([1.0, 4.0]), act="relu").tolist()
    [[1.5, 0.0]]
    """
    op = "fp8_linear"
    _require_dtype(op, "w_fp8", w_fp8, "float8_e4m3fn")
    if x.shape[-1] != w_fp8.shape[0]:
        raise input_error(op, "w_fp8", f"shape [{x.shape[-1]}, out_features]", tuple(w_fp8.shape))
    out_features = w_fp8.shape[1]
    _check_bias(op, bias, out_features)
    w_scale = _scale_along(op, "w_scale", w_scale, (out_features,), 0).astype(jnp.float32)
    x_scale = jnp.max(jnp.abs(x)).astype(jnp.float32)
    x_fp8 = _to_fp8(x.astype(jnp.float32), x_scale)
    acc = lax.dot_general(x_fp8, w_fp8, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    y = acc * (x_scale * w_scale * (1 / FP8_MAX ** 2))
    return fused_activation(y if bias is None else y + bias, act, act_alpha).astype(x.dtype)


quantize_fp8 = define("quantize_fp8", _quantize_fp8,
                      inputs=[Input("x", dtype="float"), Input("scale", rank=_SCALE_RANK, dtype="float")],
                      attrs={"axis": _axis_attr()}, flops=elementwise_flops, traits=Traits())
fp8_linear = define("fp8_linear", _fp8_linear,
                    inputs=[Input("x", rank=_ANY_RANK, dtype="float"), Input("w_fp8", rank=2),
                            Input("w_scale", rank=_SCALE_RANK, dtype="float"),
                            Input("bias", rank=1, dtype="float", optional=True)],
                    attrs=fused_activation_attrs(), flops=_linear_flops, traits=Traits(channels="consumed"))
