"""Targeted numeric checks: conv variants and transpose, batch_norm running stats, pooling
corner cases, cross_entropy by hand, dropout statistics, attention variants."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax.ops as ops

rng = np.random.default_rng(1)


def rand(*shape):
    return np.asarray(rng.normal(size=shape), np.float32)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def variant_tolerance(op, name, want):
    """Variants agree with the reference ``want`` to float32 rounding; reduced-precision ones to
    bfloat16's, 1e-2 of the output's magnitude."""
    return 1e-2 * float(np.abs(want).max()) if name in op.reduced_precision else 1e-4


CONV_CONFIGS = [
    dict(),
    dict(groups=2, stride=2, padding=1),
    dict(groups=3, stride=(1, 2), padding=((2, 0), (1, 1)), dilation=(2, 1)),
    dict(padding="SAME", stride=2),
    dict(padding="VALID", dilation=2, data_format="NHWC"),
    dict(groups=6, padding="SAME", data_format="NHWC"),
]


@pytest.mark.parametrize("attrs", CONV_CONFIGS)
def test_conv2d_variants_agree(attrs):
    groups = attrs.get("groups", 1)
    x = rand(2, 6, 7, 8) if attrs.get("data_format", "NCHW") == "NCHW" else rand(2, 7, 8, 6)
    w, b = rand(6, 6 // groups, 3, 2), rand(6)
    want = ops.conv2d(x, w, b, **attrs)
    full = ops.conv2d.check_attrs(attrs)
    assert set(ops.conv2d.variants) >= {"lax_nhwc", "im2col", "shifted_matmul"}
    for name, kernel in ops.conv2d.variants.items():
        tol = variant_tolerance(ops.conv2d, name, want)
        close(kernel(x, w, b, **full), want, tol)
        close(jax.jit(lambda *a, k=kernel: k(*a, **full))(x, w, b), want, tol)


@pytest.mark.parametrize("attrs", [dict(padding=1), dict(stride=2, data_format="NHWC"),
                                   dict(padding=((2, 0), (1, 1)), dilation=(2, 1), stride=(1, 2))])
def test_depthwise_variants_agree(attrs):
    x = rand(2, 3, 6, 6) if "data_format" not in attrs else rand(2, 6, 6, 3)
    w = rand(6, 1, 3, 3)
    want = ops.depthwise_conv2d(x, w, **attrs)
    close(want, ops.conv2d(x, w, groups=3, **attrs), 1e-5)
    assert "depthwise_shifted" in ops.depthwise_conv2d.variants
    for name, kernel in ops.depthwise_conv2d.variants.items():
        tol = variant_tolerance(ops.depthwise_conv2d, name, want)
        close(kernel(x, w, **ops.depthwise_conv2d.check_attrs(attrs)), want, tol)


def test_same_padding_ignores_dilation_like_paddle():
    x, w = rand(1, 2, 7, 7), rand(3, 2, 3, 3)
    close(ops.conv2d(x, w, padding="SAME", dilation=2), ops.conv2d(x, w, padding=1))


@pytest.mark.parametrize("attrs,in_hw", [
    (dict(), (5, 6)),
    (dict(stride=2, padding=1), (7, 5)),
    (dict(stride=(2, 3), padding=((1, 0), (0, 2)), dilation=(1, 2)), (6, 9)),
    (dict(groups=2, stride=2, padding=1), (7, 9)),
    (dict(groups=2, padding="VALID", data_format="NHWC"), (5, 5)),
])
def test_conv2d_transpose_is_conv_input_vjp(attrs, in_hw):
    nhwc = attrs.get("data_format") == "NHWC"
    z = rand(2, *in_hw, 4) if nhwc else rand(2, 4, *in_hw)
    w = rand(6, 4 // attrs.get("groups", 1), 3, 3)
    y, vjp = jax.vjp(lambda t: ops.conv2d(t, w, **attrs), z)
    close(ops.conv2d_transpose(y, w, **attrs), vjp(y)[0], 1e-4)


def test_conv2d_transpose_output_size():
    x, w = rand(1, 2, 4, 5), rand(2, 3, 3, 3)
    y = ops.conv2d_transpose(x, w, stride=2, padding=1, output_padding=(1, 0))
    assert y.shape == (1, 3, (4 - 1) * 2 - 2 + 2 + 1 + 1, (5 - 1) * 2 - 2 + 2 + 1)
    assert ops.conv2d_transpose(x, w, stride=2, padding="SAME").shape[2:] == (8, 9)  # Paddle's SAME


def test_batch_norm_training_updates_running_stats():
    x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)  # [N=2, C=2]
    out, mean, var = ops.batch_norm(x, np.array([0.0, 1.0], np.float32), np.array([1.0, 2.0], np.float32),
                                    training=True, momentum=0.8, epsilon=0.0)
    close(mean, [0.8 * 0 + 0.2 * 2, 0.8 * 1 + 0.2 * 4])
    close(var, [0.8 * 1 + 0.2 * 1, 0.8 * 2 + 0.2 * 4])  # biased batch variance
    close(out, [[-1, -1], [1, 1]])
    out, mean, var = ops.batch_norm(x, np.array([0.0, 1.0], np.float32), np.array([1.0, 4.0], np.float32),
                                    epsilon=0.0)
    close(out, [[1, 0.5], [3, 2.5]])
    close(mean, [0, 1])
    close(var, [1, 4])


def _batch_norm_by_jnp(x, weight, bias, axis, epsilon=1e-5):
    """Training-mode batch norm written out in jnp: its derivatives are XLA's own."""
    axes = tuple(i for i in range(x.ndim) if i != axis)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    m, v = jnp.mean(x, axes, keepdims=True), jnp.var(x, axes, keepdims=True)
    out = (x - m) / jnp.sqrt(v + epsilon)
    out = out if weight is None else out * weight.reshape(shape)
    return out if bias is None else out + bias.reshape(shape)


@pytest.mark.parametrize("data_format,affine", [("NCHW", True), ("NHWC", True), ("NCHW", False), ("NC", True)])
def test_batch_norm_training_derivatives_match_autodiff_of_its_formula(data_format, affine):
    # the closed-form derivative of the batch statistics: reverse, forward and second order,
    # and the running statistics' tangents
    rng = np.random.default_rng(1)
    shape = (3, 4) if data_format == "NC" else (3, 4, 5, 2) if data_format == "NCHW" else (3, 5, 2, 4)
    axis = 1 if data_format in ("NCHW", "NC") else 3
    x = jnp.asarray(rng.normal(size=shape) * 2 + 1, jnp.float32)
    weight, bias = (jnp.asarray(rng.normal(size=4), jnp.float32) for _ in range(2))
    running = (jnp.zeros(4), jnp.ones(4))
    if not affine:
        weight = bias = None

    def ours(x, weight, bias):
        return ops.batch_norm(x, *running, weight, bias, training=True, data_format=data_format)[0]

    def loss(f):
        return lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b)) * x)

    argnums = (0, 1, 2) if affine else (0,)
    want = jax.grad(loss(lambda x, w, b: _batch_norm_by_jnp(x, w, b, axis)), argnums)(x, weight, bias)
    got = jax.jit(jax.grad(loss(ours), argnums))(x, weight, bias)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    dx = jnp.asarray(rng.normal(size=shape), jnp.float32)
    hvp = lambda f: jax.jvp(jax.grad(loss(f)), (x, weight, bias), (dx, weight, bias))[1]  # noqa: E731
    np.testing.assert_allclose(hvp(ours), hvp(lambda x, w, b: _batch_norm_by_jnp(x, w, b, axis)), rtol=1e-3, atol=1e-3)
    stats = lambda x: ops.batch_norm(x, *running, training=True, momentum=0.5, data_format=data_format)[1:]  # noqa
    axes = tuple(i for i in range(x.ndim) if i != axis)
    by_jnp = lambda x: (0.5 * running[0] + 0.5 * jnp.mean(x, axes), 0.5 * running[1] + 0.5 * jnp.var(x, axes))  # noqa
    for got, want in zip(jax.jvp(stats, (x,), (dx,))[1], jax.jvp(by_jnp, (x,), (dx,))[1]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layer_norm_accepts_flat_affine():
    x, w = rand(2, 3, 4), rand(12)
    close(ops.layer_norm(x, w, begin_norm_axis=1), ops.layer_norm(x, w.reshape(3, 4), begin_norm_axis=1))


GRID = np.arange(1, 26, dtype=np.float32).reshape(1, 1, 5, 5)


@pytest.mark.parametrize("attrs,want", [
    (dict(kernel_size=2), [[7, 9], [17, 19]]),
    (dict(kernel_size=2, ceil_mode=True), [[7, 9, 10], [17, 19, 20], [22, 24, 25]]),
    (dict(pooling_type="avg", kernel_size=2, ceil_mode=True),
     [[4, 6, 7.5], [14, 16, 17.5], [21.5, 23.5, 25]]),
    (dict(pooling_type="avg", kernel_size=2, ceil_mode=True, exclusive=False),
     [[4, 6, 3.75], [14, 16, 8.75], [10.75, 11.75, 6.25]]),
    (dict(pooling_type="avg", kernel_size=3, stride=2, padding=1),
     [[(1 + 2 + 6 + 7) / 4, (2 + 3 + 4 + 7 + 8 + 9) / 6, (4 + 5 + 9 + 10) / 4],
      [(6 + 7 + 11 + 12 + 16 + 17) / 6, 13, (9 + 10 + 14 + 15 + 19 + 20) / 6],
      [(16 + 17 + 21 + 22) / 4, (17 + 18 + 19 + 22 + 23 + 24) / 6, (19 + 20 + 24 + 25) / 4]]),
    (dict(pooling_type="avg", kernel_size=3, stride=2, padding=1, exclusive=False),
     [[16 / 9, 33 / 9, 28 / 9], [69 / 9, 13, 87 / 9], [76 / 9, 123 / 9, 88 / 9]]),
    (dict(kernel_size=2, stride=1, padding="SAME"), [[7, 8, 9, 10, 10], [12, 13, 14, 15, 15],
                                                     [17, 18, 19, 20, 20], [22, 23, 24, 25, 25],
                                                     [22, 23, 24, 25, 25]]),
])
def test_pool2d_hand_checked(attrs, want):
    close(ops.pool2d(GRID, **attrs)[0, 0], want)


def test_pool2d_ceil_mode_drops_window_starting_in_right_padding():
    row = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 1, 5)
    # windows of 3 with stride 3 over [pad, 1..5, pad]: a third window would start in the padding
    got = ops.pool2d(row, kernel_size=(1, 3), stride=(1, 3), padding=((0, 0), (1, 1)), ceil_mode=True)
    close(got[0, 0, 0], [2, 5])


LOGITS = np.log(np.array([[1, 2, 3, 4], [4, 3, 2, 1], [1, 1, 1, 1]], np.float32))  # softmax = x / sum(x)


def test_cross_entropy_hand_computed():
    label = np.array([3, 0, -100])
    close(ops.cross_entropy(LOGITS, label), -np.log(0.4))
    close(ops.cross_entropy(LOGITS, label, reduction="sum"), -2 * np.log(0.4))
    close(ops.cross_entropy(LOGITS, label, reduction="none"), [-np.log(0.4), -np.log(0.4), 0])
    close(ops.cross_entropy(LOGITS, label[:, None], reduction="none"), [[-np.log(0.4)], [-np.log(0.4)], [0]])
    close(ops.cross_entropy(LOGITS, np.array([3, 0, 1]), ignore_index=1, reduction="sum"), -2 * np.log(0.4))
    mean_nll = -np.log([0.1, 0.2, 0.3, 0.4]).mean()
    smoothed = 0.8 * -np.log(0.4) + 0.2 * mean_nll
    close(ops.cross_entropy(LOGITS, label, label_smoothing=0.2), smoothed)
    soft = np.array([[0, 0, 0.5, 0.5], [1, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]], np.float32)
    per_row = [-(0.5 * np.log(0.3) + 0.5 * np.log(0.4)), -np.log(0.4), np.log(4)]
    close(ops.cross_entropy(LOGITS, soft, soft_label=True), np.mean(per_row))
    close(ops.cross_entropy(LOGITS, soft, soft_label=True, reduction="none"), np.array(per_row)[:, None])


def test_cross_entropy_all_ignored_is_zero():
    close(ops.cross_entropy(LOGITS, np.array([-100, -100, -100])), 0.0)


KEY = jax.random.PRNGKey(7)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics(p):
    x = jnp.ones((200, 100))
    y = ops.dropout(x, KEY, p=p)
    assert abs(float(jnp.mean(y == 0)) - p) < 0.02
    assert abs(float(jnp.mean(y)) - 1.0) < 0.05
    close(np.unique(np.asarray(y)), [0.0, 1 / (1 - p)])
    kept = ops.dropout(x, KEY, p=p, mode="downscale_in_infer")
    close(np.unique(np.asarray(kept)), [0.0, 1.0])


def test_dropout_determinism_and_modes():
    x = rand(50, 40)
    close(ops.dropout(x, KEY), ops.dropout(x, KEY))
    assert not np.array_equal(ops.dropout(x, KEY), ops.dropout(x, jax.random.PRNGKey(8)))
    close(ops.dropout(x, KEY, training=False), x)
    close(ops.dropout(x, KEY, training=False, mode="downscale_in_infer", p=0.25), 0.75 * x)
    close(ops.dropout(x, KEY, p=1.0), np.zeros_like(x))
    close(ops.dropout(x, KEY, p=0.0), x)
    close(jax.jit(lambda a, k: ops.dropout(a, k))(x, KEY), ops.dropout(x, KEY))


@pytest.mark.parametrize("kv_heads,mask,attrs", [
    (2, None, dict()),
    (2, "bool", dict(is_causal=True)),
    (1, "float", dict(scale=0.5)),
    (2, "bool", dict()),
])
def test_attention_xla_variant_agrees(kv_heads, mask, attrs):
    q, k, v = rand(2, 3, 2, 4), rand(2, 5, kv_heads, 4), rand(2, 5, kv_heads, 4)
    m = {None: None, "bool": rng.random((2, 1, 3, 5)) > 0.4, "float": rand(3, 5)}[mask]
    args = (q, k, v) if m is None else (q, k, v, m)
    want = ops.scaled_dot_product_attention(*args, **attrs)
    full = ops.scaled_dot_product_attention.check_attrs(attrs)
    close(ops.scaled_dot_product_attention.variants["xla"](*args, **full), want, 1e-5)


@pytest.mark.parametrize("dtype, kernel", [(jnp.bfloat16, "cudnn"), (jnp.float32, "xla")])
def test_attention_cudnn_gets_a_mask_row_per_query_and_falls_back_where_it_cannot_run(monkeypatch, dtype, kernel):
    # What cuDNN is handed, recorded on a CPU: it refuses a padding mask [b, 1, 1, keys]
    # ("Bias must have same seq length as QKV") and runs only fp16/bf16 with head_dim % 8 == 0.
    calls = []
    real = jax.nn.dot_product_attention

    def record(q, k, v, bias=None, mask=None, *, implementation, **kw):
        calls.append((implementation, None if mask is None else mask.shape))
        return real(q, k, v, bias, mask, implementation="xla", **kw)

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", record)
    q = jnp.asarray(rand(2, 6, 2, 8), dtype)
    keep = jnp.arange(6)[None, None, None, :] < jnp.array([6, 4])[:, None, None, None]
    out = ops.scaled_dot_product_attention(q, q, q, keep, implementation="cudnn")
    assert calls == [(kernel, (2, 1, 6, 6) if kernel == "cudnn" else (2, 1, 1, 6))]
    close(out.astype(jnp.float32), ops.scaled_dot_product_attention(q, q, q, keep).astype(jnp.float32),
          1e-2 if dtype == jnp.bfloat16 else 1e-5)


def test_attention_gqa_matches_repeated_heads():
    q, k, v = rand(1, 3, 4, 2), rand(1, 5, 2, 2), rand(1, 5, 2, 2)
    rep = lambda a: np.repeat(a, 2, axis=2)  # noqa: E731
    close(ops.scaled_dot_product_attention(q, k, v), ops.scaled_dot_product_attention(q, rep(k), rep(v)))


def test_flops():
    x, w = (2, 4, 6, 5), (6, 2, 3, 3)
    flops = ops.conv2d.flops([x, w], [(2, 6, 4, 3)], ops.conv2d.check_attrs({"groups": 2}))
    assert flops == 2 * 2 * 4 * 3 * 6 * 2 * 3 * 3
    assert ops.linear.flops([(2, 3, 4), (4, 5)], [(2, 3, 5)], {}) == 2 * 6 * 4 * 5
    assert ops.matmul.flops([(7, 2, 3), (3, 5)], [(7, 2, 5)], ops.matmul.check_attrs({})) == 2 * 7 * 2 * 5 * 3
    assert ops.matmul.flops([(3, 2), (3, 5)], [(2, 5)], ops.matmul.check_attrs({"transpose_x": True})) == 2 * 10 * 3
    sdpa = ops.scaled_dot_product_attention
    assert sdpa.flops([(2, 3, 4, 8), (2, 5, 4, 8), (2, 5, 4, 8)], [(2, 3, 4, 8)], {}) == 4 * 2 * 4 * 3 * 5 * 8
    assert ops.relu.flops([(2, 3)], [(2, 3)], {}) == 6
    assert ops.elementwise_add.flops([(2, 3), (3,)], [(2, 3)], {}) == 6
