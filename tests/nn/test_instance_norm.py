"""InstanceNorm1D/2D/3D against a numpy per-sample, per-channel normalisation: layouts,
Paddle's parameters (``scale``, ``bias``; none when either attr is False), no running
statistics, gradients, capture and errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax.nn as nn

rng = np.random.default_rng(0)


def np_instance_norm(x, scale=None, bias=None, eps=1e-5):
    """Channels-first input normalised per sample and channel over every other axis, float64."""
    x = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y if scale is None else y * scale.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("layer, shape", [(nn.InstanceNorm1D, (2, 3, 7)), (nn.InstanceNorm2D, (2, 3, 4, 5)),
                                          (nn.InstanceNorm3D, (2, 3, 2, 3, 4))])
def test_matches_numpy_with_trained_scale_and_bias(layer, shape):
    norm = layer(3)
    norm.scale.set_value(jnp.asarray([0.5, 2.0, -1.0]))
    norm.bias.set_value(jnp.asarray([0.0, 1.0, 3.0]))
    x = rng.normal(2.0, 3.0, size=shape).astype(np.float32)
    np.testing.assert_allclose(norm(x), np_instance_norm(x, np.asarray(norm.scale[...]), np.asarray(norm.bias[...])),
                               rtol=1e-4, atol=1e-5)


def test_channels_last_and_eval_compute_the_same():
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    norm = nn.InstanceNorm2D(3, data_format="NHWC")
    np.testing.assert_allclose(norm(x.transpose(0, 2, 3, 1)), np_instance_norm(x).transpose(0, 2, 3, 1), rtol=1e-4,
                               atol=1e-5)
    norm.eval()  # no running statistics: eval normalises by the sample's own
    np.testing.assert_allclose(norm(x.transpose(0, 2, 3, 1)), np_instance_norm(x).transpose(0, 2, 3, 1), rtol=1e-4,
                               atol=1e-5)


def test_parameters_follow_paddle():
    assert sorted(nn.state_dict(nn.InstanceNorm2D(4))) == ["bias", "scale"]
    for attrs in ({"weight_attr": False}, {"bias_attr": False}):
        norm = nn.InstanceNorm2D(4, **attrs)
        assert norm.scale is None and norm.bias is None and nn.state_dict(norm) == {}


def test_float64_gradients_match_finite_differences():
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        norm = nn.InstanceNorm2D(2, weight_attr=False)
        x = jnp.asarray(rng.normal(size=(2, 2, 3, 3)))
        assert norm(x).dtype == jnp.float64
        check_grads(norm, (x,), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def test_jit_and_vmap():
    norm = nn.InstanceNorm2D(3)
    x = rng.normal(size=(4, 2, 3, 4, 4)).astype(np.float32)
    batched = jax.vmap(norm)(x)
    np.testing.assert_allclose(batched, np.stack([np_instance_norm(s) for s in x]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jax.jit(norm)(x[0]), batched[0], rtol=1e-6, atol=1e-6)


def test_traces_to_one_group_norm_and_round_trips(round_trip):
    text = round_trip(nn.InstanceNorm2D(3), rng.normal(size=(2, 3, 4, 4)).astype(np.float32), tol=1e-5)
    assert "group_norm(" in text and "groups=3" in text


@pytest.mark.parametrize("call, match", [
    (lambda: nn.InstanceNorm2D(0), r"InstanceNorm2D: argument 'num_features' expects an int >= 1"),
    (lambda: nn.InstanceNorm2D(3, data_format="NCL"), r"InstanceNorm2D: argument 'data_format' expects one of"),
    (lambda: nn.InstanceNorm1D(3, epsilon=-1), r"InstanceNorm1D: argument 'epsilon' expects a number >= 0"),
    (lambda: nn.InstanceNorm2D(3)(jnp.ones((2, 3, 4))), r"InstanceNorm2D: input 'x' expects rank 4"),
    (lambda: nn.InstanceNorm2D(3)(jnp.ones((2, 4, 4, 4))),
     r"InstanceNorm2D: input 'x' expects 3 channels on axis 1 \(data_format='NCHW'\), got shape \(2, 4, 4, 4\)"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
