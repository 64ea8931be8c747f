"""Transforms: forward against numpy formulas, inverse(forward(x)) == x, log-Jacobians against
the log-determinant of jax.jacobian, shapes, TransformedDistribution, pytrees and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st

import paddlejax.distribution as D


def stick_breaking(x):
    """Paddle's formula: z_k = sigmoid(x_k - log(K + 1 - k)), y = z_k prod_{j<k} (1 - z_j), rest last."""
    k = x.shape[-1]
    z = 1 / (1 + np.exp(-(x - np.log(k - np.arange(k)))))
    remaining = np.cumprod(1 - z, axis=-1)
    return np.concatenate([z, np.ones_like(z[..., :1])], -1) * np.concatenate([np.ones_like(z[..., :1]), remaining], -1)


X = np.array([[-1.2, 0.3, 2.0], [0.5, -0.4, 0.1]])
LOC, SCALE = np.array([1.0, -2.0, 0.5]), np.array([2.0, -0.5, 3.0])

# name: (transform, input, numpy forward, domain event rank)
CASES = {
    "Exp": (lambda: D.ExpTransform(), X, np.exp, 0),
    "Sigmoid": (lambda: D.SigmoidTransform(), X, lambda x: 1 / (1 + np.exp(-x)), 0),
    "Tanh": (lambda: D.TanhTransform(), X, np.tanh, 0),
    "Affine": (lambda: D.AffineTransform(LOC, SCALE), X, lambda x: LOC + SCALE * x, 0),
    "Power": (lambda: D.PowerTransform(2.5), np.abs(X) + 0.1, lambda x: x ** 2.5, 0),
    "StickBreaking": (lambda: D.StickBreakingTransform(), X, stick_breaking, 1),
    "Chain": (lambda: D.ChainTransform([D.AffineTransform(1.0, 2.0), D.ExpTransform()]), X,
              lambda x: np.exp(1 + 2 * x), 0),
    "Chain-of-ranks": (lambda: D.ChainTransform([D.ExpTransform(), D.AffineTransform(-1.0, 1.0),
                                                 D.StickBreakingTransform()]), X,
                       lambda x: stick_breaking(np.exp(x) - 1), 1),
    "Independent": (lambda: D.IndependentTransform(D.AffineTransform(0.0, SCALE), 1), X, lambda x: SCALE * x, 1),
    "Reshape": (lambda: D.ReshapeTransform((2, 3), (3, 2)), np.stack([X, 2 * X]),
                lambda x: x.reshape(2, 3, 2), 2),
    "Stack": (lambda: D.StackTransform([D.ExpTransform(), D.AffineTransform(0.0, 3.0)], axis=0), X,
              lambda x: np.stack([np.exp(x[0]), 3 * x[1]]), 0),
    "Stack-last-axis": (lambda: D.StackTransform([D.SigmoidTransform(), D.ExpTransform(), D.TanhTransform()], axis=-1),
                        X, lambda x: np.stack([1 / (1 + np.exp(-x[:, 0])), np.exp(x[:, 1]), np.tanh(x[:, 2])], -1), 0),
}


def jacobian_log_det(forward, x, rank):
    """log|det| of the Jacobian of each event of ``x`` (an injective map that adds coordinates,
    like stick breaking, is measured on its first ones)."""
    batch = x.shape[:x.ndim - rank]
    b, e_in = int(np.prod(batch)), int(np.prod(x.shape[x.ndim - rank:]))
    e_out = forward(x).size // b
    jac = jax.jacobian(lambda v: forward(v.reshape(x.shape)).reshape(b, e_out))(jnp.asarray(x).reshape(b, e_in))
    blocks = np.stack([jac[i, :e_in, i, :] for i in range(b)])
    return np.linalg.slogdet(blocks)[1].reshape(batch)


@pytest.mark.parametrize("name", CASES)
def test_transform(name):
    make, x, reference, rank = CASES[name]
    t = make()
    y = t.forward(x)
    np.testing.assert_allclose(y, reference(x), rtol=1e-12)
    np.testing.assert_allclose(t.inverse(y), x, rtol=1e-10, atol=1e-12)
    ldj = t.forward_log_det_jacobian(x)
    assert ldj.shape == x.shape[:x.ndim - rank]
    np.testing.assert_allclose(ldj, jacobian_log_det(t.forward, x, rank), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t.inverse_log_det_jacobian(y), -ldj, rtol=1e-10, atol=1e-12)
    assert t.forward_shape(x.shape) == y.shape and t.inverse_shape(y.shape) == x.shape
    np.testing.assert_allclose(jax.jit(lambda t, x: t.forward(x))(t, x), y, rtol=1e-12)  # a pytree


def test_abs_and_softmax_are_not_injective():
    x = np.array([-2.0, 0.5])
    t = D.AbsTransform()
    np.testing.assert_array_equal(t.forward(x), [2.0, 0.5])
    negative, positive = t.inverse(np.array([2.0, 0.5]))
    np.testing.assert_array_equal(negative, [-2.0, -0.5]) and np.testing.assert_array_equal(positive, [2.0, 0.5])
    assert all(float(z.sum()) == 0.0 for z in t.inverse_log_det_jacobian(np.array([2.0, 0.5])))
    with pytest.raises(NotImplementedError):
        t.forward_log_det_jacobian(x)
    s = D.SoftmaxTransform()
    y = s.forward(X)
    np.testing.assert_allclose(y, np.exp(X) / np.exp(X).sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(s.forward(s.inverse(y)), y, rtol=1e-12)  # log(y) is a preimage
    assert s.forward_shape((2, 3)) == (2, 3) == s.inverse_shape((2, 3))
    with pytest.raises(NotImplementedError, match="SoftmaxTransform is not injective"):
        s.forward_log_det_jacobian(X)
    with pytest.raises(TypeError, match="SoftmaxTransform is not injective"):
        D.TransformedDistribution(D.Normal(np.zeros(3), 1.0), [s])


def test_transformed_distribution_is_the_change_of_variables():
    # onto the simplex: the base's rightmost batch dimension becomes the event, as in Paddle
    base = D.Normal(np.array([0.1, -0.3, 0.2]), np.array([1.0, 0.5, 2.0]))
    t = D.StickBreakingTransform()
    d = D.TransformedDistribution(base, [t])
    assert (d.batch_shape, d.event_shape) == ((), (4,))
    y = t.forward(X)
    expected = base.log_prob(X).sum(-1) - t.forward_log_det_jacobian(X)
    np.testing.assert_allclose(d.log_prob(y), expected, rtol=1e-10)
    samples = d.sample((5,), key=0)
    assert samples.shape == (5, 4)
    np.testing.assert_allclose(samples.sum(-1), 1.0, rtol=1e-12)
    # a stack of transforms over a batch axis
    d = D.TransformedDistribution(D.Normal(np.zeros((2, 3)), 1.0),
                                  [D.StackTransform([D.ExpTransform(), D.AffineTransform(1.0, 3.0)], axis=0)])
    y = np.array([[0.5, 1.0, 2.0], [0.0, 1.0, 4.0]])
    expected = np.concatenate([st.lognorm(1.0).logpdf(y[:1]), st.norm(1.0, 3.0).logpdf(y[1:])])
    np.testing.assert_allclose(d.log_prob(y), expected, rtol=1e-10)


def test_calling_a_transform():
    t = D.ExpTransform()
    assert float(t(0.0)) == 1.0
    d = t(D.Normal(0.0, 1.0))
    assert isinstance(d, D.TransformedDistribution)
    np.testing.assert_allclose(d.log_prob(2.0), st.lognorm(1.0).logpdf(2.0), rtol=1e-12)
    chain = t(D.AffineTransform(1.0, 2.0))  # this transform first, as Paddle composes
    np.testing.assert_allclose(chain.forward(0.5), 1 + 2 * np.exp(0.5), rtol=1e-12)


def test_transforms_are_pytrees_for_grad_and_vmap():
    grad = jax.grad(lambda t: t.forward(3.0))(D.AffineTransform(1.0, 2.0))
    assert (float(grad.loc), float(grad.scale)) == (1.0, 3.0)
    batch = D.AffineTransform(jnp.arange(3.0), jnp.full(3, 2.0))
    out = jax.vmap(lambda t: t.forward(1.0))(batch)
    np.testing.assert_allclose(out, np.arange(3.0) + 2.0)
    chain = D.ChainTransform([D.AffineTransform(1.0, 2.0), D.ExpTransform()])
    leaves = jax.tree_util.tree_leaves(chain)
    assert [float(v) for v in leaves] == [1.0, 2.0]


def test_bad_transform_arguments():
    with pytest.raises(ValueError, match="AffineTransform: scale must be nonzero, got 0.0"):
        D.AffineTransform(1.0, 0.0)
    with pytest.raises(ValueError, match="PowerTransform: power must be nonzero"):
        D.PowerTransform(0.0)
    with pytest.raises(ValueError, match=r"ReshapeTransform: in_event_shape \(2, 3\) and out_event_shape \(4,\)"):
        D.ReshapeTransform((2, 3), (4,))
    with pytest.raises(TypeError, match="ReshapeTransform: in_event_shape must be a list or tuple of ints >= 1"):
        D.ReshapeTransform(6, (6,))
    with pytest.raises(TypeError, match="ChainTransform: transforms must be a list of Transform"):
        D.ChainTransform([D.ExpTransform(), np.exp])
    with pytest.raises(ValueError, match="IndependentTransform: reinterpreted_batch_rank must be an int >= 1"):
        D.IndependentTransform(D.ExpTransform(), 0)
    with pytest.raises(TypeError, match="IndependentTransform: base must be a Transform"):
        D.IndependentTransform(np.exp, 1)
    with pytest.raises(TypeError, match="StackTransform: axis must be an int"):
        D.StackTransform([D.ExpTransform()], axis=0.5)
    with pytest.raises(ValueError, match="StackTransform: axis 0 of the input has 2 entries for 3 transforms"):
        D.StackTransform([D.ExpTransform()] * 3).forward(X)
    with pytest.raises(ValueError, match="StackTransform: axis -1 is an event axis"):
        D.StackTransform([D.StickBreakingTransform()] * 3, axis=-1).forward_log_det_jacobian(X)
    with pytest.raises(TypeError, match="TransformedDistribution: base must be a paddlejax.distribution"):
        D.TransformedDistribution(D.Distribution(), [D.ExpTransform()])
