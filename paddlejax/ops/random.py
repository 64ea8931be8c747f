"""Random ops: dropout driven by an explicit raw PRNG key (``jax.random.PRNGKey``).

``mode="upscale_in_train"`` (Paddle's default) scales kept values by ``1 / (1 - p)`` in
training and is the identity in inference; ``"downscale_in_infer"`` keeps values unscaled in
training and multiplies by ``1 - p`` in inference.

>>> import jax, jax.numpy as jnp
>>> from paddlejax.ops.random import dropout
>>> y = dropout(jnp.ones(1000), jax.random.PRNGKey(0), p=0.5)
>>> sorted(set(y.tolist()))
[0.0, 2.0]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define, elementwise_flops
from paddlejax.ops.common import attr_error, input_error


def _dropout(x, key, *, p, training, mode):
    """Zero each element with probability ``p`` (a fresh mask per key), rescaling per ``mode``."""
    if p > 1:
        raise attr_error("dropout", "p", "a probability in [0, 1]", p)
    if key.shape != (2,):
        raise input_error("dropout", "key", "a raw uint32[2] PRNG key (jax.random.PRNGKey)", key.shape)
    if not training:
        return x if mode == "upscale_in_train" else x * jnp.asarray(1 - p, x.dtype)
    keep = jax.random.bernoulli(key.astype(jnp.uint32), 1 - p, x.shape)
    # p == 1 keeps nothing; avoid the 0 * inf of scaling by 1 / (1 - p)
    scale = 1.0 if mode == "downscale_in_infer" else (0.0 if p == 1 else 1 / (1 - p))
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


dropout = define("dropout", _dropout, inputs=[Input("x", dtype="float"), Input("key", rank=1, dtype="int")],
                 attrs={"p": Attr("float", 0.5, minimum=0.0), "training": Attr("bool", True),
                        "mode": Attr("str", "upscale_in_train", choices=("upscale_in_train", "downscale_in_infer"))},
                 flops=elementwise_flops)
