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


def test_sync_batch_norm_split_over_devices_computes_what_one_device_does_on_the_whole_batch():
    from jax.sharding import Mesh, PartitionSpec as P

    import paddlejax as pj

    bn = nn.SyncBatchNorm(3, weight_attr=nn.initializer.Constant(1.5))
    program = pj.to_static(bn, pj.InputSpec((None, 3, 2, 2)), train=True)
    x, c = rand(16, 3, 2, 2, loc=3.0), rand(16, 3, 2, 2)

    def loss(params, x, c):
        out, stats = program.apply(params, x)
        return jnp.sum(out * c), stats

    grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
    (want_dparams, want_dx), want_stats = grad(program.params, x, c)

    def per_device(params, x, c):
        # each device differentiates its own copy of the parameters; their sum is the gradient
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "dp", to="varying"), params)
        (dparams, dx), stats = grad(local, x, c)
        return jax.lax.psum(dparams, "dp"), dx, jax.lax.pmean(stats, "dp")

    run = jax.jit(jax.shard_map(per_device, mesh=Mesh(jax.devices(), ("dp",)), in_specs=(P(), P("dp"), P("dp")),
                                out_specs=(P(), P("dp"), P())))
    dparams, dx, stats = run(program.params, x, c)  # two rows per device
    np.testing.assert_allclose(stats["mean"], 0.1 * x.mean((0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(stats["variance"], 0.9 + 0.1 * x.var((0, 2, 3)), rtol=1e-6)
    for got, want in ((dparams, want_dparams), (dx, want_dx), (stats, want_stats)):
        jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5), got, want)


def test_sync_batch_norm_on_one_device_is_batch_norm_and_eval_is_the_plain_op():
    x = rand(4, 3, 5, loc=1.0)
    sync, plain = nn.SyncBatchNorm(3), nn.BatchNorm1D(3)
    np.testing.assert_array_equal(sync(x), plain(x))
    np.testing.assert_array_equal(sync.variance[...], plain.variance[...])
    sync.eval()
    ops = [e.primitive.name for e in jax.make_jaxpr(sync)(x).eqns]
    assert ops == ["batch_norm"]  # inference programs hold the op the fusion passes fold
    channels_last = nn.SyncBatchNorm(3, data_format="NHWC")
    np.testing.assert_allclose(channels_last(x.transpose(0, 2, 1)[:, :, None]), normalise(
        x.transpose(0, 2, 1)[:, :, None], (0, 1, 2)), rtol=1e-4, atol=1e-4)


def test_convert_sync_batchnorm_replaces_every_batch_norm_keeping_its_state():
    shared = nn.BatchNorm1D(4, momentum=0.5, epsilon=1e-3)
    model = nn.Sequential(nn.Linear(2, 4), shared, nn.LayerList([shared, nn.BatchNorm2D(4, data_format="NHWC")]))
    shared.mean.set_value(jnp.full(4, 2.0))
    model.eval()
    names = [n for n, _ in model.named_parameters()]
    assert nn.SyncBatchNorm.convert_sync_batchnorm(model) is model
    first, second, image = model[1], model[2][0], model[2][1]
    assert type(first) is nn.SyncBatchNorm and first is second  # a shared layer stays shared
    assert (first._momentum, first._epsilon, first._data_format, first.training) == (0.5, 1e-3, "NCL", False)
    assert type(image) is nn.SyncBatchNorm and image._data_format == "NHWC"
    np.testing.assert_array_equal(first.mean[...], jnp.full(4, 2.0))
    assert [n for n, _ in model.named_parameters()] == names
    bn = nn.BatchNorm2D(2)
    assert type(nn.SyncBatchNorm.convert_sync_batchnorm(bn)) is nn.SyncBatchNorm


def test_mixed_precision_keeps_sync_batch_norm_statistics_in_float32_as_batch_norm():
    import paddlejax as pj
    from paddlejax.passes import PassManager

    for bn in (nn.BatchNorm2D(3), nn.SyncBatchNorm(3)):
        model = nn.Sequential(nn.Conv2D(3, 3, 1), bn)
        program = PassManager(["amp{dtype=bfloat16}"]).run(
            pj.to_static(model, pj.InputSpec((None, 3, 2, 2)), train=True), training=True)
        [norm] = [op for op in program.walk() if op.type.endswith("batch_norm")]
        assert [v.type.dtype for v in norm.operands] == ["bfloat16"] + ["float32"] * 4, norm.type
