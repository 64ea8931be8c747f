"""Digit image domains: the enlarged digits against a separable numpy bilinear resize, edge maps
against scipy's grey dilation and erosion, paired and unpaired edge/digit sets, errors."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from paddlejax.data import DigitEdges, DigitImages, Digits
from paddlejax.data.digit_domains import digit_images, edge_map


def double_bilinear(x):
    """2x bilinear enlargement with half-pixel centres along the last two axes: output 2i is
    0.75 x[i] + 0.25 x[i - 1], output 2i + 1 is 0.75 x[i] + 0.25 x[i + 1], edges clamped."""
    for axis in (-2, -1):
        n = x.shape[axis]
        prev = np.take(x, np.maximum(np.arange(n) - 1, 0), axis=axis)
        nxt = np.take(x, np.minimum(np.arange(n) + 1, n - 1), axis=axis)
        x = np.stack([0.75 * x + 0.25 * prev, 0.75 * x + 0.25 * nxt], axis=axis).reshape(
            *x.shape[:axis % x.ndim], 2 * n, *x.shape[axis % x.ndim + 1:])
    return x


def test_enlarged_digits_are_bilinear_and_in_minus_one_to_one():
    small = Digits("test")
    images, labels = digit_images("test", size=16)
    assert images.shape == (360, 1, 16, 16) and images.dtype == np.float32
    np.testing.assert_array_equal(labels, small.labels)
    np.testing.assert_allclose(images, double_bilinear(small.images.astype(np.float64)) * 2 - 1, atol=1e-5)
    assert images.min() == -1.0 and images.max() == 1.0


def test_edge_map_is_the_morphological_gradient():
    images, _ = digit_images("test", size=16)
    want = np.stack([ndimage.grey_dilation(im, size=(3, 3), mode="nearest")
                     - ndimage.grey_erosion(im, size=(3, 3), mode="nearest") for im in images[:20, 0]])[:, None] - 1
    np.testing.assert_allclose(edge_map(images[:20]), want, atol=1e-6)
    assert edge_map(-np.ones((1, 1, 4, 4), np.float32)).max() == -1  # a blank image has no edges


def test_paired_edges_belong_to_their_digits():
    data = DigitEdges("test", size=32)
    edges, digits = data.arrays()
    assert edges.shape == digits.shape == (360, 1, 32, 32) and len(data) == 360
    np.testing.assert_array_equal(edges, edge_map(digits))
    np.testing.assert_array_equal(data.labels, Digits("test").labels)


def test_unpaired_domains_come_from_disjoint_halves():
    all_digits, _ = digit_images("train", 16)
    data = DigitEdges("train", paired=False, seed=3)
    edges, digits = data.arrays()
    assert len(edges) == len(digits) == len(all_digits) // 2
    index = {im.tobytes(): i for i, im in enumerate(all_digits)}
    edge_index = {im.tobytes(): i for i, im in enumerate(edge_map(all_digits))}
    b = {index[im.tobytes()] for im in digits}
    a = {edge_index[im.tobytes()] for im in edges}
    assert len(a) == len(b) == len(edges) and not a & b
    assert not np.array_equal(DigitEdges("train", paired=False, seed=4).digits, digits)


def test_digit_images_dataset():
    data = DigitImages("test", size=8)
    image, label = data[5]
    assert len(data) == 360 and image.shape == (1, 8, 8) and label == Digits("test").labels[5]


@pytest.mark.parametrize("call, match", [
    (lambda: DigitImages("test", size=4), r"DigitImages: size expects an int >= 8 \(the digits are 8x8\), got 4"),
    (lambda: digit_images("test", size=16.0), r"digit_images: size expects an int >= 8"),
    (lambda: DigitEdges("test", paired="yes"), r"DigitEdges: paired expects a bool, got 'yes'"),
    (lambda: DigitImages("valid"), r"Digits: split expects one of \['train', 'test', 'all'\], got 'valid'"),
    (lambda: edge_map(np.zeros((4, 4))), r"edge_map: images expects shape \[N, C, H, W\], got \(4, 4\)"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
