"""TSM: where the shifts sit (one per residual block, on the branch, never on the shortcut),
output shapes, the consensus, static programs, NCHW = NHWC, weights, errors, and that training
on moving digits learns the direction of motion with the shifts and cannot without them.

ResNet-18/50 TSMs are built abstractly except for one ResNet-50 forward pass at 32x32; the
numeric tests use a small ResNet of the zoo's BasicBlocks."""
from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.data import MovingDigits
from paddlejax.inference import Config, Predictor
from paddlejax.models.tsm import TSM, TemporalShift, small_resnet, tsm_resnet18, tsm_resnet50

CLIPS = np.random.default_rng(0).normal(size=(2, 3, 1, 16, 16)).astype(np.float32)  # 2 clips of 3 frames


def tiny(shift_ratio=0.25, data_format="NCHW", seed=0):
    nn.seed(seed)
    model = TSM(small_resnet(4, widths=(8, 16), blocks=(1, 1), data_format=data_format), num_segments=3,
                shift_ratio=shift_ratio, data_format=data_format)
    model.eval()
    return model


@pytest.fixture(scope="module")
def model():
    return tiny()


def shifts(traced):
    return [(p["seg_num"], p["shift_ratio"]) for name, p in traced if name == "temporal_shift"]


def test_a_shift_per_residual_block_of_resnet_18_and_50(traced_ops):
    shape = (1, 8, 3, 32, 32)
    assert shifts(traced_ops(lambda: tsm_resnet18(num_classes=4, num_segments=8), shape)) == [(8, 0.125)] * 8
    assert shifts(traced_ops(lambda: tsm_resnet50(num_classes=4, num_segments=8, shift_ratio=0.25), shape)) == \
        [(8, 0.25)] * 16
    assert shifts(traced_ops(lambda: tsm_resnet18(num_classes=4, num_segments=8, shift_ratio=0), shape)) == []


def test_the_shift_feeds_the_branch_and_the_shortcut_keeps_the_frame(model):
    prog = pj.to_static(model, pj.InputSpec((None, *CLIPS.shape[1:])))
    lines = [line for line in str(prog).splitlines() if "temporal_shift(" in line]
    assert len(lines) == 2 and all('{seg_num=3, shift_ratio=0.25, data_format="NCHW"}' in line for line in lines), \
        lines
    shifted = [op for op in prog.walk() if op.type == "temporal_shift"]
    # the shift's result goes to the block's first conv only; its input also to the shortcut:
    # the identity add in the first block, the strided 1x1 projection in the second
    assert [[u.type for u in op.result.users] for op in shifted] == [["conv2d"], ["conv2d"]]
    assert [sorted(u.type for u in op.operands[0].users) for op in shifted] == [
        ["elementwise_add", "temporal_shift"], ["conv2d", "temporal_shift"]]
    assert [op.type for op in prog.walk()][-3:] == ["reshape", "reduce_mean", "return"]  # [N, T, K] -> mean over T


def test_output_shapes(out_shape):
    assert out_shape(lambda: tsm_resnet18(num_classes=5, num_segments=4), (2, 4, 3, 32, 32)) == (2, 5)
    assert out_shape(lambda: tsm_resnet50(num_classes=5, num_segments=2, data_format="NHWC"),
                     (3, 2, 32, 32, 3)) == (3, 5)
    assert out_shape(lambda: TSM(small_resnet(7, in_channels=3), 8), (1, 8, 3, 24, 24)) == (1, 7)


def test_resnet50_tsm_runs_a_forward_pass(forward):
    nn.seed(0)
    model = tsm_resnet50(num_classes=3, num_segments=2)
    model.eval()
    x = np.random.default_rng(1).normal(size=(1, 2, 3, 32, 32)).astype(np.float32)
    y = np.asarray(forward(model, x))
    assert y.shape == (1, 3) and np.isfinite(y).all()
    assert not np.allclose(forward(model, x[:, ::-1]), y, atol=1e-6)  # the frames' order counts


def test_without_shifts_the_scores_are_the_mean_of_the_frames_scores(forward):
    tsn = tiny(shift_ratio=0)
    frames = np.asarray(forward(tsn.backbone, CLIPS.reshape(6, 1, 16, 16))).reshape(2, 3, 4)
    np.testing.assert_allclose(forward(tsn, CLIPS), frames.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(forward(tsn, CLIPS[:, ::-1]), forward(tsn, CLIPS), rtol=1e-5, atol=1e-6)


def test_shifts_make_the_scores_depend_on_the_frames_order(model, forward):
    y = np.asarray(forward(model, CLIPS))
    assert np.abs(np.asarray(forward(model, CLIPS[:, ::-1])) - y).max() > 1e-3
    # clips stay apart: a batch gives each clip's scores alone
    np.testing.assert_allclose(forward(model, CLIPS[1:]), y[1:], rtol=1e-5, atol=1e-6)


def test_static_program_matches_dygraph_and_survives_save_and_load(model, static_matches):
    static_matches(model, CLIPS)


def test_predictor_pads_and_chunks_whole_clips(model, forward):
    prog = pj.to_static(model, pj.InputSpec((None, *CLIPS.shape[1:])))
    clips = np.concatenate([CLIPS, CLIPS[:1] * 0.5])  # 3 clips: padded to a bucket of 4
    predictor = Predictor(prog, Config(passes="", max_batch_size=4, progress=False))
    np.testing.assert_allclose(predictor(clips), forward(model, clips), rtol=1e-5, atol=1e-6)


def test_nhwc_gives_the_nchw_outputs_with_the_same_weights(model, forward):
    nhwc = tiny(data_format="NHWC", seed=1)
    nn.set_state_dict(nhwc, nn.state_dict(model))
    np.testing.assert_allclose(forward(nhwc, CLIPS.transpose(0, 1, 3, 4, 2)), forward(model, CLIPS),
                               rtol=1e-4, atol=1e-5)


def test_weights_keep_resnet_names_under_net_and_reload(tmp_path):
    names = set(nn.state_dict(nnx.eval_shape(lambda: tsm_resnet18(num_classes=4, num_segments=8))))
    assert {"backbone.conv1.weight", "backbone.layer1.0.conv1.net.weight", "backbone.layer1.0.conv2.weight",
            "backbone.layer2.0.downsample.0.weight", "backbone.fc.weight"} <= names
    nn.seed(0)
    source = tsm_resnet18(num_classes=4, num_segments=2)
    path = tmp_path / "tsm18.safetensors"
    nn.save_weights(source, path)
    nn.seed(1)
    loaded = tsm_resnet18(num_classes=4, num_segments=2, pretrained=path)
    for (name, a), (_, b) in zip(sorted(nn.state_dict(source).items()), sorted(nn.state_dict(loaded).items())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_the_shift_layer_shifts_then_applies_its_net():
    x = np.random.default_rng(2).normal(size=(4, 8, 2, 2)).astype(np.float32)
    layer = TemporalShift(nn.ReLU(), num_segments=2, shift_ratio=0.25)
    np.testing.assert_array_equal(layer(x), np.maximum(pj.ops.temporal_shift(x, seg_num=2), 0))


def test_moving_digits_need_the_shift():
    """A TSM learns the direction a digit moves; the same network without shifts sees the same
    frames in any order, so it gives a clip and the same clip played backwards one answer: at
    most half the held-out clips right, where guessing gets a quarter."""
    train = MovingDigits("train", num_clips=640, num_frames=4, size=16)
    test = MovingDigits("test", num_frames=4, size=16)
    clips, labels = test.arrays()
    results = {}
    for ratio in (0.25, 0.0):
        nn.seed(0)
        model = TSM(small_resnet(4, widths=(8, 16), blocks=(1, 1)), num_segments=4, shift_ratio=ratio)
        trainer = pj.Trainer(model, optax.adam(3e-3), metrics=["accuracy"], progress=False)
        trainer.fit(train.arrays(), epochs=2, batch_size=32)
        predicted = trainer.predict(clips).argmax(1)
        results[ratio] = (predicted == labels).mean(), (predicted[0::2] == predicted[1::2]).mean()
    (tsm_acc, _), (tsn_acc, tsn_same) = results[0.25], results[0.0]
    assert tsm_acc > 0.9, results
    assert tsn_same == 1.0 and tsn_acc <= 0.5, results  # each reversed pair: one answer, at most one right


@pytest.mark.parametrize("build, message", [
    (lambda: TSM(small_resnet(4), 0), "TSM: argument 'num_segments' expects an int >= 1, got 0"),
    (lambda: TSM(small_resnet(4), 8, shift_ratio=0.5), "TSM: argument 'shift_ratio' expects a ratio in [0, 0.5)"),
    (lambda: TSM(small_resnet(4), 8, shift_ratio="1/8"), "TSM: argument 'shift_ratio' expects a ratio in [0, 0.5)"),
    (lambda: TSM(nn.Linear(4, 4), 8), "TSM: argument 'backbone' expects a network of residual blocks"),
    (lambda: TSM(small_resnet(4), 8, data_format="NCTHW"), "TSM: argument 'data_format' expects one of"),
    (lambda: small_resnet(4, widths=(8, 16), blocks=(1,)), "small_resnet: argument 'blocks' expects one count per "
                                                           "stage (2 widths), got (1,)"),
    (lambda: small_resnet(4, widths=(8, 0), blocks=(1, 1)),
     "small_resnet: argument 'widths' expects an int >= 1, got 0"),
    (lambda: tsm_resnet18(4, 8, pretrained=True), "TSM: argument 'pretrained' expects None or the path of a local"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError) as info:
        nnx.eval_shape(build)
    assert message in str(info.value)


def test_clips_of_the_wrong_shape_are_named(model):
    with pytest.raises(ValueError, match=r"TSM: input 'x' expects clips of shape \[N, 3, C, H, W\] "
                                         r"\(num_segments=3\), got \(2, 4, 1, 16, 16\)"):
        model(np.zeros((2, 4, 1, 16, 16), np.float32))
    with pytest.raises(ValueError, match=r"TSM: input 'x' expects clips .* got \(6, 1, 16, 16\)"):
        model(np.zeros((6, 1, 16, 16), np.float32))
    with pytest.raises(ValueError, match=r"TSM: input 'x' expects clips of shape \[N, 3, H, W, C\]"):
        tiny(data_format="NHWC")(np.zeros((2, 4, 16, 16, 1), np.float32))
