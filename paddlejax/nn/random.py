"""Randomness for layers: the global seeded stream that initialises parameters (like
``paddle.seed``) and :class:`RngKey`, the key state a layer advances itself.

Every random initialisation draws the next key of one global stream, so re-seeding gives
identical parameters. A layer built with ``rngs=nnx.Rngs(...)`` draws from those instead.

>>> import paddlejax.nn as nn
>>> nn.seed(7); a = nn.Linear(2, 3).weight[...]
>>> nn.seed(7); b = nn.Linear(2, 3).weight[...]
>>> bool((a == b).all())
True
"""
from __future__ import annotations

import jax
from flax import nnx

from paddlejax.nn.args import arg_error, is_int

_stream = {"seed": 0, "count": 0, "base": None}


def seed(n: int) -> None:
    """Restart the global parameter stream from seed ``n`` (as ``paddle.seed`` does).

    >>> seed(0); k1 = next_key()
    >>> seed(0); bool((jax.random.key_data(k1) == jax.random.key_data(next_key())).all())
    True
    """
    if not is_int(n):
        raise arg_error("seed", "n", "an int", n)
    _stream.update(seed=int(n), count=0, base=None)


def next_key(rngs: nnx.Rngs | None = None, stream: str = "params") -> jax.Array:
    """A fresh typed PRNG key: from ``rngs[stream]`` if given, else from the global stream.

    >>> next_key(nnx.Rngs(0)).dtype
    key<fry>
    """
    if rngs is not None:
        return getattr(rngs, stream)()
    # keys stay concrete even when a layer is built inside a jax trace
    with jax.ensure_compile_time_eval():
        if _stream["base"] is None:
            _stream["base"] = jax.random.key(_stream["seed"])
        key = jax.random.fold_in(_stream["base"], _stream["count"])
    _stream["count"] += 1
    return key


class RngKey(nnx.Variable):
    """A raw ``uint32[2]`` PRNG key held by a layer (e.g. :class:`~paddlejax.nn.Dropout`).

    Raw rather than typed, because program IR values cannot hold typed keys; the layer
    advances it with the ``split_key`` op on every random call.

    >>> k = RngKey.fresh(nnx.Rngs(0))
    >>> k[...].dtype, k[...].shape
    (dtype('uint32'), (2,))
    """

    @classmethod
    def fresh(cls, rngs: nnx.Rngs | None = None) -> RngKey:
        """A new key state seeded from ``rngs.dropout`` or the global stream."""
        return cls(jax.random.key_data(next_key(rngs, "dropout")))
