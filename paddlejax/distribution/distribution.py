"""The base class of every distribution: Paddle's ``paddle.distribution.Distribution`` API.

A subclass that lists its array attributes in ``_params`` is a pytree
(:mod:`paddlejax.distribution.pytree`), so a distribution can be an argument of a jitted
function or the thing ``jax.grad`` differentiates. A subclass that does not is a plain object,
as a user's own distribution written against Paddle's API would be:

>>> class Coin(Distribution):
...     def __init__(self):
...         super().__init__(batch_shape=(), event_shape=())
...     def log_prob(self, value):
...         return jnp.log(jnp.full(jnp.shape(value), 0.5))
>>> float(Coin().prob(1.0))
0.5
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.distribution.pytree import Parametrised


class Distribution(Parametrised):
    """The abstract base class of probability distributions (Paddle's ``Distribution``).

    ``batch_shape`` indexes independent, not identically distributed distributions; one draw
    has ``event_shape`` (``()`` for a scalar distribution, ``(n,)`` for an n-dimensional one).
    Subclasses implement what they support; the rest raises NotImplementedError.

    >>> d = Distribution(batch_shape=[3], event_shape=[2])
    >>> d.batch_shape, d.event_shape
    ((3,), (2,))
    """

    name = None  # Paddle's ``name`` argument, accepted for compatibility

    def __init__(self, batch_shape=(), event_shape=()):
        self._batch_shape = tuple(batch_shape)
        self._event_shape = tuple(event_shape)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The shape of the batch of distributions."""
        return self._batch_shape

    @property
    def event_shape(self) -> tuple[int, ...]:
        """The shape of one draw."""
        return self._event_shape

    @property
    def mean(self) -> jax.Array:
        """The mean."""
        raise NotImplementedError(f"{type(self).__name__}.mean")

    @property
    def variance(self) -> jax.Array:
        """The variance."""
        raise NotImplementedError(f"{type(self).__name__}.variance")

    @property
    def stddev(self) -> jax.Array:
        """The standard deviation: the square root of the variance."""
        return jnp.sqrt(self.variance)

    def sample(self, shape=(), key=None) -> jax.Array:
        """``shape + batch_shape + event_shape`` draws, without gradient."""
        raise NotImplementedError(f"{type(self).__name__}.sample")

    def rsample(self, shape=(), key=None) -> jax.Array:
        """Reparameterised draws: differentiable with respect to the parameters."""
        raise NotImplementedError(f"{type(self).__name__}.rsample")

    def log_prob(self, value) -> jax.Array:
        """The log density (or log mass) at ``value``."""
        raise NotImplementedError(f"{type(self).__name__}.log_prob")

    def prob(self, value) -> jax.Array:
        """The density (or mass) at ``value``: ``exp(log_prob(value))``."""
        return jnp.exp(self.log_prob(value))

    def probs(self, value) -> jax.Array:
        """Paddle's older name of :meth:`prob`."""
        return self.prob(value)

    def entropy(self) -> jax.Array:
        """The (differential) entropy, in nats."""
        raise NotImplementedError(f"{type(self).__name__}.entropy")

    def cdf(self, value) -> jax.Array:
        """The cumulative distribution function at ``value``."""
        raise NotImplementedError(f"{type(self).__name__}.cdf")

    def icdf(self, value) -> jax.Array:
        """The inverse of the cumulative distribution function (the quantile function)."""
        raise NotImplementedError(f"{type(self).__name__}.icdf")

    def kl_divergence(self, other: Distribution) -> jax.Array:
        """``KL(self || other)``: see :func:`paddlejax.distribution.kl_divergence`."""
        from paddlejax.distribution.kl import kl_divergence  # kl dispatches on these classes
        return kl_divergence(self, other)

    def _extend_shape(self, sample_shape) -> tuple[int, ...]:
        """The shape of ``sample(sample_shape)``."""
        return tuple(sample_shape) + tuple(self.batch_shape) + tuple(self.event_shape)

