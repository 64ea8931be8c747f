"""Every distribution's log_prob, entropy, mean, variance, cdf and icdf against scipy.stats (or,
where scipy has no such family, numerical integration of a density written out here), in
float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats as st

import paddlejax.distribution as D


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def scalar(ref, values, discrete=False, quantiles=True):
    """The reference methods of a frozen scalar scipy distribution."""
    out = {"log_prob": (values, ref.logpmf if discrete else ref.logpdf), "entropy": ref.entropy(),
           "mean": ref.mean(), "variance": ref.var(), "cdf": (values, ref.cdf)}
    if quantiles:  # 0.5 included: the library's inverse incomplete beta function misses it for Beta
        out["icdf"] = (np.array([0.1, 0.5, 0.93]), ref.ppf)
    return out


def continuous_bernoulli(p):
    """The continuous Bernoulli density written out, and its moments by integration."""
    norm = 2.0 if p == 0.5 else 2 * np.arctanh(1 - 2 * p) / (1 - 2 * p)
    pdf = lambda x: norm * p ** x * (1 - p) ** (1 - x)  # noqa: E731
    integral = lambda f: scipy.integrate.quad(f, 0, 1, epsabs=1e-13)[0]  # noqa: E731
    mean = integral(lambda x: x * pdf(x))
    values = np.array([0.05, 0.4, 0.9])
    return {"log_prob": (values, lambda x: np.log(pdf(x))), "entropy": integral(lambda x: -pdf(x) * np.log(pdf(x))),
            "mean": mean, "variance": integral(lambda x: (x - mean) ** 2 * pdf(x)),
            "cdf": (values, np.vectorize(lambda v: scipy.integrate.quad(pdf, 0, v)[0]))}


P3 = np.array([0.2, 0.3, 0.5])
COV = np.array([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.5]])
LOC3 = np.array([0.5, -1.0, 2.0])
X3 = np.array([[0.1, 0.2, 0.3], [1.0, -1.0, 2.5]])

CASES = {
    "Normal": (lambda: D.Normal(0.5, 2.0), scalar(st.norm(0.5, 2.0), np.array([-1.0, 0.3, 2.5]))),
    "Uniform": (lambda: D.Uniform(-1.0, 3.0), scalar(st.uniform(-1.0, 4.0), np.array([-0.5, 0.2, 2.9]))),
    "Beta": (lambda: D.Beta(2.0, 3.5), scalar(st.beta(2.0, 3.5), np.array([0.05, 0.4, 0.9]), quantiles=False)),
    "Gamma": (lambda: D.Gamma(2.5, 1.5), scalar(st.gamma(2.5, scale=1 / 1.5), np.array([0.1, 1.0, 4.0]))),
    "Chi2": (lambda: D.Chi2(3.5), scalar(st.chi2(3.5), np.array([0.1, 1.0, 6.0]))),
    "Exponential": (lambda: D.Exponential(1.5), scalar(st.expon(scale=1 / 1.5), np.array([0.1, 1.0, 4.0]))),
    "Laplace": (lambda: D.Laplace(0.5, 2.0), scalar(st.laplace(0.5, 2.0), np.array([-3.0, 0.5, 2.0]))),
    "Gumbel": (lambda: D.Gumbel(0.5, 2.0), scalar(st.gumbel_r(0.5, 2.0), np.array([-3.0, 0.5, 2.0]))),
    "LogNormal": (lambda: D.LogNormal(0.3, 0.8), scalar(st.lognorm(s=0.8, scale=np.exp(0.3)), np.array([0.2, 1.0, 3.0]))),
    "Cauchy": (lambda: D.Cauchy(0.5, 2.0), {k: v for k, v in scalar(st.cauchy(0.5, 2.0), np.array([-3.0, 0.5, 9.0])).items()
                                           if k not in ("mean", "variance")}),
    "StudentT": (lambda: D.StudentT(4.5, 0.5, 2.0), scalar(st.t(4.5, 0.5, 2.0), np.array([-3.0, 0.5, 9.0]))),
    "ContinuousBernoulli": (lambda: D.ContinuousBernoulli(0.3), continuous_bernoulli(0.3)),
    "ContinuousBernoulli-near-half": (lambda: D.ContinuousBernoulli(0.4999), continuous_bernoulli(0.4999)),
    "ContinuousBernoulli-half": (lambda: D.ContinuousBernoulli(0.5), continuous_bernoulli(0.5)),
    "Bernoulli": (lambda: D.Bernoulli(0.3), scalar(st.bernoulli(0.3), np.array([0.0, 1.0]), True, quantiles=False)),
    "Binomial": (lambda: D.Binomial(7, 0.3), scalar(st.binom(7, 0.3), np.array([0.0, 2.0, 7.0]), True, False)),
    "Poisson": (lambda: D.Poisson(2.5), scalar(st.poisson(2.5), np.array([0.0, 2.0, 9.0]), True, False)),
    "Poisson-large-rate": (lambda: D.Poisson(400.0), {"entropy": st.poisson(400.0).entropy()}),
    "Geometric": (lambda: D.Geometric(0.3), scalar(st.geom(0.3), np.array([1.0, 2.0, 9.0]), True, False)),
    "Categorical": (lambda: D.Categorical(np.log(P3) + 1.0),
                    {"log_prob": (np.array([0, 2, 1]), lambda k: np.log(P3[k])), "entropy": st.entropy(P3)}),
    "Multinomial": (lambda: D.Multinomial(5, 4 * P3),
                    {"log_prob": (np.array([[1.0, 1.0, 3.0], [0.0, 5.0, 0.0]]), st.multinomial(5, P3).logpmf),
                     "entropy": st.multinomial(5, P3).entropy(), "mean": 5 * P3, "variance": 5 * P3 * (1 - P3)}),
    "Dirichlet": (lambda: D.Dirichlet([1.5, 2.0, 3.0]),
                  {"log_prob": (np.array([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]]),
                                lambda x: np.array([st.dirichlet([1.5, 2.0, 3.0]).logpdf(v) for v in x])),
                   "entropy": st.dirichlet([1.5, 2.0, 3.0]).entropy(), "mean": st.dirichlet([1.5, 2.0, 3.0]).mean(),
                   "variance": st.dirichlet([1.5, 2.0, 3.0]).var()}),
    "MultivariateNormal-covariance": (lambda: D.MultivariateNormal(LOC3, covariance_matrix=COV),
                                      {"log_prob": (X3, st.multivariate_normal(LOC3, COV).logpdf),
                                       "entropy": st.multivariate_normal(LOC3, COV).entropy(), "mean": LOC3,
                                       "variance": np.diag(COV)}),
    "MultivariateNormal-precision": (lambda: D.MultivariateNormal(LOC3, precision_matrix=np.linalg.inv(COV)),
                                     {"log_prob": (X3, st.multivariate_normal(LOC3, COV).logpdf),
                                      "variance": np.diag(COV)}),
    "MultivariateNormal-scale_tril": (lambda: D.MultivariateNormal(LOC3, scale_tril=np.linalg.cholesky(COV)),
                                      {"log_prob": (X3, st.multivariate_normal(LOC3, COV).logpdf),
                                       "entropy": st.multivariate_normal(LOC3, COV).entropy()}),
    # for dim 2 the free entry r of the Cholesky factor is the correlation: (r + 1) / 2 ~ Beta(c, c)
    "LKJCholesky": (lambda: D.LKJCholesky(2, 2.5),
                    {"log_prob": (np.array([[[1.0, 0.0], [r, np.sqrt(1 - r * r)]] for r in (-0.7, 0.0, 0.4)]),
                                  lambda L: st.beta(2.5, 2.5).logpdf((L[:, 1, 0] + 1) / 2) - np.log(2))}),
    "Independent": (lambda: D.Independent(D.Normal(LOC3, [1.0, 2.0, 3.0]), 1),
                    {"log_prob": (X3, lambda x: st.norm(LOC3, [1.0, 2.0, 3.0]).logpdf(x).sum(-1)),
                     "entropy": st.norm(LOC3, [1.0, 2.0, 3.0]).entropy().sum(), "mean": LOC3}),
    "TransformedDistribution-exp": (lambda: D.TransformedDistribution(D.Normal(0.3, 0.8), [D.ExpTransform()]),
                                    {"log_prob": (np.array([0.2, 1.0, 3.0]), st.lognorm(s=0.8, scale=np.exp(0.3)).logpdf),
                                     "cdf": (np.array([0.2, 1.0, 3.0]), st.lognorm(s=0.8, scale=np.exp(0.3)).cdf)}),
    "TransformedDistribution-affine": (lambda: D.TransformedDistribution(D.Normal(0.0, 1.0),
                                                                         [D.AffineTransform(1.0, -2.0)]),
                                       {"log_prob": (np.array([-2.0, 1.0, 3.5]), st.norm(1.0, 2.0).logpdf),
                                        "entropy": st.norm(1.0, 2.0).entropy()}),
}


def checks():
    for name, (_, ref) in CASES.items():
        for method in ref:
            yield pytest.param(name, method, id=f"{name}-{method}")


@pytest.mark.parametrize("name,method", list(checks()))
def test_matches_reference(name, method):
    make, ref = CASES[name]
    d = make()
    expected = ref[method]
    # jitted (the distribution closed over, as concrete constants): one compilation instead of
    # dispatching the library's many small operations one by one
    if isinstance(expected, tuple):
        values, fn = expected
        got, expected = jax.jit(getattr(d, method))(jnp.asarray(values)), fn(values)
    else:
        got = jax.jit(lambda: getattr(d, method)() if method == "entropy" else getattr(d, method))()
    assert got.dtype in (jnp.float64, jnp.int64)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-9)


def test_batched_parameters_broadcast_like_scipy():
    loc, scale = np.array([[0.0], [1.0]]), np.array([1.0, 2.0, 3.0])
    d = D.Normal(loc, scale)
    assert d.batch_shape == (2, 3)
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    np.testing.assert_allclose(d.log_prob(x), st.norm(loc, scale).logpdf(x), rtol=1e-12)
    np.testing.assert_allclose(d.entropy(), st.norm(loc, scale).entropy(), rtol=1e-12)


def test_batched_binomial_and_poisson_entropies():
    n, p = np.array([3.0, 10.0]), np.array([0.2, 0.7])
    binomial, poisson = D.Binomial(n, p), D.Poisson(np.array([[0.05], [30.0]]))
    np.testing.assert_allclose(jax.jit(binomial.entropy)(), st.binom(n, p).entropy(), rtol=1e-9)
    np.testing.assert_allclose(jax.jit(poisson.entropy)(), st.poisson(np.array([[0.05], [30.0]])).entropy(), rtol=1e-9)


@pytest.mark.parametrize("make,value", [
    (lambda: D.Uniform(0.0, 1.0), 1.5), (lambda: D.Beta(2.0, 2.0), 1.5), (lambda: D.Gamma(2.0, 1.0), -1.0),
    (lambda: D.Exponential(1.0), -1.0), (lambda: D.Poisson(2.0), 1.5), (lambda: D.Categorical(np.zeros(3)), 3),
    (lambda: D.Geometric(0.5), 0.0),  # the support starts at one trial
    (lambda: D.Dirichlet([1.0, 2.0]), [1.5, -0.5])])
def test_values_outside_the_support_have_zero_probability(make, value):
    assert float(make().prob(jnp.asarray(value))) == 0.0


def test_geometric_follows_paddles_trial_count_convention():
    d = D.Geometric(0.5)
    # Paddle's docstring examples: mean 2, variance 2, pmf(2) = 0.25, cdf(4) = 0.9375
    np.testing.assert_allclose([d.mean, d.variance, d.pmf(2), d.cdf(4)], [2.0, 2.0, 0.25, 0.9375], rtol=1e-12)
    np.testing.assert_allclose(d.log_pmf(2), np.log(0.25))
    assert float(d.sample((1000,), key=0).min()) >= 1.0
