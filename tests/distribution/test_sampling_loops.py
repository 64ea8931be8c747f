"""Sampling from the families whose library samplers loop (rejection sampling: the gamma
family, Beta, Dirichlet, StudentT, Binomial, Poisson, Multinomial, LKJ): moments against mean and
variance, and implicit-reparameterisation gradients. Each compiles a sampler, so they are drawn
under ``jax.jit`` and kept few: Chi2 draws with the Gamma sampler (its parameter mapping is
checked against scipy)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax.distribution as D

N = 4000  # draws per check; a moment is within 5 standard errors

MOMENTS = {
    "Beta": lambda: D.Beta([2.0, 0.5], 3.5),
    "Gamma": lambda: D.Gamma([2.5, 0.4], 1.5),
    "StudentT": lambda: D.StudentT(9.0, 0.5, 2.0),
    "Binomial": lambda: D.Binomial([7, 20], 0.3),
    "Poisson": lambda: D.Poisson([0.5, 12.0]),
    "Multinomial": lambda: D.Multinomial(6, [0.2, 0.3, 0.5]),
    "Dirichlet": lambda: D.Dirichlet([1.5, 2.0, 3.0]),
}


@pytest.mark.parametrize("name", MOMENTS)
def test_sample_moments_match_mean_and_variance(name, assert_moments):
    d = MOMENTS[name]()
    samples = jax.jit(lambda key: d.sample((N,), key=key))(jax.random.key(7))
    assert samples.shape == (N, *d.batch_shape, *d.event_shape)
    assert samples.dtype == jnp.float64  # counts too, as in Paddle
    assert_moments(samples, d.mean, d.variance)


def test_lkj_cholesky_draws_are_cholesky_factors_of_correlations(assert_moments):
    concentration = 2.0
    for method in ("onion", "cvine"):  # Paddle's two sampler names draw from the one distribution
        L = jax.jit(lambda key: D.LKJCholesky(2, concentration, method).sample((N,), key=key))(jax.random.key(5))
        assert L.shape == (N, 2, 2)
        np.testing.assert_allclose(np.einsum("nij,nij->ni", L, L), 1.0, rtol=1e-12)  # unit diagonal of L L^T
        assert np.all(np.asarray(L[:, 0, 1]) == 0) and np.all(np.asarray(L[:, 1, 1]) > 0)
        # the correlation r = L[1, 0] is 2 Beta(c, c) - 1: mean 0, variance 1 / (2c + 1)
        assert_moments(L[:, 1, 0], 0.0, 1.0 / (2 * concentration + 1))


def test_implicit_reparameterisation_gradients():
    # the mean of the draws' derivatives estimates the derivative of the mean, 1 / rate (Beta,
    # Dirichlet and StudentT draws are built from Gamma draws and differentiate through them)
    draws = jax.jacfwd(lambda c: D.Gamma(c, 2.0).rsample((N,), key=1))  # one forward pass for all draws
    per_draw = np.asarray(jax.jit(draws)(3.0))
    assert abs(per_draw.mean() - 0.5) < 5 * per_draw.std() / np.sqrt(N)
