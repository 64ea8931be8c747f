"""Paddle's initialisers and fans, each layer's default initialisation (statistics on large
layers), and ParamAttr / weight_attr / bias_attr handling."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn
from paddlejax.nn import initializer as I

KEY = jax.random.key(0)


@pytest.mark.parametrize("shape,fans", [((), (1, 1)), ((7,), (7, 7)), ((3, 5), (3, 5)),
                                        ((64, 16, 3, 2), (16 * 6, 64 * 6))])
def test_paddle_fans(shape, fans):
    assert I.compute_fans(shape) == fans


XAVIER_LIMIT = 2 * math.sqrt(6 / 500)  # gain 2, fans 200 + 300


@pytest.mark.parametrize("init,mean,std,bounds", [
    (I.Normal(1.0, 0.5), 1.0, 0.5, None),
    (I.Uniform(-0.3, 0.1), -0.1, 0.4 / math.sqrt(12), (-0.3, 0.1)),
    (I.XavierNormal(), 0.0, math.sqrt(2 / (200 + 300)), None),
    (I.XavierUniform(gain=2.0), 0.0, XAVIER_LIMIT / math.sqrt(3), (-XAVIER_LIMIT, XAVIER_LIMIT)),
    (I.XavierUniform(fan_in=10, fan_out=14), 0.0, math.sqrt(6 / 24) / math.sqrt(3), None),
    (I.KaimingNormal(), 0.0, math.sqrt(2 / 200), None),
    (I.KaimingNormal(negative_slope=0.2, nonlinearity="leaky_relu"), 0.0, math.sqrt(2 / 1.04 / 200), None),
    (I.KaimingUniform(), 0.0, math.sqrt(2 / 200), None),
], ids=["normal", "uniform", "xavier-normal", "xavier-uniform-gain", "xavier-given-fans", "kaiming-normal",
        "kaiming-leaky", "kaiming-uniform"])
def test_initialiser_statistics(init, mean, std, bounds):
    w = np.asarray(init(KEY, (200, 300)), np.float64)  # fan_in 200, fan_out 300
    assert abs(w.mean() - mean) < 5 * std / math.sqrt(w.size)
    assert abs(w.std() / std - 1) < 0.02
    if bounds is not None:
        assert bounds[0] <= w.min() and w.max() <= bounds[1]


def test_truncated_normal_cuts_at_absolute_bounds():
    w = np.asarray(I.TruncatedNormal(mean=0.5, std=1.0, a=0.0, b=1.0)(KEY, (100_000,)))
    assert 0.0 <= w.min() and w.max() <= 1.0 and abs(w.mean() - 0.5) < 0.01
    small = np.asarray(I.TruncatedNormal(std=0.02)(KEY, (100_000,)))  # bounds far away: plain normal
    assert abs(small.std() / 0.02 - 1) < 0.02


def test_constant_assign_and_gain():
    assert I.Constant(2.0)(None, (2,)).tolist() == [2.0, 2.0]
    assert I.Assign(np.arange(3.0))(None, (3,)).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"Assign: value has shape \(3,\), the parameter needs \(4,\)"):
        I.Assign(np.arange(3.0))(None, (4,))
    assert I.calculate_gain("leaky_relu", 0.0) == pytest.approx(math.sqrt(2))
    with pytest.raises(ValueError, match="calculate_gain: argument 'nonlinearity'"):
        I.calculate_gain("swish")


def _values(param):
    return np.asarray(param[...], np.float64)


def test_conv2d_default_is_paddles_normal_over_all_input_channels():
    nn.seed(0)
    conv = nn.Conv2D(64, 128, 3, groups=4)
    w = _values(conv.weight)
    assert w.shape == (128, 16, 3, 3)
    # the std within 3 %, the mean within 4 standard errors of 0
    assert abs(w.std() / math.sqrt(2 / (64 * 9)) - 1) < 0.03 and abs(w.mean()) < 4 * w.std() / math.sqrt(w.size)
    assert not _values(conv.bias).any()


def test_conv2d_transpose_default_is_xavier_uniform_with_paddle_fans():
    w = _values(nn.Conv2DTranspose(64, 32, 3).weight)  # [in, out, kh, kw]: fan_in 32*9, fan_out 64*9
    limit = math.sqrt(6 / (32 * 9 + 64 * 9))
    assert w.shape == (64, 32, 3, 3) and abs(w).max() <= limit and abs(w).max() > 0.99 * limit
    assert abs(w.std() / (limit / math.sqrt(3)) - 1) < 0.03


@pytest.mark.parametrize("make,param,fans", [
    (lambda: nn.Linear(300, 500), "weight", (300, 500)),
    (lambda: nn.Embedding(1000, 64), "weight", (1000, 64)),
])
def test_xavier_uniform_defaults(make, param, fans):
    w = _values(getattr(make(), param))
    limit = math.sqrt(6 / sum(fans))
    assert abs(w).max() <= limit and abs(w).max() > 0.99 * limit


@pytest.mark.parametrize("make", [lambda: nn.LSTM(16, 64), lambda: nn.GRU(16, 64, direction="bidirect")])
def test_rnn_defaults_are_uniform_in_one_over_sqrt_hidden(make):
    for _, p in make().named_parameters():
        w = _values(p)
        assert abs(w).max() <= 1 / 8 and abs(w).max() > 0.9 / 8


@pytest.mark.parametrize("make", [lambda: nn.BatchNorm2D(5), lambda: nn.LayerNorm(5), lambda: nn.GroupNorm(5, 5)])
def test_norm_defaults_ones_and_zeros(make):
    layer = make()
    assert _values(layer.weight).tolist() == [1.0] * 5 and _values(layer.bias).tolist() == [0.0] * 5


def test_weight_and_bias_attrs_follow_paddle():
    lin = nn.Linear(2, 3, weight_attr=I.Constant(0.5), bias_attr=nn.ParamAttr(name="fc.b", initializer=I.Constant(1.0)))
    assert _values(lin.weight).tolist() == [[0.5] * 3] * 2 and _values(lin.bias).tolist() == [1.0] * 3
    assert lin.bias.get_metadata("name") == "fc.b"
    assert nn.Linear(2, 3, bias_attr=False).bias is None
    assert nn.Linear(2, 3, weight_attr="fc.w").weight.get_metadata("name") == "fc.w"
    with pytest.raises(TypeError, match="Linear: argument 'bias_attr' expects None, False"):
        nn.Linear(2, 3, bias_attr=0.5)
    bn = nn.BatchNorm1D(3, weight_attr=False)  # Paddle: a frozen weight of ones
    assert isinstance(bn.weight, I.FrozenParam) and _values(bn.weight).tolist() == [1.0] * 3


def test_frozen_parameters_get_no_gradient():
    lin = nn.Linear(2, 3, weight_attr=nn.ParamAttr(trainable=False))
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 2)))))(lin)
    assert set(grads.keys()) == {"bias"}


def test_same_seed_same_parameters_and_rngs_take_over_from_the_stream():
    def build(**kw):
        return nn.Sequential(nn.Conv2D(2, 3, 3, **kw), nn.Linear(3, 4, **kw), nn.Embedding(5, 4, **kw))

    def params(model):
        return [np.asarray(p[...]) for p in model.parameters()]

    nn.seed(3)
    a = params(build())
    nn.seed(3)
    b = params(build())
    nn.seed(4)
    c = params(build())
    assert all((x == y).all() for x, y in zip(a, b))
    assert not any((x == y).all() for x, y in zip(a, c) if x.std() > 0)
    d, e = params(build(rngs=nnx.Rngs(7))), params(build(rngs=nnx.Rngs(7)))
    assert all((x == y).all() for x, y in zip(d, e))
    nn.seed(3)
    build(rngs=nnx.Rngs(7))  # draws nothing from the global stream
    assert all((x == y).all() for x, y in zip(params(build()), a))


def test_weights_of_many_shapes_are_drawn_by_a_few_compiled_samplers():
    _flat_sampler = I._flat_sampler

    _flat_sampler.cache_clear()
    shapes = [(64, 3, 7, 7), (64, 64, 3, 3), (128, 64, 3, 3), (128, 128, 3, 3), (256, 128, 1, 1), (300, 500)]
    for i, shape in enumerate(shapes):
        w = I.Normal(0.0, 2.0)(jax.random.key(i), shape)
        assert w.shape == shape and w.dtype == jnp.float32 and abs(float(w.std()) - 2.0) < 0.1
    assert _flat_sampler.cache_info().currsize == len({max(1024, 1 << (math.prod(s) - 1).bit_length())
                                                        for s in shapes}) == 5
