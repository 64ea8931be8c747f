"""``Shapes``: a generated object-detection data set -- rectangles, circles and triangles of
random colours and sizes on noise -- with exact boxes, so detectors train and are scored offline.

Every image is drawn from its own seed (the data set's seed, the split and the index), so an
item is the same wherever and whenever it is read, and the splits never share an image.

>>> data = Shapes("test", num_images=4, image_size=32)
>>> image, target = data[0]
>>> image.shape, image.dtype, target.shape
((3, 32, 32), dtype('float32'), (4, 5))
>>> bool((target[:, 0] >= 0).any())  # rows of (label, x1, y1, x2, y2); label -1 pads
True
"""
from __future__ import annotations

import numpy as np

from paddlejax.boxes import iou

_SPLIT_CODES = {"train": 0, "test": 1}


class Shapes:
    """``num_images`` images of ``image_size`` squared pixels (``[3, H, W]`` float32 in [0, 1]),
    each with 1 to ``max_objects`` shapes whose boxes overlap by an IoU of at most ``max_iou``.

    ``data[i]`` is ``(image, target)``: ``target`` is ``[max_objects, 5]`` rows of
    ``(label, x1, y1, x2, y2)`` in pixels (corners inclusive-exclusive, as drawn), padded with
    label -1. ``arrays()`` gives all of them stacked. Objects span ``min_size`` to
    ``max_size`` pixels (defaults: an eighth and two fifths of the image).

    >>> images, targets = Shapes("train", num_images=8, image_size=32).arrays()
    >>> images.shape, targets.shape, Shapes.classes
    ((8, 3, 32, 32), (8, 4, 5), ('rectangle', 'circle', 'triangle'))
    """

    classes = ("rectangle", "circle", "triangle")
    num_classes = len(classes)

    def __init__(self, split: str = "train", num_images: int = 2000, image_size: int = 64, max_objects: int = 4,
                 min_size: int | None = None, max_size: int | None = None, max_iou: float = 0.2, seed: int = 0):
        if split not in _SPLIT_CODES:
            raise ValueError(f"Shapes: split expects one of {list(_SPLIT_CODES)}, got {split!r}")
        if image_size < 16:
            raise ValueError(f"Shapes: image_size expects at least 16 pixels, got {image_size}")
        if num_images < 1 or max_objects < 1:
            raise ValueError(f"Shapes: num_images and max_objects expect at least 1, got {num_images} and {max_objects}")
        self.split, self.num_images, self.image_size, self.max_objects = split, num_images, image_size, max_objects
        self.min_size = min_size or max(4, image_size // 8)
        self.max_size = max_size or max(self.min_size + 1, image_size * 2 // 5)
        if not 2 <= self.min_size < self.max_size <= image_size:
            raise ValueError(f"Shapes: expects 2 <= min_size < max_size <= image_size, got {self.min_size} and "
                             f"{self.max_size} for images of {image_size}")
        self.max_iou, self.seed = max_iou, seed

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not -self.num_images <= index < self.num_images:
            raise IndexError(f"Shapes: index {index} out of range for {self.num_images} images")
        index %= self.num_images
        rng = np.random.default_rng([self.seed, _SPLIT_CODES[self.split], index])
        size = self.image_size
        image = rng.uniform(0.0, 0.6, (3, size, size)).astype(np.float32)  # coloured noise
        target = np.full((self.max_objects, 5), -1.0, np.float32)
        boxes: list[np.ndarray] = []
        count = rng.integers(1, self.max_objects + 1)
        for _ in range(50 * self.max_objects):  # bounded: a crowded image keeps fewer objects
            if len(boxes) == count:
                break
            w, h = rng.integers(self.min_size, self.max_size + 1, 2)
            x, y = rng.integers(0, size - w + 1), rng.integers(0, size - h + 1)
            box = np.array([x, y, x + w, y + h], np.float32)
            if boxes and iou(box[None], np.stack(boxes)).max() > self.max_iou:
                continue
            label = int(rng.integers(0, self.num_classes))
            mask = _mask(label, box, size, rng)
            image[:, mask] = rng.uniform(0.4, 1.0, (3, 1)).astype(np.float32)
            target[len(boxes)] = (label, *box)
            boxes.append(box)
        return image, target

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All images ``[N, 3, H, W]`` and targets ``[N, max_objects, 5]``."""
        items = [self[i] for i in range(self.num_images)]
        return np.stack([i for i, _ in items]), np.stack([t for _, t in items])


def _mask(label: int, box: np.ndarray, size: int, rng) -> np.ndarray:
    """The pixels of shape ``label`` filling ``box``: a rectangle, the inscribed ellipse, or a
    triangle with a base on one side of the box and its apex on the opposite side."""
    x1, y1, x2, y2 = box
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    inside = (xs >= x1) & (xs < x2) & (ys >= y1) & (ys < y2)
    if label == 0:
        return inside
    if label == 1:
        cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        return ((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1.0
    apex = x1 + rng.uniform(0.0, 1.0) * (x2 - x1)  # apex on the top side, base along the bottom
    t = (ys - y1) / (y2 - y1)  # 0 at the apex row, 1 at the base
    left, right = apex + t * (x1 - apex), apex + t * (x2 - apex)
    return inside & (xs >= left) & (xs <= right)
