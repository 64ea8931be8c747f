"""Distributions built from others: Independent (batch dimensions read as event dimensions)
and TransformedDistribution (a distribution pushed through transforms).

>>> import jax.numpy as jnp
>>> from paddlejax.distribution import Normal
>>> d = Independent(Normal(jnp.zeros(3), 1.0), 1)
>>> d.batch_shape, d.event_shape, d.log_prob(jnp.zeros(3)).shape
((), (3,), ())
"""
from __future__ import annotations

from paddlejax.distribution.args import whole
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.backend import tfd
from paddlejax.distribution.transform import ChainTransform


def _base(owner: str, base) -> Backed:
    if not isinstance(base, Backed):
        raise TypeError(f"{owner}: base must be a paddlejax.distribution distribution, got {type(base).__name__}")
    return base


def _reinterpreted(owner: str, base, rank: int):
    """``base``'s ``tfd`` distribution with its ``rank`` rightmost batch dimensions as event
    dimensions."""
    if rank > len(base.batch_shape):
        raise ValueError(f"{owner}: the base has batch shape {base.batch_shape}, fewer than the {rank} "
                         "dimensions to read as event dimensions")
    return tfd.Independent(base._dist, reinterpreted_batch_ndims=rank) if rank else base._dist


class Independent(Backed):
    """``base`` with its ``reinterpreted_batch_rank`` rightmost batch dimensions read as event
    dimensions: ``log_prob`` sums over them.

    >>> import jax.numpy as jnp
    >>> from paddlejax.distribution import Beta
    >>> Independent(Beta(jnp.ones((2, 3)), 1.0), 2).event_shape
    (2, 3)
    """

    _params = ("base",)
    _static = ("reinterpreted_batch_rank",)

    def __init__(self, base, reinterpreted_batch_rank):
        self.base = _base("Independent", base)
        rank = whole(reinterpreted_batch_rank)
        if rank is None or rank < 1:
            raise ValueError(f"Independent: reinterpreted_batch_rank must be an int >= 1, got {reinterpreted_batch_rank!r}")
        self.reinterpreted_batch_rank = rank
        self._built()

    def _make(self):
        return _reinterpreted("Independent", self.base, self.reinterpreted_batch_rank)


class TransformedDistribution(Backed):
    """The distribution of ``transforms[-1](...transforms[0](X))`` for ``X ~ base``. Where the
    transforms act on vectors (StickBreaking, Reshape), the base's rightmost batch dimensions
    become event dimensions, as in Paddle.

    >>> from paddlejax.distribution import Normal, ExpTransform
    >>> d = TransformedDistribution(Normal(0.0, 1.0), [ExpTransform()])  # the log-normal
    >>> round(float(d.log_prob(1.0)), 4)
    -0.9189
    """

    _params = ("base", "transforms")

    def __init__(self, base, transforms):
        self.base = _base("TransformedDistribution", base)
        self.transforms = ChainTransform(transforms).transforms
        self._built()

    def _make(self):
        chain = ChainTransform(self.transforms)._built()
        extra = max(chain.forward_min_event_ndims - len(self.base.event_shape), 0)
        return tfd.TransformedDistribution(_reinterpreted("TransformedDistribution", self.base, extra), chain)
