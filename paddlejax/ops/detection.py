"""Object detection ops with Paddle's semantics: ``roi_align``, ``yolo_box`` and
``multiclass_nms`` (Paddle's ``multiclass_nms3``), all with static shapes so they jit, trace and
batch like any other op.

Boxes are ``(x1, y1, x2, y2)`` in pixels. ``roi_align`` pools each region of interest of a
feature map into ``output_size`` bins; ``yolo_box`` decodes a YOLOv3 head into boxes and class
scores; ``multiclass_nms`` keeps, per image, the best-scoring boxes of each class that do not
overlap a better one too much, and returns a fixed number of rows padded after the valid ones.

Bilinear sampling is separable, so ``roi_align`` computes a bin's mean of samples as a product
of row weights, the feature map and column weights: exact for any box and sampling ratio with
static shapes, at a cost that grows with the map (``K * N * H * W * C``), not with the boxes.

>>> import jax.numpy as jnp
>>> x = jnp.arange(16.0).reshape(1, 1, 4, 4)
>>> roi_align(x, jnp.array([[0.0, 0.0, 4.0, 4.0]]), jnp.array([1]), output_size=2).tolist()
[[[[2.5, 4.5], [10.5, 12.5]]]]
>>> boxes = jnp.array([[[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]]])
>>> scores = jnp.array([[[0.9, 0.8, 0.7]]])  # one class
>>> out, index, count = multiclass_nms(boxes, scores, score_threshold=0.1, nms_top_k=-1, keep_top_k=4,
...                                    background_label=-1)
>>> out[0, :, 0].tolist(), index.tolist(), count.tolist()  # box 1 overlaps box 0 too much
([0.0, 0.0, -1.0, -1.0], [[0, 2, -1, -1]], [2])
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from paddlejax.ops.common import attr_error, input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.sampling import linear_taps
from paddlejax.ops.traits import Traits

# ---------------------------------------------------------------------------------------
# roi_align


def _image_of_each_box(op, boxes, boxes_num, images: int):
    """The image index of each box: the first ``boxes_num[0]`` boxes are image 0's, and so on."""
    if boxes_num is None:
        if images != 1:
            raise input_error(op, "boxes_num", f"the number of boxes of each of the {images} images", None)
        return jnp.zeros(boxes.shape[0], jnp.int32)
    if boxes_num.shape != (images,):
        raise input_error(op, "boxes_num", f"shape ({images},) (one count per image of x)", tuple(boxes_num.shape))
    ends = jnp.cumsum(boxes_num)  # box k belongs to the first image whose boxes end after k
    return jnp.minimum(jnp.sum(jnp.arange(boxes.shape[0])[:, None] >= ends, axis=1), images - 1)


def _bin_weights(start, end, bins: int, size: int, sampling_ratio: int, aligned: bool):
    """What each bin of each box reads along one axis of ``size`` pixels: ``[K, bins, size]``
    weights, summed over the bin's samples, and the number of samples per bin ``[K]``.

    A bin samples at ``g`` evenly spaced points (``sampling_ratio``, or ``ceil(bin length)``),
    each linearly interpolated between its two pixels; a sample more than a pixel outside the
    map reads 0, one within a pixel of it reads the border pixel (Paddle's rule). With an
    adaptive ``g`` the samples lie at least half a pixel apart, so at most ``2 * size + 3`` of a
    bin's land where they read anything: those are the ones computed, whatever the box's size.
    """
    length = end - start
    if not aligned:
        length = jnp.maximum(length, 1)
    bin_length = length / bins
    if sampling_ratio > 0:
        count = jnp.full_like(start, sampling_ratio, dtype=jnp.int32)
    else:
        count = jnp.maximum(jnp.ceil(bin_length), 0).astype(jnp.int32)
    spacing = (bin_length / jnp.maximum(count, 1))[:, None]
    first = start[:, None] + bin_length[:, None] * jnp.arange(bins)  # [K, bins]: where each bin begins
    if sampling_ratio > 0:
        skip, samples = jnp.zeros_like(first), sampling_ratio
    else:  # from just before the first sample at or after -1: the 2 * size + 3, and one either side for rounding
        skip, samples = jnp.maximum(jnp.ceil((-1 - first) / spacing - 0.5) - 1, 0), 2 * size + 5
    step = skip[..., None] + jnp.arange(samples)  # [K, bins, samples]: which of the bin's samples
    pos = first[..., None] + (step + 0.5) * spacing[..., None]
    valid = (step < count[:, None, None]) & (pos >= -1) & (pos <= size)
    pos = jnp.clip(pos, 0, size - 1)
    k = start.shape[0]
    row = jnp.broadcast_to(jnp.arange(k * bins).reshape(k, bins, 1), pos.shape)
    weights = jnp.zeros((k * bins, size), pos.dtype)
    for index, weight in linear_taps(pos):
        inside = valid & (index <= size - 1)
        weights = weights.at[row, jnp.clip(index, 0, size - 1).astype(jnp.int32)].add(jnp.where(inside, weight, 0))
    return weights.reshape(k, bins, size), count


# The kernels are jitted so that eager calls reuse one compiled kernel per shape and attributes,
# not dispatch their many small operations one by one. Under tracing it is just a nested call.
@functools.partial(jax.jit, static_argnames=("output_size", "spatial_scale", "sampling_ratio", "aligned"))
def _roi_align(x, boxes, boxes_num=None, *, output_size, spatial_scale, sampling_ratio, aligned):
    """Each box of ``boxes`` ``[K, 4]`` pooled from its image of ``x`` ``[N, C, H, W]`` into
    ``output_size`` bins, each the mean of bilinear samples (0 for an empty box): output
    ``[K, C, out_h, out_w]``."""
    op = "roi_align"
    n, _, h, w = x.shape
    if boxes.shape[1] != 4:
        raise input_error(op, "boxes", "shape [K, 4] (x1, y1, x2, y2 per box)", tuple(boxes.shape))
    image = _image_of_each_box(op, boxes, boxes_num, n)
    b = boxes.astype(jnp.promote_types(boxes.dtype, jnp.float32)) * spatial_scale - (0.5 if aligned else 0.0)
    rows, count_y = _bin_weights(b[:, 1], b[:, 3], output_size[0], h, sampling_ratio, aligned)
    cols, count_x = _bin_weights(b[:, 0], b[:, 2], output_size[1], w, sampling_ratio, aligned)
    # bilinear sampling is separable: a bin's mean is rows @ image @ cols^T over the box's image
    rows = rows[:, :, None, :] * (image[:, None] == jnp.arange(n))[:, None, :, None]  # [K, out_h, N, H]
    out = jnp.einsum("kpnh,nchw->kcpw", rows.astype(x.dtype), x)
    out = jnp.einsum("kcpw,kqw->kcpq", out, cols.astype(x.dtype))
    return out / jnp.maximum(count_y * count_x, 1).astype(x.dtype)[:, None, None, None]


def _roi_align_flops(in_shapes, out_shapes, attrs):
    """The two products: rows over every image's map, then columns."""
    (n, c, h, w), (k, _) = in_shapes[0], in_shapes[1]
    out_h, out_w = attrs["output_size"]
    return 2 * k * out_h * n * h * c * w + 2 * k * c * out_h * w * out_w


roi_align = define(
    "roi_align", _roi_align,
    inputs=[Input("x", rank=4, dtype="float"), Input("boxes", rank=2, dtype="float"),
            Input("boxes_num", rank=1, dtype="int", optional=True)],
    attrs={"output_size": Attr("ints", length=2, minimum=1), "spatial_scale": Attr("float", 1.0),
           "sampling_ratio": Attr("int", -1), "aligned": Attr("bool", True)},
    flops=_roi_align_flops,
    # boxes index into the batch of images: padding or chunking the images alone changes them
    traits=Traits(amp="black", batch_coupled=True, saved_for_backward=("operands",)))

# ---------------------------------------------------------------------------------------
# yolo_box


@functools.partial(jax.jit, static_argnames=("anchors", "class_num", "conf_thresh", "downsample_ratio",
                                             "clip_bbox", "scale_x_y", "iou_aware", "iou_aware_factor"))
def _yolo_box(x, img_size, *, anchors, class_num, conf_thresh, downsample_ratio, clip_bbox, scale_x_y, iou_aware,
              iou_aware_factor):
    """Boxes ``[N, A*H*W, 4]`` (x1, y1, x2, y2 in the pixels of each image's ``img_size``
    ``(height, width)``) and class scores ``[N, A*H*W, class_num]`` decoded from a YOLOv3 head
    ``x`` ``[N, A*(5+class_num), H, W]`` (with ``iou_aware``, A IoU channels first); a box whose
    confidence is below ``conf_thresh`` reads all zeros."""
    op = "yolo_box"
    n, channels, h, w = x.shape
    if len(anchors) % 2 or not anchors:
        raise attr_error(op, "anchors", "(width, height) pairs", anchors)
    a, per = len(anchors) // 2, 5 + class_num
    expected, extra = (a * (per + 1), f" + {a} IoU channels") if iou_aware else (a * per, "")
    if channels != expected:
        raise input_error(op, "x", f"{expected} channels ({a} anchors x (5 + class_num={class_num}){extra})",
                          tuple(x.shape))
    if img_size.shape != (n, 2):
        raise input_error(op, "img_size", f"shape ({n}, 2) ((height, width) per image)", tuple(img_size.shape))
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    v = x.astype(dtype)
    iou, v = (v[:, :a], v[:, a:]) if iou_aware else (None, v)
    v = v.reshape(n, a, per, h, w)
    img_h, img_w = (img_size[:, i].astype(dtype).reshape(n, 1, 1, 1) for i in (0, 1))
    anchor_w, anchor_h = (jnp.asarray(anchors[i::2], dtype).reshape(1, a, 1, 1) for i in (0, 1))
    bias = -0.5 * (scale_x_y - 1)
    cx = (jnp.arange(w) + jax.nn.sigmoid(v[:, :, 0]) * scale_x_y + bias) * img_w / w
    cy = (jnp.arange(h)[:, None] + jax.nn.sigmoid(v[:, :, 1]) * scale_x_y + bias) * img_h / h
    half_w = jnp.exp(v[:, :, 2]) * anchor_w * img_w / (downsample_ratio * w) / 2
    half_h = jnp.exp(v[:, :, 3]) * anchor_h * img_h / (downsample_ratio * h) / 2
    x1, y1, x2, y2 = cx - half_w, cy - half_h, cx + half_w, cy + half_h
    if clip_bbox:
        x1, y1 = jnp.maximum(x1, 0), jnp.maximum(y1, 0)
        x2, y2 = jnp.minimum(x2, img_w - 1), jnp.minimum(y2, img_h - 1)
    conf = jax.nn.sigmoid(v[:, :, 4])
    if iou_aware:
        conf = conf ** (1 - iou_aware_factor) * jax.nn.sigmoid(iou) ** iou_aware_factor
    keep = (conf >= conf_thresh)[..., None]  # [N, A, H, W, 1]
    boxes = jnp.where(keep, jnp.stack([x1, y1, x2, y2], axis=-1), 0)
    scores = jnp.where(keep, conf[..., None] * jax.nn.sigmoid(jnp.moveaxis(v[:, :, 5:], 2, -1)), 0)
    return (boxes.reshape(n, a * h * w, 4).astype(x.dtype),
            scores.reshape(n, a * h * w, class_num).astype(x.dtype))


yolo_box = define(
    "yolo_box", _yolo_box,
    inputs=[Input("x", rank=4, dtype="float"), Input("img_size", rank=2, dtype="int")],
    attrs={"anchors": Attr("ints", minimum=1), "class_num": Attr("int", minimum=1),
           "conf_thresh": Attr("float"), "downsample_ratio": Attr("int", minimum=1),
           "clip_bbox": Attr("bool", True), "scale_x_y": Attr("float", 1.0), "iou_aware": Attr("bool", False),
           "iou_aware_factor": Attr("float", 0.5, minimum=0.0)},
    outputs=("boxes", "scores"),
    flops=lambda ins, outs, attrs: 4 * math.prod(ins[0]),
    traits=Traits(amp="black"))

# ---------------------------------------------------------------------------------------
# multiclass_nms


def _overlap(box, boxes, normalized: bool):
    """Paddle's JaccardOverlap of ``box`` [4] with each of ``boxes`` [K, 4]: 0 for boxes apart,
    areas of unnormalised (pixel) boxes counting their last row and column."""
    one = 0.0 if normalized else 1.0
    apart = ((boxes[:, 0] > box[2]) | (boxes[:, 2] < box[0]) | (boxes[:, 1] > box[3]) | (boxes[:, 3] < box[1]))

    def area(b):
        empty = (b[..., 2] < b[..., 0]) | (b[..., 3] < b[..., 1])
        return jnp.where(empty, 0, (b[..., 2] - b[..., 0] + one) * (b[..., 3] - b[..., 1] + one))

    inter = ((jnp.minimum(box[2], boxes[:, 2]) - jnp.maximum(box[0], boxes[:, 0]) + one)
             * (jnp.minimum(box[3], boxes[:, 3]) - jnp.maximum(box[1], boxes[:, 1]) + one))
    return jnp.where(apart, 0, inter / (area(box) + area(boxes) - inter))


def _greedy_nms(boxes, valid, nms_threshold, nms_eta, normalized):
    """Which of the score-sorted candidates ``boxes`` [K, 4] greedy NMS keeps: a valid candidate
    is kept when its overlap with every kept one before it is at most the threshold, which
    ``nms_eta`` < 1 shrinks after each kept box while it is above 0.5."""
    def step(i, carry):
        keep, threshold = carry
        # not (overlap <= threshold): an undefined (NaN) overlap suppresses, as in Paddle
        suppressed = jnp.any(keep & ~(_overlap(boxes[i], boxes, normalized) <= threshold))
        kept = valid[i] & ~suppressed
        if nms_eta < 1:
            threshold = jnp.where(kept & (threshold > 0.5), threshold * nms_eta, threshold)
        return keep.at[i].set(kept), threshold

    # the carry starts from the operands, so that inside shard_map it varies as they do
    start = (jnp.zeros_like(valid), jnp.full_like(boxes[0, 0], nms_threshold))
    return lax.fori_loop(0, boxes.shape[0], step, start)[0]


@functools.partial(jax.jit, static_argnames=("score_threshold", "nms_top_k", "keep_top_k", "nms_threshold",
                                             "normalized", "nms_eta", "background_label"))
def _multiclass_nms(bboxes, scores, *, score_threshold, nms_top_k, keep_top_k, nms_threshold, normalized, nms_eta,
                    background_label):
    """Per image, greedy NMS of each class's boxes, then the ``keep_top_k`` best-scoring of all
    classes: ``out`` ``[N, rows, 6]`` (label, score, x1, y1, x2, y2) listed class by class, each
    class best first, the rows after the valid ones label -1 and zeros; ``index`` ``[N, rows]``
    each row's box in the flattened ``[N * M]`` boxes (-1 for padding); ``nms_rois_num`` ``[N]``
    the valid rows. ``rows`` is ``keep_top_k``, or every candidate when it is -1. Not
    differentiable: gradients through it are zero."""
    op = "multiclass_nms"
    n, m, coords = bboxes.shape
    if coords != 4:
        raise input_error(op, "bboxes", "shape [N, M, 4] (x1, y1, x2, y2 per box)", tuple(bboxes.shape))
    if scores.shape[0] != n or scores.shape[2] != m:
        raise input_error(op, "scores", f"shape [{n}, C, {m}] (per image, class and box of bboxes)",
                          tuple(scores.shape))
    bboxes, scores = lax.stop_gradient(bboxes), lax.stop_gradient(scores.astype(bboxes.dtype))
    classes = [c for c in range(scores.shape[1]) if c != background_label]
    k = m if nms_top_k < 0 else min(nms_top_k, m)
    rows = keep_top_k if keep_top_k >= 0 else len(classes) * k

    def per_image(boxes, class_scores, image):
        top, order = lax.top_k(class_scores[jnp.asarray(classes, jnp.int32)], k)  # ties: lower index first
        candidates = boxes[order]  # [C', K, 4]
        valid = top > jnp.asarray(score_threshold, top.dtype)
        keep = jax.vmap(_greedy_nms, (0, 0, None, None, None))(candidates, valid, nms_threshold, nms_eta,
                                                               normalized).reshape(-1)
        ranked = jnp.where(keep, top.reshape(-1), -jnp.inf)
        if rows > ranked.shape[0]:
            ranked = jnp.pad(ranked, (0, rows - ranked.shape[0]), constant_values=-jnp.inf)
            keep = jnp.pad(keep, (0, rows - keep.shape[0]))
        best = lax.top_k(ranked, rows)[1]  # the best kept detections, ties in class order
        chosen = keep[best]
        # Paddle lists them class by class and, within a class, best first: the candidates' order
        best = jnp.sort(jnp.where(chosen, best, ranked.shape[0]))
        chosen = best < ranked.shape[0]
        slot = jnp.minimum(best, len(classes) * k - 1)
        label = jnp.asarray(classes, boxes.dtype)[slot // k]
        row = jnp.concatenate([label[:, None], top.reshape(-1)[slot][:, None], candidates.reshape(-1, 4)[slot]], 1)
        out = jnp.where(chosen[:, None], row, jnp.array([-1, 0, 0, 0, 0, 0], boxes.dtype))
        index = jnp.where(chosen, image * m + order.reshape(-1)[slot], -1).astype(jnp.int32)
        return out, index, jnp.sum(chosen, dtype=jnp.int32)

    if not classes or k == 0:  # nothing can be kept
        return (jnp.tile(jnp.array([-1, 0, 0, 0, 0, 0], bboxes.dtype), (n, rows, 1)),
                jnp.full((n, rows), -1, jnp.int32), jnp.zeros(n, jnp.int32))
    return jax.vmap(per_image)(bboxes, scores, jnp.arange(n))


def _nms_flops(in_shapes, out_shapes, attrs):
    """Each class's candidates against each other: K^2 overlaps of about 12 FLOPs."""
    n, classes, m = in_shapes[1]
    k = m if attrs["nms_top_k"] < 0 else min(attrs["nms_top_k"], m)
    return 12 * n * classes * k * k


multiclass_nms = define(
    "multiclass_nms", _multiclass_nms,
    inputs=[Input("bboxes", rank=3, dtype="float"), Input("scores", rank=3, dtype="float")],
    attrs={"score_threshold": Attr("float"), "nms_top_k": Attr("int", minimum=-1),
           "keep_top_k": Attr("int", minimum=-1), "nms_threshold": Attr("float", 0.3),
           "normalized": Attr("bool", True), "nms_eta": Attr("float", 1.0, minimum=0.0),
           "background_label": Attr("int", 0, minimum=-1)},
    outputs=("out", "index", "nms_rois_num"), flops=_nms_flops,
    # selection, not arithmetic: no gradient, and coordinates kept in float32
    traits=Traits(amp="black", saved_for_backward=()))
