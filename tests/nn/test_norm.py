"""Normalisation layers against numpy: batch norm's training/eval behaviour and running
statistics (eagerly and under nnx.jit), layer norm and group norm."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn

rng = np.random.default_rng(0)


def rand(*shape, loc=0.0):
    return (loc + rng.normal(size=shape)).astype(np.float32)


def normalise(x, axes, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)


def test_batch_norm_2d_trains_on_batch_stats_and_updates_running_ones():
    bn = nn.BatchNorm2D(3, momentum=0.8, weight_attr=nn.initializer.Constant(2.0), bias_attr=nn.initializer.Constant(1.0))
    assert type(bn.mean) is nnx.BatchStat and type(bn.variance) is nnx.BatchStat and type(bn.weight) is nnx.Param
    x = rand(4, 3, 2, 2, loc=3.0)
    np.testing.assert_allclose(bn(x), 2 * normalise(x, (0, 2, 3)) + 1, rtol=1e-4, atol=1e-4)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))  # biased variance, as Paddle
    np.testing.assert_allclose(bn.mean[...], 0.2 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.variance[...], 0.8 + 0.2 * var, rtol=1e-5)
    bn.eval()
    y = rand(2, 3, 2, 2)
    shape = (1, 3, 1, 1)
    want = 2 * (y - 0.2 * mean.reshape(shape)) / np.sqrt(0.8 + 0.2 * var.reshape(shape) + 1e-5) + 1
    np.testing.assert_allclose(bn(y), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.mean[...], 0.2 * mean, rtol=1e-5)  # eval leaves the stats alone


def test_batch_norm_updates_running_stats_under_nnx_jit_and_shows_the_op():
    bn = nn.BatchNorm2D(2, data_format="NHWC")
    x = rand(3, 2, 2, 2, loc=1.0)
    step = nnx.jit(lambda m, x: m(x))
    step(bn, x)
    step(bn, x)
    np.testing.assert_allclose(bn.mean[...], (1 - 0.81) * x.mean((0, 1, 2)), rtol=1e-5)
    bn.eval()
    assert [e.primitive.name for e in jax.make_jaxpr(bn)(x).eqns] == ["batch_norm"]


def test_use_global_stats_forces_running_statistics_in_training():
    bn = nn.BatchNorm1D(2, use_global_stats=True)
    x = rand(5, 2, loc=4.0)
    np.testing.assert_allclose(bn(x), x / np.sqrt(1 + 1e-5), rtol=1e-5)
    assert bn.mean[...].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape,data_format,axes", [((6, 3), "NC", (0,)), ((4, 3, 5), "NCL", (0, 2)),
                                                    ((4, 5, 3), "NLC", (0, 1))])
def test_batch_norm_1d_layouts(shape, data_format, axes):
    x = rand(*shape)
    np.testing.assert_allclose(nn.BatchNorm1D(3, data_format=data_format)(x), normalise(x, axes), rtol=1e-4,
                               atol=1e-4)


def test_batch_norm_gradients_flow_to_weight_and_bias():
    bn = nn.BatchNorm2D(2)
    x = rand(2, 2, 3, 3)
    grads = nnx.grad(lambda m: jnp.sum(m(x) * x))(bn)
    np.testing.assert_allclose(grads["bias"][...], x.sum((0, 2, 3)), rtol=1e-4)
    np.testing.assert_allclose(grads["weight"][...], (normalise(x, (0, 2, 3)) * x).sum((0, 2, 3)), rtol=1e-4)


def test_layer_norm_over_trailing_axes_with_flat_affine():
    ln = nn.LayerNorm([3, 4], epsilon=1e-6, weight_attr=nn.initializer.Uniform(0.5, 1.5),
                      bias_attr=nn.initializer.Uniform(-1, 1))
    assert ln.weight[...].shape == (12,) and ln.bias[...].shape == (12,)
    x = rand(2, 3, 4)
    w, b = (np.asarray(p[...]).reshape(3, 4) for p in (ln.weight, ln.bias))
    np.testing.assert_allclose(ln(x), normalise(x, (1, 2), 1e-6) * w + b, rtol=1e-4, atol=1e-4)
    assert [e.primitive.name for e in jax.make_jaxpr(ln)(x).eqns] == ["layer_norm"]
    no_affine = nn.LayerNorm(4, weight_attr=False, bias_attr=False)
    assert no_affine.weight is None and no_affine.bias is None
    np.testing.assert_allclose(no_affine(x), normalise(x, (2,)), rtol=1e-4, atol=1e-4)
    bias_only = nn.LayerNorm(4, weight_attr=False, bias_attr=nn.initializer.Constant(1.0))
    np.testing.assert_allclose(bias_only(x), normalise(x, (2,)) + 1, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"LayerNorm: input 'x' expects trailing dims \(3, 4\)"):
        ln(rand(2, 4, 3))


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_group_norm_per_group(data_format):
    gn = nn.GroupNorm(2, 4, data_format=data_format, bias_attr=nn.initializer.Constant(0.5))
    x = rand(2, 4, 3, 3)
    want = normalise(x.reshape(2, 2, -1), (2,)).reshape(x.shape) + 0.5
    if data_format == "NHWC":
        x, want = x.transpose(0, 2, 3, 1), want.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(gn(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make,match", [
    (lambda: nn.GroupNorm(3, 4), r"GroupNorm: argument 'num_groups' expects a divisor of num_channels \(4\)"),
    (lambda: nn.BatchNorm2D(4, data_format="NCL"), r"BatchNorm2D: argument 'data_format' expects one of"),
    (lambda: nn.BatchNorm2D(4, momentum=-1), r"BatchNorm2D: argument 'momentum' expects a number >= 0"),
    (lambda: nn.LayerNorm([]), r"LayerNorm: argument 'normalized_shape' expects an int or a list"),
    (lambda: nn.BatchNorm2D(3)(jnp.ones((2, 3))), r"BatchNorm2D: input 'x' expects rank 4"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
