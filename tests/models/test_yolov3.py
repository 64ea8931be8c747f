"""YOLOv3: the backbones' and heads' shapes, the loss's box encoding read back by the
``yolo_box`` / ``multiclass_nms`` decoding, training that lowers the loss, a deformable variant,
and capture to a program that saves and loads."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax.models.yolov3 import YOLOv3, evaluate_map, yolov3_darknet53, yolov3_tiny

SIZE = 64
ANCHORS = ((8, 8), (12, 20), (20, 12), (16, 16), (24, 24), (30, 40))


def targets():
    return np.array([[[0, 4, 6, 14, 16], [2, 30, 34, 54, 58], [-1, -1, -1, -1, -1]],
                     [[1, 40, 2, 60, 22], [-1] * 5, [-1] * 5]], np.float32)


def encode(model, rows, size):
    """Raw head maps that say exactly ``rows`` (label, x1, y1, x2, y2) with confidence, built the
    way the loss assigns boxes: the best-shaped anchor of all scales, the cell of the centre."""
    outputs = [np.full((len(rows), 3, 5 + model.num_classes, size // s, size // s), -12.0, np.float32)
               for s in model.strides]
    anchors = np.asarray(model.anchors)
    for n, image in enumerate(rows):
        for label, x1, y1, x2, y2 in image[image[:, 0] >= 0]:
            w, h = x2 - x1, y2 - y1
            inter = np.minimum(w, anchors[:, 0]) * np.minimum(h, anchors[:, 1])
            best = int(np.argmax(inter / (w * h + anchors.prod(1) - inter)))
            scale = next(i for i, m in enumerate(model.masks) if best in m)
            stride, a = model.strides[scale], model.masks[scale].index(best)
            cx, cy = (x1 + x2) / 2 / stride, (y1 + y2) / 2 / stride
            gi, gj = int(cx), int(cy)
            logit = lambda t: np.log(t / (1 - t))  # noqa: E731
            out = outputs[scale][n, a, :, gj, gi]
            out[:4] = logit(cx - gi), logit(cy - gj), np.log(w / anchors[best, 0]), np.log(h / anchors[best, 1])
            out[4], out[5 + int(label)] = 12.0, 12.0
    return [jnp.asarray(o.reshape(len(rows), -1, *o.shape[3:])) for o in outputs]


@pytest.mark.parametrize("backbone, output_stride, strides", [("tiny", 32, (32, 16)), ("tiny", 16, (16, 8)),
                                                               ("darknet53", 32, (32, 16, 8))])
def test_heads_predict_every_anchor_and_cell_of_each_scale(backbone, output_stride, strides):
    pj.nn.seed(0)
    model = YOLOv3(4, backbone, width=0.125, output_stride=output_stride)
    model.eval()
    outs = jax.eval_shape(model, jax.ShapeDtypeStruct((2, 3, SIZE, SIZE), jnp.float32))
    assert model.strides == strides
    assert [o.shape for o in outs] == [(2, 3 * 9, SIZE // s, SIZE // s) for s in strides]


@pytest.mark.parametrize("output_stride", [32, 16])
def test_detect_reads_back_the_boxes_the_loss_encodes(output_stride):
    pj.nn.seed(0)
    model = yolov3_tiny(3, anchors=ANCHORS, width=0.25, output_stride=output_stride)
    rows = targets()
    found, count = model.detect(encode(model, rows, SIZE), SIZE, conf_thresh=0.5)
    assert count.tolist() == [2, 1]
    for n, image in enumerate(rows):
        want = image[image[:, 0] >= 0]
        got = np.asarray(found[n, :count[n]])
        got = got[np.argsort(got[:, 0])]
        np.testing.assert_array_equal(got[:, 0], want[np.argsort(want[:, 0]), 0])
        np.testing.assert_allclose(got[:, 2:], want[np.argsort(want[:, 0]), 1:], atol=1e-2)
        assert (got[:, 1] > 0.99).all()
    # and those outputs cost the loss far less than the same maps shifted by one class
    loss = jax.jit(lambda outs, t: model.loss(outs, t, SIZE))
    wrong = rows.copy()
    wrong[..., 0] = np.where(rows[..., 0] >= 0, (rows[..., 0] + 1) % 3, -1)
    assert float(loss(encode(model, rows, SIZE), rows)) < 0.5 * float(loss(encode(model, wrong, SIZE), rows))


def test_loss_ignores_padding_and_boxes_of_other_images():
    pj.nn.seed(0)
    model = yolov3_tiny(3, anchors=ANCHORS, width=0.25)
    outs = [jnp.asarray(np.random.default_rng(i).normal(size=(2, 3 * (5 + 3), SIZE // s, SIZE // s)), jnp.float32)
            for i, s in enumerate(model.strides)]
    loss = jax.jit(lambda outs, t: model.loss(outs, t, SIZE))
    rows = targets()
    padded = np.concatenate([rows, np.full((2, 5, 5), -1, np.float32)], 1)
    np.testing.assert_allclose(loss(outs, padded), loss(outs, rows), rtol=1e-6)
    # an image's loss is its own: the batch's is the mean of the images' alone
    each = [float(loss([o[i:i + 1] for o in outs], rows[i:i + 1])) for i in range(2)]
    np.testing.assert_allclose(float(loss(outs, rows)), np.mean(each), rtol=1e-5)


@pytest.mark.slow
def test_training_lowers_the_loss_and_finds_the_boxes_of_a_small_set():
    from paddlejax.data.shapes import Shapes

    images, rows = Shapes("train", num_images=8, image_size=SIZE).arrays()
    pj.nn.seed(0)
    model = yolov3_tiny(3, anchors=ANCHORS, width=0.25)
    trainer = pj.Trainer(model, optax.adam(3e-3), loss=lambda outs, t: model.loss(outs, t, SIZE), progress=False)
    losses = [trainer.train_batch([images], rows) for _ in range(150)]
    assert losses[-1] < 0.2 * losses[0]
    trainer.sync_model()
    assert evaluate_map(model, images, rows).accumulate() > 0.5  # memorised its own images


def test_deformable_variant_starts_as_plain_convolutions_and_traces():
    pj.nn.seed(0)
    model = yolov3_darknet53(2, width=0.0625, dcn=True)
    model.eval()
    x = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    prog = pj.trace(model, x)
    assert "deformable_conv2d" in str(prog)
    np.testing.assert_allclose(prog(x)[0], jax.jit(model)(x)[0], rtol=1e-4, atol=1e-4)
    # zero offsets and masks of 0.5: half of what the same weights give as a plain convolution
    dcn = model.backbone.stages[4][1].conv2[0]
    feature = jnp.asarray(np.random.default_rng(1).normal(size=(1, dcn.conv.weight.shape[1], 4, 4)), jnp.float32)
    plain = pj.ops.conv2d(feature, dcn.conv.weight[...], padding=1)
    np.testing.assert_allclose(dcn(feature), 0.5 * plain, rtol=1e-4, atol=1e-5)


def test_tiny_model_saves_loads_and_detects_the_same(tmp_path):
    pj.nn.seed(0)
    model = yolov3_tiny(3, anchors=ANCHORS, width=0.25)
    model.eval()
    x = np.random.default_rng(0).normal(size=(2, 3, SIZE, SIZE)).astype(np.float32)
    prog = pj.trace(model, pj.InputSpec((None, 3, SIZE, SIZE)))
    pj.save(prog, tmp_path / "yolo")
    loaded = pj.load(tmp_path / "yolo")
    for got, want in zip(loaded(x), jax.jit(model)(x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match="backbone expects one of"):
        YOLOv3(3, "resnet")
    with pytest.raises(ValueError, match="the tiny backbone expects 6 anchors"):
        YOLOv3(3, "tiny", anchors=ANCHORS[:3])
    with pytest.raises(ValueError, match="output_stride 16 is for the tiny backbone"):
        YOLOv3(3, "darknet53", output_stride=16)
    with pytest.raises(ValueError, match="output_stride expects 16 or 32"):
        YOLOv3(3, "tiny", output_stride=8)


def test_evaluation_compiles_one_detector_whatever_the_last_batch_and_the_call():
    """A ragged last batch is padded to the others' size, and the weights are arguments: five
    images in batches of two, scored twice, compile one detector, and score as one batch of five."""
    from paddlejax.data.shapes import Shapes
    from paddlejax.models.yolov3 import _detect_batch

    images, rows = Shapes("test", num_images=5, image_size=32).arrays()
    pj.nn.seed(0)
    model = yolov3_tiny(3, width=0.25)
    before = _detect_batch._cache_size()
    first, again = (evaluate_map(model, images, rows, batch_size=2, conf_thresh=0.001) for _ in range(2))
    assert _detect_batch._cache_size() == before + 1
    whole = evaluate_map(model, images, rows, batch_size=5, conf_thresh=0.001)
    assert evaluate_map(model, images[:0], rows[:0]).accumulate() == 0.0  # no images: nothing scored
    assert sum(map(len, whole._scores)) > 0  # the untrained detector still proposes boxes
    assert first._scores == again._scores
    for got, want in zip(first._scores, whole._scores):  # to float rounding: XLA's kernels vary with the batch
        assert len(got) == len(want)
        np.testing.assert_allclose(sorted(s for s, _ in got), sorted(s for s, _ in want), rtol=1e-4)
        assert sorted(tp for _, tp in got) == sorted(tp for _, tp in want)
