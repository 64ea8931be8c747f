"""OCR in NumPy: PP-OCR's pre- and post-processing around three programs (text detection,
direction classification, recognition), as the hub's ``ocr`` processor declares it.

The geometry follows PaddleOCR's reference pipeline, which is written over OpenCV: its resizes,
perspective crops and contour boxes are reproduced here in NumPy with OpenCV's rounding rules,
so that a module reads the same text as PaddleOCR (or RapidOCR) from the same image.

- :func:`resize_linear`, :func:`warp_quad`: OpenCV's ``INTER_LINEAR`` resize and ``INTER_CUBIC``
  perspective warp of 8-bit images (fixed-point, replicated border).
- :func:`db_text_boxes`: DB post-processing of a text probability map (threshold, dilation,
  contours, minimum-area boxes, box score, unclip, size filter).
- :func:`ctc_decode`: greedy CTC decoding (best class per step, repeats merged, blanks dropped).
- :class:`OCRPipeline`: the whole path from an image to ``[{"box", "text", "score"}]`` in reading
  order, with the programs given as callables.

>>> prob = np.zeros((32, 64), np.float32)
>>> prob[12:20, 8:56] = 0.9                                 # a line of text, as DB's shrunk kernel
>>> boxes, scores = db_text_boxes(prob, (32, 64), DB_DEFAULTS)
>>> boxes[0].tolist(), round(scores[0], 2)                  # grown back to the text's extent
([[3, 7], [61, 7], [61, 25], [3, 25]], 0.78)
>>> ctc_decode(np.eye(4)[[1, 1, 0, 2, 3, 3]][None], ["blank", "a", "b", "c"])
[('abc', 1.0)]
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

# PaddleOCR's DB post-processing settings as RapidOCR ships them.
DB_DEFAULTS = {"threshold": 0.3, "box_threshold": 0.5, "max_candidates": 1000, "unclip_ratio": 1.6,
               "dilation": True, "min_size": 3}

_RESIZE_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS
_TAB_BITS = 5  # OpenCV's INTER_BITS: warps sample at 1/32 pixel
_REMAP_SCALE = 1 << 15  # OpenCV's INTER_REMAP_COEF_SCALE


# -- resizing and warping ------------------------------------------------------------------------
def _linear_taps(src: int, dst: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per destination index: the two source indices and the fixed-point weight of the second.
    OpenCV clamps the weights at the edges along x but only the indices along y."""
    f = ((np.arange(dst) + 0.5) * (src / dst) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = f - s.astype(np.float32)
    if clamp:
        f[(s < 0) | (s >= src - 1)] = 0
    weight = np.rint(f * (1 << _RESIZE_BITS)).astype(np.int32)
    return np.clip(s, 0, src - 1), np.clip(s + 1, 0, src - 1), weight


def resize_linear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An 8-bit image ``[H, W(, C)]`` resized to ``size`` (height, width) by bilinear
    interpolation with pixel centres aligned and no anti-aliasing, rounded as OpenCV's
    ``cv2.resize(image, (w, h))`` rounds.

    >>> resize_linear(np.array([[0, 100]], np.uint8), (1, 4)).tolist()
    [[0, 25, 75, 100]]
    """
    height, width = size
    if image.shape[:2] == (height, width):
        return image.copy()
    one = 1 << _RESIZE_BITS
    src = image.astype(np.int32)  # products stay under 1 << 27
    x0, x1, ax = _linear_taps(image.shape[1], width, clamp=True)
    ax = ax.reshape((1, -1) + (1,) * (image.ndim - 2))
    rows = src[:, x0] * (one - ax) + src[:, x1] * ax
    y0, y1, ay = _linear_taps(image.shape[0], height, clamp=False)
    ay = ay.reshape((-1,) + (1,) * (image.ndim - 1))
    # OpenCV's vectorised vertical pass: each product of 16-bit halves truncated, then rounded
    total = (((one - ay) * (rows[y0] >> 4)) >> 16) + ((ay * (rows[y1] >> 4)) >> 16)
    return np.clip((total + 2) >> 2, 0, 255).astype(np.uint8)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """OpenCV's bicubic kernel (a = -0.75) at fractional offsets ``t``: ``[len(t), 4]``."""
    a = np.float32(-0.75)
    t = t.astype(np.float32)
    w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    return np.stack([w0, w1, w2, 1 - w0 - w1 - w2], axis=-1).astype(np.float32)


@functools.cache
def _cubic_table() -> np.ndarray:
    """OpenCV's fixed-point 4x4 bicubic weights for each (1/32 y, 1/32 x) offset, each summing
    to exactly 1 << 15 (the excess taken from a central tap, as OpenCV does)."""
    n = 1 << _TAB_BITS
    w = _cubic_weights(np.arange(n) / np.float32(n))
    table = np.rint(w[:, None, :, None] * w[None, :, None, :] * _REMAP_SCALE).astype(np.int32)
    for fy in range(n):
        for fx in range(n):
            tab = table[fy, fx]
            diff = int(tab.sum()) - _REMAP_SCALE
            if diff:
                centre = tab[2:4, 2:4]
                flat = centre.ravel()
                # the first smallest (or largest) of the central four, scanning rows then columns
                pick = int(np.argmin(flat)) if diff > 0 else int(np.argmax(flat))
                centre[divmod(pick, 2)] -= diff
    return table


def warp_quad(image: np.ndarray, quad: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The quadrilateral ``quad`` (4 x 2 points: top-left, top-right, bottom-right, bottom-left)
    of an 8-bit image mapped onto an upright ``size`` (height, width) rectangle: a perspective
    warp with bicubic interpolation and a replicated border, as OpenCV's
    ``warpPerspective(..., INTER_CUBIC, BORDER_REPLICATE)`` computes it.

    >>> image = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    >>> warp_quad(image, np.array([[1, 1], [3, 1], [3, 3], [1, 3]], np.float32), (2, 2)).tolist()
    [[50, 60], [90, 100]]
    """
    height, width = size
    corners = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float64)
    # OpenCV solves for source -> destination, then inverts: the same rounding as its own
    m = np.linalg.inv(_perspective(np.asarray(quad, np.float32).astype(np.float64), corners))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    w = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
    w = np.where(w != 0, (1 << _TAB_BITS) / np.where(w != 0, w, 1), 0)
    fx = np.clip((m[0, 0] * xs + m[0, 1] * ys + m[0, 2]) * w, -2**31, 2**31 - 1)
    fy = np.clip((m[1, 0] * xs + m[1, 1] * ys + m[1, 2]) * w, -2**31, 2**31 - 1)
    x, y = np.rint(fx).astype(np.int64), np.rint(fy).astype(np.int64)
    weights = _cubic_table()[y & 31, x & 31]  # [H, W, 4, 4]
    taps = np.arange(-1, 3)
    rows = np.clip((y >> _TAB_BITS)[..., None] + taps, 0, image.shape[0] - 1)
    cols = np.clip((x >> _TAB_BITS)[..., None] + taps, 0, image.shape[1] - 1)
    # int32 holds the sums: 16 taps of 255 times weights under 1 << 16
    pixels = image[rows[..., :, None], cols[..., None, :]].astype(np.int32)  # [H, W, 4, 4(, C)]
    if image.ndim == 3:
        weights = weights[..., None]
    total = (pixels * weights).sum(axis=(2, 3))
    return np.clip((total + (1 << 14)) >> 15, 0, 255).astype(np.uint8)


def _perspective(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 3x3 projective matrix taking the 4 points ``src`` onto ``dst``."""
    a = np.zeros((8, 8))
    b = np.zeros(8)
    for i, ((x, y), (u, v)) in enumerate(zip(src, dst)):
        a[i] = [x, y, 1, 0, 0, 0, -x * u, -y * u]
        a[i + 4] = [0, 0, 0, x, y, 1, -x * v, -y * v]
        b[i], b[i + 4] = u, v
    return np.append(np.linalg.solve(a, b), 1.0).reshape(3, 3)


# -- DB text boxes -------------------------------------------------------------------------------
def _contours(mask: np.ndarray) -> list[np.ndarray]:
    """The border pixels (x, y) of each region of ``mask`` and of each hole in one, as OpenCV's
    ``findContours(RETR_LIST)`` finds them: regions are 8-connected, holes 4-connected."""
    from scipy import ndimage

    cross = ndimage.generate_binary_structure(2, 1)
    found = []
    regions, _ = ndimage.label(mask, structure=np.ones((3, 3), bool))
    # 8-connected regions never touch, so one erosion of the whole mask finds every border
    borders = mask & ~ndimage.binary_erosion(mask, structure=cross, border_value=0)
    for index, window in enumerate(ndimage.find_objects(regions), start=1):
        y, x = np.nonzero(borders[window] & (regions[window] == index))
        found.append(np.stack([x + window[1].start, y + window[0].start], axis=1))
    holes, _ = ndimage.label(ndimage.binary_fill_holes(mask) & ~mask, structure=cross)
    for index, window in enumerate(ndimage.find_objects(holes), start=1):
        window = tuple(slice(max(w.start - 1, 0), w.stop + 1) for w in window)  # with the pixels around
        y, x = np.nonzero(ndimage.binary_dilation(holes[window] == index, structure=cross) & mask[window])
        found.append(np.stack([x + window[1].start, y + window[0].start], axis=1))
    return found


def _hull(points: np.ndarray) -> np.ndarray:
    """The convex hull of integer points, counter-clockwise, without collinear points."""
    pts = np.unique(points, axis=0)
    if len(pts) < 3:
        return pts.astype(np.float64)

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and ((out[-1][0] - out[-2][0]) * (p[1] - out[-2][1])
                                     - (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0])) <= 0:
                out.pop()
            out.append(p)
        return out

    ordered = [tuple(p) for p in pts]
    lower, upper = half(ordered), half(ordered[::-1])
    return np.array(lower[:-1] + upper[:-1], np.float64)


def min_area_rect(points: np.ndarray) -> tuple[np.ndarray, float]:
    """The smallest rotated rectangle around ``points`` as 4 corners, and its shorter side.

    >>> corners, short = min_area_rect(np.array([[0, 0], [4, 0], [4, 2], [0, 2]]))
    >>> sorted(map(tuple, corners.tolist())), short
    ([(0.0, 0.0), (0.0, 2.0), (4.0, 0.0), (4.0, 2.0)], 2.0)
    """
    hull = _hull(np.asarray(points))
    if len(hull) == 1:
        return np.repeat(hull, 4, axis=0), 0.0
    if len(hull) == 2:
        return np.array([hull[0], hull[1], hull[1], hull[0]]), 0.0
    best = None
    for i in range(len(hull)):
        edge = hull[(i + 1) % len(hull)] - hull[i]
        u = edge / np.hypot(*edge)
        v = np.array([-u[1], u[0]])
        pu, pv = hull @ u, hull @ v
        area = (pu.max() - pu.min()) * (pv.max() - pv.min())
        if best is None or area < best[0] - 1e-9:
            best = (area, u, v, pu.min(), pu.max(), pv.min(), pv.max())
    _, u, v, u0, u1, v0, v1 = best
    corners = np.array([u * a + v * b for a, b in ((u0, v0), (u1, v0), (u1, v1), (u0, v1))])
    return corners, float(min(u1 - u0, v1 - v0))


def _mini_box(points: np.ndarray) -> tuple[np.ndarray, float]:
    """PaddleOCR's ``get_mini_boxes``: the minimum-area box's corners ordered top-left,
    top-right, bottom-right, bottom-left (by x, then y within each side)."""
    corners, short = min_area_rect(points)
    p = sorted(corners.tolist(), key=lambda c: c[0])
    left = (p[0], p[1]) if p[1][1] > p[0][1] else (p[1], p[0])
    right = (p[2], p[3]) if p[3][1] > p[2][1] else (p[3], p[2])
    return np.array([left[0], right[0], right[1], left[1]], np.float64), short


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncating toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _clip_line(w: int, h: int, x1: int, y1: int, x2: int, y2: int):
    """OpenCV's ``clipLine``: the segment cut to the image, or None when it misses it."""
    right, bottom = w - 1, h - 1

    def code(x, y):
        return (x < 0) + (x > right) * 2 + (y < 0) * 4 + (y > bottom) * 8

    c1, c2 = code(x1, y1), code(x2, y2)
    if (c1 & c2) == 0 and (c1 | c2) != 0:
        if c1 & 12:
            a = 0 if c1 < 8 else bottom
            x1 += _cdiv((a - y1) * (x2 - x1), y2 - y1)
            y1, c1 = a, (x1 < 0) + (x1 > right) * 2
        if c2 & 12:
            a = 0 if c2 < 8 else bottom
            x2 += _cdiv((a - y2) * (x2 - x1), y2 - y1)
            y2, c2 = a, (x2 < 0) + (x2 > right) * 2
        if (c1 & c2) == 0 and (c1 | c2) != 0:
            if c1:
                a = 0 if c1 == 1 else right
                y1 += _cdiv((a - x1) * (y2 - y1), x2 - x1)
                x1, c1 = a, 0
            if c2:
                a = 0 if c2 == 1 else right
                y2 += _cdiv((a - x2) * (y2 - y1), x2 - x1)
                x2, c2 = a, 0
    return (x1, y1, x2, y2) if (c1 | c2) == 0 else None


def _line(mask: np.ndarray, x1: int, y1: int, x2: int, y2: int) -> None:
    """An 8-connected line drawn into ``mask`` as OpenCV draws it: clipped to the image, then
    stepped from its left end (which decides the pixels where a step is a tie)."""
    h, w = mask.shape
    if not (0 <= x1 < w and 0 <= x2 < w and 0 <= y1 < h and 0 <= y2 < h):
        clipped = _clip_line(w, h, x1, y1, x2, y2)
        if clipped is None:
            return
        x1, y1, x2, y2 = clipped
    if x2 < x1:
        x1, y1, x2, y2 = x2, y2, x1, y1
    dx, dy = x2 - x1, abs(y2 - y1)
    sy = 1 if y2 >= y1 else -1
    steep = dy > dx
    major, minor = (dy, dx) if steep else (dx, dy)
    err = major - 2 * minor
    x, y = x1, y1
    for _ in range(major + 1):
        mask[y, x] = True
        diagonal = err < 0
        err += -2 * minor + (2 * major if diagonal else 0)
        if steep:
            y += sy
            x += 1 if diagonal else 0
        else:
            x += 1
            y += sy if diagonal else 0


def _fill_mask(shape: tuple[int, int], polygon: np.ndarray) -> np.ndarray:
    """Pixels of a ``shape`` grid covered by an integer ``polygon`` as OpenCV's ``fillPoly``
    covers them: its edges drawn, then each row filled between the edges' crossings (walked
    in 16.16 fixed point, inner pixels only)."""
    mask = np.zeros(shape, bool)
    points = [(int(x), int(y)) for x, y in polygon]
    edges = []
    for (x0, y0), (x1, y1) in zip(points[-1:] + points[:-1], points):
        _line(mask, x0, y0, x1, y1)
        if y0 != y1:
            top = (x0, y0) if y0 < y1 else (x1, y1)
            edges.append((min(y0, y1), max(y0, y1), top[0] << 16, _cdiv((x1 - x0) << 16, y1 - y0)))
    for y in range(max(min((e[0] for e in edges), default=0), 0), min(max((e[1] for e in edges), default=0),
                                                                       shape[0])):
        xs = sorted(x + (y - y0) * step for y0, y1, x, step in edges if y0 <= y < y1)
        for left, right in zip(xs[::2], xs[1::2]):
            x1, x2 = (left + (1 << 16) - 1) >> 16, right >> 16
            if x1 < shape[1] and x2 >= 0:
                mask[y, max(x1, 0):min(x2, shape[1] - 1) + 1] = True
    return mask


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """The mean probability inside ``box`` (PaddleOCR's ``box_score_fast``)."""
    h, w = prob.shape
    x0, x1 = (int(np.clip(v, 0, w - 1)) for v in (math.floor(box[:, 0].min()), math.ceil(box[:, 0].max())))
    y0, y1 = (int(np.clip(v, 0, h - 1)) for v in (math.floor(box[:, 1].min()), math.ceil(box[:, 1].max())))
    mask = _fill_mask((y1 - y0 + 1, x1 - x0 + 1), (box - [x0, y0]).astype(np.int32))
    return float(prob[y0:y1 + 1, x0:x1 + 1][mask].mean()) if mask.any() else 0.0


def _round_away(value: float) -> int:
    return int(value - 0.5) if value < 0 else int(value + 0.5)


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """The polygon of ``box`` grown by ``area * ratio / perimeter`` with round joins, as
    Clipper's offset (6.4, arc tolerance 0.25) computes it on integer coordinates: the box's
    size after growing decides which boxes are kept and where the crop is taken."""
    area = abs(float(np.dot(box[:, 0], np.roll(box[:, 1], -1)) - np.dot(box[:, 1], np.roll(box[:, 0], -1)))) / 2
    edges = np.roll(box, -1, axis=0) - box
    length = float(np.hypot(edges[:, 0], edges[:, 1]).sum())
    delta = area * ratio / length if length else 0.0
    path = []
    for x, y in box.astype(np.float64).tolist():
        point = (int(x), int(y))  # Clipper truncates to integers
        if not path or point != path[-1]:
            path.append(point)
    while len(path) > 1 and path[0] == path[-1]:
        path.pop()
    if len(path) < 3 or delta <= 0:
        return np.array(path, np.float64)
    signed = sum((path[j][0] + path[i][0]) * (path[j][1] - path[i][1])
                 for i, j in zip(range(len(path)), [len(path) - 1] + list(range(len(path) - 1))))
    if -signed * 0.5 < 0:
        path.reverse()
    tolerance = min(0.25, delta * 0.25)
    steps = min(math.pi / math.acos(1 - tolerance / delta), delta * math.pi)
    sin, cos, per_radian = math.sin(2 * math.pi / steps), math.cos(2 * math.pi / steps), steps / (2 * math.pi)
    normals = []
    for (x0, y0), (x1, y1) in zip(path, path[1:] + path[:1]):
        dx, dy = x1 - x0, y1 - y0
        norm = math.hypot(dx, dy)
        normals.append((dy / norm, -dx / norm) if norm else (0.0, 0.0))
    out = []
    k = len(path) - 1
    for j, (px, py) in enumerate(path):
        (kx, ky), (jx, jy) = normals[k], normals[j]
        sin_a = kx * jy - jx * ky
        cos_a = kx * jx + ky * jy
        if abs(sin_a * delta) < 1.0 and cos_a > 0:
            # a straight join: Clipper keeps measuring the next corner from the same edge
            out.append((_round_away(px + kx * delta), _round_away(py + ky * delta)))
            continue
        if max(-1.0, min(1.0, sin_a)) * delta < 0:
            out += [(_round_away(px + kx * delta), _round_away(py + ky * delta)), (px, py),
                    (_round_away(px + jx * delta), _round_away(py + jy * delta))]
        else:
            angle = math.atan2(max(-1.0, min(1.0, sin_a)), cos_a)
            x, y = kx, ky
            for _ in range(max(_round_away(per_radian * abs(angle)), 1)):
                out.append((_round_away(px + x * delta), _round_away(py + y * delta)))
                x, y = x * cos - sin * y, x * sin + y * cos
            out.append((_round_away(px + jx * delta), _round_away(py + jy * delta)))
        k = j
    return np.array(out, np.float64)


def db_text_boxes(prob: np.ndarray, size: tuple[int, int], spec: dict) -> tuple[list[np.ndarray], list[float]]:
    """Text boxes of a DB probability map ``prob`` ``[h, w]``, scaled to an image of ``size``
    (height, width): int32 4 x 2 corners (clockwise from top-left) and their scores.

    ``spec`` holds ``threshold`` (pixels above it are text), ``box_threshold`` (the least mean
    probability inside a box), ``unclip_ratio`` (how far a box grows: the shrunk text kernel
    back to the text's extent), ``max_candidates``, ``dilation`` (grow the text mask by one
    pixel first) and ``min_size`` (the shortest side kept), as :data:`DB_DEFAULTS`.
    """
    height, width = prob.shape
    mask = prob > spec.get("threshold", DB_DEFAULTS["threshold"])
    if spec.get("dilation", DB_DEFAULTS["dilation"]):
        # as OpenCV's 2x2 dilation: a pixel is text if it, or its neighbour above, left or
        # above-left, is
        grown = mask.copy()
        grown[1:] |= mask[:-1]
        grown[:, 1:] |= grown[:, :-1].copy()
        mask = grown
    min_size = spec.get("min_size", DB_DEFAULTS["min_size"])
    boxes, scores = [], []
    for contour in _contours(mask)[:spec.get("max_candidates", DB_DEFAULTS["max_candidates"])]:
        points, short = _mini_box(contour)
        if short < min_size:
            continue
        score = _box_score(prob, points)
        if score < spec.get("box_threshold", DB_DEFAULTS["box_threshold"]):
            continue
        box, short = _mini_box(_unclip(points, spec.get("unclip_ratio", DB_DEFAULTS["unclip_ratio"])))
        if short < min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * size[1]), 0, size[1])
        box[:, 1] = np.clip(np.round(box[:, 1] / height * size[0]), 0, size[0])
        boxes.append(box.astype(np.int32))
        scores.append(score)
    return boxes, scores


# -- CTC -----------------------------------------------------------------------------------------
def ctc_decode(probs: np.ndarray, characters: Sequence[str], blank: int = 0) -> list[tuple[str, float]]:
    """Greedy CTC decoding of ``probs`` ``[batch, steps, classes]``: the best class per step,
    repeats merged, blanks dropped; the score is the mean probability of the characters kept
    (0 when none is).

    >>> ctc_decode(np.eye(3)[[0, 0]][None], ["blank", "x", "y"])
    [('', 0.0)]
    """
    best = probs.argmax(-1)
    confidence = probs.max(-1)
    results = []
    for row, conf in zip(best, confidence):
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        kept = conf[keep]
        results.append(("".join(characters[i] for i in row[keep]), float(kept.mean()) if kept.size else 0.0))
    return results


# -- the pipeline --------------------------------------------------------------------------------
def order_clockwise(box: np.ndarray) -> np.ndarray:
    """The 4 points of ``box`` as top-left, top-right, bottom-right, bottom-left.

    >>> order_clockwise(np.array([[5, 9], [0, 0], [5, 0], [0, 9]])).tolist()
    [[0.0, 0.0], [5.0, 0.0], [5.0, 9.0], [0.0, 9.0]]
    """
    by_x = box[np.argsort(box[:, 0], kind="stable")]
    left = by_x[:2][np.argsort(by_x[:2, 1], kind="stable")]
    right = by_x[2:][np.argsort(by_x[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], np.float32)


def reading_order(boxes: Sequence[np.ndarray], line_tolerance: float = 10) -> list[int]:
    """The indices of ``boxes`` (clockwise from top-left) in reading order: top to bottom, then
    left to right among boxes whose tops are within ``line_tolerance`` pixels (one line of
    text), as PaddleOCR orders its results.

    >>> reading_order([np.array([[50, 12], [90, 12], [90, 30], [50, 30]]),
    ...                np.array([[0, 40], [40, 40], [40, 60], [0, 60]]),
    ...                np.array([[0, 10], [40, 10], [40, 30], [0, 30]])])
    [2, 0, 1]
    """
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]][0], boxes[order[j + 1]][0]
            if abs(b[1] - a[1]) < line_tolerance and b[0] < a[0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order


def _fit_multiple(image: np.ndarray, ratio: float) -> tuple[np.ndarray, float, float]:
    """The image resized by ``ratio`` with both sides rounded to multiples of 32, and the
    original-over-new ratios of the sides."""
    h, w = image.shape[:2]
    new_h, new_w = (int(round(int(s * ratio) / 32) * 32) for s in (h, w))
    if new_h <= 0 or new_w <= 0:
        raise ValueError(f"an image of {w}x{h} pixels cannot be resized by {ratio:.3g}")
    return resize_linear(image, (new_h, new_w)), h / new_h, w / new_w


def crop_text(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The text inside ``box`` (clockwise from top-left) as an upright crop; crops much taller
    than wide are turned a quarter (vertical text reads along its length)."""
    box = box.astype(np.float32)
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    crop = warp_quad(image, box, (height, width))
    if crop.shape[0] / max(crop.shape[1], 1) >= 1.5:
        crop = np.rot90(crop)
    return crop


def line_batch(crops: Sequence[np.ndarray], height: int, width: int, normalize: Callable) -> np.ndarray:
    """Text crops resized to ``height`` keeping their aspect (at most ``width`` wide),
    normalised and padded with zeros on the right: an NCHW float32 batch ``[n, C, height, width]``."""
    batch = None
    for i, crop in enumerate(crops):
        resized_w = min(width, int(math.ceil(height * crop.shape[1] / crop.shape[0])))
        pixels = normalize(resize_linear(crop, (height, max(resized_w, 1))))
        if batch is None:
            batch = np.zeros((len(crops), pixels.shape[0], height, width), np.float32)
        batch[i, :, :, :pixels.shape[2]] = pixels
    return batch


class OCRPipeline:
    """PP-OCR from an 8-bit image to its lines of text, with the programs as callables.

    - ``spec``: the ``ocr`` post-processing of a module's processor (see
      :mod:`paddlejax.hub.processor`): ``resize``, ``det``, ``cls``, ``rec`` sections;
    - ``normalize``: 8-bit ``[H, W, C]`` pixels → float32 ``[C, H, W]`` as the programs take them;
    - ``det``: ``{(height, width): fn}``, a float32 ``[1, C, height, width]`` batch → the
      probability map ``[1, 1, height, width]``, one per compiled size;
    - ``cls``: ``((height, width), fn)``, ``[n, C, height, width]`` → class probabilities ``[n, 2]``;
    - ``rec``: ``{width: fn}`` at the recogniser's height → probabilities ``[n, steps, classes]``;
      ``rec_height`` is that height;
    - ``characters``: the recogniser's classes (``characters[blank]`` is the CTC blank).

    A stage left out (``None``) is skipped: without ``det`` each image is one line of text,
    without ``rec`` the result is the boxes and their scores. Programs have fixed sizes, so
    inputs are padded with zeros to the smallest compiled size that holds them; an image too
    large for every detector size is shrunk to fit, and a line too long for every recogniser
    width is squeezed into the widest.
    """

    def __init__(self, spec: dict, normalize: Callable, *, det=None, cls=None, rec=None, rec_height: int = 48,
                 characters: Sequence[str] = ()):
        self.spec, self.normalize = spec, normalize
        self.det, self.cls, self.rec = det, cls, rec
        self.rec_height, self.characters = rec_height, list(characters)

    def __call__(self, image: np.ndarray) -> list[dict]:
        """``[{"box": 4 x 2 corners, "text": str, "score": float}]`` for the 8-bit ``[H, W, C]``
        image, in reading order (``text`` left out without a recogniser; the box the whole
        image without a detector)."""
        raw_h, raw_w = image.shape[:2]
        image, scale_h, scale_w = self._limit_size(image)
        if self.det is None:
            w, h = float(raw_w), float(raw_h)
            boxes, crops = [[[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]]], [image]
        else:
            image, top = self._letterbox(image)
            found, scores = self._detect(image)
            boxes = [self._to_original(box, top, scale_h, scale_w, raw_h, raw_w) for box in found]
            if self.rec is None:
                return [{"box": box, "score": round(score, 4)} for box, score in zip(boxes, scores)]
            crops = [crop_text(image, box) for box in found]
        if self.cls is not None:
            crops = self._upright(crops)
        threshold = self.spec["rec"].get("score_threshold", 0.5)
        return [{"box": box, "text": text, "score": round(score, 4)}
                for box, (text, score) in zip(boxes, self._recognize(crops)) if score >= threshold]

    # -- sizes ---------------------------------------------------------------------------------
    def _limit_size(self, image):
        """Very large images shrunk and tiny ones grown, sides multiples of 32 (RapidOCR's
        first step); the ratios map boxes back."""
        limits = self.spec.get("resize", {})
        scale_h = scale_w = 1.0
        longest, shortest = limits.get("max_side_len", 2000), limits.get("min_side_len", 30)
        if max(image.shape[:2]) > longest:
            image, scale_h, scale_w = _fit_multiple(image, longest / max(image.shape[:2]))
        if min(image.shape[:2]) < shortest:
            image, scale_h, scale_w = _fit_multiple(image, shortest / min(image.shape[:2]))
        return image, scale_h, scale_w

    def _letterbox(self, image):
        """Short or very wide images padded above and below with black, so that the detector
        sees lines of text at a height it was trained on."""
        limits = self.spec.get("resize", {})
        h, w = image.shape[:2]
        ratio = limits.get("width_height_ratio", 8)
        if h > limits.get("min_height", 30) and (ratio == -1 or w / h <= ratio):
            return image, 0
        pad = int(abs(max(int(w / ratio), limits.get("min_height", 30)) * 2 - h) / 2)
        return np.pad(image, ((pad, pad), (0, 0), (0, 0))), pad

    @staticmethod
    def _to_original(box, top, scale_h, scale_w, raw_h, raw_w) -> list[list[float]]:
        box = box.astype(np.float32)
        box[:, 1] -= top
        box[:, 0] *= scale_w
        box[:, 1] *= scale_h
        box = np.maximum(box, 0)
        box[:, 0] = np.minimum(box[:, 0], raw_w)
        box[:, 1] = np.minimum(box[:, 1], raw_h)
        return box.tolist()

    # -- detection -----------------------------------------------------------------------------
    def _det_size(self, h: int, w: int) -> tuple[int, int]:
        """The detector's input size for an ``h`` x ``w`` image: the short side (``limit_type``
        ``"min"``) or the long side (``"max"``) brought to ``limit_side_len``, multiples of 32
        (at least 32, as PaddleOCR's: a thin image still gets a row of text)."""
        det = self.spec["det"]
        limit, kind = det.get("limit_side_len", 736), det.get("limit_type", "min")
        ratio = 1.0
        if kind == "min" and min(h, w) < limit:
            ratio = limit / min(h, w)
        elif kind == "max" and max(h, w) > limit:
            ratio = limit / max(h, w)
        return max(32, int(round(int(h * ratio) / 32) * 32)), max(32, int(round(int(w * ratio) / 32) * 32))

    def _canvas(self, h: int, w: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The compiled detector size that holds an ``h`` x ``w`` input (the smallest), and the
        size the image takes in it: shrunk to fit the roomiest when none holds it."""
        sizes = sorted(self.det, key=lambda s: (s[0] * s[1], s))
        for size in sizes:
            if size[0] >= h and size[1] >= w:
                return size, (h, w)
        size = max(sizes, key=lambda s: (min(s[0] / h, s[1] / w), -s[0] * s[1]))
        ratio = min(size[0] / h, size[1] / w)
        return size, (max(32, int(h * ratio) // 32 * 32), max(32, int(w * ratio) // 32 * 32))

    def _detect(self, image):
        h, w = image.shape[:2]
        canvas, fitted = self._canvas(*self._det_size(h, w))
        pixels = self.normalize(resize_linear(image, fitted))
        batch = np.zeros((1, pixels.shape[0], *canvas), np.float32)
        batch[0, :, :fitted[0], :fitted[1]] = pixels
        prob = np.asarray(self.det[canvas](batch))[0, 0, :fitted[0], :fitted[1]]
        boxes, scores = db_text_boxes(prob, (h, w), self.spec["det"])
        kept, kept_scores = [], []
        for box, score in zip(boxes, scores):
            box = order_clockwise(box)
            box[:, 0] = np.clip(box[:, 0], 0, w - 1).astype(np.int64)
            box[:, 1] = np.clip(box[:, 1], 0, h - 1).astype(np.int64)
            if int(np.linalg.norm(box[0] - box[1])) > 3 and int(np.linalg.norm(box[0] - box[3])) > 3:
                kept.append(box)
                kept_scores.append(score)
        order = reading_order(kept)
        return [kept[i] for i in order], [kept_scores[i] for i in order]

    # -- direction and recognition -------------------------------------------------------------
    def _batches(self, crops, size):
        """Crop indices by aspect ratio (narrow first), in groups of the stage's batch size."""
        order = np.argsort([c.shape[1] / c.shape[0] for c in crops], kind="stable")
        return [order[i:i + size] for i in range(0, len(order), size)]

    def _upright(self, crops):
        spec = self.spec["cls"]
        (height, width), run = self.cls
        labels = spec.get("labels", ["0", "180"])
        crops = list(crops)
        for group in self._batches(crops, spec.get("batch_size", 6)):
            probs = np.asarray(run(line_batch([crops[i] for i in group], height, width, self.normalize)))
            for i, row in zip(group, probs):
                best = int(row.argmax())
                if "180" in labels[best] and row[best] > spec.get("threshold", 0.9):
                    crops[i] = np.ascontiguousarray(crops[i][::-1, ::-1])
        return crops

    def _recognize(self, crops):
        spec = self.spec["rec"]
        widths = sorted(self.rec)
        results = [("", 0.0)] * len(crops)
        for group in self._batches(crops, spec.get("batch_size", 6)):
            ratio = max([widths[0] / self.rec_height] + [crops[i].shape[1] / crops[i].shape[0] for i in group])
            wanted = int(self.rec_height * ratio)
            width = next((w for w in widths if w >= wanted), widths[-1])
            batch = line_batch([crops[i] for i in group], self.rec_height, min(wanted, width), self.normalize)
            if batch.shape[3] < width:
                batch = np.pad(batch, ((0, 0), (0, 0), (0, 0), (0, width - batch.shape[3])))
            decoded = ctc_decode(np.asarray(self.rec[width](batch)), self.characters, self.spec["rec"].get("blank", 0))
            for i, result in zip(group, decoded):
                results[i] = result
        return results
