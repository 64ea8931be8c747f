"""Box geometry and the VOC evaluation: IoU, average precision, mAP with its matching rules, and
anchors by k-means."""
import numpy as np
import pytest

from paddlejax.boxes import DetectionMAP, average_precision, iou, kmeans_anchors


def test_iou_by_hand():
    got = iou(np.array([[0, 0, 4, 4], [10, 10, 12, 12]]), np.array([[2, 0, 6, 4], [0, 0, 4, 4]]))
    np.testing.assert_allclose(got, [[8 / 24, 1.0], [0.0, 0.0]])


def test_average_precision_integral_and_11_point_by_hand():
    # three detections: hit, miss, hit of two objects
    recall, precision = np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3])
    assert average_precision(recall, precision) == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)
    assert average_precision(recall, precision, "11point") == pytest.approx((6 * 1.0 + 5 * 2 / 3) / 11)
    with pytest.raises(ValueError, match="method expects 'integral' or '11point'"):
        average_precision(recall, precision, "coco")


def test_map_counts_a_second_detection_of_one_object_as_false_and_skips_difficult_ones():
    m = DetectionMAP(num_classes=2)
    gt, gt_labels = [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], [0, 0, 0]
    m.update(boxes=[[0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30], [40, 40, 50, 50], [-1, -1, -1, -1]],
             scores=[0.9, 0.8, 0.7, 0.6, 0.0], labels=[0, 0, 0, 0, -1], gt_boxes=gt, gt_labels=gt_labels,
             difficult=[False, False, True])
    # by score: a hit, a second detection of the same object (false), a hit, and one on the
    # difficult object (neither); 2 objects count: precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1
    assert m.per_class() == [pytest.approx(0.5 * 1 + 0.5 * 2 / 3), None]
    assert m.accumulate() == pytest.approx(5 / 6)
    m.update(boxes=[[20, 20, 30, 30]], scores=[0.95], labels=[0], gt_boxes=[[20, 20, 30, 30]], gt_labels=[0])
    # the new image's hit ranks first: hit, hit, false, hit of 3 objects
    assert m.per_class()[0] == pytest.approx(2 / 3 * 1 + 1 / 3 * 3 / 4)
    m.reset()
    assert m.accumulate() == 0.0


def test_map_threshold_and_errors():
    strict = DetectionMAP(1, iou_threshold=0.9)
    strict.update([[0, 0, 10, 10]], [1.0], [0], [[1, 1, 10, 10]], [0])  # IoU 0.81
    assert strict.accumulate() == 0.0
    loose = DetectionMAP(1, iou_threshold=0.8)
    loose.update([[0, 0, 10, 10]], [1.0], [0], [[1, 1, 10, 10]], [0])
    assert loose.accumulate() == 1.0
    with pytest.raises(ValueError, match="a label is >= num_classes"):
        loose.update([[0, 0, 1, 1]], [1.0], [3], [], [])
    with pytest.raises(ValueError, match="expects as many boxes, scores and labels"):
        loose.update([[0, 0, 1, 1]], [1.0, 0.5], [0], [], [])
    with pytest.raises(ValueError, match="iou_threshold expects a number in"):
        DetectionMAP(2, iou_threshold=0.0)


def test_kmeans_anchors_finds_the_clusters_smallest_first():
    rng = np.random.default_rng(1)
    centres = np.array([[30, 60], [8, 8], [60, 30]])
    sizes = np.concatenate([rng.normal(c, 0.5, (40, 2)) for c in centres])
    got = kmeans_anchors(sizes, k=3)
    np.testing.assert_allclose(got, centres[[1, 0, 2]], atol=0.5)
    with pytest.raises(ValueError, match="k expects 1 to 120"):
        kmeans_anchors(sizes, k=200)
    with pytest.raises(ValueError, match="positive"):
        kmeans_anchors(-sizes, k=2)
