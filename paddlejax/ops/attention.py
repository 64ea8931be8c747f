"""Scaled dot-product attention in Paddle's (and ``jax.nn.dot_product_attention``'s) layout
``[batch, seq, heads, head_dim]``.

``mask`` is boolean (True keeps a position) or an additive float bias, broadcastable to
``[batch, heads, q_len, k_len]``; ``is_causal`` masks keys after each query (top-left
aligned). Key/value may have fewer heads than the query (grouped-query attention).

``implementation`` picks the kernel: None (the default) computes attention explicitly in
(at least) float32 and leaves fusion to XLA; ``"xla"`` and ``"cudnn"`` call
``jax.nn.dot_product_attention`` with that implementation. cuDNN's fused (flash) attention
needs an NVIDIA GPU (asking for it elsewhere is a clear ValueError) and runs where
:func:`cudnn_fits` the inputs -- float16/bfloat16, a head_dim that is a multiple of 8, at most
128; elsewhere ``"cudnn"`` takes XLA's implementation, so that it can be set on a float32
program that mixed precision casts later (measured on an H100 at BERT-base shapes, forward
and backward in bf16: cuDNN 0.65 ms, ``"xla"`` 1.83 ms, written out 2.92 ms).

>>> import jax.numpy as jnp
>>> from paddlejax.ops.attention import scaled_dot_product_attention
>>> q = jnp.ones((1, 4, 2, 8))
>>> scaled_dot_product_attention(q, q, q, is_causal=True).shape
(1, 4, 2, 8)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import input_error

_OP = "scaled_dot_product_attention"


def _check(query, key, value, mask):
    b, sq, h, d = query.shape
    if key.shape[0] != b or key.shape[3] != d or h % key.shape[2]:
        raise input_error(_OP, "key", f"shape [{b}, k_len, heads dividing {h}, {d}]", key.shape)
    if value.shape != key.shape:
        raise input_error(_OP, "value", f"key's shape {key.shape}", value.shape)
    full = (b, h, sq, key.shape[1])
    if mask is not None:
        try:
            ok = jnp.broadcast_shapes(mask.shape, full) == full  # jnp's accepts symbolic sizes
        except ValueError:
            ok = False
        if not ok:
            raise input_error(_OP, "mask", f"a shape broadcastable to {full}", mask.shape)


def _large_negative(dtype):
    # the same finite "minus infinity" as jax.nn.dot_product_attention, so fully masked rows agree
    return jnp.asarray(-0.7 * jnp.finfo(dtype).max, dtype)


def require_implementation(implementation: str | None) -> None:
    """Raise a ValueError if ``implementation`` cannot run on this machine's JAX backend.

    >>> require_implementation("xla")
    """
    backend = jax.default_backend()
    if implementation == "cudnn" and backend != "gpu":
        raise ValueError(f"{_OP}: attribute 'implementation' is 'cudnn', which needs an NVIDIA GPU; "
                         f"the JAX backend here is '{backend}' (use None or 'xla')")


def cudnn_fits(query) -> bool:
    """Whether cuDNN's fused attention takes a query like this one (dtype and head_dim).

    >>> cudnn_fits(jax.ShapeDtypeStruct((2, 128, 12, 64), jnp.bfloat16))
    True
    >>> cudnn_fits(jax.ShapeDtypeStruct((2, 128, 12, 64), jnp.float32))
    False
    """
    return jnp.dtype(query.dtype) in (jnp.float16, jnp.bfloat16) and query.shape[-1] % 8 == 0 \
        and query.shape[-1] <= 128


def _sdpa(query, key, value, mask=None, *, is_causal, scale, implementation):
    """softmax(q k^T * scale + mask) v, computed explicitly in (at least) float32."""
    if implementation is not None:
        return _jax_nn(query, key, value, mask, is_causal=is_causal, scale=scale, implementation=implementation)
    _check(query, key, value, mask)
    b, sq, h, d = query.shape
    sk, hk = key.shape[1:3]
    dt = jnp.promote_types(query.dtype, jnp.float32)
    q = query.astype(dt).reshape(b, sq, hk, h // hk, d)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q, key.astype(dt)).reshape(b, h, sq, sk)
    logits = logits * (1 / math.sqrt(d) if scale is None else scale)
    if mask is not None and mask.dtype == jnp.bool_:
        logits = jnp.where(mask, logits, _large_negative(dt))
    elif mask is not None:
        logits = logits + mask.astype(dt)
    if is_causal:
        logits = jnp.where(jnp.tril(jnp.ones((sq, sk), bool)), logits, _large_negative(dt))
    probs = jax.nn.softmax(logits, axis=-1).reshape(b, hk, h // hk, sq, sk)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, value.astype(dt))
    return out.reshape(b, sq, h, d).astype(query.dtype)


def _jax_nn(query, key, value, mask=None, *, is_causal, scale, implementation):
    """jax.nn.dot_product_attention with ``implementation`` ("xla", or "cudnn" where it fits)."""
    _check(query, key, value, mask)
    require_implementation(implementation)
    if implementation == "cudnn" and not cudnn_fits(query):
        implementation = "xla"
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if mask is not None and implementation == "cudnn":  # cuDNN takes a mask with a row per query
        mask = jnp.broadcast_to(mask, mask.shape[:2] + (query.shape[1], key.shape[1]))
    is_bool = mask is not None and mask.dtype == jnp.bool_
    return jax.nn.dot_product_attention(query, key, value, bias=None if is_bool else mask,
                                        mask=mask if is_bool else None, scale=scale, is_causal=is_causal,
                                        implementation=implementation)


def _sdpa_xla(query, key, value, mask=None, *, is_causal, scale, implementation=None):
    """jax.nn.dot_product_attention's XLA implementation, whatever ``implementation`` says."""
    return _jax_nn(query, key, value, mask, is_causal=is_causal, scale=scale, implementation="xla")


def _sdpa_flops(in_shapes, out_shapes, attrs):
    """4 * batch * heads * q_len * k_len * head_dim (two matmuls)."""
    b, sq, h, d = in_shapes[0]
    return 4 * b * h * sq * in_shapes[1][1] * d


scaled_dot_product_attention = define(
    _OP, _sdpa,
    inputs=[Input("query", rank=4, dtype="float"), Input("key", rank=4, dtype="float"),
            Input("value", rank=4, dtype="float"), Input("mask", rank=(1, 2, 3, 4), optional=True)],
    attrs={"is_causal": Attr("bool", False), "scale": Attr("float", None, optional=True),
           "implementation": Attr("str", None, choices=("xla", "cudnn"), optional=True)},
    variants={"xla": _sdpa_xla}, flops=_sdpa_flops,
    traits=Traits(amp="white", channels="heads", channel_axis=lambda attrs, rank: 2))
