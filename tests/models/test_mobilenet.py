"""MobileNet V1 / V2: published parameter counts, width multipliers and channel rounding,
depthwise and inverted-residual structure, output shapes, NCHW = NHWC, static programs,
pretrained weights, training, errors.

Full-size models are only built abstractly (``nnx.eval_shape``); one MobileNetV2 at scale 0.35
with 4 classes is built for real and shared by the numeric tests."""
from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.models.blocks import make_divisible
from paddlejax.models.mobilenet import MobileNetV1, MobileNetV2, mobilenet_v1, mobilenet_v2

X = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    nn.seed(0)
    m = mobilenet_v2(scale=0.35, num_classes=4)
    m.eval()
    return m


def test_parameter_counts_match_the_published_ones(count_params):
    assert count_params(mobilenet_v1) == 4_231_976
    assert count_params(mobilenet_v2) == 3_504_872


def test_counts_grow_with_the_width_multiplier(count_params):
    v1 = [count_params(lambda: mobilenet_v1(scale=s)) for s in (0.25, 0.5, 0.75, 1.0)]
    v2 = [count_params(lambda: mobilenet_v2(scale=s)) for s in (0.35, 0.5, 0.75, 1.0, 1.4)]
    assert v1 == sorted(set(v1)) and v2 == sorted(set(v2))


def test_v1_truncates_widths_and_keeps_depthwise_convs_depthwise():
    model = nnx.eval_shape(lambda: mobilenet_v1(scale=0.75))
    assert model.conv1[0].weight.shape == (24, 3, 3, 3)  # int(32 * 0.75)
    dw, pw = model.conv2_2._depthwise_conv[0], model.conv2_2._pointwise_conv[0]
    assert (dw.weight.shape, dw._groups, dw._stride) == ((48, 1, 3, 3), 48, (2, 2))
    assert pw.weight.shape == (96, 48, 1, 1)
    assert model.conv6._pointwise_conv[0].weight.shape == (768, 768, 1, 1)
    assert model.fc.weight.shape == (768, 1000)


def test_v2_rounds_widths_to_multiples_of_8():
    assert [make_divisible(c * 0.35) for c in (32, 16, 24, 32, 64, 96, 160, 320)] == [16, 8, 8, 16, 24, 32, 56, 112]
    model = nnx.eval_shape(lambda: mobilenet_v2(scale=0.35))
    assert model.features[0][0].weight.shape == (16, 3, 3, 3)
    # the first block has expansion 1: depthwise 16, projection to 8; the second expands 8 -> 48
    assert [layer.weight.shape for layer in (model.features[1].conv[0][0], model.features[1].conv[1])] == [
        (16, 1, 3, 3), (8, 16, 1, 1)]
    assert model.features[2].conv[0][0].weight.shape == (48, 8, 1, 1)
    assert model.features[-1][0].weight.shape == (1280, 112, 1, 1)  # the last conv never narrows below 1280
    wide = nnx.eval_shape(lambda: mobilenet_v2(scale=1.4))
    assert wide.features[-1][0].weight.shape == (1792, 448, 1, 1)  # 1280 * 1.4, 320 * 1.4


def test_v2_adds_the_input_back_where_shapes_agree_and_uses_relu6(traced_ops):
    ops = [name for name, _ in traced_ops(lambda: mobilenet_v2(scale=0.35), X.shape)]
    # repeated blocks of each stage: (24: 1) + (32: 2) + (64: 3) + (96: 2) + (160: 2)
    assert ops.count("elementwise_add") == 10
    # the stem, 17 depthwise convs, 16 expansions (every block but the first), the last conv
    assert ops.count("relu6") == 1 + 17 + 16 + 1 and "relu" not in ops
    assert ops.count("dropout") == 0  # eval mode


@pytest.mark.parametrize("factory, shape, want", [
    (lambda: mobilenet_v1(scale=0.25, num_classes=3), (2, 3, 32, 32), (2, 3)),
    (lambda: mobilenet_v1(scale=0.5, num_classes=0), (2, 3, 32, 32), (2, 512, 1, 1)),
    (lambda: MobileNetV1(scale=0.25, num_classes=0, with_pool=False, data_format="NHWC"), (2, 64, 96, 3),
     (2, 2, 3, 256)),
    (lambda: mobilenet_v2(scale=0.5, num_classes=3), (2, 3, 32, 32), (2, 3)),
    (lambda: MobileNetV2(num_classes=0, with_pool=False), (2, 3, 64, 96), (2, 1280, 2, 3)),
])
def test_output_shapes(out_shape, factory, shape, want):
    assert out_shape(factory, shape) == want


def test_nhwc_gives_the_nchw_outputs_with_the_same_weights(model, same_in_nhwc):
    same_in_nhwc(model, mobilenet_v2(scale=0.35, num_classes=4, data_format="NHWC"), X)


def test_static_program_matches_dygraph_and_survives_save_and_load(model, static_matches):
    static_matches(model, X)


def test_pretrained_loads_a_local_weights_file(model, reloads_pretrained):
    path = reloads_pretrained(model, lambda path: mobilenet_v2(path, scale=0.35, num_classes=4), X)
    # e.g. a 4-class checkpoint for a 5-class model
    with pytest.raises(nn.WeightsError, match=r"tensor 'classifier\.1\.bias' has shape \(4,\), "
                                              r"the model's 'classifier\.1\.bias' is \(5,\)"):
        mobilenet_v2(path, scale=0.35, num_classes=5)


@pytest.mark.slow
def test_a_few_steps_fit_one_batch():
    nn.seed(0)
    # eight rows: batch statistics of four rows at the 1x1 last stage made the loss jump about
    x = np.random.default_rng(1).normal(size=(8, 3, 32, 32)).astype(np.float32)
    y = np.array([0, 1, 2, 3] * 2, np.int32)
    trainer = pj.Trainer(mobilenet_v2(scale=0.35, num_classes=4), optax.adam(3e-3), progress=False)
    losses = [trainer.train_batch((x,), y) for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("build, message", [
    (lambda: mobilenet_v1(scale=0.01), "MobileNetV1: argument 'scale' expects a width multiplier >= 0.03125, got 0.01"),
    (lambda: mobilenet_v2(scale=0), "MobileNetV2: argument 'scale' expects a width multiplier > 0, got 0"),
    (lambda: mobilenet_v2(scale="1.0"), "MobileNetV2: argument 'scale' expects a width multiplier > 0, got '1.0'"),
    (lambda: mobilenet_v1(data_format="CHWN"), "MobileNetV1: argument 'data_format' expects one of ['NCHW', 'NHWC']"),
    (lambda: mobilenet_v2(pretrained=True), "MobileNetV2: argument 'pretrained' expects None or the path of a local"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError) as info:
        nnx.eval_shape(build)
    assert message in str(info.value)


def test_an_image_in_the_wrong_layout_is_reported_as_such(out_shape):
    with pytest.raises(ValueError, match=r"MobileNetV1: input 'x' expects shape \[N, H, W, 3\] \(data_format 'NHWC'\)"):
        out_shape(lambda: mobilenet_v1(scale=0.25, data_format="NHWC"), (2, 3, 32, 32))
