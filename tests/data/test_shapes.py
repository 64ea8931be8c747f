"""The generated detection data: every item is drawn from its own seed, boxes are exact and the
shapes are where their boxes say."""
import numpy as np
import pytest

from paddlejax.boxes import iou
from paddlejax.data.shapes import Shapes


def test_items_are_reproducible_and_splits_differ():
    a, b = Shapes("train", num_images=6, image_size=32), Shapes("train", num_images=6, image_size=32)
    for i in range(6):
        np.testing.assert_array_equal(a[i][0], b[i][0])
        np.testing.assert_array_equal(a[i][1], b[i][1])
    np.testing.assert_array_equal(a[-1][1], a[5][1])
    test = Shapes("test", num_images=6, image_size=32)
    assert not any(np.array_equal(a[i][0], test[i][0]) for i in range(6))
    assert not np.array_equal(a[0][0], Shapes("train", num_images=6, image_size=32, seed=1)[0][0])


def test_boxes_are_inside_the_image_overlap_little_and_hold_their_shape():
    data = Shapes("train", num_images=40, image_size=48, max_objects=4)
    images, targets = data.arrays()
    counts = (targets[..., 0] >= 0).sum(1)
    assert counts.min() >= 1 and counts.max() == 4
    labels = targets[..., 0][targets[..., 0] >= 0]
    assert set(labels.astype(int)) == {0, 1, 2}
    for image, target in zip(images, targets):
        rows = target[target[:, 0] >= 0]
        assert (rows[:, 1:3] >= 0).all() and (rows[:, 3:5] <= 48).all()
        assert (rows[:, 3:5] - rows[:, 1:3] >= data.min_size).all()
        overlaps = iou(rows[:, 1:], rows[:, 1:])
        assert (overlaps[~np.eye(len(rows), dtype=bool)] <= data.max_iou + 1e-6).all()
        assert (target[len(rows):, 0] == -1).all()  # padding after the objects
    # a rectangle fills its box with one colour; a circle leaves the box's corners as noise
    for label, filled in ((0, True), (1, False)):
        n, k = np.argwhere(targets[..., 0] == label)[-1]  # the last drawn: nothing covers it
        x1, y1, x2, y2 = targets[n, k, 1:].astype(int)
        patch = images[n][:, y1:y2, x1:x2]
        assert (patch[:, 0, 0] == patch[:, (y2 - y1) // 2, (x2 - x1) // 2]).all() == filled


@pytest.mark.parametrize("kwargs, match", [
    (dict(split="val"), "split expects one of"),
    (dict(image_size=8), "image_size expects at least 16"),
    (dict(num_images=0), "num_images and max_objects expect at least 1"),
    (dict(min_size=30, max_size=20), "expects 2 <= min_size < max_size <= image_size"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Shapes(**kwargs)
    with pytest.raises(IndexError, match="index 3 out of range for 3 images"):
        Shapes(num_images=3)[3]
