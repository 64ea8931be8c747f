"""The base of the distributions that TensorFlow Probability computes: each subclass builds
its ``tfd`` distribution from its parameters (``_make``) and inherits Paddle's methods here.

``sample`` stops gradients, as Paddle's does; ``rsample`` keeps them and exists for the
reparameterisable families (Paddle raises for the others, and so does this).

>>> from paddlejax.distribution import Normal
>>> d = Normal(0.0, 2.0)
>>> d.sample((2, 3), key=0).shape, round(float(d.variance), 3)
((2, 3), 4.0)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.distribution.args import prng_key, sample_shape
from paddlejax.distribution.backend import tfd
from paddlejax.distribution.distribution import Distribution


class Backed(Distribution):
    """A distribution computed by the ``tfd`` distribution that :meth:`_make` builds.

    Subclasses set their parameters as attributes named in ``_params`` and implement ``_make``.
    Samples have shape ``shape + batch_shape + event_shape`` and need ``key=`` (a JAX PRNG key
    or an int seed).

    >>> from paddlejax.distribution import Gamma
    >>> Gamma(2.0, 4.0).batch_shape, round(float(Gamma(2.0, 4.0).mean), 3)
    ((), 0.5)
    """

    @property
    def _dist(self):
        """The ``tfd`` distribution of the parameters."""
        return self._built()

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The shape of the batch of distributions."""
        return tuple(int(n) for n in self._dist.batch_shape)

    @property
    def event_shape(self) -> tuple[int, ...]:
        """The shape of one draw."""
        return tuple(int(n) for n in self._dist.event_shape)

    @property
    def mean(self) -> jax.Array:
        """The mean."""
        return self._dist.mean()

    @property
    def variance(self) -> jax.Array:
        """The variance (of each coordinate, for a multivariate distribution)."""
        return self._dist.variance()

    def log_prob(self, value) -> jax.Array:
        """The log density (or log mass) at ``value``, cast to the parameters' dtype."""
        return self._dist.log_prob(self._value(value))

    def entropy(self) -> jax.Array:
        """The (differential) entropy, in nats."""
        return self._dist.entropy()

    def cdf(self, value) -> jax.Array:
        """The cumulative distribution function at ``value``."""
        return self._dist.cdf(self._value(value))

    def icdf(self, value) -> jax.Array:
        """The quantile function: the value whose cdf is ``value``."""
        return self._dist.quantile(self._value(value))

    def sample(self, shape=(), key=None) -> jax.Array:
        """``shape + batch_shape + event_shape`` draws, with gradients stopped."""
        return jax.lax.stop_gradient(self._draw("sample", shape, key))

    def rsample(self, shape=(), key=None) -> jax.Array:
        """Reparameterised draws: ``jax.grad`` flows through them to the parameters."""
        name = type(self).__name__
        if self._dist.reparameterization_type != tfd.FULLY_REPARAMETERIZED:
            raise NotImplementedError(f"{name}.rsample: {name} is not reparameterizable; use sample")
        return self._draw("rsample", shape, key)

    def _draw(self, method: str, shape, key) -> jax.Array:
        owner = f"{type(self).__name__}.{method}"
        return self._dist.sample(sample_shape(owner, shape), seed=prng_key(owner, key))

    def _value(self, value) -> jax.Array:
        value = jnp.asarray(value)
        return value if value.dtype == self._dist.dtype else value.astype(self._dist.dtype)
