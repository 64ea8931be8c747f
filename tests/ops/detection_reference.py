"""Plain numpy/python references for the detection and sampling ops, written as loops after
Paddle's CPU kernels (deformable_conv's im2col, roi_align, grid_sample, yolo_box,
multiclass_nms3), in float64, independently of the JAX kernels."""
from __future__ import annotations

import math

import numpy as np


def _dmcn_bilinear(image, h, w):
    """Paddle's DmcnIm2colBilinear: ``image`` [C, H, W] at (h, w); 0 outside (-1, H) x (-1, W)."""
    height, width = image.shape[1:]
    if not (-1 < h < height and -1 < w < width):
        return np.zeros(image.shape[0])
    hl, wl = math.floor(h), math.floor(w)
    lh, lw = h - hl, w - wl

    def at(y, x):
        return image[:, y, x] if 0 <= y <= height - 1 and 0 <= x <= width - 1 else 0.0

    return ((1 - lh) * (1 - lw) * at(hl, wl) + (1 - lh) * lw * at(hl, wl + 1) + lh * (1 - lw) * at(hl + 1, wl)
            + lh * lw * at(hl + 1, wl + 1))


def np_deform_conv(x, offset, weight, mask=None, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                   deformable_groups=1, groups=1):
    """Modulated deformable convolution: im2col by bilinear sampling, then a grouped product."""
    x = x.astype(np.float64)
    n, cin, _, _ = x.shape
    cout, cin_g, kh, kw = weight.shape
    ho, wo = offset.shape[2:]
    cols = np.zeros((n, cin, kh * kw, ho, wo))
    per_group = cin // deformable_groups
    for b in range(n):
        for g in range(deformable_groups):
            channels = slice(g * per_group, (g + 1) * per_group)
            for i in range(kh):
                for j in range(kw):
                    k = i * kw + j
                    for oh in range(ho):
                        for ow in range(wo):
                            dy = offset[b, 2 * (g * kh * kw + k), oh, ow]
                            dx = offset[b, 2 * (g * kh * kw + k) + 1, oh, ow]
                            h = oh * stride[0] - padding[0] + i * dilation[0] + dy
                            w = ow * stride[1] - padding[1] + j * dilation[1] + dx
                            m = 1.0 if mask is None else mask[b, g * kh * kw + k, oh, ow]
                            cols[b, channels, k, oh, ow] = m * _dmcn_bilinear(x[b, channels], h, w)
    out = np.zeros((n, cout, ho, wo))
    og = cout // groups
    for g in range(groups):
        w_g = weight[g * og:(g + 1) * og].reshape(og, cin_g, kh * kw)
        out[:, g * og:(g + 1) * og] = np.einsum("nckhw,ock->nohw", cols[:, g * cin_g:(g + 1) * cin_g], w_g)
    return out if bias is None else out + bias[:, None, None]


def _roi_bilinear(image, y, x):
    """Paddle's roi_align sample: 0 beyond one pixel outside the map, else clamped and bilinear."""
    height, width = image.shape[1:]
    if y < -1 or y > height or x < -1 or x > width:
        return np.zeros(image.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    yl, xl = int(y), int(x)
    if yl >= height - 1:
        yl = yh = height - 1
        y = float(yl)
    else:
        yh = yl + 1
    if xl >= width - 1:
        xl = xh = width - 1
        x = float(xl)
    else:
        xh = xl + 1
    ly, lx = y - yl, x - xl
    return ((1 - ly) * (1 - lx) * image[:, yl, xl] + (1 - ly) * lx * image[:, yl, xh]
            + ly * (1 - lx) * image[:, yh, xl] + ly * lx * image[:, yh, xh])


def np_roi_align(x, boxes, boxes_num, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True):
    """Each box averaged over its bins' sample grids; an empty grid gives 0."""
    x = x.astype(np.float64)
    ph, pw = output_size
    image_of = np.repeat(np.arange(len(boxes_num)), boxes_num)
    out = np.zeros((len(boxes), x.shape[1], ph, pw))
    offset = 0.5 if aligned else 0.0
    for k, box in enumerate(boxes.astype(np.float64)):
        x1, y1, x2, y2 = box * spatial_scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        grid_h = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_h / ph), 0)
        grid_w = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_w / pw), 0)
        for p in range(ph):
            for q in range(pw):
                total = np.zeros(x.shape[1])
                for iy in range(grid_h):
                    y = y1 + p * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        xx = x1 + q * bin_w + (ix + 0.5) * bin_w / grid_w
                        total += _roi_bilinear(x[image_of[k]], y, xx)
                out[k, :, p, q] = total / max(grid_h * grid_w, 1)
    return out


def _grid_coord(g, size, padding_mode, align_corners):
    """Paddle's Unnormalize then Clip for one coordinate."""
    coord = (g + 1) * (size - 1) / 2 if align_corners else (g + 1) * size / 2 - 0.5
    if padding_mode == "border":
        coord = min(max(coord, 0.0), size - 1.0)
    elif padding_mode == "reflection":
        if align_corners:
            double = 2.0 * (size - 1)
            if double == 0:
                return 0.0
            a = abs(coord)
            extra = a - math.floor(a / double) * double
            coord = min(extra, double - extra)
        else:
            double = 2.0 * size
            a = abs(coord + 0.5)
            extra = a - math.floor(a / double) * double
            coord = min(max(min(extra, double - extra) - 0.5, 0.0), size - 1.0)
    return coord


def _round_half_away(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def np_grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True):
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    ho, wo = grid.shape[1:3]
    out = np.zeros((n, c, ho, wo))

    def at(b, yy, xx):
        return x[b, :, yy, xx] if 0 <= yy <= h - 1 and 0 <= xx <= w - 1 else 0.0

    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                gx = _grid_coord(float(grid[b, i, j, 0]), w, padding_mode, align_corners)
                gy = _grid_coord(float(grid[b, i, j, 1]), h, padding_mode, align_corners)
                if mode == "nearest":
                    out[b, :, i, j] = at(b, _round_half_away(gy), _round_half_away(gx))
                    continue
                x0, y0 = math.floor(gx), math.floor(gy)
                dx, dy = gx - x0, gy - y0
                out[b, :, i, j] = ((1 - dx) * (1 - dy) * at(b, y0, x0) + dx * (1 - dy) * at(b, y0, x0 + 1)
                                   + (1 - dx) * dy * at(b, y0 + 1, x0) + dx * dy * at(b, y0 + 1, x0 + 1))
    return out


def _sigmoid(v):
    return 1 / (1 + math.exp(-v))


def np_yolo_box(x, img_size, anchors, class_num, conf_thresh, downsample_ratio, clip_bbox=True, scale_x_y=1.0,
                iou_aware=False, iou_aware_factor=0.5):
    """Paddle's YoloBoxKernel loop."""
    x = x.astype(np.float64)
    n, _, h, w = x.shape
    an = len(anchors) // 2
    boxes = np.zeros((n, an * h * w, 4))
    scores = np.zeros((n, an * h * w, class_num))
    bias = -0.5 * (scale_x_y - 1)
    for i in range(n):
        img_h, img_w = img_size[i]
        iou = x[i, :an] if iou_aware else None
        head = x[i, an:] if iou_aware else x[i]
        for a in range(an):
            entry = head[a * (5 + class_num):(a + 1) * (5 + class_num)]
            for k in range(h):
                for l in range(w):
                    conf = _sigmoid(entry[4, k, l])
                    if iou_aware:
                        conf = conf ** (1 - iou_aware_factor) * _sigmoid(iou[a, k, l]) ** iou_aware_factor
                    if conf < conf_thresh:
                        continue
                    cx = (l + _sigmoid(entry[0, k, l]) * scale_x_y + bias) * img_w / w
                    cy = (k + _sigmoid(entry[1, k, l]) * scale_x_y + bias) * img_h / h
                    bw = math.exp(entry[2, k, l]) * anchors[2 * a] * img_w / (downsample_ratio * w)
                    bh = math.exp(entry[3, k, l]) * anchors[2 * a + 1] * img_h / (downsample_ratio * h)
                    box = [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]
                    if clip_bbox:
                        box = [max(box[0], 0), max(box[1], 0), min(box[2], img_w - 1), min(box[3], img_h - 1)]
                    row = a * h * w + k * w + l
                    boxes[i, row] = box
                    scores[i, row] = [conf * _sigmoid(entry[5 + c, k, l]) for c in range(class_num)]
    return boxes, scores


def _jaccard(a, b, normalized):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    one = 0.0 if normalized else 1.0

    def area(box):
        if box[2] < box[0] or box[3] < box[1]:
            return 0.0
        return (box[2] - box[0] + one) * (box[3] - box[1] + one)

    inter = (min(a[2], b[2]) - max(a[0], b[0]) + one) * (min(a[3], b[3]) - max(a[1], b[1]) + one)
    union = area(a) + area(b) - inter
    return inter / union if union else math.nan


def python_multiclass_nms(bboxes, scores, score_threshold, nms_top_k, keep_top_k, nms_threshold=0.3,
                          normalized=True, nms_eta=1.0, background_label=0):
    """Paddle's MultiClassNMS + MultiClassOutput per image, as lists of (label, score, box, index) rows."""
    images = []
    for i in range(len(bboxes)):
        selected = {}
        for c in range(scores.shape[1]):
            if c == background_label:
                continue
            order = sorted((m for m in range(bboxes.shape[1]) if scores[i, c, m] > score_threshold),
                           key=lambda m: -scores[i, c, m])  # sorted() is stable: ties keep index order
            if nms_top_k > -1:
                order = order[:nms_top_k]
            kept, threshold = [], nms_threshold
            for m in order:
                if all(_jaccard(bboxes[i, m], bboxes[i, j], normalized) <= threshold for j in kept):
                    kept.append(m)
                    if nms_eta < 1 and threshold > 0.5:
                        threshold *= nms_eta
            selected[c] = kept
        pairs = [(scores[i, c, m], c, m) for c in sorted(selected) for m in selected[c]]
        if -1 < keep_top_k < len(pairs):
            pairs = sorted(pairs, key=lambda p: -p[0])[:keep_top_k]
            selected = {c: [m for _, cc, m in pairs if cc == c] for c in selected}
        images.append([(c, scores[i, c, m], bboxes[i, m], i * bboxes.shape[1] + m)
                       for c in sorted(selected) for m in selected[c]])
    return images


def padded_nms(images, rows):
    """The rows of :func:`python_multiclass_nms` as the op lays them out: ``rows`` per image,
    padding label -1 and zeros (index -1), and the count of each image's valid rows."""
    out = np.zeros((len(images), rows, 6))
    out[:, :, 0] = -1
    index = np.full((len(images), rows), -1)
    for i, found in enumerate(images):
        for r, (label, score, box, idx) in enumerate(found):
            out[i, r] = [label, score, *box]
            index[i, r] = idx
    return out, index, np.array([len(found) for found in images])


def np_sigmoid_focal_loss(logit, label, normalizer=None, alpha=0.25, gamma=2.0, reduction="sum"):
    x, y = logit.astype(np.float64), label.astype(np.float64)
    p = 1 / (1 + np.exp(-x))
    ce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    p_t = p * y + (1 - p) * (1 - y)
    loss = (alpha * y + (1 - alpha) * (1 - y)) * (1 - p_t) ** gamma * ce
    if normalizer is not None:
        loss = loss / float(np.reshape(normalizer, ()))
    return {"sum": loss.sum(), "mean": loss.mean(), "none": loss}[reduction]


def np_unfold(x, kernel_sizes, strides=(1, 1), paddings=(0, 0, 0, 0), dilations=(1, 1)):
    """im2col by explicit loops over blocks; paddings (top, left, bottom, right)."""
    top, left, bottom, right = paddings
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, w = xp.shape
    kh, kw = kernel_sizes
    ho = (h - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    wo = (w - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, c * kh * kw, ho * wo), x.dtype)
    for a in range(ho):
        for b in range(wo):
            for ch in range(c):
                for i in range(kh):
                    for j in range(kw):
                        out[:, (ch * kh + i) * kw + j, a * wo + b] = xp[:, ch, a * strides[0] + i * dilations[0],
                                                                        b * strides[1] + j * dilations[1]]
    return out
