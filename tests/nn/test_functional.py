"""nn.functional: each function against numpy (Paddle's formulas) or the layer it mirrors,
Paddle's F.pad conventions, dropout's keys, the ops in the jaxpr, gradients, bfloat16, and a
model written with functions that traces, saves and loads."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import paddlejax as pj
import paddlejax.nn as nn
import paddlejax.nn.functional as F

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def op_names(fn, *args):
    return [e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns]


X = rand(2, 3, 4, 5)

ACTIVATIONS = [
    (F.relu, lambda v: np.maximum(v, 0), "relu"),
    (F.relu6, lambda v: np.clip(v, 0, 6), "relu6"),
    (F.gelu, lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))), "gelu"),
    (F.sigmoid, lambda v: 1 / (1 + np.exp(-v)), "sigmoid"),
    (F.tanh, np.tanh, "tanh"),
    (F.silu, lambda v: v / (1 + np.exp(-v)), "silu"),
    (F.hardswish, lambda v: v * np.clip(v + 3, 0, 6) / 6, "hard_swish"),
    (lambda v: F.leaky_relu(v, 0.3), lambda v: np.where(v > 0, v, 0.3 * v), "leaky_relu"),
    (lambda v: F.softmax(v, axis=1), lambda v: np.exp(v) / np.exp(v).sum(1, keepdims=True), "softmax"),
    (F.log_softmax, lambda v: v - np.log(np.exp(v).sum(-1, keepdims=True)), "log_softmax"),
    (lambda v: F.prelu(v, np.array([0.1, 0.2, 0.3], np.float32)),
     lambda v: np.where(v > 0, v, np.array([0.1, 0.2, 0.3])[:, None, None] * v), "prelu"),
]


@pytest.mark.parametrize("fn,ref,op", ACTIVATIONS, ids=[a[2] for a in ACTIVATIONS])
def test_activations_match_formulas_and_are_their_op(fn, ref, op):
    np.testing.assert_allclose(fn(X), ref(X.astype(np.float64)), rtol=1e-5, atol=1e-6)
    assert op_names(fn, X) == [op]


def test_softmax_dtype_casts_first():
    assert F.softmax(X.astype(jnp.bfloat16), dtype="float32").dtype == jnp.float32
    assert F.log_softmax(X, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_convolutions_and_linear_match_the_layers():
    conv = nn.Conv2D(3, 4, 3, stride=2, padding=[[0, 0], [0, 0], [1, 0], [0, 1]])
    np.testing.assert_allclose(F.conv2d(X, conv.weight[...], conv.bias[...], 2, [[0, 0], [0, 0], [1, 0], [0, 1]]),
                               conv(X), rtol=1e-6)
    c1 = nn.Conv1D(3, 2, 2, data_format="NLC", padding="same")
    v = rand(2, 6, 3)
    np.testing.assert_allclose(F.conv1d(v, c1.weight[...], c1.bias[...], padding="same", data_format="NLC"), c1(v))
    c3 = nn.Conv3D(3, 2, 2, groups=1, dilation=(1, 2, 1))
    v3 = rand(1, 3, 3, 5, 3)
    np.testing.assert_allclose(F.conv3d(v3, c3.weight[...], c3.bias[...], dilation=(1, 2, 1)), c3(v3), rtol=1e-6)
    up = nn.Conv2DTranspose(3, 2, 3, stride=2, padding=1, output_padding=1)
    np.testing.assert_allclose(F.conv2d_transpose(X, up.weight[...], up.bias[...], 2, 1, 1), up(X), rtol=1e-6)
    fc = nn.Linear(5, 2)
    np.testing.assert_allclose(F.linear(X, fc.weight[...], fc.bias[...]), fc(X), rtol=1e-6)
    assert op_names(lambda v, w: F.conv1d(v, w), rand(1, 3, 5), rand(2, 3, 2)) == ["conv1d"]
    with pytest.raises(ValueError, match=r"conv2d: input 'x' .* pass data_format='NHWC'"):
        F.conv2d(X.transpose(0, 2, 3, 1), conv.weight[...])


def test_conv2d_transpose_takes_paddles_output_size_like_the_layer():
    local = np.random.default_rng(7)  # apart from the module's stream, which later tests read
    x, w = local.normal(size=(1, 2, 3, 3)).astype(np.float32), local.normal(size=(2, 4, 3, 3)).astype(np.float32)
    layer = nn.Conv2DTranspose(2, 4, 3, stride=2, padding=1, bias_attr=False)
    layer.weight[...] = w
    for size in ([5, 5], [6, 6], [5, 6]):
        got = F.conv2d_transpose(x, w, stride=2, padding=1, output_size=size)
        assert got.shape == (1, 4, *size)
        np.testing.assert_allclose(got, layer(x, output_size=size), rtol=1e-6)
    nhwc = F.conv2d_transpose(x.transpose(0, 2, 3, 1), w, stride=2, padding=1, output_size=[6, 6], data_format="NHWC")
    np.testing.assert_allclose(nhwc, np.asarray(layer(x, output_size=[6, 6])).transpose(0, 2, 3, 1), rtol=1e-5)
    with pytest.raises(ValueError, match=r"conv2d_transpose: argument 'output_size' expects sizes from \(5, 5\) up "
                                         r"to \(6, 6\), got \[9, 9\]"):
        F.conv2d_transpose(x, w, stride=2, padding=1, output_size=[9, 9])
    with pytest.raises(ValueError, match="conv2d_transpose: argument 'output_padding' expects 0 when output_size"):
        F.conv2d_transpose(x, w, stride=2, padding=1, output_padding=1, output_size=[6, 6])


def test_pooling_functions_match_the_layers():
    np.testing.assert_allclose(F.max_pool2d(X, 2, ceil_mode=True), nn.MaxPool2D(2, ceil_mode=True)(X))
    np.testing.assert_allclose(F.avg_pool2d(X, 3, 1, 1, exclusive=False), nn.AvgPool2D(3, 1, 1, exclusive=False)(X))
    np.testing.assert_allclose(F.avg_pool2d(X, 2, divisor_override=2), nn.AvgPool2D(2, divisor_override=2)(X))
    np.testing.assert_allclose(F.adaptive_avg_pool2d(X, [2, 3]), nn.AdaptiveAvgPool2D([2, 3])(X))
    np.testing.assert_allclose(F.adaptive_max_pool2d(X, 1), X.max((2, 3), keepdims=True))
    v = X.reshape(2, 3, 20)
    np.testing.assert_allclose(F.adaptive_avg_pool1d(v, 4), v.reshape(2, 3, 4, 5).mean(-1), rtol=1e-6)
    np.testing.assert_allclose(F.adaptive_max_pool1d(v, 5), v.reshape(2, 3, 5, 4).max(-1))


def test_pad_spatial_pads_start_from_the_last_dim_and_full_pads_cover_every_dim():
    np.testing.assert_allclose(F.pad(X, [1, 2, 0, 3], mode="replicate"),
                               np.pad(X, ((0, 0), (0, 0), (0, 3), (1, 2)), mode="edge"))
    np.testing.assert_allclose(F.pad(X.transpose(0, 2, 3, 1), [1, 2, 0, 3], mode="circular", data_format="NHWC"),
                               np.pad(X, ((0, 0), (0, 0), (0, 3), (1, 2)), mode="wrap").transpose(0, 2, 3, 1))
    # 2 * ndim constant pads run over all dims, first to last
    np.testing.assert_allclose(F.pad(X, [1, 0, 0, 2, 0, 0, 3, 1], value=7.0),
                               np.pad(X, ((1, 0), (0, 2), (0, 0), (3, 1)), constant_values=7.0))
    v = rand(1, 2, 2, 3, 4)
    np.testing.assert_allclose(F.pad(v, 1, mode="reflect", data_format="NCDHW"),
                               np.pad(v, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)), mode="reflect"))
    with pytest.raises(ValueError, match=r"pad: argument 'padding' expects an int or 4 ints >= 0"):
        F.pad(X, [1, 2, 3], mode="reflect")
    with pytest.raises(ValueError, match=r"pad: argument 'pad' expects 4 ints \(mode='constant'\) for a rank-2"):
        F.pad(X[0, 0], [1, 1], mode="reflect")


def test_interpolate_and_upsample_match_the_layer():
    want = nn.Upsample(size=[6, 9], mode="bilinear", align_corners=True)(X)
    np.testing.assert_allclose(F.interpolate(X, size=[6, 9], mode="bilinear", align_corners=True), want)
    np.testing.assert_allclose(F.upsample(X, scale_factor=[2, 1]), np.repeat(X, 2, axis=2))
    assert op_names(lambda v: F.interpolate(v, scale_factor=2), X) == ["interpolate"]


def test_one_hot_embedding_and_norms():
    assert F.one_hot(np.array([[1, 0]]), 3).tolist() == [[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]
    with pytest.raises(ValueError, match=r"one_hot: argument 'x' expects an int array of class ids"):
        F.one_hot(np.array([1.0]), 3)
    table = rand(5, 2)
    np.testing.assert_allclose(F.embedding(np.array([0, 4]), table, padding_idx=-1), [table[0], [0.0, 0.0]])
    mean, var, w, b = rand(3), np.abs(rand(3)) + 0.5, rand(3), rand(3)
    shape = (1, 3, 1, 1)
    want = (X - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)
    np.testing.assert_allclose(F.batch_norm(X, mean, var, w, b), want, rtol=1e-5, atol=1e-5)
    batch = X.mean((0, 2, 3)), X.var((0, 2, 3))
    np.testing.assert_allclose(F.batch_norm(X, mean, var, training=True),
                               (X - batch[0].reshape(shape)) / np.sqrt(batch[1].reshape(shape) + 1e-5),
                               rtol=1e-4, atol=1e-4)
    flat = X.reshape(2, 3, 20)
    want = (flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(F.layer_norm(X, [4, 5], bias=np.ones(20, np.float32)), want.reshape(X.shape) + 1,
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"layer_norm: argument 'normalized_shape' expects the trailing dims"):
        F.layer_norm(X, [5, 4])


def test_dropout_draws_fresh_masks_from_the_global_stream_or_uses_a_key():
    nn.seed(3)
    a, b = F.dropout(jnp.ones(64)), F.dropout(jnp.ones(64))
    assert set(np.unique(a).tolist()) == {0.0, 2.0} and bool((a != b).any())
    nn.seed(3)
    np.testing.assert_array_equal(F.dropout(jnp.ones(64)), a)
    key = np.asarray(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(F.dropout(jnp.ones(8), 0.5, key=key), F.dropout(jnp.ones(8), 0.5, key=key))
    assert F.dropout(jnp.ones(3), 0.5, training=False).tolist() == [1.0, 1.0, 1.0]
    assert F.dropout(jnp.ones(3), 0.5, training=False, mode="downscale_in_infer").tolist() == [0.5, 0.5, 0.5]


def test_losses_are_the_layers_and_differentiate():
    logits, label = rand(4, 3), np.array([0, 2, 1, -100])
    w = np.array([1.0, 2.0, 0.5], np.float32)
    np.testing.assert_allclose(F.cross_entropy(logits, label, w, reduction="sum"),
                               nn.CrossEntropyLoss(w, reduction="sum")(logits, label))
    logp = F.log_softmax(logits)
    np.testing.assert_allclose(F.nll_loss(logp, label), F.cross_entropy(logits, label), rtol=1e-6)
    y = rand(4, 3)
    for fn, layer in ((F.mse_loss, nn.MSELoss()), (F.l1_loss, nn.L1Loss()), (F.smooth_l1_loss, nn.SmoothL1Loss()),
                      (F.binary_cross_entropy_with_logits, nn.BCEWithLogitsLoss())):
        np.testing.assert_allclose(fn(logits, jax.nn.sigmoid(y)), layer(logits, jax.nn.sigmoid(y)))
    np.testing.assert_allclose(F.kl_div(logp, jax.nn.softmax(y), "batchmean"),
                               nn.KLDivLoss("batchmean")(logp, jax.nn.softmax(y)))
    with jax.enable_x64(True):
        target = jnp.asarray(jax.nn.sigmoid(y), jnp.float64)
        check_grads(lambda p: F.binary_cross_entropy(p, target, reduction="sum"),
                    (jnp.asarray(jax.nn.sigmoid(logits), jnp.float64),), order=1, modes=("rev",))
    half = F.mse_loss(logits.astype(jnp.bfloat16), y.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(half), F.mse_loss(logits, y), rtol=2e-2)


def test_losses_of_integer_inputs_are_float32_not_truncated():
    x, y = np.array([1, 2]), np.array([0, 0])
    assert F.mse_loss(x, y).dtype == jnp.float32 and float(F.mse_loss(x, y)) == 2.5
    assert float(nn.L1Loss()(np.array([1, 2, 2]), np.array([0, 0, 0]))) == pytest.approx(5 / 3)
    assert F.smooth_l1_loss(x, y, reduction="none").tolist() == [0.5, 1.5]
    assert float(F.kl_div(np.zeros((2, 1), np.int32), np.ones((2, 1), np.int32), "batchmean")) == 0.0


def classifier(p, x, label):
    """A small network written with functions only."""
    h = F.relu(F.conv2d(x, p["conv"], padding="same"))
    h = F.interpolate(F.pad(h, [1, 1, 0, 0], mode="reflect"), size=[4, 4], mode="bilinear")
    h = F.adaptive_avg_pool2d(h, 1).reshape(x.shape[0], -1)
    logits = F.linear(F.prelu(h, p["slope"]), p["fc"])
    return F.cross_entropy(logits, label, p["class_weight"])


def test_a_functional_model_traces_saves_and_loads(tmp_path):
    params = {"conv": rand(4, 3, 3, 3), "slope": np.full(1, 0.1, np.float32), "fc": rand(4, 3),
              "class_weight": np.array([1.0, 2.0, 3.0], np.float32)}
    x, label = X, np.array([0, 2], np.int32)
    program = pj.trace(classifier, x, label, params=params)
    text = str(program)
    for op in ("conv2d(", "pad(", "interpolate(", "adaptive_pool2d(", "prelu(", "linear(", "cross_entropy("):
        assert op in text
    pj.save(program, tmp_path / "classifier")
    loaded = pj.load(tmp_path / "classifier")
    assert str(loaded) == text
    want = classifier(params, x, label)
    np.testing.assert_allclose(program(x, label), want, rtol=1e-5)
    np.testing.assert_allclose(loaded(x, label), want, rtol=1e-5)
