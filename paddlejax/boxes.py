"""Box geometry in NumPy for data preparation and evaluation (boxes as ``x1, y1, x2, y2``).

>>> iou(np.array([[0, 0, 4, 4]]), np.array([[2, 2, 6, 6]])).tolist()
[[0.14285714285714285]]
"""
from __future__ import annotations

import numpy as np


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of boxes ``a`` ``[N, 4]`` and ``b`` ``[M, 4]`` (x1, y1, x2, y2): ``[N, M]``.

    >>> iou(np.array([[0, 0, 2, 2]]), np.array([[1, 1, 3, 3], [0, 0, 2, 2]])).round(3).tolist()
    [[0.143, 1.0]]
    """
    a, b = np.asarray(a, np.float64)[:, None], np.asarray(b, np.float64)[None]
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = w * h
    area = lambda z: (z[..., 2] - z[..., 0]) * (z[..., 3] - z[..., 1])  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def average_precision(recall: np.ndarray, precision: np.ndarray, method: str = "integral") -> float:
    """The area under a precision-recall curve (points in order of falling score), as the VOC
    benchmark computes it: ``"integral"`` integrates the precision envelope (each precision
    raised to the best at any higher recall; VOC 2010 and later, PaddleDetection's
    ``map_type="integral"``), ``"11point"`` averages that envelope at recall 0, 0.1, ... 1 (VOC 2007).

    >>> average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3]))
    0.8333333333333333
    >>> round(average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3]), "11point"), 4)
    0.8485
    """
    if method not in ("integral", "11point"):
        raise ValueError(f"average_precision: method expects 'integral' or '11point', got {method!r}")
    recall, precision = np.asarray(recall, np.float64), np.asarray(precision, np.float64)
    if method == "11point":
        return float(np.mean([precision[recall >= t].max(initial=0.0) for t in np.linspace(0, 1, 11)]))
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]  # the envelope
    steps = np.flatnonzero(r[1:] != r[:-1])
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


class DetectionMAP:
    """Mean average precision over classes at one IoU threshold (mAP@0.5 by default), as the VOC
    benchmark and PaddleDetection's ``VOCMetric`` count it: per class, detections in order of
    falling score are true positives when they overlap a ground-truth box of their class, not
    yet matched in their image, by at least ``iou_threshold``, else false positives; a box
    marked ``difficult`` neither counts nor penalises. Classes without ground truth are left
    out of the mean.

    >>> m = DetectionMAP(num_classes=2)
    >>> m.update(boxes=[[0, 0, 10, 10], [20, 20, 30, 30]], scores=[0.9, 0.8], labels=[0, 1],
    ...          gt_boxes=[[1, 1, 10, 10], [50, 50, 60, 60]], gt_labels=[0, 1])
    >>> m.accumulate(), m.per_class()
    (0.5, [1.0, 0.0])
    """

    def __init__(self, num_classes: int, iou_threshold: float = 0.5, method: str = "integral"):
        if num_classes < 1:
            raise ValueError(f"DetectionMAP: num_classes expects at least 1, got {num_classes}")
        if not 0.0 < iou_threshold <= 1.0:
            raise ValueError(f"DetectionMAP: iou_threshold expects a number in (0, 1], got {iou_threshold}")
        average_precision(np.zeros(1), np.zeros(1), method)  # checks the method's name now
        self.num_classes, self.iou_threshold, self.method = num_classes, iou_threshold, method
        self.reset()

    def reset(self) -> None:
        """Forget every image seen."""
        self._scores = [[] for _ in range(self.num_classes)]  # per class: (score, true positive)
        self._positives = np.zeros(self.num_classes, np.int64)

    def update(self, boxes, scores, labels, gt_boxes, gt_labels, difficult=None) -> None:
        """Add one image: its detections (``boxes`` ``[K, 4]``, ``scores``, ``labels``; rows with a
        negative label are padding, as ``multiclass_nms`` pads) and its ground truth
        (``gt_boxes`` ``[G, 4]``, ``gt_labels``, negative labels padding; optional ``difficult`` flags)."""
        boxes, scores, labels = (np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64).ravel(),
                                 np.asarray(labels).ravel().astype(np.int64))
        gt_boxes, gt_labels = np.asarray(gt_boxes, np.float64).reshape(-1, 4), np.asarray(gt_labels).ravel().astype(np.int64)
        if not len(boxes) == len(scores) == len(labels) or len(gt_boxes) != len(gt_labels):
            raise ValueError(f"DetectionMAP.update: expects as many boxes, scores and labels ({len(boxes)}, "
                             f"{len(scores)}, {len(labels)}) and gt_boxes and gt_labels ({len(gt_boxes)}, {len(gt_labels)})")
        difficult = np.zeros(len(gt_labels), bool) if difficult is None else np.asarray(difficult, bool).ravel()
        if labels.max(initial=-1) >= self.num_classes or gt_labels.max(initial=-1) >= self.num_classes:
            raise ValueError(f"DetectionMAP.update: a label is >= num_classes ({self.num_classes})")
        for c in range(self.num_classes):
            gt = gt_labels == c
            c_boxes, c_difficult = gt_boxes[gt], difficult[gt]
            self._positives[c] += int((~c_difficult).sum())
            mine = np.flatnonzero(labels == c)
            mine = mine[np.argsort(-scores[mine], kind="stable")]
            overlaps = iou(boxes[mine], c_boxes) if len(c_boxes) else np.zeros((len(mine), 0))
            taken = np.zeros(len(c_boxes), bool)
            for row, k in enumerate(mine):
                best = int(np.argmax(overlaps[row])) if len(c_boxes) else -1
                if best >= 0 and overlaps[row, best] >= self.iou_threshold:
                    if c_difficult[best]:
                        continue
                    if not taken[best]:
                        taken[best] = True
                        self._scores[c].append((scores[k], True))
                        continue
                self._scores[c].append((scores[k], False))

    def per_class(self) -> list[float | None]:
        """Each class's average precision (None for a class without ground truth)."""
        aps = []
        for c in range(self.num_classes):
            if self._positives[c] == 0:
                aps.append(None)
                continue
            found = sorted(self._scores[c], key=lambda s: -s[0])
            hits = np.array([t for _, t in found], bool)
            tp, fp = np.cumsum(hits), np.cumsum(~hits)
            recall = tp / self._positives[c]
            precision = tp / np.maximum(tp + fp, 1)
            aps.append(average_precision(recall, precision, self.method) if len(found) else 0.0)
        return aps

    def accumulate(self) -> float:
        """The mean of the classes' average precisions (0.0 before any ground truth)."""
        aps = [a for a in self.per_class() if a is not None]
        return float(np.mean(aps)) if aps else 0.0


def kmeans_anchors(sizes: np.ndarray, k: int = 9, iterations: int = 100, seed: int = 0) -> np.ndarray:
    """``k`` anchor shapes ``[k, 2]`` (width, height; smallest area first) fitted to box
    ``sizes`` ``[N, 2]`` by k-means (k-means++ seeding) with ``1 - IoU`` of shapes as the
    distance, as YOLOv2 and v3 choose their anchors; each centre is the median of its boxes.

    >>> rng = np.random.default_rng(0)
    >>> sizes = np.concatenate([rng.normal(10, 1, (50, 2)), rng.normal(40, 2, (50, 2))])
    >>> kmeans_anchors(sizes, k=2).round(0).tolist()
    [[10.0, 10.0], [40.0, 40.0]]
    """
    sizes = np.asarray(sizes, np.float64)
    if sizes.ndim != 2 or sizes.shape[1] != 2 or (sizes <= 0).any():
        raise ValueError(f"kmeans_anchors: sizes expect [N, 2] positive (width, height) pairs, got shape {sizes.shape}")
    if not 1 <= k <= len(sizes):
        raise ValueError(f"kmeans_anchors: k expects 1 to {len(sizes)} (the number of boxes), got {k}")
    def shape_iou(a, b):
        inter = np.minimum(a[:, None, 0], b[None, :, 0]) * np.minimum(a[:, None, 1], b[None, :, 1])
        return inter / (a[:, None].prod(-1) + b[None].prod(-1) - inter)

    # k-means++ seeding: each new centre drawn in proportion to the squared distance to the nearest
    # chosen one, so that no cluster is left without a centre as plain random seeding may
    rng = np.random.default_rng(seed)
    centres = sizes[[rng.integers(len(sizes))]]
    while len(centres) < k:
        far = (1.0 - shape_iou(sizes, centres).max(1)) ** 2
        pick = rng.choice(len(sizes), p=far / far.sum()) if far.sum() > 0 else rng.integers(len(sizes))  # all alike
        centres = np.concatenate([centres, sizes[[pick]]])

    for _ in range(iterations):
        nearest = np.argmax(shape_iou(sizes, centres), 1)
        moved = np.array([np.median(sizes[nearest == j], 0) if (nearest == j).any() else centres[j] for j in range(k)])
        if np.allclose(moved, centres):
            break
        centres = moved
    return centres[np.argsort(centres.prod(1))]
