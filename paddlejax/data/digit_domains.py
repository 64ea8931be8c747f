"""Image domains made from scikit-learn's digits for generative models: the digits enlarged and
scaled to [-1, 1] (what a ``tanh`` generator outputs), and their edge maps paired with them
(edges -> digit translation, as Pix2Pix learns it) or unpaired (the two domains drawn from
disjoint halves of the digits, as CycleGAN learns it).

>>> images = DigitImages("test", size=16)
>>> images.images.shape, float(images.images.min()), float(images.images.max())
((360, 1, 16, 16), -1.0, 1.0)
>>> edges, digits = DigitEdges("test").arrays()
>>> edges.shape == digits.shape == (360, 1, 16, 16)
True
"""
from __future__ import annotations

import numpy as np

from paddlejax import ops
from paddlejax.data.datasets import ArrayDataset, Digits


def _check_size(owner: str, size) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 8:
        raise ValueError(f"{owner}: size expects an int >= 8 (the digits are 8x8), got {size!r}")
    return int(size)


def digit_images(split: str = "train", size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of the digits split ``split`` (see :class:`~paddlejax.data.Digits`):
    float32 ``[N, 1, size, size]`` images, bilinearly resized from 8x8 (half-pixel centres),
    scaled from [0, 1] to [-1, 1]; int32 labels.

    >>> images, labels = digit_images("test", size=8)
    >>> bool(np.allclose(images, Digits("test").images * 2 - 1)), labels[:3].tolist()
    (True, [7, 6, 3])
    """
    size = _check_size("digit_images", size)
    digits = Digits(split)
    images = digits.images
    if size != 8:
        images = np.asarray(ops.interpolate(images, size=(size, size), mode="bilinear"))
    return (images * 2 - 1).astype(np.float32), digits.labels


def edge_map(images: np.ndarray) -> np.ndarray:
    """The morphological gradient (3x3 dilation minus 3x3 erosion, edges replicated) of
    ``[N, C, H, W]`` images in [-1, 1]: bright where the stroke's edge is, as a line drawing of
    the image; returned in [-1, 1].

    >>> square = -np.ones((1, 1, 5, 5), np.float32); square[..., 1:4, 1:4] = 1
    >>> (edge_map(square)[0, 0] > 0).astype(int).tolist()
    [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    """
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"edge_map: images expects shape [N, C, H, W], got {images.shape}")
    padded = np.pad(images, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    h, w = images.shape[2:]
    windows = np.stack([padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)])
    return (windows.max(0) - windows.min(0) - 1).astype(images.dtype)


class DigitImages(ArrayDataset):
    """The digits as images for a generator to learn: ``images`` float32 ``[N, 1, size, size]``
    in [-1, 1] (see :func:`digit_images`) and int32 ``labels``; a sample is ``(image, label)``.

    >>> data = DigitImages("train", size=32)
    >>> len(data), data[0][0].shape, data.num_classes
    (1437, (1, 32, 32), 10)
    """

    num_classes = Digits.num_classes

    def __init__(self, split: str = "train", size: int = 16):
        self.split, self.size = split, _check_size("DigitImages", size)
        self.images, self.labels = digit_images(split, self.size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(images, labels)``, the whole split."""
        return self.images, self.labels


class DigitEdges(ArrayDataset):
    """Edge maps (:func:`edge_map`) and digits, both ``[N, 1, size, size]`` in [-1, 1]; a
    sample is ``(edges, digit)``.

    ``paired=True``: each digit with its own edge map (``labels`` are the digits'). ``paired=False``:
    two unpaired domains from disjoint halves of the split (shuffled with ``seed``): the edge
    maps of one half and the digits of the other, ``N // 2`` of each, so that no edge map's
    digit is in the set.

    >>> paired, unpaired = DigitEdges("train"), DigitEdges("train", paired=False)
    >>> len(paired), len(unpaired)
    (1437, 718)
    >>> edges, digits = paired[0]
    >>> bool(np.array_equal(edges, edge_map(digits[None])[0]))
    True
    """

    def __init__(self, split: str = "train", size: int = 16, paired: bool = True, seed: int = 0):
        if not isinstance(paired, bool):
            raise ValueError(f"DigitEdges: paired expects a bool, got {paired!r}")
        self.split, self.size, self.paired = split, _check_size("DigitEdges", size), paired
        digits, labels = digit_images(split, self.size)
        if paired:
            self.edges, self.digits, self.labels = edge_map(digits), digits, labels
        else:
            order = np.random.default_rng(seed).permutation(len(digits))
            half = len(digits) // 2
            a, b = order[:half], order[half:2 * half]
            self.edges, self.digits, self.labels = edge_map(digits[a]), digits[b], labels[b]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(edges, digits)``, the whole set."""
        return self.edges, self.digits
