"""YOLOv3 (Redmon and Farhadi 2018) as PaddleDetection builds it: a DarkNet-53 or YOLOv3-tiny
backbone, a feature pyramid of detection blocks, one head per scale predicting, for each of its
anchors and grid cells, box offsets, objectness and per-class scores; its loss (Paddle's
``yolov3_loss``: sigmoid cross-entropy on the centre offsets, L1 on the log sizes, objectness
with predictions that already overlap a box ignored, sigmoid class scores), and decoding by the
``yolo_box`` and ``multiclass_nms`` ops.

``dcn=True`` makes the 3x3 convolutions of the deepest stage deformable (DCN v2, PaddleDetection's
``dcn_v2_stages=[5]``).

>>> import numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> model = YOLOv3(num_classes=3, backbone="tiny", width=0.25)
>>> [o.shape for o in model(np.zeros((1, 3, 64, 64), np.float32))]
[(1, 24, 2, 2), (1, 24, 4, 4)]
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paddlejax import nn, ops
from paddlejax.boxes import DetectionMAP
from paddlejax.models.blocks import ConvNormActivation

# COCO's anchors (width, height in pixels at 416), smallest first, and which of them each scale
# predicts (the deepest scale the largest)
COCO_ANCHORS = {"darknet53": ((10, 13), (16, 30), (33, 23), (30, 61), (62, 45), (59, 119), (116, 90), (156, 198),
                              (373, 326)),
                "tiny": ((10, 14), (23, 27), (37, 58), (81, 82), (135, 169), (344, 319))}
ANCHOR_MASKS = {"darknet53": ((6, 7, 8), (3, 4, 5), (0, 1, 2)), "tiny": ((3, 4, 5), (0, 1, 2))}

_Leaky = functools.partial(nn.LeakyReLU, 0.1)


class DeformableConvV2(nn.Layer):
    """A 3x3 DCN v2 layer that predicts its own offsets and modulation (PaddleDetection's
    ``DeformableConvV2``): a convolution of the input gives ``2 * 9`` offsets and ``9`` mask
    logits per position. That convolution starts at zero: offsets 0 and masks 0.5, a plain
    convolution (scaled) until training moves the taps.

    >>> import numpy as np
    >>> DeformableConvV2(4, 8, stride=2)(np.ones((1, 4, 6, 6), np.float32)).shape
    (1, 8, 3, 3)
    """

    def __init__(self, cin: int, cout: int, stride: int = 1):
        zero = nn.initializer.Constant(0.0)
        self.offsets = nn.Conv2D(cin, 27, 3, stride=stride, padding=1, weight_attr=nn.ParamAttr(initializer=zero))
        self.conv = nn.DeformConv2D(cin, cout, 3, stride=stride, padding=1, bias_attr=False)

    def forward(self, x):
        out = self.offsets(x)
        return self.conv(x, out[:, :18], jax.nn.sigmoid(out[:, 18:]))


def _conv(cin: int, cout: int, kernel: int = 3, stride: int = 1, dcn: bool = False) -> nn.Layer:
    """Conv (no bias) -> batch norm -> leaky ReLU(0.1); deformable when ``dcn`` (3x3 only)."""
    if dcn and kernel == 3:
        return nn.Sequential(DeformableConvV2(cin, cout, stride), nn.BatchNorm2D(cout), _Leaky())
    return ConvNormActivation(cin, cout, kernel, stride=stride, activation_layer=_Leaky)


class _Residual(nn.Layer):
    """DarkNet's residual block: 1x1 to half the channels, 3x3 back, added to the input."""

    def __init__(self, channels: int, dcn: bool = False):
        self.conv1 = _conv(channels, channels // 2, 1)
        self.conv2 = _conv(channels // 2, channels, 3, dcn=dcn)

    def forward(self, x):
        return x + self.conv2(self.conv1(x))


class DarkNet53(nn.Layer):
    """DarkNet-53: a 3x3 stem, then five stages, each a stride-2 3x3 convolution and 1, 2, 8, 8
    and 4 residual blocks; returns the last three stages' features (strides 8, 16, 32) with
    ``256, 512, 1024`` channels times ``width``.

    >>> import numpy as np
    >>> [f.shape for f in DarkNet53(width=0.125)(np.zeros((1, 3, 32, 32), np.float32))]
    [(1, 32, 4, 4), (1, 64, 2, 2), (1, 128, 1, 1)]
    """

    def __init__(self, width: float = 1.0, dcn: bool = False):
        c = lambda n: max(8, int(n * width))  # noqa: E731
        self.stem = _conv(3, c(32))
        stages, cin = [], c(32)
        for i, blocks in enumerate((1, 2, 8, 8, 4)):
            cout, last = c(64 * 2 ** i), i == 4
            stages.append(nn.Sequential(_conv(cin, cout, 3, stride=2),
                                        *[_Residual(cout, dcn=dcn and last) for _ in range(blocks)]))
            cin = cout
        self.stages = nn.LayerList(stages)
        self.channels = (c(256), c(512), c(1024))
        self.strides = (8, 16, 32)

    def forward(self, x):
        x, outs = self.stem(x), []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs[2:]


class TinyBackbone(nn.Layer):
    """YOLOv3-tiny's backbone: 3x3 convolutions of 16 to 1024 channels (times ``width``) with
    2x2 max pooling between them; returns the features at strides 16 and 32, or at 8 and 16
    with ``output_stride=16`` (one max pooling fewer: a grid twice as fine for small images).

    >>> import numpy as np
    >>> [f.shape for f in TinyBackbone(width=0.25)(np.zeros((1, 3, 64, 64), np.float32))]
    [(1, 64, 4, 4), (1, 256, 2, 2)]
    >>> TinyBackbone(width=0.25, output_stride=16).strides
    (8, 16)
    """

    def __init__(self, width: float = 1.0, dcn: bool = False, output_stride: int = 32):
        if output_stride not in (16, 32):
            raise ValueError(f"TinyBackbone: output_stride expects 16 or 32, got {output_stride!r}")
        c = lambda n: max(8, int(n * width))  # noqa: E731
        chans = [c(16 * 2 ** i) for i in range(7)]
        pools = 4 if output_stride == 32 else 3
        self.early = nn.Sequential(*[layer for i in range(5) for layer in
                                     (_conv(3 if i == 0 else chans[i - 1], chans[i]),
                                      *([nn.MaxPool2D(2)] if i < pools else []))])
        # one stride more: pool, a 3x3 conv, a stride-1 pool (padded on the right and bottom), a 3x3 conv
        self.pool = nn.MaxPool2D(2)
        self.conv5 = _conv(chans[4], chans[5], dcn=dcn)
        self.pad = nn.Pad2D((0, 1, 0, 1), mode="replicate")
        self.pool_same = nn.MaxPool2D(2, stride=1)
        self.conv6 = _conv(chans[5], chans[6], dcn=dcn)
        self.channels = (chans[4], chans[6])
        self.strides = (output_stride // 2, output_stride)

    def forward(self, x):
        c4 = self.early(x)
        c5 = self.conv6(self.pool_same(self.pad(self.conv5(self.pool(c4)))))
        return [c4, c5]


class _DetectionBlock(nn.Layer):
    """YOLOv3's detection block: five alternating 1x1 / 3x3 convolutions (``route``, kept for
    the next scale) then a 3x3 (``tip``, fed to the head)."""

    def __init__(self, cin: int, channels: int):
        self.convs = nn.Sequential(_conv(cin, channels, 1), _conv(channels, 2 * channels), _conv(2 * channels, channels, 1),
                                   _conv(channels, 2 * channels), _conv(2 * channels, channels, 1))
        self.tip = _conv(channels, 2 * channels)

    def forward(self, x):
        route = self.convs(x)
        return route, self.tip(route)


class YOLOv3(nn.Layer):
    """YOLOv3 for ``num_classes`` classes; ``backbone`` ``"darknet53"`` (three scales) or
    ``"tiny"`` (two). ``anchors`` are ``(width, height)`` pixel pairs, smallest first, 3 per
    scale, rounded to whole pixels (the backbone's :data:`COCO_ANCHORS` by default;
    :func:`paddlejax.boxes.kmeans_anchors` fits them to a data set). ``width`` scales every layer's channels; ``output_stride=16`` gives the tiny backbone a
    grid twice as fine (strides 16 and 8) for small images. The forward pass returns one raw
    map per scale, deepest first: ``[N, 3 * (5 + num_classes), H / stride, W / stride]``;
    :meth:`loss` trains them, :meth:`detect` decodes them.
    """

    def __init__(self, num_classes: int, backbone: str = "darknet53", anchors: Sequence | None = None,
                 width: float = 1.0, dcn: bool = False, ignore_thresh: float = 0.7, label_smooth: bool = False,
                 output_stride: int = 32):
        if backbone not in ANCHOR_MASKS:
            raise ValueError(f"YOLOv3: backbone expects one of {list(ANCHOR_MASKS)}, got {backbone!r}")
        masks = ANCHOR_MASKS[backbone]
        # whole pixels, as the yolo_box op takes them, so the loss and the decoding use the same
        anchors = tuple(tuple(float(round(float(v))) for v in a)
                        for a in (COCO_ANCHORS[backbone] if anchors is None else anchors))
        if len(anchors) != 3 * len(masks) or any(len(a) != 2 or min(a) <= 0 for a in anchors):
            raise ValueError(f"YOLOv3: the {backbone} backbone expects {3 * len(masks)} anchors of (width, height) > 0, "
                             f"got {anchors}")
        self.num_classes, self.anchors, self.masks = num_classes, anchors, masks
        self.ignore_thresh, self.label_smooth = ignore_thresh, label_smooth
        if backbone == "darknet53" and output_stride != 32:
            raise ValueError(f"YOLOv3: output_stride {output_stride} is for the tiny backbone; DarkNet-53's is 32")
        self.backbone = DarkNet53(width, dcn) if backbone == "darknet53" else TinyBackbone(width, dcn, output_stride)
        self.strides = self.backbone.strides[::-1]
        feats = self.backbone.channels[::-1]
        out = 3 * (5 + num_classes)
        if backbone == "darknet53":
            widths = [max(8, int(n * width)) for n in (512, 256, 128)]
            blocks, laterals, cin = [], [], feats[0]
            for i, channels in enumerate(widths):
                blocks.append(_DetectionBlock(cin, channels))
                if i < 2:
                    laterals.append(_conv(channels, channels // 2, 1))
                    cin = channels // 2 + feats[i + 1]
            self.blocks, self.laterals = nn.LayerList(blocks), nn.LayerList(laterals)
            tips = [2 * c for c in widths]
        else:  # tiny: a 1x1 route and a 3x3 tip at stride 32, an upsampled route and a 3x3 tip at 16
            c = max(8, int(256 * width))
            self.route = _conv(feats[0], c, 1)
            self.tip = _conv(c, 2 * c)
            self.lateral = _conv(c, c // 2, 1)
            self.tip16 = _conv(c // 2 + feats[1], c)
            tips = [2 * c, c]
        self.heads = nn.LayerList([nn.Conv2D(t, out, 1) for t in tips])
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x):
        feats = self.backbone(x)[::-1]  # deepest first
        if hasattr(self, "blocks"):
            tips, h = [], feats[0]
            for i, block in enumerate(self.blocks):
                route, tip = block(h)
                tips.append(tip)
                if i < 2:
                    h = jnp.concatenate([self.upsample(self.laterals[i](route)), feats[i + 1]], axis=1)
        else:
            route = self.route(feats[0])
            up = jnp.concatenate([self.upsample(self.lateral(route)), feats[1]], axis=1)
            tips = [self.tip(route), self.tip16(up)]
        return [head(t) for head, t in zip(self.heads, tips)]

    # -- training ------------------------------------------------------------------------------

    def loss(self, outputs, targets, image_size: int):
        """The YOLOv3 loss of ``outputs`` (the forward pass's maps) against ``targets``
        ``[N, G, 5]`` rows of ``(label, x1, y1, x2, y2)`` in pixels (label -1 pads), for square
        images of ``image_size`` pixels, summed over boxes and cells and averaged over images.

        Each box is assigned to the anchor (of all scales) whose shape overlaps it most, in the
        cell holding its centre. There the loss has sigmoid cross-entropy on the centre offset
        in the cell, L1 on ``log(size / anchor)``, both weighted by ``2 - w h / image area``,
        objectness 1 and sigmoid cross-entropy on the classes; elsewhere objectness 0, except
        for predictions whose box already overlaps a box by more than ``ignore_thresh``."""
        targets = jnp.asarray(targets, jnp.float32)
        labels, boxes = targets[..., 0], targets[..., 1:]
        valid = labels >= 0
        wh = boxes[..., 2:] - boxes[..., :2]
        centre = (boxes[..., :2] + boxes[..., 2:]) / 2
        anchors = jnp.asarray(self.anchors)
        inter = jnp.prod(jnp.minimum(wh[..., None, :], anchors), -1)
        shape_iou = inter / (jnp.prod(wh, -1)[..., None] + jnp.prod(anchors, -1) - inter)
        best = jnp.argmax(shape_iou, -1)  # [N, G]
        total = 0.0
        for out, mask, stride in zip(outputs, self.masks, self.strides):
            total = total + self._scale_loss(out, labels, boxes, valid, wh, centre, best, mask, stride, image_size)
        return total / outputs[0].shape[0]

    def _scale_loss(self, out, labels, boxes, valid, wh, centre, best, mask, stride, image_size):
        n, _, h, w = out.shape
        p = out.reshape(n, 3, 5 + self.num_classes, h, w).transpose(0, 1, 3, 4, 2)  # [N, 3, H, W, 5 + C]
        anchors = jnp.asarray([self.anchors[m] for m in mask])
        # targets scattered to (image, anchor, row, column); boxes of other scales go out of bounds
        local = jnp.argmax(best[..., None] == jnp.asarray(mask), -1)
        mine = valid & jnp.isin(best, jnp.asarray(mask))
        gi = jnp.clip((centre[..., 0] / stride).astype(jnp.int32), 0, w - 1)
        gj = jnp.clip((centre[..., 1] / stride).astype(jnp.int32), 0, h - 1)
        image = jnp.where(mine, jnp.arange(n)[:, None], n)
        where = (image, local, gj, gi)
        xy = centre / stride - jnp.stack([gi, gj], -1)
        twh = jnp.log(jnp.maximum(wh, 1e-6) / anchors[local])
        weight = 2.0 - jnp.prod(wh, -1) / image_size ** 2
        onehot = jax.nn.one_hot(labels.astype(jnp.int32), self.num_classes)
        if self.label_smooth:
            delta = min(1.0 / self.num_classes, 1.0 / 40)
            onehot = onehot * (1 - delta) + delta / self.num_classes
        grid = (n, 3, h, w)
        scatter = lambda v, shape=(): jnp.zeros(grid + shape).at[where].set(v, mode="drop")  # noqa: E731
        obj_mask = scatter(1.0)
        t_xy, t_wh, t_w, t_cls = scatter(xy, (2,)), scatter(twh, (2,)), scatter(weight), scatter(onehot, (self.num_classes,))
        bce = functools.partial(nn.functional.binary_cross_entropy_with_logits, reduction="none")
        loss_xy = (bce(p[..., 0:2], t_xy).sum(-1) * t_w * obj_mask).sum()
        loss_wh = (jnp.abs(p[..., 2:4] - t_wh).sum(-1) * t_w * obj_mask).sum()
        loss_cls = (bce(p[..., 5:], t_cls).sum(-1) * obj_mask).sum()
        # predictions already overlapping some box well are not pushed towards "no object"
        pred = self._decode(jax.lax.stop_gradient(p), anchors, stride)  # [N, 3, H, W, 4]
        overlap = _iou(pred.reshape(n, -1, 4), boxes, valid).max(-1, initial=0.0).reshape(grid)
        noobj = (1.0 - obj_mask) * (overlap <= self.ignore_thresh)
        objectness = p[..., 4]
        loss_obj = (bce(objectness, jnp.ones_like(objectness)) * obj_mask
                    + bce(objectness, jnp.zeros_like(objectness)) * noobj).sum()
        return loss_xy + loss_wh + loss_obj + loss_cls

    @staticmethod
    def _decode(p, anchors, stride):
        """Pixel boxes ``x1, y1, x2, y2`` of the raw predictions ``p`` ``[N, 3, H, W, 5 + C]``."""
        h, w = p.shape[2:4]
        cx = (jax.nn.sigmoid(p[..., 0]) + jnp.arange(w)) * stride
        cy = (jax.nn.sigmoid(p[..., 1]) + jnp.arange(h)[:, None]) * stride
        bw = jnp.exp(p[..., 2]) * anchors[:, 0, None, None]
        bh = jnp.exp(p[..., 3]) * anchors[:, 1, None, None]
        return jnp.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1)

    # -- inference -----------------------------------------------------------------------------

    def detect(self, outputs, image_size: int, conf_thresh: float = 0.01, nms_threshold: float = 0.45,
               keep_top_k: int = 100, nms_top_k: int = 400):
        """Decode ``outputs`` with ``yolo_box`` and keep the best boxes with ``multiclass_nms``:
        ``(detections [N, keep_top_k, 6], counts [N])``, rows ``(label, score, x1, y1, x2, y2)``
        padded with label -1."""
        n = outputs[0].shape[0]
        size = jnp.full((n, 2), image_size, jnp.int32)
        boxes, scores = [], []
        for out, mask, stride in zip(outputs, self.masks, self.strides):
            anchors = [int(v) for m in mask for v in self.anchors[m]]  # whole pixels already
            b, s = ops.yolo_box(out, size, anchors=anchors, class_num=self.num_classes, conf_thresh=conf_thresh,
                                downsample_ratio=stride, clip_bbox=True)
            boxes.append(b)
            scores.append(s)
        boxes, scores = jnp.concatenate(boxes, 1), jnp.concatenate(scores, 1).transpose(0, 2, 1)
        out, _, count = ops.multiclass_nms(boxes, scores, score_threshold=conf_thresh, nms_top_k=nms_top_k,
                                           keep_top_k=keep_top_k, nms_threshold=nms_threshold, normalized=False,
                                           background_label=-1)
        return out, count


def evaluate_map(model: YOLOv3, images: np.ndarray, targets: np.ndarray, batch_size: int = 64,
                 method: str = "integral", **detect) -> DetectionMAP:
    """Detect on ``images`` ``[N, 3, S, S]`` in eval mode and score against ``targets``
    ``[N, G, 5]`` (label, x1, y1, x2, y2; label -1 pads): the filled
    :class:`~paddlejax.boxes.DetectionMAP` (``.accumulate()`` is mAP@0.5). ``detect`` goes to
    :meth:`YOLOv3.detect`.

    >>> import numpy as np, paddlejax as pj
    >>> from paddlejax.data.shapes import Shapes
    >>> pj.nn.seed(0)
    >>> images, targets = Shapes("test", num_images=2, image_size=32).arrays()
    >>> evaluate_map(yolov3_tiny(3, width=0.25), images, targets).accumulate() < 0.1  # untrained
    True
    """
    size = images.shape[-1]
    training = model.training
    model.eval()
    graphdef, state = nnx.split(model)
    metric = DetectionMAP(model.num_classes, method=method)
    batch = max(1, min(batch_size, len(images)))
    for i in range(0, len(images), batch):
        x = images[i:i + batch]
        # the last batch padded to the others' size: one compiled detector serves every batch
        # (eval mode: an image's detections do not depend on the others in its batch)
        padded = np.concatenate([x, np.zeros((batch - len(x), *x.shape[1:]), x.dtype)]) if len(x) < batch else x
        found, _ = _detect_batch(graphdef, state, padded, size, tuple(sorted(detect.items())))
        for rows, truth in zip(np.asarray(found)[:len(x)], targets[i:i + batch]):
            rows, truth = rows[rows[:, 0] >= 0], truth[truth[:, 0] >= 0]
            metric.update(rows[:, 2:], rows[:, 1], rows[:, 0], truth[:, 1:], truth[:, 0])
    if training:
        model.train()
    return metric


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _detect_batch(graphdef, state, x, size: int, detect: tuple):
    """One batch's detections, compiled once per model structure, batch shape and options (the
    weights are arguments, so a later call, or another model of the same structure, reuses it)."""
    model = nnx.merge(graphdef, state)
    return model.detect(model(x), size, **dict(detect))


def _iou(a, b, valid):
    """IoU of boxes ``a`` ``[N, K, 4]`` with ``b`` ``[N, G, 4]`` (0 where ``valid`` is false): ``[N, K, G]``."""
    lo = jnp.maximum(a[:, :, None, :2], b[:, None, :, :2])
    hi = jnp.minimum(a[:, :, None, 2:], b[:, None, :, 2:])
    inter = jnp.prod(jnp.clip(hi - lo, 0), -1)
    area = lambda z: jnp.prod(z[..., 2:] - z[..., :2], -1)  # noqa: E731
    out = inter / jnp.maximum(area(a)[:, :, None] + area(b)[:, None, :] - inter, 1e-9)
    return jnp.where(valid[:, None, :], out, 0.0)


def yolov3_darknet53(num_classes: int = 80, **kwargs) -> YOLOv3:
    """YOLOv3 on DarkNet-53 (three scales).

    >>> yolov3_darknet53(3, width=0.125).strides
    (32, 16, 8)
    """
    return YOLOv3(num_classes, "darknet53", **kwargs)


def yolov3_tiny(num_classes: int = 80, **kwargs) -> YOLOv3:
    """YOLOv3-tiny (two scales).

    >>> yolov3_tiny(3, width=0.25).strides
    (32, 16)
    """
    return YOLOv3(num_classes, "tiny", **kwargs)

