"""Spectral norm: the ``spectral_norm`` op, the ``SpectralNorm`` layer and
``nn.utils.spectral_norm``, against numpy's SVD; the power-iteration vectors as state that
training advances and eval reads; gradients; capture, saving and the Trainer."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn

rng = np.random.default_rng(0)
W = rng.normal(size=(6, 4, 3)).astype(np.float32)


def top_singular_value(w, dim=0):
    return np.linalg.svd(np.moveaxis(np.asarray(w, np.float64), dim, 0).reshape(w.shape[dim], -1),
                         compute_uv=False)[0]


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_training_calls_converge_to_the_largest_singular_value(dim):
    nn.seed(0)
    sn = nn.SpectralNorm(W.shape, dim=dim)
    for _ in range(60):  # one power iteration per call, kept between calls
        out = sn(W)
    np.testing.assert_allclose(W / np.asarray(out), top_singular_value(W, dim), rtol=1e-4)
    assert top_singular_value(np.asarray(out), dim) == pytest.approx(1.0, rel=1e-4)


def test_float64_weights_give_float64_results_to_svd_precision():
    with jax.enable_x64(True):
        sn = nn.SpectralNorm((5, 3), power_iters=200, dtype="float64")
        w = rng.normal(size=(5, 3))
        out = sn(jnp.asarray(w))
        assert out.dtype == jnp.float64 and sn.weight_u[...].dtype == jnp.float64
        np.testing.assert_allclose(w / np.asarray(out), top_singular_value(w), rtol=1e-10)


def test_vectors_advance_in_training_only_and_eval_reads_them():
    nn.seed(0)
    sn = nn.SpectralNorm(W.shape, power_iters=2)
    u0, v0 = np.asarray(sn.weight_u[...]), np.asarray(sn.weight_v[...])
    assert np.linalg.norm(u0) == pytest.approx(1.0, rel=1e-6) and v0.shape == (12,)
    sn(W)
    u1, v1 = np.asarray(sn.weight_u[...]), np.asarray(sn.weight_v[...])
    assert not np.allclose(u1, u0) and not np.allclose(v1, v0)
    sn.eval()
    out = sn(W)
    np.testing.assert_array_equal(sn.weight_u[...], u1)
    np.testing.assert_array_equal(sn.weight_v[...], v1)
    mat = W.reshape(6, -1).astype(np.float64)
    np.testing.assert_allclose(out, W / (u1 @ mat @ v1), rtol=1e-5)


def test_gradient_treats_the_iterated_vectors_as_constants():
    w, g = (rng.normal(size=(4, 3)).astype(np.float32) for _ in range(2))
    u, v = rng.normal(size=4).astype(np.float32), rng.normal(size=3).astype(np.float32)
    grad = jax.grad(lambda w: jnp.sum(pj.ops.spectral_norm(w, u, v, power_iters=3)[0] * g))(w)
    _, u3, v3 = pj.ops.spectral_norm(w, u, v, power_iters=3)
    u3, v3 = np.asarray(u3, np.float64), np.asarray(v3, np.float64)
    sigma = u3 @ w @ v3
    want = (g - np.sum(g * w) / sigma * np.outer(u3, v3)) / sigma
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_nnx_jit_carries_the_vectors_out():
    nn.seed(0)
    sn = nn.SpectralNorm(W.shape)
    eager = nnx.clone(sn)
    step = nnx.jit(lambda m, w: m(w))
    for _ in range(3):
        np.testing.assert_allclose(step(sn, W), eager(W), rtol=1e-5)
    np.testing.assert_allclose(sn.weight_u[...], eager.weight_u[...], rtol=1e-5)


@pytest.mark.parametrize("make, shape, dim", [
    (lambda: nn.Conv2D(3, 5, 3), (2, 3, 6, 6), 0),
    (lambda: nn.Conv2DTranspose(3, 5, 3, stride=2), (2, 3, 4, 4), 1),
    (lambda: nn.Linear(7, 4), (2, 7), 1),
    (lambda: nn.Embedding(10, 6), None, 0),
])
def test_wrapped_layers_compute_with_the_normalised_weight(make, shape, dim):
    nn.seed(0)
    layer = make()
    wrapped = nn.utils.spectral_norm(layer, n_power_iterations=50)
    x = jnp.asarray(rng.integers(0, 10, (2, 3)), jnp.int32) if shape is None else jnp.asarray(
        rng.normal(size=shape), jnp.float32)
    got = wrapped(x)
    weight = np.asarray(layer.weight[...])
    plain = nnx.clone(layer)
    plain.weight.set_value(weight / top_singular_value(weight, dim))
    np.testing.assert_allclose(got, plain(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(layer.weight[...], weight)  # the trained weight stays as it was


def test_wrapper_names_and_errors():
    nn.seed(0)
    wrapped = nn.utils.spectral_norm(nn.Linear(3, 2), dim=0)
    assert sorted(nn.state_dict(wrapped)) == ["layer.bias", "layer.weight", "spectral_norm.weight_u",
                                              "spectral_norm.weight_v"]
    assert wrapped.spectral_norm.weight_u[...].shape == (3,)  # dim 0 of the [in, out] weight
    with pytest.raises(ValueError, match="spectral_norm: argument 'name' expects the name of a parameter of Linear"):
        nn.utils.spectral_norm(nn.Linear(3, 2), name="kernel")
    with pytest.raises(ValueError, match="spectral_norm: argument 'dim' expects None or an int"):
        nn.utils.spectral_norm(nn.Linear(3, 2), dim="0")
    with pytest.raises(ValueError, match="spectral_norm: argument 'n_power_iterations' expects an int >= 0"):
        nn.utils.spectral_norm(nn.Linear(3, 2), n_power_iterations=-1)


@pytest.mark.parametrize("call, match", [
    (lambda: nn.SpectralNorm((3,)), r"SpectralNorm: argument 'weight_shape' expects a list of at least 2 ints"),
    (lambda: nn.SpectralNorm((3, 2), dim=2), r"SpectralNorm: argument 'dim' expects an axis of weight_shape"),
    (lambda: nn.SpectralNorm((3, 2), eps=-1.0), r"SpectralNorm: argument 'eps' expects a number >= 0"),
    (lambda: nn.SpectralNorm((3, 2))(jnp.ones((2, 3))),
     r"SpectralNorm: input 'weight' expects shape \(3, 2\), got \(2, 3\)"),
    (lambda: pj.ops.spectral_norm(jnp.ones((3, 2)), jnp.ones(2), jnp.ones(2)),
     r"spectral_norm: input 'u' expects shape \(3,\)"),
    (lambda: pj.ops.spectral_norm(jnp.ones((3, 2)), jnp.ones(3), jnp.ones(2), dim=2),
     r"spectral_norm: attribute 'dim' expects an axis in \[-2, 2\)"),
    (lambda: pj.ops.spectral_norm(jnp.ones((3, 2)), jnp.ones(3), jnp.ones(2), power_iters=-1),
     r"spectral_norm: attribute 'power_iters' expects values >= 0"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


class Critic(nn.Layer):
    def __init__(self):
        self.conv = nn.utils.spectral_norm(nn.Conv2D(1, 4, 3, stride=2, padding=1))
        self.fc = nn.utils.spectral_norm(nn.Linear(4 * 3 * 3, 1))

    def forward(self, x):
        return self.fc(nn.functional.leaky_relu(self.conv(x), 0.2).reshape(x.shape[0], -1))


X = rng.normal(size=(2, 1, 6, 6)).astype(np.float32)


def test_trace_in_eval_mode_shows_the_op_and_round_trips(round_trip):
    nn.seed(0)
    model = Critic()
    model(X)  # one training step of the vectors
    model.eval()
    text = round_trip(model, X, tol=1e-5)
    assert text.count(" = spectral_norm(") == 2 and "power_iters=0" in text


def test_to_static_in_training_returns_the_advanced_vectors_as_updates():
    nn.seed(0)
    model = Critic()
    prog = pj.to_static(model, pj.InputSpec((None, 1, 6, 6)), train=True)
    out, updates = prog(X)
    assert sorted(updates) == ["conv.spectral_norm.weight_u", "conv.spectral_norm.weight_v",
                               "fc.spectral_norm.weight_u", "fc.spectral_norm.weight_v"]
    dygraph = nnx.clone(model)
    np.testing.assert_allclose(out, dygraph(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(updates["fc.spectral_norm.weight_v"], dygraph.fc.spectral_norm.weight_v[...],
                               rtol=1e-5)


def test_weights_file_keeps_the_vectors(tmp_path):
    nn.seed(0)
    model = Critic()
    model(X)
    nn.save_weights(model, tmp_path / "critic.safetensors")
    nn.seed(1)
    other = Critic()
    nn.load_weights(other, tmp_path / "critic.safetensors")
    model.eval(), other.eval()
    np.testing.assert_array_equal(other(X), model(X))


def test_trainer_carries_the_vectors_and_keeps_the_critic_one_lipschitz():
    nn.seed(0)
    model = Critic()
    v0 = np.asarray(model.fc.spectral_norm.weight_v[...])
    x = rng.normal(size=(16, 1, 6, 6)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    trainer = pj.Trainer(model, optax.adam(0.01), loss="mse", progress=False)
    trainer.fit((x, y), epochs=20, batch_size=8)
    assert not np.allclose(model.fc.spectral_norm.weight_v[...], v0)
    for wrapped, dim in ((model.conv, 0), (model.fc, 1)):  # 40 steps of one iteration: sigma is found
        weight = np.asarray(wrapped.layer.weight[...])
        wrapped.eval()
        assert top_singular_value(np.asarray(wrapped.spectral_norm(weight)), dim) == pytest.approx(1.0, rel=1e-2)
