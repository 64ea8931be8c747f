"""ResNet / ResNeXt / SE-ResNeXt: published parameter counts, the vb/vc/vd variants' structure,
SE placement, output shapes, NCHW = NHWC, static programs, pretrained weights, training, errors.

Big models are only built abstractly (``nnx.eval_shape``); one ResNet-18 with 4 classes is
built for real and shared by the numeric tests."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.models.resnet import (BasicBlock, BottleneckBlock, ResNet, SqueezeExcitation, resnet18, resnet34,
                                     resnet50, resnet101, resnet152, resnext50_32x4d, se_resnext50_32x4d)

X = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    nn.seed(0)
    m = resnet18(num_classes=4)
    m.eval()
    return m


@pytest.mark.parametrize("factory, published", [
    (resnet18, 11_689_512), (resnet34, 21_797_672), (resnet50, 25_557_032), (resnet101, 44_549_160),
    (resnet152, 60_192_808), (resnext50_32x4d, 25_028_904), (se_resnext50_32x4d, 27_559_896)])
def test_parameter_counts_match_the_published_ones(count_params, factory, published):
    assert count_params(factory) == published


def test_deep_stem_of_vc_and_vd_adds_19232_parameters(count_params):
    # vb stem: 7x7 conv 3->64 (3*64*49 = 9408) + bn1 (2*64) = 9536.
    # vc/vd stem: 3x3 convs 3->32 (864), 32->32 (9216), 32->64 (18432), BN after the first two
    # (2*32 each) and bn1 (2*64): 28512 + 256 = 28768; 28768 - 9536 = 19232.
    # vd's shortcut pool has no parameters and its 1x1 conv has the same shape as vb's.
    assert count_params(lambda: resnet50(variant="vd")) == 25_557_032 + 19_232 == 25_576_264
    assert count_params(lambda: resnet50(variant="vc")) == 25_576_264
    assert count_params(lambda: resnet18(variant="vd")) == 11_689_512 + 19_232


def test_vb_strides_the_3x3_conv_of_the_bottleneck():
    block = nnx.eval_shape(lambda: resnet50()).layer2[0]
    assert (block.conv1._stride, block.conv2._stride, block.conv3._stride) == ((1, 1), (2, 2), (1, 1))
    assert block.downsample[0]._stride == (2, 2) and block.downsample[0]._kernel_size == (1, 1)


def test_vc_has_the_deep_stem_and_the_strided_shortcut_conv():
    model = nnx.eval_shape(lambda: resnet50(variant="vc"))
    stem = [model.conv1[0][0], model.conv1[1][0], model.conv1[2]]
    assert [(c.weight.shape, c._stride) for c in stem] == [
        ((32, 3, 3, 3), (2, 2)), ((32, 32, 3, 3), (1, 1)), ((64, 32, 3, 3), (1, 1))]
    assert model.layer2[0].downsample[0]._stride == (2, 2)


def test_vd_shortcut_average_pools_then_applies_a_stride_1_conv(traced_ops):
    model = nnx.eval_shape(lambda: resnet50(variant="vd"))
    assert isinstance(model.layer1[0].downsample[0], nn.Identity)  # stage 1 does not downsample
    for stage in (model.layer2, model.layer3, model.layer4):
        pool, conv, _ = stage[0].downsample
        assert isinstance(pool, nn.AvgPool2D) and conv._stride == (1, 1)
    pools = [(p["pooling_type"], p["kernel_size"], p["stride"], p["ceil_mode"])
             for name, p in traced_ops(lambda: resnet18(variant="vd"), X.shape) if name == "pool2d"]
    assert pools == [("max", (3, 3), (2, 2), False)] + [("avg", (2, 2), (2, 2), True)] * 3
    assert [p["pooling_type"] for name, p in traced_ops(resnet18, X.shape) if name == "pool2d"] == ["max"]


def test_se_scales_the_residual_branch_before_the_add(traced_ops):
    shortcut = lambda: nn.Sequential(nn.Conv2D(64, 64, 1, bias_attr=False), nn.BatchNorm2D(64))  # noqa: E731
    block = lambda: BottleneckBlock(64, 16, downsample=shortcut(), se_reduction=16)  # noqa: E731
    assert [name for name, _ in traced_ops(block, (1, 64, 4, 4))] == [
        "conv2d", "batch_norm", "relu", "conv2d", "batch_norm", "relu", "conv2d", "batch_norm",
        # squeeze-and-excitation
        "adaptive_pool2d", "reshape", "linear", "relu", "linear", "sigmoid", "reshape", "elementwise_mul",
        # shortcut, add, ReLU
        "conv2d", "batch_norm", "elementwise_add", "relu"]


def test_squeeze_excitation_with_zero_weights_halves_the_input():
    se = SqueezeExcitation(32, reduction=16)
    assert se.squeeze.weight[...].shape == (32, 2) and se.excitation.bias[...].shape == (32,)
    se.excitation.weight.set_value(jnp.zeros((2, 32)))  # sigmoid(0 + bias 0) = 0.5 everywhere
    x = jnp.arange(2 * 32 * 9, dtype=jnp.float32).reshape(2, 32, 3, 3)
    np.testing.assert_allclose(se(x), 0.5 * x)


@pytest.mark.parametrize("factory, shape, want", [
    (lambda: resnet18(num_classes=3), (2, 3, 32, 32), (2, 3)),
    (lambda: resnet34(num_classes=3, variant="vc"), (2, 3, 32, 32), (2, 3)),
    (lambda: resnet50(num_classes=3, variant="vd"), (2, 3, 32, 32), (2, 3)),
    (lambda: resnext50_32x4d(num_classes=3), (2, 3, 32, 32), (2, 3)),
    (lambda: se_resnext50_32x4d(num_classes=3, variant="vd"), (2, 3, 32, 32), (2, 3)),
    (lambda: resnet50(num_classes=0), (2, 3, 32, 32), (2, 2048, 1, 1)),
    # without pool or head: the stride-32 feature map
    (lambda: resnet50(num_classes=0, with_pool=False), (2, 3, 64, 96), (2, 2048, 2, 3)),
    (lambda: resnet18(num_classes=-1, with_pool=False, data_format="NHWC"), (2, 64, 96, 3), (2, 2, 3, 512)),
])
def test_output_shapes(out_shape, factory, shape, want):
    assert out_shape(factory, shape) == want


def test_parameter_names_follow_paddle(model):
    names = set(nn.state_dict(model))
    assert {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.mean", "bn1.variance", "layer1.0.conv1.weight",
            "layer1.1.bn2.bias", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
            "layer4.1.conv2.weight", "fc.weight", "fc.bias"} <= names
    assert not any(n.startswith("layer1.0.downsample") for n in names)  # 64 -> 64 at stride 1: no shortcut


def test_nhwc_gives_the_nchw_outputs_with_the_same_weights(model, same_in_nhwc):
    same_in_nhwc(model, resnet18(num_classes=4, data_format="NHWC"), X)


def test_static_program_matches_dygraph_and_survives_save_and_load(model, static_matches):
    static_matches(model, X)


def test_pretrained_loads_a_local_weights_file(model, reloads_pretrained):
    path = reloads_pretrained(model, lambda path: resnet18(num_classes=4, pretrained=path), X)
    with pytest.raises(nn.WeightsError, match=r"missing .*'layer1\.2\.bn1\.bias'"):
        resnet34(num_classes=4, pretrained=path)


def test_a_few_steps_fit_one_batch():
    nn.seed(0)
    x = np.random.default_rng(1).normal(size=(4, 3, 16, 16)).astype(np.float32)
    y = np.array([0, 1, 2, 3], np.int32)
    trainer = pj.Trainer(resnet18(num_classes=4), optax.adam(1e-3), progress=False)
    losses = [trainer.train_batch((x,), y) for _ in range(6)]
    assert losses[-1] < 0.25 * losses[0], losses


@pytest.mark.parametrize("build, message", [
    (lambda: ResNet(BasicBlock, 20), "ResNet: argument 'depth' expects one of [18, 34, 50, 101, 152], got 20"),
    (lambda: resnet50(variant="vz"), "ResNet: argument 'variant' expects one of ['vb', 'vc', 'vd'], got 'vz'"),
    (lambda: resnet18(data_format="NWHC"), "ResNet: argument 'data_format' expects one of ['NCHW', 'NHWC']"),
    (lambda: ResNet(nn.Linear), "ResNet: argument 'block' expects BasicBlock or BottleneckBlock"),
    (lambda: resnet18(groups=32), "BasicBlock: argument 'groups' expects groups=1 and base_width=64"),
    (lambda: resnet50(se_reduction=0), "ResNet: argument 'se_reduction' expects an int >= 1, got 0"),
    (lambda: resnet18(pretrained=True), "ResNet: argument 'pretrained' expects None or the path of a local"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError) as info:
        nnx.eval_shape(build)
    assert message in str(info.value)


def test_an_image_in_the_wrong_layout_is_reported_as_such(model):
    with pytest.raises(ValueError, match=r"ResNet: input 'x' expects shape \[N, 3, H, W\] \(data_format 'NCHW'\), "
                                         r"got \(2, 32, 32, 3\)"):
        model(X.transpose(0, 2, 3, 1))
