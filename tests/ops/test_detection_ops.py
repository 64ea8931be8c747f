"""Detection and sampling ops against loop references written after Paddle's kernels:
multiclass_nms against a python greedy NMS (ties, everything suppressed, keep_top_k below the
survivors, under jit), roi_align, deformable_conv2d (zero offsets give conv2d), grid_sample in
every mode, yolo_box, unfold, sigmoid_focal_loss and einsum; bad arguments name the op; a
program using every one of them prints, parses back and saves."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
import paddlejax.ops as ops

sys.path.insert(0, str(Path(__file__).parent))  # the loop references beside this file
from detection_reference import (np_deform_conv, np_grid_sample, np_roi_align, np_sigmoid_focal_loss,  # noqa: E402
                                 np_unfold, np_yolo_box, padded_nms, python_multiclass_nms)

rng = np.random.default_rng(7)


def normal(*shape, dtype=np.float32):
    return rng.normal(size=shape).astype(dtype)


def random_boxes(n, m, scale=10.0):
    corner = rng.uniform(0, scale, (n, m, 2))
    return np.concatenate([corner, corner + rng.uniform(0.1 * scale, 0.5 * scale, (n, m, 2))], -1).astype(np.float32)


# ---------------------------------------------------------------------------------------
# multiclass_nms


def assert_nms_matches(bboxes, scores, **attrs):
    out, index, count = ops.multiclass_nms(bboxes, scores, **attrs)
    want = padded_nms(python_multiclass_nms(np.asarray(bboxes), np.asarray(scores), **attrs), out.shape[1])
    np.testing.assert_array_equal(count, want[2])
    np.testing.assert_array_equal(index, want[1])
    np.testing.assert_allclose(out, want[0], rtol=1e-6)
    return out, count


NMS_SETTINGS = {
    "top-k-both": dict(score_threshold=0.2, nms_top_k=5, keep_top_k=6),
    "unlimited-pixels": dict(score_threshold=0.1, nms_top_k=-1, keep_top_k=-1, background_label=-1, normalized=False),
    "eta-loose": dict(score_threshold=0.05, nms_top_k=8, keep_top_k=40, nms_eta=0.8, nms_threshold=0.8),
    "background-2": dict(score_threshold=0.0, nms_top_k=3, keep_top_k=4, background_label=2, nms_threshold=0.5),
}


@pytest.mark.parametrize("setting", NMS_SETTINGS)
def test_nms_matches_the_greedy_reference(setting):
    bboxes, scores = random_boxes(2, 9), rng.random((2, 3, 9)).astype(np.float32)
    assert_nms_matches(bboxes, scores, **NMS_SETTINGS[setting])


def test_nms_ties_go_to_the_lower_index_and_the_lower_class():
    bboxes = np.array([[[0, 0, 1, 1], [5, 5, 6, 6], [0, 0, 1, 1], [9, 9, 10, 10]]], np.float32)
    scores = np.array([[[0.5, 0.5, 0.5, 0.2], [0.5, 0.3, 0.5, 0.5]]], np.float32)  # ties within and across classes
    out, count = assert_nms_matches(bboxes, scores, score_threshold=0.1, nms_top_k=-1, keep_top_k=3,
                                    background_label=-1)
    # box 2 repeats box 0 and is suppressed by it; of the ties at 0.5 the first three in (class, box) order stay
    assert out[0, :, 0].tolist() == [0, 0, 1] and count.tolist() == [3]
    assert out[0, :, 2].tolist() == [0, 5, 0]


def test_nms_of_identical_boxes_keeps_one_per_class_and_nothing_below_the_threshold():
    bboxes = np.tile(np.array([1, 1, 4, 4], np.float32), (2, 5, 1))
    scores = rng.random((2, 3, 5)).astype(np.float32)
    scores[1] = 0.01  # image 1: all under the threshold
    out, count = assert_nms_matches(bboxes, scores, score_threshold=0.05, nms_top_k=-1, keep_top_k=10)
    assert count.tolist() == [2, 0]  # classes 1 and 2 (0 is the background)
    assert (out[1, :, 0] == -1).all() and (out[1, :, 1:] == 0).all()


def test_nms_keep_top_k_below_the_survivors_keeps_the_best_listed_by_class():
    bboxes = random_boxes(1, 12, scale=100.0)  # far apart: every box survives
    scores = rng.random((1, 4, 12)).astype(np.float32)
    out, count = assert_nms_matches(bboxes, scores, score_threshold=0.0, nms_top_k=-1, keep_top_k=5,
                                    background_label=-1)
    survivors = np.sort(scores[0].ravel())[::-1][:5]
    np.testing.assert_allclose(np.sort(out[0, :, 1])[::-1], survivors)
    assert count.tolist() == [5] and (np.diff(out[0, :, 0]) >= 0).all()


def test_nms_under_jit_in_float64_and_without_gradient():
    bboxes, scores = random_boxes(2, 6), rng.random((2, 3, 6)).astype(np.float32)
    attrs = dict(score_threshold=0.2, nms_top_k=4, keep_top_k=5)
    eager = ops.multiclass_nms(bboxes, scores, **attrs)
    jitted = jax.jit(lambda b, s: ops.multiclass_nms(b, s, **attrs))(bboxes, scores)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(a, b)
    with jax.enable_x64(True):
        assert_nms_matches(bboxes.astype(np.float64), scores.astype(np.float64), **attrs)
        grad = jax.grad(lambda s: ops.multiclass_nms(bboxes, s, **attrs)[0][..., 1].sum())(scores)
    assert not np.asarray(grad).any()  # selection has no gradient


def test_nms_with_nothing_to_select_returns_padding_only():
    out, index, count = ops.multiclass_nms(random_boxes(2, 3), rng.random((2, 1, 3)).astype(np.float32),
                                           score_threshold=0.0, nms_top_k=-1, keep_top_k=4)  # only the background
    assert out.shape == (2, 4, 6) and (out[..., 0] == -1).all() and (index == -1).all() and not count.any()


# ---------------------------------------------------------------------------------------
# roi_align


ROI_BOXES = np.array([[1, 2, 9, 11], [-3, -2, 5, 4], [4, 1, 13.5, 12], [0, 0, 30, 20],  # partly outside
                      [2, 2, 2, 2], [6, 6, 3, 3]], np.float32)  # empty and inverted


@pytest.mark.parametrize("sampling_ratio,aligned", [(-1, True), (-1, False), (2, True), (1, False)])
def test_roi_align_matches_the_loop_reference(sampling_ratio, aligned):
    x = normal(2, 3, 6, 7)
    got = ops.roi_align(x, ROI_BOXES, np.array([4, 2], np.int32), output_size=(2, 3), spatial_scale=0.5,
                        sampling_ratio=sampling_ratio, aligned=aligned)
    want = np_roi_align(x, ROI_BOXES, [4, 2], (2, 3), 0.5, sampling_ratio, aligned)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_roi_align_of_a_box_far_wider_than_the_map_reads_only_the_samples_on_it():
    # 600 samples per bin across, a handful on the map: the adaptive grid is exact, not capped
    x, boxes = normal(1, 2, 5, 6), np.array([[-300.2, 0.3, 299.7, 4.0], [-0.7, -0.9, 6.4, 5.2]], np.float32)
    got = jax.jit(lambda x, b: ops.roi_align(x, b, output_size=(2, 1)))(x, boxes)  # one image: no boxes_num
    np.testing.assert_allclose(got, np_roi_align(x, boxes, [2], (2, 1)), rtol=1e-5, atol=1e-7)


def test_roi_align_in_float64():
    with jax.enable_x64(True):
        x = normal(1, 2, 5, 5, dtype=np.float64)
        got = ops.roi_align(x, ROI_BOXES[:3].astype(np.float64), np.array([3]), output_size=2)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, np_roi_align(x, ROI_BOXES[:3], [3], (2, 2)), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# deformable_conv2d


DEFORM_SETTINGS = [dict(stride=(2, 2), padding=(1, 1), deformable_groups=2, groups=2),
                   dict(dilation=(2, 1), padding=(2, 0)),
                   dict(stride=(1, 2), padding=(0, 1), groups=2)]


@pytest.mark.parametrize("attrs", DEFORM_SETTINGS)
def test_deformable_conv_with_zero_offsets_is_conv2d(attrs):
    x, w, b = normal(2, 4, 7, 6), normal(6, 4 // attrs.get("groups", 1), 3, 3), normal(6)
    plain = ops.conv2d(x, w, b, **{k: v for k, v in attrs.items() if k != "deformable_groups"})
    taps = attrs.get("deformable_groups", 1) * 9
    offset = np.zeros((2, 2 * taps, *plain.shape[2:]), np.float32)
    mask = np.ones((2, taps, *plain.shape[2:]), np.float32)
    v2 = jax.jit(lambda *a: ops.deformable_conv2d(*a, **attrs))(x, offset, w, mask, b)
    v1 = ops.deformable_conv2d(x, offset, w, **attrs) + b[:, None, None]
    np.testing.assert_allclose(v2, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v1, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", DEFORM_SETTINGS)
def test_deformable_conv_with_random_offsets_matches_the_loop_reference(attrs):
    x, w = normal(2, 4, 7, 6), normal(6, 4 // attrs.get("groups", 1), 3, 3)
    shape = ops.conv2d(x, w, **{k: v for k, v in attrs.items() if k != "deformable_groups"}).shape
    taps = attrs.get("deformable_groups", 1) * 9
    offset = 2 * normal(2, 2 * taps, *shape[2:])  # reaches past the borders
    mask = rng.random((2, taps, *shape[2:])).astype(np.float32)
    want = np_deform_conv(x, offset, w, mask, None, **{"stride": (1, 1), "padding": (0, 0), **attrs})
    np.testing.assert_allclose(ops.deformable_conv2d(x, offset, w, mask, **attrs), want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------
# grid_sample


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
def test_grid_sample_matches_the_loop_reference(mode, padding_mode, align_corners):
    x, grid = normal(2, 3, 5, 4), rng.uniform(-1.6, 1.6, (2, 3, 4, 2)).astype(np.float32)  # some positions outside
    got = ops.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    np.testing.assert_allclose(got, np_grid_sample(x, grid, mode, padding_mode, align_corners), rtol=1e-5, atol=1e-6)


def test_sampling_in_bfloat16_keeps_the_image_dtype_and_float32_positions():
    x, grid = normal(1, 2, 9, 9), rng.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    low = ops.grid_sample(jnp.asarray(x, jnp.bfloat16), grid)
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32), np_grid_sample(x, grid), rtol=2e-2, atol=2e-2)
    offset, w = normal(1, 18, 9, 9), normal(3, 2, 3, 3)
    y = ops.deformable_conv2d(jnp.asarray(x, jnp.bfloat16), offset, jnp.asarray(w, jnp.bfloat16), padding=1)
    assert y.dtype == jnp.bfloat16
    want = np_deform_conv(x, offset, w, padding=(1, 1))
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=5e-2, atol=5e-2 * np.abs(want).max())


def test_grid_sample_rounds_halves_away_from_zero_and_handles_one_pixel_axes():
    x = np.arange(6.0, dtype=np.float32).reshape(1, 1, 2, 3)
    grid = np.array([[[[-0.5, -1.0], [0.5, 1.0]]]], np.float32)  # x at pixel 0.5 and 1.5
    assert ops.grid_sample(x, grid, mode="nearest").tolist() == [[[[1.0, 5.0]]]]
    one = np.full((1, 1, 1, 4), 2.0, np.float32)  # one row: every y reads it
    for pm in ("zeros", "border", "reflection"):
        got = ops.grid_sample(one, np.array([[[[0.3, 0.9]]]], np.float32), padding_mode=pm)
        np.testing.assert_allclose(got, np_grid_sample(one, np.array([[[[0.3, 0.9]]]]), "bilinear", pm, True))


# ---------------------------------------------------------------------------------------
# yolo_box, unfold, sigmoid_focal_loss, einsum


@pytest.mark.parametrize("attrs", [dict(), dict(iou_aware=True, clip_bbox=False, scale_x_y=1.05, iou_aware_factor=0.3)])
def test_yolo_box_matches_the_loop_reference(attrs):
    channels = 2 * (5 + 3) + (2 if attrs.get("iou_aware") else 0)
    x, img_size = normal(2, channels, 3, 4), np.array([[40, 50], [30, 60]], np.int32)
    boxes, scores = ops.yolo_box(x, img_size, anchors=(10, 13, 16, 30), class_num=3, conf_thresh=0.4,
                                 downsample_ratio=8, **attrs)
    want_boxes, want_scores = np_yolo_box(x, img_size, (10, 13, 16, 30), 3, 0.4, 8, **attrs)
    assert (want_scores == 0).all(-1).any() and not (want_scores == 0).all()  # some boxes under conf_thresh
    np.testing.assert_allclose(boxes, want_boxes, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("paddings", [0, [1, 2], [1, 0, 0, 2]])
def test_unfold_matches_the_loop_reference(paddings):
    x = np.arange(2 * 3 * 5 * 6).reshape(2, 3, 5, 6).astype(np.int32)  # exact for integers too
    got = ops.unfold(x, kernel_sizes=(2, 3), strides=(2, 1), paddings=paddings, dilations=(1, 2))
    pads = ops.unfold.check_attrs({"kernel_sizes": 2, "paddings": paddings})["paddings"]
    np.testing.assert_array_equal(got, np_unfold(x, (2, 3), (2, 1), pads, (1, 2)))


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_sigmoid_focal_loss_matches_the_formula(reduction):
    logit, label = 3 * normal(4, 5), (rng.random((4, 5)) > 0.7).astype(np.float32)
    for normalizer in (None, np.array([3.0], np.float32)):
        got = ops.sigmoid_focal_loss(logit, label, normalizer, reduction=reduction, alpha=0.3, gamma=1.5)
        want = np_sigmoid_focal_loss(logit, label, normalizer, 0.3, 1.5, reduction)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_einsum_matches_numpy_and_counts_its_flops():
    a, b, c = normal(2, 3, 4), normal(4, 5), normal(5, 2)
    np.testing.assert_allclose(ops.einsum(a, b, c, equation="bij,jk,kl->bil"), np.einsum("bij,jk,kl->bil", a, b, c),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.einsum(a, equation="bij"), np.einsum("bij", a))
    np.testing.assert_allclose(ops.einsum(a, b, equation="...j,jk"), np.einsum("...j,jk", a, b), rtol=1e-5)
    assert ops.einsum.flops([(3, 4), (4, 5)], [(3, 5)], {"equation": "ij,jk->ik"}) == 2 * 3 * 4 * 5
    # the cheaper order: (a @ b) then @ c, not a @ (b @ c)
    cheap = 2 * (8 * 4 * 2 + 8 * 2 * 64)
    assert ops.einsum.flops([(8, 4), (4, 2), (2, 64)], [(8, 64)], {"equation": "ij,jk,kl->il"}) == cheap


def test_einsum_couples_the_batch_only_where_rows_mix():
    couples = ops.einsum.traits.couples_batch
    assert not couples({"equation": "bij,bjk->bik"}) and not couples({"equation": "bij,jk->bik"})
    assert not couples({"equation": "...ij,jk"})
    assert couples({"equation": "bi,bj->ij"}) and couples({"equation": "bi,bi"})


# ---------------------------------------------------------------------------------------
# Errors name the op and the argument

x4 = np.zeros((1, 4, 6, 6), np.float32)

BAD_CALLS = [
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 18, 5, 4), np.float32), np.zeros((2, 4, 3, 3), np.float32)),
     r"deformable_conv2d: input 'offset' expects shape \(1, 18, 4, 4\) \(\(dy, dx\) per deformable group"),
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 18, 4, 4), np.float32), np.zeros((2, 4, 3, 3), np.float32),
                                   np.ones((1, 18, 4, 4), np.float32)),
     r"deformable_conv2d: input 'mask' expects shape \(1, 9, 4, 4\)"),
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 54, 4, 4), np.float32), np.zeros((2, 4, 3, 3), np.float32),
                                   deformable_groups=3),
     r"deformable_conv2d: attribute 'deformable_groups' expects a divisor of the input channels \(4\)"),
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 18, 4, 4), np.float32), np.zeros((2, 3, 3, 3), np.float32)),
     r"deformable_conv2d: input 'weight' expects shape \[out_c, 4 / groups=1, kh, kw\]"),
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 18, 4, 4), np.float32), np.zeros((2, 4, 3, 3), np.float32),
                                   None, np.zeros(2, np.float32)),
     r"deformable_conv2d: input 'mask' must be given when \['bias'\] is"),
    (lambda: ops.deformable_conv2d(x4, np.zeros((1, 18, 4, 4), np.float32), np.zeros((2, 4, 9, 9), np.float32)),
     r"deformable_conv2d: attribute 'padding' expects a padded input at least as large"),
    (lambda: ops.roi_align(np.zeros((2, 1, 4, 4), np.float32), np.zeros((3, 4), np.float32), output_size=2),
     r"roi_align: input 'boxes_num' expects the number of boxes of each of the 2 images"),
    (lambda: ops.roi_align(x4, np.zeros((3, 5), np.float32), np.array([3]), output_size=2),
     r"roi_align: input 'boxes' expects shape \[K, 4\]"),
    (lambda: ops.roi_align(x4, np.zeros((3, 4), np.float32), np.array([3, 0]), output_size=2),
     r"roi_align: input 'boxes_num' expects shape \(1,\)"),
    (lambda: ops.roi_align(x4, np.zeros((3, 4), np.float32), np.array([3.0]), output_size=2),
     r"roi_align: input 'boxes_num' expects a int array"),
    (lambda: ops.roi_align(x4, np.zeros((3, 4), np.float32), np.array([3])),
     r"roi_align: attribute 'output_size' is required"),
    (lambda: ops.multiclass_nms(np.zeros((1, 5, 4), np.float32), np.zeros((1, 2, 4), np.float32), score_threshold=0.1,
                                nms_top_k=-1, keep_top_k=3),
     r"multiclass_nms: input 'scores' expects shape \[1, C, 5\]"),
    (lambda: ops.multiclass_nms(np.zeros((1, 5, 8), np.float32), np.zeros((1, 2, 5), np.float32), score_threshold=0.1,
                                nms_top_k=-1, keep_top_k=3),
     r"multiclass_nms: input 'bboxes' expects shape \[N, M, 4\]"),
    (lambda: ops.multiclass_nms(np.zeros((1, 5, 4), np.float32), np.zeros((1, 2, 5), np.float32), score_threshold=0.1,
                                nms_top_k=-2, keep_top_k=3),
     r"multiclass_nms: attribute 'nms_top_k' expects values >= -1"),
    (lambda: ops.yolo_box(np.zeros((1, 15, 2, 2), np.float32), np.array([[8, 8]]), anchors=(1, 2, 3, 4), class_num=3,
                          conf_thresh=0.1, downsample_ratio=4),
     r"yolo_box: input 'x' expects 16 channels \(2 anchors x \(5 \+ class_num=3\)\)"),
    (lambda: ops.yolo_box(np.zeros((1, 16, 2, 2), np.float32), np.array([[8, 8]]), anchors=(1, 2, 3), class_num=3,
                          conf_thresh=0.1, downsample_ratio=4),
     r"yolo_box: attribute 'anchors' expects \(width, height\) pairs"),
    (lambda: ops.yolo_box(np.zeros((1, 16, 2, 2), np.float32), np.array([[8, 8, 8]]), anchors=(1, 2, 3, 4),
                          class_num=3, conf_thresh=0.1, downsample_ratio=4),
     r"yolo_box: input 'img_size' expects shape \(1, 2\)"),
    (lambda: ops.grid_sample(x4, np.zeros((1, 3, 3, 3), np.float32)),
     r"grid_sample: input 'grid' expects shape \[1, Ho, Wo, 2\]"),
    (lambda: ops.grid_sample(x4, np.zeros((1, 3, 3, 2), np.float32), mode="bicubic"),
     r"grid_sample: attribute 'mode' expects one of \['bilinear', 'nearest'\]"),
    (lambda: ops.grid_sample(x4, np.zeros((1, 3, 3, 2), np.float32), padding_mode="wrap"),
     r"grid_sample: attribute 'padding_mode' expects one of"),
    (lambda: ops.unfold(x4, kernel_sizes=3, paddings=(1, 2, 3)),
     r"unfold: attribute 'paddings' expects an int, \[pad_h, pad_w\] or \[top, left, bottom, right\]"),
    (lambda: ops.unfold(x4, kernel_sizes=7), r"unfold: attribute 'kernel_sizes' expects \(dilated\) blocks that fit"),
    (lambda: ops.sigmoid_focal_loss(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),
     r"sigmoid_focal_loss: input 'label' expects the shape of 'logit' \(2, 3\)"),
    (lambda: ops.sigmoid_focal_loss(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32),
                                    np.ones(2, np.float32)),
     r"sigmoid_focal_loss: input 'normalizer' expects a scalar or shape \(1,\)"),
    (lambda: ops.sigmoid_focal_loss(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), reduction="avg"),
     r"sigmoid_focal_loss: attribute 'reduction' expects one of"),
    (lambda: ops.einsum(np.zeros((2, 3)), equation="ij,jk->ik"),
     r"einsum: attribute 'equation' expects one subscript per operand \(1 operands\)"),
    (lambda: ops.einsum(np.zeros((2, 3)), np.zeros((4, 5)), equation="ij,jk->ik"),
     r"einsum: attribute 'equation' expects subscripts that fit the operands' shapes \(\(2, 3\), \(4, 5\)\)"),
]


@pytest.mark.parametrize("bad,match", BAD_CALLS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD_CALLS)])
def test_bad_calls_raise_naming_the_op(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


# ---------------------------------------------------------------------------------------
# Programs: printed, parsed back, saved and loaded


def _detector(x, offset, weight, mask, boxes, boxes_num, grid, head, img_size, logit, label):
    """A small function that calls every one of the ops."""
    y = ops.deformable_conv2d(x, offset, weight, mask, padding=(1, 1), deformable_groups=2)
    y = ops.grid_sample(y, grid, padding_mode="reflection", align_corners=False)
    pooled = ops.roi_align(y, boxes, boxes_num, output_size=(2, 2), spatial_scale=0.5, sampling_ratio=-1)
    cols = ops.unfold(pooled, kernel_sizes=2, paddings=[1, 0, 0, 1])
    mixed = ops.einsum(cols, cols, equation="kcl,kdl->kcd")
    decoded, scores = ops.yolo_box(head, img_size, anchors=(4, 6, 8, 10), class_num=2, conf_thresh=0.01,
                                   downsample_ratio=8)
    kept = ops.multiclass_nms(decoded, jnp.swapaxes(scores, 1, 2), score_threshold=0.05, nms_top_k=6, keep_top_k=5,
                              normalized=False, background_label=-1)
    loss = ops.sigmoid_focal_loss(logit, label, reduction="mean")
    return mixed, kept, loss


def _detector_inputs():
    return (normal(2, 4, 5, 5), 0.5 * normal(2, 36, 5, 5), normal(3, 4, 3, 3), rng.random((2, 18, 5, 5), np.float32),
            np.array([[0, 0, 8, 8], [2, 1, 9, 7], [1, 1, 5, 9]], np.float32), np.array([2, 1], np.int32),
            rng.uniform(-1, 1, (2, 4, 4, 2)).astype(np.float32), normal(2, 14, 2, 3),
            np.array([[16, 24], [20, 20]], np.int32), normal(3, 4), (rng.random((3, 4)) > 0.5).astype(np.float32))


def test_a_program_of_the_ops_prints_parses_and_saves(tmp_path):
    inputs = _detector_inputs()
    prog = pj.trace(_detector, *inputs)
    text = str(prog)
    for name in ("deformable_conv2d", "grid_sample", "roi_align", "unfold", "einsum", "yolo_box", "multiclass_nms",
                 "sigmoid_focal_loss"):
        assert f" {name}(" in text
    assert 'equation="kcl,kdl->kcd"' in text and "paddings=(1, 0, 0, 1)" in text and "anchors=(4, 6, 8, 10)" in text
    parsed = pj.parse(text)
    assert str(parsed) == text
    pj.save(prog, tmp_path / "detector")
    loaded = pj.load(tmp_path / "detector")
    assert str(loaded) == text
    want = jax.tree.leaves(jax.jit(_detector)(*inputs))
    got = jax.tree.leaves(loaded(*inputs))
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
