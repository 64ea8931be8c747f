"""Discrete distributions with Paddle's names and arguments: Bernoulli, Categorical, Binomial,
Poisson, Geometric and Multinomial.

Samples of counts (Bernoulli, Binomial, Poisson, Geometric, Multinomial) are floats of the
parameters' dtype, as in Paddle; Categorical samples are integer category indices.

>>> Bernoulli(0.3).sample((4,), key=0).dtype == Bernoulli(0.3).probs.dtype
True
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.distribution.args import constrain, floats, positive, probability, prng_key, sample_shape, whole
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.backend import tfb, tfd
from paddlejax.distribution.exponential_family import ExponentialFamily


class Bernoulli(Backed, ExponentialFamily):
    """The Bernoulli distribution: 1 with probability ``probs``, else 0.

    :meth:`rsample` draws from the relaxed (Concrete) Bernoulli at ``temperature``, a
    differentiable stand-in for the discrete draws.

    >>> d = Bernoulli(0.25)
    >>> float(d.prob(1.0)), float(d.mean), round(float(d.logits), 4)
    (0.25, 0.25, -1.0986)
    """

    _params = ("probs",)

    def __init__(self, probs, name=None):
        (self.probs,) = floats("Bernoulli", probs=probs)
        probability("Bernoulli", "probs", self.probs)
        self.name = name

    @property
    def logits(self) -> jax.Array:
        """The log-odds ``log(probs / (1 - probs))``."""
        return self._dist.logits_parameter()

    def _make(self):
        return tfd.Bernoulli(probs=self.probs, dtype=self.probs.dtype)

    def rsample(self, shape=(), temperature=1.0, key=None) -> jax.Array:
        """Relaxed draws in ``(0, 1)``, differentiable in ``probs``; they approach 0/1 draws as
        ``temperature`` goes to 0.

        >>> x = Bernoulli(0.5).rsample((3,), temperature=0.5, key=0)
        >>> x.shape, bool(((x > 0) & (x < 1)).all())
        ((3,), True)
        """
        (temperature,) = floats("Bernoulli.rsample", temperature=temperature)
        positive("Bernoulli.rsample", temperature=temperature)
        relaxed = tfd.RelaxedBernoulli(temperature.astype(self.probs.dtype), probs=self.probs)
        return relaxed.sample(sample_shape("Bernoulli.rsample", shape), seed=prng_key("Bernoulli.rsample", key))


class Categorical(Backed):
    """A distribution over the category indices ``0 .. K-1`` of the last axis of ``logits``.

    ``logits`` are unnormalised log-probabilities (``softmax(logits)`` are the probabilities)
    in every method. Paddle 2.x reads them so in ``entropy`` and ``kl_divergence`` but as
    unnormalised probabilities in ``sample`` and ``probs``; pass ``log(p)`` to get Paddle's
    sampling of probabilities ``p``.

    >>> d = Categorical(jnp.log(jnp.array([0.2, 0.3, 0.5])))
    >>> round(float(d.prob(2)), 4), d.sample((4,), key=0).shape
    (0.5, (4,))
    """

    _params = ("logits",)

    def __init__(self, logits, name=None):
        (self.logits,) = floats("Categorical", logits=logits)
        if self.logits.ndim < 1:
            raise ValueError("Categorical: logits must have at least one axis (the categories)")
        self.name = name

    def _make(self):
        return tfd.Categorical(logits=self.logits, dtype=jax.dtypes.canonicalize_dtype(jnp.int64),
                               force_probs_to_zero_outside_support=True)


def _support_size(owner: str, name: str, value) -> int:
    """The largest value of ``value`` as an int, which must be concrete."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{owner} sums over the support, whose size depends on {name}: build the "
                        f"distribution from a concrete {name}, not from a traced argument")
    return int(np.ceil(np.max(np.asarray(value)))) if np.size(value) else 0


def _entropy_over(dist, upper: int) -> jax.Array:
    """``-sum p log p`` over the values ``0 .. upper`` of a scalar discrete ``dist``."""
    k = jnp.arange(upper + 1, dtype=dist.dtype).reshape((-1,) + (1,) * len(dist.batch_shape))
    log_p = dist.log_prob(k)
    return -jnp.sum(jnp.where(jnp.isfinite(log_p), jnp.exp(log_p) * log_p, 0), axis=0)


class Binomial(Backed):
    """The number of successes in ``total_count`` trials of probability ``probs``.

    :meth:`entropy` sums over the support, so it needs a concrete ``total_count``.

    >>> d = Binomial(10, 0.3)
    >>> round(float(d.mean), 4), round(float(d.variance), 4)
    (3.0, 2.1)
    """

    _params = ("total_count", "probs")

    def __init__(self, total_count, probs):
        self.total_count, self.probs = floats("Binomial", total_count=total_count, probs=probs)
        constrain("Binomial", "total_count", self.total_count, lambda n: (n >= 0) & (n == jnp.floor(n)),
                  "a whole number >= 0")
        probability("Binomial", "probs", self.probs)

    def _make(self):
        return tfd.Binomial(self.total_count, probs=self.probs)

    def entropy(self) -> jax.Array:
        """The entropy, summed over ``0 .. total_count``."""
        return _entropy_over(self._dist, _support_size("Binomial.entropy", "total_count", self.total_count))


class Poisson(Backed):
    """The Poisson distribution with ``rate`` (its mean and variance).

    :meth:`entropy` sums over ``0 .. rate + 30 sqrt(rate) + 30`` (the mass beyond is far below
    float64 resolution), so it needs a concrete ``rate``.

    >>> round(float(Poisson(2.0).prob(0)), 4)  # exp(-2)
    0.1353
    """

    _params = ("rate",)

    def __init__(self, rate):
        (self.rate,) = floats("Poisson", rate=rate)
        positive("Poisson", rate=self.rate)

    def _make(self):
        return tfd.Poisson(rate=self.rate, force_probs_to_zero_outside_support=True)

    def entropy(self) -> jax.Array:
        """The entropy, summed over the support up to far in the tail."""
        top = _support_size("Poisson.entropy", "rate", self.rate)
        return _entropy_over(self._dist, int(top + 30 * np.sqrt(top) + 30))


class Geometric(Backed):
    """The number of Bernoulli(``probs``) trials up to and including the first success: values
    ``1, 2, 3, ...`` with ``P(k) = (1 - probs)**(k - 1) probs``, mean ``1 / probs`` and
    ``cdf(k) = 1 - (1 - probs)**k``, as Paddle's docstrings give them.

    >>> d = Geometric(0.5)
    >>> float(d.mean), float(d.pmf(2)), float(d.cdf(4))
    (2.0, 0.25, 0.9375)
    """

    _params = ("probs",)

    def __init__(self, probs):
        (self.probs,) = floats("Geometric", probs=probs)
        probability("Geometric", "probs", self.probs, open_low=True)

    def _make(self):
        # the library counts the failures before the first success: one less
        failures = tfd.Geometric(probs=self.probs, force_probs_to_zero_outside_support=True)
        return tfd.TransformedDistribution(failures, tfb.Shift(jnp.ones((), self.probs.dtype)))

    def pmf(self, k) -> jax.Array:
        """Paddle's name of :meth:`prob`."""
        return self.prob(k)

    def log_pmf(self, k) -> jax.Array:
        """Paddle's name of :meth:`log_prob`."""
        return self.log_prob(k)


class Multinomial(Backed):
    """Counts of ``total_count`` draws from the categories of ``probs`` (normalised along the
    last axis, as Paddle does).

    >>> d = Multinomial(4, [1.0, 1.0, 2.0])
    >>> d.mean.tolist(), d.sample((), key=0).sum().item()
    ([1.0, 1.0, 2.0], 4.0)
    """

    _params = ("probs",)
    _static = ("total_count",)

    def __init__(self, total_count, probs):
        if whole(total_count) is None or total_count < 1:
            raise ValueError(f"Multinomial: total_count must be an int >= 1, got {total_count!r}")
        self.total_count = whole(total_count)
        (probs,) = floats("Multinomial", probs=probs)
        if probs.ndim < 1:
            raise ValueError("Multinomial: probs must have at least one axis (the categories)")
        constrain("Multinomial", "probs", probs, lambda p: p >= 0, ">= 0")
        self.probs = probs / probs.sum(-1, keepdims=True)

    def _make(self):
        return tfd.Multinomial(float(self.total_count), probs=self.probs)

    def entropy(self) -> jax.Array:
        """``-log n! - n sum p log p + sum_i E[log X_i!]``, each count ``X_i`` being
        Binomial(n, p_i)."""
        n, p = self.total_count, self.probs
        counts = jnp.arange(n + 1, dtype=p.dtype)
        count_pmf = tfd.Binomial(float(n), probs=p[..., None]).prob(counts)
        expected_log_factorials = jnp.sum(count_pmf * jax.scipy.special.gammaln(counts + 1), axis=(-2, -1))
        return (-jax.scipy.special.gammaln(n + 1.0) - n * jnp.sum(jax.scipy.special.xlogy(p, p), -1)
                + expected_log_factorials)
