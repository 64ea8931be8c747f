"""``kl_divergence(p, q)`` and ``register_kl``, as in Paddle.

A pair of distributions finds its KL divergence in this order: a function registered with
:func:`register_kl` for their classes (the most specific match of the two class hierarchies),
the library's closed form (TensorFlow Probability's own KL registry), and for two instances of
one user-defined :class:`~paddlejax.distribution.ExponentialFamily` class, the Bregman
divergence of its log normaliser. Otherwise a NotImplementedError names the pair.

>>> from paddlejax.distribution import Normal
>>> round(float(kl_divergence(Normal(0.0, 1.0), Normal(1.0, 1.0))), 4)
0.5
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from paddlejax.distribution.args import constrain
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.backend import tfd
from paddlejax.distribution.discrete import Binomial, Geometric, Poisson
from paddlejax.distribution.distribution import Distribution
from paddlejax.distribution.exponential_family import ExponentialFamily

_REGISTRY: dict[tuple[type, type], Callable] = {}


def register_kl(cls_p: type, cls_q: type):
    """A decorator registering ``fn(p, q)`` as ``KL(p || q)`` for instances of ``cls_p`` and
    ``cls_q`` (and their subclasses, unless a more specific pair is registered).

    >>> from paddlejax.distribution import Distribution
    >>> class Point(Distribution):
    ...     pass
    >>> @register_kl(Point, Point)
    ... def _kl_point(p, q):
    ...     return jnp.zeros(())
    >>> float(kl_divergence(Point(), Point()))
    0.0
    """
    for cls in (cls_p, cls_q):
        if not (isinstance(cls, type) and issubclass(cls, Distribution)):
            raise TypeError(f"register_kl: expects two Distribution subclasses, got {cls!r}")

    def decorator(fn: Callable) -> Callable:
        _REGISTRY[cls_p, cls_q] = fn
        return fn
    return decorator


def _registered(type_p: type, type_q: type) -> Callable | None:
    matches = [pair for pair in _REGISTRY if issubclass(type_p, pair[0]) and issubclass(type_q, pair[1])]
    if not matches:
        return None
    return _REGISTRY[min(matches, key=lambda pair: (type_p.__mro__.index(pair[0]), type_q.__mro__.index(pair[1])))]


def kl_divergence(p: Distribution, q: Distribution) -> jax.Array:
    """``KL(p || q) = E_p[log p(X) - log q(X)]``, of the two distributions' batch shape.

    >>> from paddlejax.distribution import Categorical
    >>> p, q = Categorical(jnp.zeros(2)), Categorical(jnp.log(jnp.array([0.25, 0.75])))
    >>> round(float(kl_divergence(p, q)), 4)  # 0.5 log 2 + 0.5 log(2/3)
    0.1438
    """
    if not (isinstance(p, Distribution) and isinstance(q, Distribution)):
        raise TypeError(f"kl_divergence: expects two distributions, got {type(p).__name__} and {type(q).__name__}")
    registered = _registered(type(p), type(q))
    if registered is not None:
        return registered(p, q)
    if isinstance(p, Backed) and isinstance(q, Backed):
        try:
            return tfd.kl_divergence(p._dist, q._dist)
        except NotImplementedError:
            pass
    if type(p) is type(q) and isinstance(p, ExponentialFamily) and not isinstance(p, Backed):
        return _bregman(p, q)
    raise NotImplementedError(f"kl_divergence: no KL divergence known for ({type(p).__name__}, {type(q).__name__}); "
                              "register one with register_kl")


def _bregman(p: ExponentialFamily, q: ExponentialFamily) -> jax.Array:
    """``F(theta_q) - F(theta_p) - <theta_q - theta_p, grad F(theta_p)>``."""
    theta_p, theta_q = p._natural_parameters, q._natural_parameters
    log_norm_p, grads = p._log_normalizer_and_grads(theta_p)
    kl = q._log_normalizer(*theta_q) - log_norm_p
    for tp, tq, g in zip(theta_p, theta_q, grads):
        kl = kl - p._batch_dot(tq - tp, g)
    return kl


def _bernoulli_kl(p_probs: jax.Array, q_probs: jax.Array) -> jax.Array:
    return tfd.kl_divergence(tfd.Bernoulli(probs=p_probs), tfd.Bernoulli(probs=q_probs))


@register_kl(Binomial, Binomial)
def _kl_binomial(p: Binomial, q: Binomial) -> jax.Array:
    # n independent trials, each contributing a Bernoulli KL
    constrain("kl_divergence(Binomial, Binomial)", "q.total_count", q.total_count,
              lambda n: n == p.total_count, "p.total_count")
    return p.total_count * _bernoulli_kl(p.probs, q.probs)


@register_kl(Geometric, Geometric)
def _kl_geometric(p: Geometric, q: Geometric) -> jax.Array:
    # each trial contributes a Bernoulli KL, and p makes 1 / p.probs trials on average (Wald)
    return _bernoulli_kl(p.probs, q.probs) / p.probs


@register_kl(Poisson, Poisson)
def _kl_poisson(p: Poisson, q: Poisson) -> jax.Array:
    return p.rate * jnp.log(p.rate / q.rate) - p.rate + q.rate
