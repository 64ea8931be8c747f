"""The package face: Paddle's names, dtypes, pytrees under jit/grad/vmap, shapes, and the
errors bad parameters raise."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st

import paddlejax as pj
import paddlejax.distribution as D

DISTRIBUTIONS = ["Bernoulli", "Beta", "Binomial", "Categorical", "Cauchy", "Chi2", "ContinuousBernoulli", "Dirichlet",
                 "Distribution", "Exponential", "ExponentialFamily", "Gamma", "Geometric", "Gumbel", "Independent",
                 "LKJCholesky", "Laplace", "LogNormal", "Multinomial", "MultivariateNormal", "Normal", "Poisson",
                 "StudentT", "TransformedDistribution", "Uniform"]
TRANSFORMS = ["Transform", "AbsTransform", "AffineTransform", "ChainTransform", "ExpTransform", "IndependentTransform",
              "PowerTransform", "ReshapeTransform", "SigmoidTransform", "SoftmaxTransform", "StackTransform",
              "StickBreakingTransform", "TanhTransform"]


def test_paddles_names_are_all_here():
    assert pj.distribution is D
    for name in DISTRIBUTIONS:
        assert issubclass(getattr(D, name), D.Distribution), name
    for name in TRANSFORMS:
        assert issubclass(getattr(D, name), D.Transform) and getattr(D.transform, name) is getattr(D, name), name
    assert callable(D.kl_divergence) and callable(D.register_kl)
    assert set(DISTRIBUTIONS + TRANSFORMS) <= set(D.__all__)
    for name in ("Beta", "Dirichlet", "Gamma", "Exponential", "Bernoulli"):  # as in Paddle
        assert issubclass(getattr(D, name), D.ExponentialFamily), name
    assert isinstance(D.Chi2(2.0), D.Gamma)


def test_import_paddlejax_stays_light():
    # (without the library, pj.distribution names the extra: tests/test_packaging.py)
    code = ("import sys, paddlejax as pj; assert 'tensorflow_probability' not in sys.modules; "
            "assert 'paddlejax.distribution' not in sys.modules; pj.distribution.Normal; "
            "assert 'tensorflow_probability' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_parameter_dtypes():
    with jax.enable_x64(False):
        assert D.Normal(0.0, 1.0).loc.dtype == jnp.float32
        assert D.Normal(0.0, 1.0).sample((2,), key=0).dtype == jnp.float32
    with jax.enable_x64(True):  # as every test here (conftest.py)
        assert D.Normal(0.0, 1).scale.dtype == jnp.float64  # ints too
        assert D.Normal(0.0, 1.0).log_prob(np.float32(0.5)).dtype == jnp.float64  # values take the dtype
        d = D.Normal(np.float32(0.0), 1.0)  # a float array sets the dtype; Python numbers follow it
        assert d.scale.dtype == jnp.float32 and d.log_prob(0.5).dtype == jnp.float32
        assert D.Normal(np.float32(0.0), np.float64(1.0)).loc.dtype == jnp.float64  # the widest float array
        assert D.Gamma(jnp.ones(2, jnp.float32), 2.0).rsample((), key=0).dtype == jnp.float32


def test_distributions_are_pytrees_under_jit_grad_and_vmap():
    d = D.Normal(np.array([0.0, 1.0]), 2.0)
    np.testing.assert_allclose(jax.jit(lambda d, x: d.log_prob(x))(d, 0.5), st.norm([0.0, 1.0], 2.0).logpdf(0.5))
    # d log p / d loc = (x - loc) / scale^2, d / d scale = ((x - loc)^2 / scale^2 - 1) / scale
    grads = jax.grad(lambda d: d.log_prob(0.5).sum())(d)
    np.testing.assert_allclose(grads.loc, (0.5 - np.array([0.0, 1.0])) / 4.0)
    np.testing.assert_allclose(grads.scale, (((0.5 - np.array([0.0, 1.0])) ** 2 / 4.0 - 1) / 2.0).sum())
    batch = D.Gamma(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 1.0, 2.0]))
    np.testing.assert_allclose(jax.vmap(lambda d: d.entropy())(batch), st.gamma([1.0, 2.0, 3.0], scale=[1, 1, 0.5]).entropy())
    nested = D.TransformedDistribution(D.Independent(D.Normal(jnp.zeros(3), 1.0), 1), [D.AffineTransform(1.0, 2.0)])
    assert len(jax.tree_util.tree_leaves(nested)) == 4
    np.testing.assert_allclose(jax.jit(lambda d: d.log_prob(jnp.ones(3)))(nested), st.norm(1.0, 2.0).logpdf(1.0) * 3)
    # static settings survive a round trip
    lkj = jax.tree_util.tree_map(lambda x: x, D.LKJCholesky(3, 2.0, "cvine"))
    assert (lkj.dim, lkj.sample_method, lkj.event_shape) == (3, "cvine", (3, 3))


def test_shapes():
    cases = [(D.Normal(np.zeros((2, 3)), 1.0), (2, 3), ()), (D.Categorical(np.zeros((2, 5))), (2,), ()),
             (D.Dirichlet(np.ones((4, 3))), (4,), (3,)), (D.Multinomial(3, np.ones((2, 4))), (2,), (4,)),
             (D.MultivariateNormal(np.zeros((5, 2)), scale_tril=np.eye(2)), (5,), (2,)),
             (D.LKJCholesky(3, np.ones(2)), (2,), (3, 3)), (D.Independent(D.Beta(np.ones((2, 3)), 1.0), 1), (2,), (3,))]
    for d, batch, event in cases:
        assert (d.batch_shape, d.event_shape) == (batch, event), type(d).__name__
        assert d._extend_shape((7,)) == (7, *batch, *event)


BAD = [
    (lambda: D.Normal(0.0, -1.0), ValueError, "Normal: scale must be > 0, got -1.0"),
    (lambda: D.Normal(0.0, [1.0, 0.0]), ValueError, "Normal: scale must be > 0, got 0.0"),
    (lambda: D.Normal(np.zeros(2), np.ones(3)), ValueError, r"Normal: parameter shapes do not broadcast: loc \(2,\)"),
    (lambda: D.Normal(object(), 1.0), TypeError, "Normal: loc must be a number or an array of numbers, got object"),
    (lambda: D.Normal(1j, 1.0), TypeError, "Normal: loc must hold real numbers, got dtype complex"),
    (lambda: D.Laplace(0.0, 0.0), ValueError, "Laplace: scale must be > 0"),
    (lambda: D.Gumbel(0.0, -2.0), ValueError, "Gumbel: scale must be > 0"),
    (lambda: D.Cauchy(0.0, -2.0), ValueError, "Cauchy: scale must be > 0"),
    (lambda: D.LogNormal(0.0, -2.0), ValueError, "LogNormal: scale must be > 0"),
    (lambda: D.StudentT(0.0, 0.0, 1.0), ValueError, "StudentT: df must be > 0"),
    (lambda: D.Uniform(1.0, 1.0), ValueError, "Uniform: high must be > low, got 1.0"),
    (lambda: D.Beta(0.0, 1.0), ValueError, "Beta: alpha must be > 0"),
    (lambda: D.Gamma(1.0, -1.0), ValueError, "Gamma: rate must be > 0"),
    (lambda: D.Chi2(-3.0), ValueError, "Chi2: df must be > 0, got -3.0"),
    (lambda: D.Exponential(0.0), ValueError, "Exponential: rate must be > 0"),
    (lambda: D.ContinuousBernoulli(1.5), ValueError, r"ContinuousBernoulli: probs must be in \[0, 1\]"),
    (lambda: D.ContinuousBernoulli(0.3, lims=(0.6, 0.7)), ValueError, "ContinuousBernoulli: lims must be two numbers"),
    (lambda: D.Bernoulli(-0.1), ValueError, r"Bernoulli: probs must be in \[0, 1\], got -0.1"),
    (lambda: D.Binomial(2.5, 0.5), ValueError, "Binomial: total_count must be a whole number >= 0, got 2.5"),
    (lambda: D.Binomial(3, 2.0), ValueError, r"Binomial: probs must be in \[0, 1\]"),
    (lambda: D.Poisson(0.0), ValueError, "Poisson: rate must be > 0"),
    (lambda: D.Geometric(0.0), ValueError, r"Geometric: probs must be in \(0, 1\], got 0.0"),
    (lambda: D.Multinomial(0, [0.5, 0.5]), ValueError, "Multinomial: total_count must be an int >= 1, got 0"),
    (lambda: D.Multinomial(2.0, [0.5, 0.5]), ValueError, "Multinomial: total_count must be an int >= 1"),
    (lambda: D.Multinomial(2, [0.5, -0.5]), ValueError, "Multinomial: probs must be >= 0"),
    (lambda: D.Categorical(0.5), ValueError, "Categorical: logits must have at least one axis"),
    (lambda: D.Dirichlet(2.0), ValueError, "Dirichlet: concentration must have at least one axis"),
    (lambda: D.Dirichlet([1.0, -1.0]), ValueError, "Dirichlet: concentration must be > 0"),
    (lambda: D.MultivariateNormal([0.0]), ValueError, "MultivariateNormal: give exactly one of .* got none"),
    (lambda: D.MultivariateNormal([0.0], [[1.0]], scale_tril=[[1.0]]), ValueError, r"got \['covariance_matrix', 'scale"),
    (lambda: D.MultivariateNormal([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]]), ValueError,
     "MultivariateNormal: covariance_matrix must be symmetric positive definite"),
    (lambda: D.MultivariateNormal([0.0, 0.0], precision_matrix=-np.eye(2)), ValueError,
     "MultivariateNormal: precision_matrix must be symmetric positive definite"),
    (lambda: D.MultivariateNormal([0.0, 0.0, 0.0], np.eye(2)), ValueError,
     r"MultivariateNormal: loc must be \(..., n\) and covariance_matrix \(..., n, n\), got \(3,\) and \(2, 2\)"),
    (lambda: D.MultivariateNormal([0.0, 0.0], scale_tril=[[1.0, 0.5], [0.0, 1.0]]), ValueError,
     "MultivariateNormal: scale_tril must be lower triangular"),
    (lambda: D.MultivariateNormal([0.0, 0.0], scale_tril=[[1.0, 0.0], [0.5, -1.0]]), ValueError,
     "MultivariateNormal: the diagonal of scale_tril must be > 0, got -1.0"),
    (lambda: D.LKJCholesky(1), ValueError, "LKJCholesky: dim must be an int >= 2, got 1"),
    (lambda: D.LKJCholesky(3, sample_method="vine"), ValueError, "LKJCholesky: sample_method must be 'onion' or 'cvine'"),
    (lambda: D.LKJCholesky(3, 0.0), ValueError, "LKJCholesky: concentration must be > 0"),
    (lambda: D.Independent(D.Normal(np.zeros(2), 1.0), 2), ValueError,
     r"Independent: the base has batch shape \(2,\), fewer than the 2"),
    (lambda: D.Independent(D.Normal(np.zeros(2), 1.0), 0), ValueError, "Independent: reinterpreted_batch_rank must be"),
    (lambda: D.Independent(st.norm(), 1), TypeError, "Independent: base must be a paddlejax.distribution distribution"),
]


@pytest.mark.parametrize("make,error,message", BAD)
def test_bad_parameters_raise_a_clear_error(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_under_jit_traced_parameters_are_not_checked():
    # the values are unknown while tracing: a bad one gives NaN, as JAX's own functions do
    assert np.isnan(jax.jit(lambda s: D.Normal(0.0, s).log_prob(0.0))(-1.0))
    # while Python numbers and closed-over (concrete) arrays are still checked when it is traced
    scale = jnp.asarray(-1.0)
    with pytest.raises(ValueError, match="Normal: scale must be > 0"):
        jax.jit(lambda x: D.Normal(0.0, scale).log_prob(x))(0.0)
    with pytest.raises(ValueError, match="Normal: scale must be > 0"):
        jax.jit(lambda x: D.Normal(x, -1.0).log_prob(x))(0.0)
    # entropies that sum over the support need its size
    with pytest.raises(TypeError, match="Poisson.entropy sums over the support, whose size depends on rate"):
        jax.jit(lambda d: d.entropy())(D.Poisson(2.0))


def test_undefined_or_unsupported_methods():
    with pytest.raises(ValueError, match="Cauchy: the Cauchy distribution has no mean"):
        D.Cauchy(0.0, 1.0).mean
    with pytest.raises(ValueError, match="has no variance"):
        D.Cauchy(0.0, 1.0).variance
    with pytest.raises(NotImplementedError, match="Beta.icdf"):
        D.Beta(2.0, 3.0).icdf(0.5)
    with pytest.raises(NotImplementedError):
        D.Dirichlet([1.0, 2.0]).cdf([0.5, 0.5])
    base = D.Distribution()
    for method in ("sample", "rsample", "entropy"):
        with pytest.raises(NotImplementedError, match=f"Distribution.{method}"):
            getattr(base, method)()
    with pytest.raises(NotImplementedError, match="Distribution.mean"):
        base.mean


def test_prob_and_probs_are_exp_log_prob():
    d = D.Normal(0.5, 2.0)
    np.testing.assert_allclose(d.prob(1.0), st.norm(0.5, 2.0).pdf(1.0), rtol=1e-12)
    np.testing.assert_allclose(d.probs(1.0), d.prob(1.0))
    np.testing.assert_allclose(d.stddev, 2.0)
    b = D.Bernoulli(0.25)  # here probs is the parameter, as in Paddle
    assert float(b.probs) == 0.25
    np.testing.assert_allclose(b.logits, np.log(1 / 3), rtol=1e-12)
    cat = D.Categorical(np.log([0.2, 0.8]))
    np.testing.assert_allclose(cat.probs(np.array([1, 0])), [0.8, 0.2], rtol=1e-12)
