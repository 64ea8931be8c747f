"""VGG: published parameter counts, the feature configurations, output shapes, NCHW = NHWC
(through the 7x7 flatten), static programs, pretrained weights, training, errors.

Full-size models are only built abstractly (``nnx.eval_shape``); one VGG-11 with batch norm,
4 classes and a 16-wide classifier is built for real and shared by the numeric tests."""
from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.models.vgg import CONFIGS, VGG, make_layers, vgg11, vgg13, vgg16, vgg19

X = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)


def small_vgg11(**kwargs):
    """VGG-11 with batch norm, 4 classes and a 16-wide classifier: the real model of these tests."""
    return vgg11(batch_norm=True, num_classes=4, classifier_width=16, **kwargs)


@pytest.fixture(scope="module")
def model():
    nn.seed(0)
    m = small_vgg11()
    m.eval()
    return m


@pytest.mark.parametrize("factory, plain, with_bn", [
    (vgg11, 132_863_336, 132_868_840), (vgg13, 133_047_848, 133_053_736),
    (vgg16, 138_357_544, 138_365_992), (vgg19, 143_667_240, 143_678_248)])
def test_parameter_counts_match_the_published_ones(count_params, factory, plain, with_bn):
    assert count_params(factory) == plain
    assert count_params(lambda: factory(batch_norm=True)) == with_bn


def test_configurations_have_8_10_13_16_convs_and_5_pools():
    assert {depth: sum(v != "M" for v in cfg) for depth, cfg in CONFIGS.items()} == {11: 8, 13: 10, 16: 13, 19: 16}
    assert all(cfg.count("M") == 5 and cfg[-2] == 512 for cfg in CONFIGS.values())
    features = nnx.eval_shape(lambda: make_layers(CONFIGS[16], batch_norm=True))
    assert [type(layer).__name__ for layer in features][:7] == [
        "Conv2D", "BatchNorm2D", "ReLU", "Conv2D", "BatchNorm2D", "ReLU", "MaxPool2D"]


def test_classifier_width_and_dropout_set_the_hidden_layers():
    head = nnx.eval_shape(lambda: vgg16(num_classes=10, classifier_width=64)).classifier
    assert [head[i].weight.shape for i in (0, 3, 6)] == [(512 * 7 * 7, 64), (64, 64), (64, 10)]
    assert [head[i].p for i in (2, 5)] == [0.5, 0.5]
    assert nnx.eval_shape(lambda: vgg11(dropout=0.1)).classifier[5].p == 0.1


@pytest.mark.parametrize("factory, shape, want", [
    (lambda: vgg13(num_classes=3, classifier_width=8), (2, 3, 32, 32), (2, 3)),
    (lambda: vgg19(num_classes=0), (2, 3, 32, 32), (2, 512, 7, 7)),
    (lambda: vgg16(num_classes=0, with_pool=False), (2, 3, 64, 96), (2, 512, 2, 3)),
    (lambda: vgg11(num_classes=3, with_pool=False, classifier_width=8), (2, 3, 224, 224), (2, 3)),
    (lambda: vgg11(num_classes=0, data_format="NHWC"), (2, 32, 32, 3), (2, 7, 7, 512)),
])
def test_output_shapes(out_shape, factory, shape, want):
    assert out_shape(factory, shape) == want


def test_parameter_names_follow_paddle(model):
    names = set(nn.state_dict(model))
    assert {"features.0.weight", "features.0.bias", "features.1.weight", "features.1.mean", "features.4.weight",
            "classifier.0.weight", "classifier.3.weight", "classifier.6.bias"} <= names


def test_nhwc_gives_the_nchw_outputs_with_the_same_weights(model, same_in_nhwc):
    # the pooled 7x7 map is flattened in NCHW order in both layouts, so classifier.0 fits both
    same_in_nhwc(model, small_vgg11(data_format="NHWC"), X)


def test_static_program_matches_dygraph_and_survives_save_and_load(model, static_matches):
    static_matches(model, X)


def test_pretrained_loads_a_local_weights_file(model, reloads_pretrained):
    path = reloads_pretrained(model, lambda path: small_vgg11(pretrained=path), X)
    with pytest.raises(nn.WeightsError, match=r"missing 40 tensor\(s\) the model needs: 'features\.10\.bias'"):
        vgg13(pretrained=path, batch_norm=True, num_classes=4, classifier_width=16)


def test_a_few_steps_fit_one_batch():
    nn.seed(0)
    x = np.random.default_rng(1).normal(size=(4, 3, 32, 32)).astype(np.float32)
    y = np.array([0, 1, 2, 3], np.int32)
    # without dropout a narrow head's loss on one batch moves steadily, step to step
    trainer = pj.Trainer(small_vgg11(dropout=0.0), optax.adam(1e-4), progress=False)
    losses = [trainer.train_batch((x,), y) for _ in range(6)]
    assert losses[-1] < 0.25 * losses[0], losses


@pytest.mark.parametrize("build, message", [
    (lambda: make_layers([64, "M", 0]), "make_layers: argument 'cfg[2]' expects a positive channel count or \"M\""),
    (lambda: vgg11(classifier_width=0), "VGG: argument 'classifier_width' expects an int >= 1, got 0"),
    (lambda: vgg11(dropout=1.5), "VGG: argument 'dropout' expects a probability in [0, 1], got 1.5"),
    (lambda: vgg16(data_format="HWC"), "make_layers: argument 'data_format' expects one of ['NCHW', 'NHWC']"),
    (lambda: VGG(make_layers([512]), data_format="nchw"), "VGG: argument 'data_format' expects one of"),
    (lambda: vgg19(pretrained=True), "VGG: argument 'pretrained' expects None or the path of a local"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError) as info:
        nnx.eval_shape(build)
    assert message in str(info.value)


def test_an_image_in_the_wrong_layout_is_reported_as_such(out_shape):
    with pytest.raises(ValueError, match=r"VGG: input 'x' expects shape \[N, 3, H, W\] \(data_format 'NCHW'\), "
                                         r"got \(2, 32, 32, 3\)"):
        out_shape(lambda: vgg11(num_classes=0), (2, 32, 32, 3))
