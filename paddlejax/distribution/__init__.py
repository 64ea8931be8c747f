"""Probability distributions with Paddle's API (``paddle.distribution``), computed by
TensorFlow Probability's JAX substrate (install the ``prob`` extra).

Every distribution has Paddle's constructor arguments and ``sample``, ``rsample``,
``log_prob``, ``prob``, ``entropy``, ``mean``, ``variance`` (and ``cdf``/``icdf`` where the
library has them); :func:`kl_divergence` and :func:`register_kl` pair them; the transforms map
values with their log-Jacobians.

Randomness is explicit: ``sample(shape, key)`` takes a JAX PRNG key (or an int seed) and no
hidden global state, so a draw is reproducible and the same under ``jax.jit``. ``sample``
stops gradients; ``rsample`` (the reparameterisable families) lets ``jax.grad`` through.
Distributions and transforms are pytrees of their parameters: pass them to jitted, vmapped or
differentiated functions. Parameters take the dtype of the float arrays given (Python numbers
follow ``jax_enable_x64``); bad parameters raise a ValueError when built eagerly (see
:mod:`paddlejax.distribution.args` for what happens under tracing).

>>> import jax, paddlejax as pj
>>> D = pj.distribution
>>> p, q = D.Normal(0.0, 1.0), D.Normal(1.0, 2.0)
>>> round(float(D.kl_divergence(p, q)), 4)
0.4431
>>> eps = D.Normal(0.0, 1.0).sample((), key=0)  # d(loc + scale * eps) / d scale = eps
>>> bool(jax.grad(lambda s: D.Normal(0.0, s).rsample((), key=0))(1.0) == eps)
True
"""
from paddlejax.distribution import transform
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.composite import Independent, TransformedDistribution
from paddlejax.distribution.continuous import (Beta, Cauchy, Chi2, ContinuousBernoulli, Exponential, Gamma, Gumbel,
                                               Laplace, LogNormal, Normal, StudentT, Uniform)
from paddlejax.distribution.discrete import Bernoulli, Binomial, Categorical, Geometric, Multinomial, Poisson
from paddlejax.distribution.distribution import Distribution
from paddlejax.distribution.exponential_family import ExponentialFamily
from paddlejax.distribution.kl import kl_divergence, register_kl
from paddlejax.distribution.multivariate import Dirichlet, LKJCholesky, MultivariateNormal
from paddlejax.distribution.transform import (AbsTransform, AffineTransform, ChainTransform, ExpTransform,
                                              IndependentTransform, PowerTransform, ReshapeTransform,
                                              SigmoidTransform, SoftmaxTransform, StackTransform,
                                              StickBreakingTransform, TanhTransform, Transform)

__all__ = ["Backed", "Bernoulli", "Beta", "Binomial", "Categorical", "Cauchy", "Chi2", "ContinuousBernoulli",
           "Dirichlet", "Distribution", "Exponential", "ExponentialFamily", "Gamma", "Geometric", "Gumbel",
           "Independent", "LKJCholesky", "Laplace", "LogNormal", "Multinomial", "MultivariateNormal", "Normal",
           "Poisson", "StudentT", "TransformedDistribution", "Uniform", "kl_divergence", "register_kl", "transform",
           "AbsTransform", "AffineTransform", "ChainTransform", "ExpTransform", "IndependentTransform",
           "PowerTransform", "ReshapeTransform", "SigmoidTransform", "SoftmaxTransform", "StackTransform",
           "StickBreakingTransform", "TanhTransform", "Transform"]
