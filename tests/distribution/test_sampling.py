"""Sampling: moments of seeded draws against mean and variance (tolerance from the standard
error), shapes and dtypes, keys, and gradients through rsample. The families whose samplers
loop (rejection sampling) are in test_sampling_loops.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st

import paddlejax.distribution as D

N = 4000  # draws per check; a moment is within 5 standard errors


MOMENTS = {
    "Normal": lambda: D.Normal([0.5, -1.0], [2.0, 0.3]),
    "Uniform": lambda: D.Uniform(-1.0, [3.0, 0.0]),
    "Exponential": lambda: D.Exponential(1.5),
    "Laplace": lambda: D.Laplace(0.5, 2.0),
    "Gumbel": lambda: D.Gumbel(0.5, 2.0),
    "LogNormal": lambda: D.LogNormal(0.3, 0.5),
    "ContinuousBernoulli": lambda: D.ContinuousBernoulli([0.2, 0.5, 0.9]),
    "Bernoulli": lambda: D.Bernoulli([0.1, 0.5]),
    "Geometric": lambda: D.Geometric([0.3, 0.9]),
    "MultivariateNormal": lambda: D.MultivariateNormal([0.5, -1.0], [[2.0, 0.3], [0.3, 1.0]]),
    "Independent": lambda: D.Independent(D.Laplace(jnp.zeros((2, 3)), 2.0), 2),
}


@pytest.mark.parametrize("name", MOMENTS)
def test_sample_moments_match_mean_and_variance(name, assert_moments):
    d = MOMENTS[name]()
    samples = jax.jit(lambda key: d.sample((N,), key=key))(jax.random.key(7))
    assert samples.shape == (N, *d.batch_shape, *d.event_shape)
    assert_moments(samples, d.mean, d.variance)


def test_cauchy_draws_follow_its_cdf():
    # no moments: the empirical cdf at a few points, within 5 binomial standard errors
    d = D.Cauchy(0.5, 2.0)
    samples = np.asarray(d.sample((N,), key=1))
    points = np.array([-5.0, 0.0, 0.5, 3.0, 20.0])
    expected = st.cauchy(0.5, 2.0).cdf(points)
    empirical = (samples[:, None] <= points).mean(0)
    np.testing.assert_array_less(np.abs(empirical - expected), 5 * np.sqrt(expected * (1 - expected) / N))


def test_categorical_draws_follow_its_probabilities():
    p = np.array([0.1, 0.6, 0.3])
    samples = D.Categorical(np.log(p)).sample((N,), key=3)
    assert samples.dtype == jnp.int64
    frequency = np.bincount(np.asarray(samples), minlength=3) / N
    np.testing.assert_array_less(np.abs(frequency - p), 5 * np.sqrt(p * (1 - p) / N))


def test_keys_make_draws_reproducible():
    d = D.Normal(0.0, 1.0)
    a, b = d.sample((3,), key=jax.random.key(1)), d.sample((3,), jax.random.key(1))  # key positional, as Paddle's seed
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(d.sample((3,), key=1), a)  # an int seed is jax.random.key(seed)
    np.testing.assert_array_equal(d.sample((3,), key=jax.random.PRNGKey(1)), a)  # raw uint32[2] keys too
    assert not np.array_equal(d.sample((3,), key=2), a)
    np.testing.assert_array_equal(jax.jit(lambda k: d.sample((3,), key=k))(jax.random.key(1)), a)


def test_sampling_needs_a_key_and_a_shape_of_ints():
    d = D.Normal(0.0, 1.0)
    with pytest.raises(TypeError, match=r"Normal.sample: pass key="):
        d.sample((2,))
    with pytest.raises(TypeError, match=r"Normal.rsample: pass key=.*got str"):
        d.rsample((2,), key="seed")
    with pytest.raises(TypeError, match=r"Normal.sample: shape must be a list or tuple of ints >= 0"):
        d.sample((2.5,), key=0)
    assert d.sample([2, 3], key=0).shape == (2, 3) and d.sample(4, key=0).shape == (4,)
    assert d.sample(key=0).shape == ()


@pytest.mark.parametrize("make,dtype", [
    (lambda: D.Bernoulli(np.float32(0.3)), jnp.float32), (lambda: D.Normal(np.float32(0.0), 1.0), jnp.float32),
    (lambda: D.Geometric(0.5), jnp.float64), (lambda: D.Bernoulli(0.5), jnp.float64)])
def test_samples_have_the_parameters_dtype(make, dtype):
    assert make().sample((2,), key=0).dtype == dtype


def test_rsample_gradients_match_the_reparameterised_derivative():
    # d/dscale of loc + scale * eps is eps = (x - loc) / scale
    x = D.Normal(1.0, 2.0).sample((5,), key=0)
    grad = jax.grad(lambda s: D.Normal(1.0, s).rsample((5,), key=0).sum())(2.0)
    np.testing.assert_allclose(grad, ((x - 1.0) / 2.0).sum(), rtol=1e-12)
    # through a multivariate normal's Cholesky factor: d/dloc of the draws is the identity
    jac = jax.jacobian(lambda m: D.MultivariateNormal(m, scale_tril=np.eye(2) * 3).rsample((), key=0))(jnp.zeros(2))
    np.testing.assert_allclose(jac, np.eye(2), atol=1e-12)


def test_sample_stops_gradients_and_rsample_refuses_discrete_families():
    assert float(jax.grad(lambda s: D.Normal(0.0, s).sample((), key=0))(1.0)) == 0.0
    for d in (D.Poisson(2.0), D.Categorical(np.zeros(3)), D.Binomial(3, 0.5), D.Geometric(0.5), D.LKJCholesky(3)):
        with pytest.raises(NotImplementedError, match=rf"{type(d).__name__}.rsample: .* is not reparameterizable"):
            d.rsample((2,), key=0)


def test_bernoulli_rsample_is_the_relaxed_bernoulli():
    d = D.Bernoulli(0.3)
    x = d.rsample((N,), temperature=0.05, key=4)
    assert np.all((np.asarray(x) >= 0) & (np.asarray(x) <= 1))
    # at a low temperature the relaxed draws sit near 0 or 1, with frequency probs
    assert abs(float((x > 0.5).mean()) - 0.3) < 5 * np.sqrt(0.21 / N)
    grad = jax.grad(lambda p: D.Bernoulli(p).rsample((64,), temperature=1.0, key=4).mean())(0.3)
    assert float(grad) > 0
    with pytest.raises(ValueError, match=r"Bernoulli.rsample: temperature must be > 0"):
        d.rsample((2,), temperature=0.0, key=0)
