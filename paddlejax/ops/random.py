"""Random ops driven by explicit raw PRNG keys (``jax.random.PRNGKey``, ``uint32[2]``):
dropout, and split_key to advance a key held as state (program values cannot be typed keys).

``mode="upscale_in_train"`` (Paddle's default) scales kept values by ``1 / (1 - p)`` in
training and is the identity in inference; ``"downscale_in_infer"`` keeps values unscaled in
training and multiplies by ``1 - p`` in inference. ``axis`` shares one mask along the other axes.

>>> import jax, jax.numpy as jnp
>>> from paddlejax.ops.random import dropout, split_key
>>> y = dropout(jnp.ones(1000), jax.random.PRNGKey(0), p=0.5)
>>> sorted(set(y.tolist()))
[0.0, 2.0]
>>> new_key, subkey = split_key(jax.random.PRNGKey(0))
>>> new_key.dtype, subkey.shape
(dtype('uint32'), (2,))
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define, elementwise_flops
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import IntOrInts, attr_error, input_error, norm_axes


def _dropout(x, key, *, p, training, mode, axis):
    """Zero each element with probability ``p`` (a fresh mask per key), rescaling per ``mode``;
    with ``axis``, one mask over those axes is shared along the others."""
    if p > 1:
        raise attr_error("dropout", "p", "a probability in [0, 1]", p)
    if key.shape != (2,):
        raise input_error("dropout", "key", "a raw uint32[2] PRNG key (jax.random.PRNGKey)", key.shape)
    if not training:
        return x if mode == "upscale_in_train" else x * jnp.asarray(1 - p, x.dtype)
    mask_shape = x.shape
    if axis is not None:
        axes = norm_axes("dropout", "axis", axis, x.ndim)
        mask_shape = tuple(n if i in axes else 1 for i, n in enumerate(x.shape))
    keep = jax.random.bernoulli(key.astype(jnp.uint32), 1 - p, mask_shape)
    # p == 1 keeps nothing; avoid the 0 * inf of scaling by 1 / (1 - p)
    scale = 1.0 if mode == "downscale_in_infer" else (0.0 if p == 1 else 1 / (1 - p))
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))


dropout = define("dropout", _dropout, inputs=[Input("x", dtype="float"), Input("key", rank=1, dtype="int")],
                 attrs={"p": Attr("float", 0.5, minimum=0.0), "training": Attr("bool", True),
                        "mode": Attr("str", "upscale_in_train", choices=("upscale_in_train", "downscale_in_infer")),
                        "axis": IntOrInts("ints", None, optional=True)},
                 flops=elementwise_flops,
                 # random given its key, so pure: the key is an operand
                 traits=Traits(channels="identity", identity_if=lambda attrs: (
                     (not attrs["training"] or attrs["p"] == 0.0) and attrs["mode"] == "upscale_in_train")))


@jax.jit  # eager calls reuse one compiled split instead of re-tracing the vmap each time
def _split_key(key):
    """Split raw ``uint32[..., 2]`` keys into ``(new_key, subkey)`` with ``jax.random.split``."""
    if key.shape[-1:] != (2,):
        raise input_error("split_key", "key", "raw uint32[..., 2] PRNG keys (jax.random.PRNGKey)", key.shape)
    pairs = jax.vmap(jax.random.split)(key.reshape(-1, 2).astype(jnp.uint32))
    return pairs[:, 0].reshape(key.shape), pairs[:, 1].reshape(key.shape)


split_key = define("split_key", _split_key, inputs=[Input("key", dtype="int")], outputs=("new_key", "subkey"),
                   traits=Traits())
