"""Scalar continuous distributions with Paddle's names and arguments: Normal, Uniform, Beta,
Gamma, Chi2, Exponential, Laplace, Gumbel, Cauchy, StudentT, LogNormal and
ContinuousBernoulli.

>>> d = Normal(loc=[0.0, 1.0], scale=2.0)
>>> d.batch_shape, d.sample((5,), key=0).shape
((2,), (5, 2))
"""
from __future__ import annotations

import jax

from paddlejax.distribution.args import constrain, floats, positive, probability
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.backend import tfd
from paddlejax.distribution.exponential_family import ExponentialFamily


class _LocationScale(Backed):
    """A family given by a location and a positive scale; ``_family`` is its ``tfd`` class."""

    _params = ("loc", "scale")
    _family = None

    def __init__(self, loc, scale, name=None):
        owner = type(self).__name__
        self.loc, self.scale = floats(owner, loc=loc, scale=scale)
        positive(owner, scale=self.scale)
        self.name = name

    def _make(self):
        return self._family(self.loc, self.scale)


class Normal(_LocationScale):
    """The normal distribution with mean ``loc`` and standard deviation ``scale``.

    >>> d = Normal(0.0, 1.0)
    >>> round(float(d.log_prob(0.0)), 4), round(float(d.entropy()), 4)
    (-0.9189, 1.4189)
    """

    _family = tfd.Normal


class Laplace(_LocationScale):
    """The Laplace distribution: density ``exp(-|x - loc| / scale) / (2 scale)``.

    >>> round(float(Laplace(0.0, 1.0).icdf(0.75)), 4)
    0.6931
    """

    _family = tfd.Laplace


class Gumbel(_LocationScale):
    """The Gumbel (type-I extreme value) distribution.

    >>> round(float(Gumbel(0.0, 1.0).mean), 4)  # the Euler-Mascheroni constant
    0.5772
    """

    _family = tfd.Gumbel


class LogNormal(_LocationScale):
    """The distribution of ``exp(X)`` for ``X ~ Normal(loc, scale)``.

    >>> round(float(LogNormal(0.0, 1.0).mean), 4)  # exp(1/2)
    1.6487
    """

    _family = tfd.LogNormal


class Cauchy(_LocationScale):
    """The Cauchy distribution; like Paddle's, its mean and variance raise a ValueError.

    >>> float(Cauchy(0.0, 1.0).cdf(0.0))
    0.5
    """

    _family = tfd.Cauchy

    @property
    def mean(self) -> jax.Array:
        """Undefined: raises ValueError."""
        raise ValueError("Cauchy: the Cauchy distribution has no mean")

    @property
    def variance(self) -> jax.Array:
        """Undefined: raises ValueError."""
        raise ValueError("Cauchy: the Cauchy distribution has no variance")

    @property
    def stddev(self) -> jax.Array:
        """Undefined: raises ValueError."""
        raise ValueError("Cauchy: the Cauchy distribution has no standard deviation")


class StudentT(Backed):
    """Student's t distribution with ``df`` degrees of freedom, shifted by ``loc`` and scaled by
    ``scale``.

    >>> round(float(StudentT(3.0, 0.0, 1.0).variance), 4)  # df / (df - 2)
    3.0
    """

    _params = ("df", "loc", "scale")

    def __init__(self, df, loc, scale, name=None):
        self.df, self.loc, self.scale = floats("StudentT", df=df, loc=loc, scale=scale)
        positive("StudentT", df=self.df, scale=self.scale)
        self.name = name

    def _make(self):
        return tfd.StudentT(self.df, self.loc, self.scale)


class Uniform(Backed):
    """The uniform distribution on ``[low, high)``; ``log_prob`` is ``-inf`` outside.

    >>> round(float(Uniform(1.0, 3.0).prob(2.0)), 4), float(Uniform(1.0, 3.0).log_prob(5.0))
    (0.5, -inf)
    """

    _params = ("low", "high")

    def __init__(self, low, high, name=None):
        self.low, self.high = floats("Uniform", low=low, high=high)
        constrain("Uniform", "high", self.high, lambda high: high > self.low, "> low")
        self.name = name

    def _make(self):
        return tfd.Uniform(self.low, self.high)


class Beta(Backed, ExponentialFamily):
    """The beta distribution on ``[0, 1]`` with concentrations ``alpha`` and ``beta``.

    >>> round(float(Beta(2.0, 3.0).mean), 4)
    0.4
    """

    _params = ("alpha", "beta")

    def __init__(self, alpha, beta):
        self.alpha, self.beta = floats("Beta", alpha=alpha, beta=beta)
        positive("Beta", alpha=self.alpha, beta=self.beta)

    def _make(self):
        return tfd.Beta(self.alpha, self.beta, force_probs_to_zero_outside_support=True)

    def icdf(self, value) -> jax.Array:
        """Not provided (nor by Paddle): the library's inverse incomplete beta function misses
        the median of asymmetric Beta distributions by about 1e-2."""
        raise NotImplementedError("Beta.icdf")


class Gamma(Backed, ExponentialFamily):
    """The gamma distribution with shape ``concentration`` and inverse scale ``rate``.

    >>> round(float(Gamma(3.0, 2.0).variance), 4)  # concentration / rate**2
    0.75
    """

    _params = ("concentration", "rate")

    def __init__(self, concentration, rate):
        owner = type(self).__name__
        self.concentration, self.rate = floats(owner, concentration=concentration, rate=rate)
        positive(owner, concentration=self.concentration, rate=self.rate)

    def _make(self):
        return tfd.Gamma(self.concentration, self.rate, force_probs_to_zero_outside_support=True)


class Chi2(Gamma):
    """The chi-squared distribution with ``df`` degrees of freedom: ``Gamma(df / 2, 1 / 2)``.

    >>> float(Chi2(4.0).mean), float(Chi2(4.0).df)
    (4.0, 4.0)
    """

    def __init__(self, df):
        (df,) = floats("Chi2", df=df)
        positive("Chi2", df=df)
        super().__init__(0.5 * df, 0.5)

    @property
    def df(self) -> jax.Array:
        """The degrees of freedom."""
        return 2 * self.concentration


class Exponential(Backed, ExponentialFamily):
    """The exponential distribution with ``rate`` (mean ``1 / rate``).

    >>> round(float(Exponential(2.0).cdf(1.0)), 4)  # 1 - exp(-2)
    0.8647
    """

    _params = ("rate",)

    def __init__(self, rate):
        (self.rate,) = floats("Exponential", rate=rate)
        positive("Exponential", rate=self.rate)

    def _make(self):
        return tfd.Exponential(self.rate, force_probs_to_zero_outside_support=True)


class ContinuousBernoulli(Backed):
    """The continuous Bernoulli distribution on ``[0, 1]``, density proportional to
    ``probs**x (1 - probs)**(1 - x)``. Paddle's ``lims`` (the interval around 1/2 where its
    normaliser switches to a Taylor expansion) is checked and kept for compatibility: the
    library computes in log-odds space, stable at 1/2 without a switch.

    >>> round(float(ContinuousBernoulli(0.5).mean), 4)
    0.5
    """

    _params = ("probs",)
    _static = ("lims",)

    def __init__(self, probs, lims=(0.499, 0.501)):
        (self.probs,) = floats("ContinuousBernoulli", probs=probs)
        probability("ContinuousBernoulli", "probs", self.probs)
        if not (isinstance(lims, (tuple, list)) and len(lims) == 2 and 0 < lims[0] < 0.5 < lims[1] < 1):
            raise ValueError(f"ContinuousBernoulli: lims must be two numbers around 0.5, got {lims!r}")
        self.lims = (float(lims[0]), float(lims[1]))

    def _make(self):
        return tfd.ContinuousBernoulli(probs=self.probs, dtype=self.probs.dtype)
