"""Activation layers: numpy formulas, one op each in the jaxpr."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

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
