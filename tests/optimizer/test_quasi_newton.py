"""BFGS and L-BFGS with Paddle's signatures: the optima scipy finds (Rosenbrock, an L2-regularised
logistic regression on real data), float32 and float64, jit, the counts and flags they return,
the initial inverse-Hessian estimate, and the errors bad arguments get."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from sklearn.datasets import load_breast_cancer

from paddlejax.optimizer import minimize_bfgs, minimize_lbfgs, scale_by_bfgs

SCIPY = {minimize_bfgs: "BFGS", minimize_lbfgs: "L-BFGS-B"}


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@pytest.mark.parametrize("minimize", [minimize_bfgs, minimize_lbfgs])
@pytest.mark.parametrize("x0", [[-1.2, 1.0], [0.0] * 10])
def test_rosenbrock_float64_reaches_ones_as_scipy_does(minimize, x0):
    want = scipy.optimize.minimize(scipy.optimize.rosen, np.array(x0), jac=scipy.optimize.rosen_der,
                                   method=SCIPY[minimize], options={"gtol": 1e-9})
    with jax.enable_x64(True):
        converged, calls, x, value, grad, *_ = minimize(rosenbrock, jnp.array(x0), max_iters=500,
                                                        dtype="float64")
        value_there = float(rosenbrock(x))
    assert bool(converged) and x.dtype == jnp.float64
    np.testing.assert_allclose(x, np.ones(len(x0)), atol=1e-6)
    np.testing.assert_allclose(x, want.x, atol=1e-5)
    assert float(value) < 1e-12 and float(value) == pytest.approx(value_there, abs=1e-15)
    assert int(calls) < 4 * want.nfev  # a line search worth the name


@pytest.mark.parametrize("minimize", [minimize_bfgs, minimize_lbfgs])
def test_rosenbrock_float32_under_jit(minimize):
    run = jax.jit(lambda x0: minimize(rosenbrock, x0, max_iters=200, tolerance_grad=1e-3))
    converged, _, x, value, grad, *_ = run(jnp.array([-1.2, 1.0, -1.2, 1.0]))
    assert bool(converged) and x.dtype == jnp.float32
    np.testing.assert_allclose(x, np.ones(4), atol=1e-3)
    assert np.abs(np.asarray(grad)).max() < 1e-3


@pytest.mark.parametrize("minimize", [minimize_bfgs, minimize_lbfgs])
def test_vmap_over_starting_points_runs_each_as_alone(minimize):
    starts = jnp.array([[-1.2, 1.0], [0.0, 0.0], [2.0, 2.0]])
    run = lambda x0: minimize(rosenbrock, x0, max_iters=200, tolerance_grad=1e-3)  # noqa: E731
    converged, calls, x, *_ = jax.vmap(run)(starts)
    assert np.asarray(converged).all()
    alone = [run(x0) for x0 in starts]
    np.testing.assert_array_equal(calls, [int(a[1]) for a in alone])
    np.testing.assert_allclose(x, np.stack([a[2] for a in alone]), rtol=1e-6)


def logistic_regression():
    """Breast-cancer features standardised, a bias column, labels +-1, and an L2 penalty off the bias."""
    features, labels = load_breast_cancer(return_X_y=True)
    features = (features - features.mean(0)) / features.std(0)
    return np.hstack([features, np.ones((len(features), 1))]), 2.0 * labels - 1.0, 1e-2


def test_logistic_regression_reaches_scipys_optimum():
    x, y, penalty = logistic_regression()

    def loss_np(w):
        return np.mean(np.logaddexp(0.0, -y * (x @ w))) + 0.5 * penalty * w[:-1] @ w[:-1]

    def grad_np(w):
        g = x.T @ (-y / (1.0 + np.exp(y * (x @ w)))) / len(x)
        g[:-1] += penalty * w[:-1]
        return g

    want = scipy.optimize.minimize(loss_np, np.zeros(x.shape[1]), jac=grad_np, method="BFGS", options={"gtol": 1e-10})
    with jax.enable_x64(True):
        xj, yj = jnp.asarray(x), jnp.asarray(y)

        def loss(w):
            return jnp.mean(jnp.logaddexp(0.0, -yj * (xj @ w))) + 0.5 * penalty * jnp.sum(w[:-1] ** 2)

        for minimize in (minimize_bfgs, minimize_lbfgs):
            run = jax.jit(lambda w0: minimize(loss, w0, max_iters=300, tolerance_grad=1e-9, dtype="float64"))
            converged, _, w, value, grad, *_ = run(jnp.zeros(x.shape[1]))
            assert bool(converged), minimize.__name__
            np.testing.assert_allclose(w, want.x, atol=1e-6)
            assert float(value) == pytest.approx(want.fun, rel=1e-12)
            np.testing.assert_allclose(grad, grad_np(np.asarray(w)), atol=1e-12)


def quadratic():
    a = np.array([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    b = np.array([1.0, -2.0, 0.5])
    return a, b, lambda x: 0.5 * x @ a @ x - b @ x


def test_num_func_calls_counts_every_evaluation():
    evaluations = []

    def counted(x):
        jax.debug.callback(lambda: evaluations.append(1))
        return rosenbrock(x)

    for minimize in (minimize_bfgs, minimize_lbfgs):
        evaluations.clear()
        _, calls, *_ = minimize(counted, jnp.array([-1.2, 1.0]), max_iters=100)
        assert int(calls) == len(evaluations) > 10


def test_too_few_iterations_is_not_convergence():
    for minimize in (minimize_bfgs, minimize_lbfgs):
        converged, calls, x, *_ = minimize(rosenbrock, jnp.array([-1.2, 1.0]), max_iters=3)
        assert not bool(converged) and 3 < int(calls)
        assert np.abs(np.asarray(x) - 1.0).max() > 0.1
        converged, calls, x, *_ = minimize(rosenbrock, jnp.ones(2), max_iters=0)
        assert bool(converged) and int(calls) == 1  # already at the minimum: nothing to do


def test_initial_inverse_hessian_estimate_exact_for_a_quadratic_takes_one_newton_step():
    a, b, f = quadratic()
    with jax.enable_x64(True):
        for minimize in (minimize_bfgs, minimize_lbfgs):
            converged, calls, x, *_ = minimize(f, jnp.zeros(3), dtype="float64",
                                               initial_inverse_hessian_estimate=np.linalg.inv(a))
            assert bool(converged) and int(calls) == 2
            np.testing.assert_allclose(x, np.linalg.solve(a, b), atol=1e-12)


def test_inverse_hessian_estimate_learns_the_curvature():
    a, b, f = quadratic()
    with jax.enable_x64(True):
        converged, _, x, _, _, h = minimize_bfgs(f, jnp.zeros(3), dtype="float64")
    x, h = np.asarray(x), np.asarray(h)
    assert bool(converged)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), atol=1e-8)
    np.testing.assert_allclose(h @ a, np.eye(3), atol=1e-2)  # secant conditions along the steps taken
    np.testing.assert_allclose(h, h.T, atol=1e-12)
    assert np.linalg.eigvalsh(h).min() > 0


def test_scale_by_bfgs_update_meets_the_secant_condition():
    tx = scale_by_bfgs()
    state = tx.init(jnp.zeros(2))
    _, state = tx.update(jnp.array([1.0, 0.0]), state, jnp.zeros(2))
    s, y = jnp.array([0.5, -1.0]), jnp.array([2.0, -1.5])
    _, state = tx.update(jnp.array([1.0, 0.0]) + y, state, s)
    np.testing.assert_allclose(state.inverse_hessian @ y, s, rtol=1e-6)


@pytest.mark.parametrize("call, error, words", [
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros(2), line_search_fn="hager_zhang"), ValueError,
     "minimize_bfgs: line_search_fn must be 'strong_wolfe'"),
    (lambda: minimize_lbfgs("rosenbrock", jnp.zeros(2)), TypeError, "minimize_lbfgs: objective_func must be callable"),
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros(2), dtype="float16"), ValueError, "dtype must be"),
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros(2), dtype="float64"), ValueError, "needs 64-bit JAX"),
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros((2, 2))), ValueError, "initial_position must be 1-D"),
    (lambda: minimize_lbfgs(lambda x: x ** 2, jnp.zeros(2)), ValueError, "must return one number"),
    (lambda: minimize_lbfgs(rosenbrock, jnp.zeros(2), history_size=0), ValueError, "history_size"),
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros(2), max_iters=-1), ValueError, "max_iters"),
    (lambda: minimize_bfgs(rosenbrock, jnp.zeros(2), initial_inverse_hessian_estimate=jnp.eye(3)), ValueError,
     "must be 2 x 2"),
    (lambda: minimize_lbfgs(rosenbrock, jnp.zeros(2), initial_inverse_hessian_estimate=-jnp.eye(2)), ValueError,
     "symmetric positive definite"),
])
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()
