"""Activation layers: numpy formulas, one op each in the jaxpr; PReLU's learnt slopes."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn

x = np.random.default_rng(0).normal(scale=3.0, size=(3, 4)).astype(np.float32)


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def log_softmax(v, axis):
    v = v - v.max(axis, keepdims=True)
    return v - np.log(np.exp(v).sum(axis, keepdims=True))


CASES = [
    (nn.ReLU(), "relu", lambda v: np.maximum(v, 0)),
    (nn.ReLU6(), "relu6", lambda v: np.clip(v, 0, 6)),
    (nn.GELU(), "gelu", lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))),
    (nn.GELU(approximate=True), "gelu",
     lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))),
    (nn.Sigmoid(), "sigmoid", sigmoid),
    (nn.Tanh(), "tanh", np.tanh),
    (nn.Softmax(axis=0), "softmax", lambda v: np.exp(log_softmax(v, 0))),
    (nn.LogSoftmax(), "log_softmax", lambda v: log_softmax(v, -1)),
    (nn.LeakyReLU(0.2), "leaky_relu", lambda v: np.where(v > 0, v, 0.2 * v)),
    (nn.Hardswish(), "hard_swish", lambda v: v * np.clip(v + 3, 0, 6) / 6),
    (nn.Silu(), "silu", lambda v: v * sigmoid(v)),
]


@pytest.mark.parametrize("layer,op,ref", CASES, ids=[f"{type(c[0]).__name__}-{i}" for i, c in enumerate(CASES)])
def test_activation_matches_formula_and_is_its_op(layer, op, ref):
    np.testing.assert_allclose(layer(x), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert [e.primitive.name for e in jax.make_jaxpr(layer)(x).eqns] == [op]


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Softmax(axis=1.0), r"Softmax: argument 'axis' expects an int"),
    (lambda: nn.GELU(approximate="tanh"), r"GELU: argument 'approximate' expects a bool"),
    (lambda: nn.LeakyReLU("0.1"), r"LeakyReLU: argument 'negative_slope' expects a number"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_prelu_per_channel_and_shared_slopes_with_their_gradients():
    v = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)
    shared = nn.PReLU()
    assert shared.weight[...].tolist() == [0.25] and [n for n, _ in shared.named_parameters()] == ["weight"]
    np.testing.assert_allclose(shared(v), np.maximum(v, 0) + 0.25 * np.minimum(v, 0), rtol=1e-6)
    per_channel = nn.PReLU(3, init=0.1, data_format="NCL")
    per_channel.weight.set_value(jnp.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(per_channel(v), np.where(v > 0, v, np.array([0.1, 0.2, 0.3])[:, None] * v), rtol=1e-6)
    channels_last = nn.PReLU(4, data_format="NLC")
    np.testing.assert_allclose(channels_last(v), np.where(v > 0, v, 0.25 * v), rtol=1e-6)
    # d sum(prelu(x)) / d weight = sum of the negative inputs of each channel
    grads = nnx.grad(lambda m: jnp.sum(m(v)))(per_channel)
    np.testing.assert_allclose(grads["weight"][...], np.minimum(v, 0).sum((0, 2)), rtol=1e-5)
    assert [e.primitive.name for e in jax.make_jaxpr(per_channel)(v).eqns] == ["prelu"]
    half = per_channel(v.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(half), per_channel(v), rtol=1e-2, atol=1e-2)


def test_prelu_bad_arguments():
    with pytest.raises(ValueError, match=r"PReLU: argument 'num_parameters' expects an int >= 1"):
        nn.PReLU(0)
    with pytest.raises(ValueError, match=r"PReLU: argument 'data_format' expects one of"):
        nn.PReLU(data_format="CHW")
    with pytest.raises(ValueError, match=r"prelu: input 'weight' expects shape \(1,\) or one slope per channel "
                                         r"\(x \(2, 3\) has 3 channels on axis 1"):
        nn.PReLU(4)(np.zeros((2, 3), np.float32))


def test_prelu_model_traces_saves_and_loads(round_trip):
    model = nn.Sequential(nn.Linear(4, 3), nn.PReLU(3, data_format="NC"))
    assert "prelu(" in round_trip(model, x, tol=1e-6)
