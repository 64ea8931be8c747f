"""``hash_bucket``: integer feature values hashed into a fixed number of buckets (Paddle's
``hash`` op), so features never seen before (new user ids, new ad ids) still land on an
embedding row. The hash is MurmurHash3's 32-bit finaliser over the value mixed with ``seed``:
neighbouring values land far apart, and a different ``seed`` per feature field spreads
fields that share one table.

>>> import jax.numpy as jnp
>>> hash_bucket(jnp.array([0, 1, 2, 123456789]), buckets=1000).tolist()
[27, 484, 93, 66]
"""
from __future__ import annotations

import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _hash_bucket(ids, *, buckets, seed):
    """Each id's bucket in ``[0, buckets)`` (int32, the ids' shape)."""
    h = ids.astype(jnp.uint32)
    if jnp.dtype(ids.dtype).itemsize > 4:  # fold the high half in, so ids past 2**32 differ too
        h = h ^ _fmix32((ids >> 32).astype(jnp.uint32) + jnp.uint32(0x9E3779B9))
    h = _fmix32(h ^ jnp.uint32((seed + 1) * 0x9E3779B1 % 2**32))
    return (h % jnp.uint32(buckets)).astype(jnp.int32)


hash_bucket = define(
    "hash_bucket", _hash_bucket, inputs=[Input("ids", dtype="int")],
    attrs={"buckets": Attr("int", minimum=1), "seed": Attr("int", 0, minimum=0)},
    flops=lambda ins, outs, attrs: 0, traits=Traits(pointwise=True))
