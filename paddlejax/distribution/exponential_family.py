"""Paddle's ``ExponentialFamily``: distributions with density
``h(x) exp(<t(x), theta> - F(theta))``, whose entropy (and KL divergence between two of one
kind) follow from the log normaliser ``F`` by automatic differentiation.

The families that TensorFlow Probability computes (Beta, Dirichlet, Gamma, Exponential,
Bernoulli) are ExponentialFamily instances, as in Paddle, and use the library's closed forms.
A user's subclass gives the three pieces below and gets :meth:`ExponentialFamily.entropy`:

>>> class Rate(ExponentialFamily):  # the exponential distribution: theta = -rate, F = -log(-theta)
...     def __init__(self, rate):
...         self.rate = jnp.asarray(rate)
...         super().__init__(batch_shape=self.rate.shape)
...     _natural_parameters = property(lambda self: (-self.rate,))
...     _mean_carrier_measure = 0.0
...     def _log_normalizer(self, theta):
...         return -jnp.log(-theta)
>>> round(float(Rate(2.0).entropy()), 4)  # 1 - log(2)
0.3069
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.distribution.distribution import Distribution


class ExponentialFamily(Distribution):
    """The base of exponential-family distributions (see the module).

    A subclass defines ``_natural_parameters`` (a tuple of arrays, each of shape
    ``batch_shape + parameter event shape``), ``_log_normalizer(*natural_parameters)`` (``F``,
    of shape ``batch_shape``) and ``_mean_carrier_measure`` (``E[log h(X)]``).
    """

    @property
    def _natural_parameters(self) -> tuple[jax.Array, ...]:
        raise NotImplementedError(f"{type(self).__name__}._natural_parameters")

    def _log_normalizer(self, *natural_parameters) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__}._log_normalizer")

    @property
    def _mean_carrier_measure(self) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__}._mean_carrier_measure")

    def _log_normalizer_and_grads(self, natural: tuple[jax.Array, ...]):
        """``F(theta)`` and its gradient with respect to each natural parameter."""
        # the batch entries are independent, so the gradient of the sum is each one's gradient
        total = lambda *theta: jnp.sum(self._log_normalizer(*theta))  # noqa: E731
        return self._log_normalizer(*natural), jax.grad(total, argnums=tuple(range(len(natural))))(*natural)

    def _batch_dot(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``<a, b>`` over the parameter's event dimensions, per batch entry."""
        product = a * b
        return jnp.sum(product, axis=tuple(range(len(self.batch_shape), product.ndim)))

    def entropy(self) -> jax.Array:
        """``F(theta) - <theta, grad F(theta)> - E[log h(X)]``."""
        natural = self._natural_parameters
        log_norm, grads = self._log_normalizer_and_grads(natural)
        entropy = log_norm - self._mean_carrier_measure
        for theta, g in zip(natural, grads):
            entropy = entropy - self._batch_dot(theta, g)
        return entropy
