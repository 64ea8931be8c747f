"""Pooling layers against numpy windows and Paddle's adaptive bins."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax.nn as nn

x = np.random.default_rng(0).normal(size=(2, 3, 7, 5)).astype(np.float32)


def np_pool(x, kind, k, s, pads=(0, 0), ceil=False, exclusive=True, divisor=None):
    """NCHW pooling over explicit windows clipped to the input (Paddle's bounds and divisors)."""
    h, w = x.shape[2:]

    def size(n, k, s, p):
        out = (-(-(n + 2 * p - k) // s) if ceil else (n + 2 * p - k) // s) + 1
        return out - 1 if ceil and (out - 1) * s >= n + p else out

    ho, wo = size(h, k[0], s[0], pads[0]), size(w, k[1], s[1], pads[1])
    out = np.zeros(x.shape[:2] + (ho, wo))
    for i in range(ho):
        for j in range(wo):
            h0, w0 = i * s[0] - pads[0], j * s[1] - pads[1]
            win = x[:, :, max(h0, 0):min(h0 + k[0], h), max(w0, 0):min(w0 + k[1], w)]
            if kind == "max":
                out[:, :, i, j] = win.max((2, 3))
            else:
                count = divisor or (win.shape[2] * win.shape[3] if exclusive else k[0] * k[1])
                out[:, :, i, j] = win.sum((2, 3)) / count
    return out


def np_adaptive(x, out, kind):
    h, w = x.shape[2:]
    oh, ow = (n if o is None else o for n, o in zip((h, w), out))
    res = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, i * h // oh:-(-(i + 1) * h // oh), j * w // ow:-(-(j + 1) * w // ow)]
            res[:, :, i, j] = win.max((2, 3)) if kind == "max" else win.mean((2, 3))
    return res


@pytest.mark.parametrize("layer,want", [
    (nn.MaxPool2D(2), np_pool(x, "max", (2, 2), (2, 2))),
    (nn.MaxPool2D((3, 2), stride=2, padding=1, ceil_mode=True), np_pool(x, "max", (3, 2), (2, 2), (1, 1), True)),
    (nn.AvgPool2D(3, 2, padding=1), np_pool(x, "avg", (3, 3), (2, 2), (1, 1))),
    (nn.AvgPool2D(3, 2, padding=1, exclusive=False), np_pool(x, "avg", (3, 3), (2, 2), (1, 1), exclusive=False)),
    (nn.AvgPool2D(2, 1, divisor_override=3), np_pool(x, "avg", (2, 2), (1, 1), divisor=3)),
    (nn.AdaptiveAvgPool2D((3, 2)), np_adaptive(x, (3, 2), "avg")),
    (nn.AdaptiveAvgPool2D([None, 4]), np_adaptive(x, (None, 4), "avg")),
    (nn.AdaptiveMaxPool2D(3), np_adaptive(x, (3, 3), "max")),
], ids=["max", "max-ceil-pad", "avg-exclusive", "avg-inclusive", "avg-divisor", "adaptive-avg", "adaptive-none",
        "adaptive-max"])
def test_pooling_matches_numpy(layer, want):
    np.testing.assert_allclose(layer(x), want, rtol=1e-5, atol=1e-6)


def test_channels_last_and_the_ops_in_the_jaxpr():
    xl = x.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(nn.AdaptiveAvgPool2D(2, data_format="NHWC")(xl),
                               np_adaptive(x, (2, 2), "avg").transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nn.MaxPool2D(2, data_format="NHWC")(xl),
                               np_pool(x, "max", (2, 2), (2, 2)).transpose(0, 2, 3, 1))
    assert [e.primitive.name for e in jax.make_jaxpr(nn.AvgPool2D(2))(x).eqns] == ["pool2d"]
    assert [e.primitive.name for e in jax.make_jaxpr(nn.AdaptiveMaxPool2D(1))(x).eqns] == ["adaptive_pool2d"]


@pytest.mark.parametrize("make,match", [
    (lambda: nn.MaxPool2D(2, return_mask=True), r"MaxPool2D: argument 'return_mask' expects False"),
    (lambda: nn.MaxPool2D(0), r"MaxPool2D: argument 'kernel_size' expects an int or 2 ints >= 1"),
    (lambda: nn.AvgPool2D(2, padding="FULL"), r"AvgPool2D: pool2d: attribute 'padding'"),
    (lambda: nn.AvgPool2D(2, divisor_override=0), r"AvgPool2D: argument 'divisor_override' expects None or a positive"),
    (lambda: nn.AdaptiveAvgPool2D((2, 0)), r"AdaptiveAvgPool2D: adaptive_pool2d: attribute 'output_size' expects"),
    (lambda: nn.AdaptiveAvgPool2D(2, data_format="CHW"), r"AdaptiveAvgPool2D: argument 'data_format' expects one of"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_adaptive_pool1d_uses_paddle_bins_along_the_last_axis():
    v = np.random.default_rng(2).normal(size=(2, 3, 7)).astype(np.float32)
    want = np_adaptive(v[:, :, None, :], (1, 3), "avg")[:, :, 0]  # bins [0, 3), [2, 5), [4, 7)
    np.testing.assert_allclose(nn.AdaptiveAvgPool1D(3)(v), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nn.AdaptiveMaxPool1D(3)(v), np_adaptive(v[:, :, None, :], (1, 3), "max")[:, :, 0])
    grad = jax.grad(lambda t: nn.AdaptiveAvgPool1D(3)(t).sum())(jnp.ones((1, 1, 7)))
    np.testing.assert_allclose(grad[0, 0], [1 / 3, 1 / 3, 2 / 3, 1 / 3, 2 / 3, 1 / 3, 1 / 3], rtol=1e-6)
    half = nn.AdaptiveAvgPool1D(2)(v.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16 and half.shape == (2, 3, 2)
    with pytest.raises(ValueError, match=r"adaptive_avg_pool1d: input 'x' expects rank 3 \[N, C, L\]"):
        nn.AdaptiveAvgPool1D(2)(x)
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool1D: argument 'output_size' expects an int >= 1"):
        nn.AdaptiveAvgPool1D([2])


def test_adaptive_pool1d_model_traces_saves_and_loads(round_trip):
    model = nn.Sequential(nn.Conv1D(3, 4, 3), nn.AdaptiveAvgPool1D(2), nn.Flatten())
    assert "adaptive_pool2d(" in round_trip(model, np.ones((2, 3, 9), np.float32), tol=1e-5)
