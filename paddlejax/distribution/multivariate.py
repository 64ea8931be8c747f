"""Distributions over vectors and matrices with Paddle's names and arguments: Dirichlet,
MultivariateNormal and LKJCholesky.

>>> d = MultivariateNormal(jnp.zeros(2), covariance_matrix=jnp.eye(2))
>>> d.event_shape, d.sample((3,), key=0).shape
((2,), (3, 2))
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.distribution.args import constrain, floats, positive, whole
from paddlejax.distribution.backed import Backed
from paddlejax.distribution.backend import tfd
from paddlejax.distribution.exponential_family import ExponentialFamily


class Dirichlet(Backed, ExponentialFamily):
    """The Dirichlet distribution on the probability simplex of the last axis of
    ``concentration``.

    >>> Dirichlet([1.0, 1.0, 2.0]).mean.tolist()
    [0.25, 0.25, 0.5]
    """

    _params = ("concentration",)

    def __init__(self, concentration):
        (self.concentration,) = floats("Dirichlet", concentration=concentration)
        if self.concentration.ndim < 1:
            raise ValueError("Dirichlet: concentration must have at least one axis")
        positive("Dirichlet", concentration=self.concentration)

    def _make(self):
        return tfd.Dirichlet(self.concentration, force_probs_to_zero_outside_support=True)


class MultivariateNormal(Backed):
    """The multivariate normal distribution with mean ``loc`` and exactly one of
    ``covariance_matrix``, ``precision_matrix`` (its inverse) or ``scale_tril`` (its lower
    Cholesky factor, with a positive diagonal).

    >>> d = MultivariateNormal([1.0, 2.0], precision_matrix=[[4.0, 0.0], [0.0, 1.0]])
    >>> d.variance.tolist(), d.scale_tril.tolist()
    ([0.25, 1.0], [[0.5, 0.0], [0.0, 1.0]])
    """

    _params = ("loc", "scale_tril")

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None):
        given = {k: v for k, v in (("covariance_matrix", covariance_matrix), ("precision_matrix", precision_matrix),
                                   ("scale_tril", scale_tril)) if v is not None}
        if len(given) != 1:
            raise ValueError("MultivariateNormal: give exactly one of covariance_matrix, precision_matrix and "
                             f"scale_tril, got {sorted(given) or 'none'}")
        (kind, matrix), = given.items()
        loc, matrix = floats("MultivariateNormal", broadcast=False, loc=loc, **{kind: matrix})
        if loc.ndim < 1 or matrix.ndim < 2 or not matrix.shape[-1] == matrix.shape[-2] == loc.shape[-1]:
            raise ValueError(f"MultivariateNormal: loc must be (..., n) and {kind} (..., n, n), "
                             f"got {loc.shape} and {matrix.shape}")
        if kind == "scale_tril":
            with jax.ensure_compile_time_eval():  # concrete inside a trace too, for the check
                diagonal = jnp.diagonal(matrix, axis1=-2, axis2=-1)
            constrain("MultivariateNormal", "the diagonal of scale_tril", diagonal, lambda d: d > 0, "> 0")
            constrain("MultivariateNormal", "scale_tril", matrix, lambda m: m == jnp.tril(m), "lower triangular")
            self.scale_tril = matrix
        else:
            with jax.ensure_compile_time_eval():  # concrete inside a trace too, for the check
                self.scale_tril = jnp.linalg.cholesky(matrix if kind == "covariance_matrix" else jnp.linalg.inv(matrix))
            constrain("MultivariateNormal", kind, matrix, lambda _: jnp.isfinite(self.scale_tril).all(),
                      "symmetric positive definite")
        self.loc = loc

    @property
    def covariance_matrix(self) -> jax.Array:
        """``scale_tril @ scale_tril.T``."""
        return self.scale_tril @ jnp.swapaxes(self.scale_tril, -1, -2)

    @property
    def precision_matrix(self) -> jax.Array:
        """The inverse of the covariance matrix."""
        return jnp.linalg.inv(self.covariance_matrix)

    def _make(self):
        return tfd.MultivariateNormalTriL(self.loc, self.scale_tril)


class LKJCholesky(Backed):
    """The LKJ distribution over lower Cholesky factors of ``dim x dim`` correlation matrices:
    the density of the correlation matrix is proportional to ``det(C)**(concentration - 1)``.

    ``sample_method`` is Paddle's choice of sampler, "onion" or "cvine"; both draw from this
    same distribution, and both are computed here by the library's onion-method sampler.

    >>> L = LKJCholesky(3, 2.0).sample((), key=0)
    >>> L.shape, jnp.allclose(jnp.diag(L @ L.T), 1.0).item()
    ((3, 3), True)
    """

    _params = ("concentration",)
    _static = ("dim", "sample_method")

    def __init__(self, dim=2, concentration=1.0, sample_method="onion"):
        if whole(dim) is None or dim < 2:
            raise ValueError(f"LKJCholesky: dim must be an int >= 2, got {dim!r}")
        if sample_method not in ("onion", "cvine"):
            raise ValueError(f"LKJCholesky: sample_method must be 'onion' or 'cvine', got {sample_method!r}")
        self.dim, self.sample_method = whole(dim), sample_method
        (self.concentration,) = floats("LKJCholesky", concentration=concentration)
        positive("LKJCholesky", concentration=self.concentration)

    def _make(self):
        return tfd.CholeskyLKJ(self.dim, self.concentration)
