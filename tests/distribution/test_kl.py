"""kl_divergence against closed forms and numerical integration of scipy's densities, against
Monte-Carlo estimates, and register_kl's dispatch."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.special as sp
import scipy.stats as st

import paddlejax.distribution as D

N = 4000


def integrated(p, q, low, high):
    """KL(p || q) of two frozen scipy densities, by quadrature."""
    def integrand(x):
        density = p.pdf(x)
        return density * (p.logpdf(x) - q.logpdf(x)) if density > 0 else 0.0

    with np.errstate(over="ignore", under="ignore"):  # the far tails under- and overflow
        return scipy.integrate.quad(integrand, low, high, epsabs=1e-12, limit=200)[0]


def summed(p, q, top):
    k = np.arange(top + 1)
    return st.entropy(p.pmf(k), q.pmf(k))


def dirichlet_kl(a, b):
    a0, b0 = a.sum(), b.sum()
    return (sp.gammaln(a0) - sp.gammaln(a).sum() - sp.gammaln(b0) + sp.gammaln(b).sum()
            + ((a - b) * (sp.digamma(a) - sp.digamma(a0))).sum())


def mvn_kl(m1, c1, m2, c2):
    inv, d = np.linalg.inv(c2), m2 - m1
    return 0.5 * (np.trace(inv @ c1) + d @ inv @ d - len(m1) + np.log(np.linalg.det(c2) / np.linalg.det(c1)))


def cb_pdf(p):
    norm = 2 * np.arctanh(1 - 2 * p) / (1 - 2 * p)
    return lambda x: norm * p ** x * (1 - p) ** (1 - x)


COV1, COV2 = np.array([[2.0, 0.3], [0.3, 1.0]]), np.array([[1.0, -0.2], [-0.2, 0.5]])

# (p, q, reference KL(p || q), whether p's sampler is cheap enough for the Monte-Carlo check)
PAIRS = {
    "Normal": (lambda: (D.Normal(0.5, 2.0), D.Normal(-1.0, 1.5)),
               np.log(1.5 / 2.0) + (4.0 + 1.5 ** 2) / (2 * 1.5 ** 2) - 0.5, True),
    "Uniform": (lambda: (D.Uniform(0.0, 1.0), D.Uniform(-1.0, 2.0)), np.log(3.0), True),
    "Exponential": (lambda: (D.Exponential(1.5), D.Exponential(0.4)), np.log(1.5 / 0.4) + 0.4 / 1.5 - 1, True),
    "Beta": (lambda: (D.Beta(2.0, 3.5), D.Beta(1.5, 1.2)), integrated(st.beta(2, 3.5), st.beta(1.5, 1.2), 0, 1), False),
    "Gamma": (lambda: (D.Gamma(2.5, 1.5), D.Gamma(1.2, 0.7)),
              integrated(st.gamma(2.5, scale=1 / 1.5), st.gamma(1.2, scale=1 / 0.7), 0, np.inf), False),
    "Chi2": (lambda: (D.Chi2(3.5), D.Chi2(2.0)), integrated(st.chi2(3.5), st.chi2(2.0), 0, np.inf), False),
    "Exponential-Gamma": (lambda: (D.Exponential(1.5), D.Gamma(2.0, 1.0)),
                          integrated(st.expon(scale=1 / 1.5), st.gamma(2.0), 0, np.inf), True),
    "Laplace": (lambda: (D.Laplace(0.5, 2.0), D.Laplace(-1.0, 1.0)),
                integrated(st.laplace(0.5, 2.0), st.laplace(-1.0, 1.0), -200, 200), True),
    "Gumbel": (lambda: (D.Gumbel(0.5, 2.0), D.Gumbel(-1.0, 3.0)),
               integrated(st.gumbel_r(0.5, 2.0), st.gumbel_r(-1.0, 3.0), -np.inf, np.inf), True),
    "Cauchy": (lambda: (D.Cauchy(0.5, 2.0), D.Cauchy(-1.0, 1.0)),
               integrated(st.cauchy(0.5, 2.0), st.cauchy(-1.0, 1.0), -np.inf, np.inf), False),
    "LogNormal": (lambda: (D.LogNormal(0.3, 0.8), D.LogNormal(0.0, 1.2)),
                  integrated(st.lognorm(0.8, scale=np.exp(0.3)), st.lognorm(1.2), 0, np.inf), True),
    "ContinuousBernoulli": (lambda: (D.ContinuousBernoulli(0.3), D.ContinuousBernoulli(0.8)),
                            scipy.integrate.quad(lambda x: cb_pdf(0.3)(x) * np.log(cb_pdf(0.3)(x) / cb_pdf(0.8)(x)),
                                                 0, 1)[0], True),
    "Bernoulli": (lambda: (D.Bernoulli(0.3), D.Bernoulli(0.6)), summed(st.bernoulli(0.3), st.bernoulli(0.6), 1), True),
    "Categorical": (lambda: (D.Categorical(np.log([0.2, 0.3, 0.5])), D.Categorical(np.log([0.6, 0.3, 0.1]))),
                    st.entropy([0.2, 0.3, 0.5], [0.6, 0.3, 0.1]), True),
    "Binomial": (lambda: (D.Binomial(7, 0.3), D.Binomial(7, 0.6)), summed(st.binom(7, 0.3), st.binom(7, 0.6), 7), False),
    "Poisson": (lambda: (D.Poisson(2.5), D.Poisson(4.0)), summed(st.poisson(2.5), st.poisson(4.0), 80), False),
    "Geometric": (lambda: (D.Geometric(0.3), D.Geometric(0.6)),
                  summed(st.geom(0.3, loc=-1), st.geom(0.6, loc=-1), 300), True),
    "Dirichlet": (lambda: (D.Dirichlet([1.5, 2.0, 3.0]), D.Dirichlet([0.7, 1.0, 4.0])),
                  dirichlet_kl(np.array([1.5, 2.0, 3.0]), np.array([0.7, 1.0, 4.0])), False),
    "MultivariateNormal": (lambda: (D.MultivariateNormal([0.5, -1.0], COV1), D.MultivariateNormal([0.0, 1.0], COV2)),
                           mvn_kl(np.array([0.5, -1.0]), COV1, np.array([0.0, 1.0]), COV2), True),
    "Independent": (lambda: (D.Independent(D.Normal([0.0, 1.0], 1.0), 1), D.Independent(D.Normal([1.0, 1.0], 2.0), 1)),
                    2 * np.log(2.0) + (1 + 1) / 8 + 1 / 8 - 1.0, True),
}


@pytest.mark.parametrize("name", PAIRS)
def test_kl_matches_the_closed_form_or_quadrature(name):
    make, expected, _ = PAIRS[name]
    p, q = make()
    got = jax.jit(lambda: D.kl_divergence(p, q))()
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(p.kl_divergence(q), expected, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("name", [n for n, (_, _, cheap) in PAIRS.items() if cheap])
def test_kl_matches_a_monte_carlo_estimate(name):
    make, expected, _ = PAIRS[name]
    p, q = make()
    ratio = np.asarray(jax.jit(lambda key: (lambda x: p.log_prob(x) - q.log_prob(x))(p.sample((N,), key=key)))(
        jax.random.key(11)))
    assert abs(ratio.mean() - expected) < 5 * ratio.std() / np.sqrt(N) + 1e-12


def test_kl_is_differentiable_and_batched():
    grad = jax.grad(lambda m: D.kl_divergence(D.Normal(m, 1.0), D.Normal(0.0, 1.0)))(0.7)
    np.testing.assert_allclose(grad, 0.7, rtol=1e-12)  # d/dm m^2 / 2
    kl = D.kl_divergence(D.Poisson(np.array([1.0, 2.0, 3.0])), D.Poisson(2.0))
    np.testing.assert_allclose(kl, [summed(st.poisson(r), st.poisson(2.0), 80) for r in (1.0, 2.0, 3.0)], rtol=1e-9)


def test_user_exponential_family_gets_the_bregman_divergence():
    class Rate(D.ExponentialFamily):  # the exponential distribution through its natural parameter -rate
        def __init__(self, rate):
            self.rate = jnp.asarray(rate)
            super().__init__(batch_shape=self.rate.shape)

        _natural_parameters = property(lambda self: (-self.rate,))
        _mean_carrier_measure = 0.0

        def _log_normalizer(self, theta):
            return -jnp.log(-theta)

    np.testing.assert_allclose(D.kl_divergence(Rate(1.5), Rate(0.4)), np.log(1.5 / 0.4) + 0.4 / 1.5 - 1, rtol=1e-12)
    np.testing.assert_allclose(Rate(np.array([0.5, 2.0])).entropy(), st.expon(scale=[2.0, 0.5]).entropy(), rtol=1e-12)


def test_register_kl_picks_the_most_specific_pair():
    class Narrow(D.Normal):
        pass

    @D.register_kl(Narrow, D.Normal)
    def _narrow_normal(p, q):
        return jnp.asarray(-1.0)

    @D.register_kl(Narrow, Narrow)
    def _narrow_narrow(p, q):
        return jnp.asarray(-2.0)

    a, b = Narrow(0.0, 1.0), D.Normal(0.0, 1.0)
    assert float(D.kl_divergence(a, b)) == -1.0
    assert float(D.kl_divergence(a, Narrow(0.0, 1.0))) == -2.0
    assert float(D.kl_divergence(b, a)) == 0.0  # no (Normal, Narrow) pair: the library's Normal KL


def test_kl_errors_name_the_pair_or_the_argument():
    with pytest.raises(NotImplementedError, match=r"no KL divergence known for \(StudentT, StudentT\).*register_kl"):
        D.kl_divergence(D.StudentT(3.0, 0.0, 1.0), D.StudentT(4.0, 0.0, 1.0))
    with pytest.raises(NotImplementedError, match=r"\(Normal, Poisson\)"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Poisson(1.0))
    with pytest.raises(TypeError, match="kl_divergence: expects two distributions, got Normal and float"):
        D.kl_divergence(D.Normal(0.0, 1.0), 1.0)
    with pytest.raises(TypeError, match="register_kl: expects two Distribution subclasses"):
        D.register_kl(D.Normal, int)
    with pytest.raises(ValueError, match=r"kl_divergence\(Binomial, Binomial\): q.total_count must be p.total_count"):
        D.kl_divergence(D.Binomial(5, 0.3), D.Binomial(6, 0.3))
