"""MovingDigits: every frame holds one held-out (or training) digit where the label's motion puts
it, clips come in time-reversed pairs, and the draw is seeded and differs per split."""
import numpy as np
import pytest

from paddlejax.data import DataLoader, Digits, MovingDigits

STEP = {0: (0, 1), 1: (0, -1), 2: (1, 0), 3: (-1, 0)}  # label -> (row, column) step: right, left, down, up


def placement(frame, image):
    """The (row, column) where the 8x8 ``image`` sits in ``frame``, the rest black; None if nowhere."""
    size = frame.shape[0]
    for r in range(size - 7):
        for c in range(size - 7):
            rest = frame.copy()
            rest[r:r + 8, c:c + 8] = 0
            if np.array_equal(frame[r:r + 8, c:c + 8], image) and not rest.any():
                return r, c
    return None


@pytest.fixture(scope="module")
def test_clips():
    return MovingDigits("test", num_clips=40, num_frames=5, size=20, speed=3)


def test_every_frame_is_the_digit_moved_by_the_labels_step(test_clips):
    images = Digits("test").images[:, 0]
    clips, labels = test_clips.arrays()
    for k, (clip, label) in enumerate(zip(clips[:, :, 0], labels)):
        image = images[k // 2]  # pair k // 2 shows test digit k // 2
        where = [placement(frame, image) for frame in clip]
        assert None not in where, k
        steps = {(b[0] - a[0], b[1] - a[1]) for a, b in zip(where, where[1:])}
        assert steps == {tuple(3 * np.array(STEP[int(label)]))}, (k, label, where)
    np.testing.assert_array_equal(test_clips.digits, np.repeat(Digits("test").labels[:20], 2))


def test_clips_come_in_time_reversed_pairs(test_clips):
    clips, labels = test_clips.arrays()
    np.testing.assert_array_equal(clips[1::2], clips[0::2, ::-1])
    np.testing.assert_array_equal(labels[1::2], labels[0::2] ^ 1)
    counts = np.bincount(labels, minlength=4)
    assert counts[0] == counts[1] and counts[2] == counts[3] and counts.sum() == 40


def test_defaults_shapes_dtypes_layouts_and_channels():
    data = MovingDigits("test")
    assert len(data) == 720 and data.clips.shape == (720, 8, 1, 32, 32)  # a pair per test digit
    assert data.clips.dtype == np.float32 and data.labels.dtype == np.int32
    assert data.clips.min() == 0.0 and data.clips.max() == 1.0
    assert data.class_names == ("right", "left", "down", "up") and data.num_classes == 4
    rgb = MovingDigits("test", num_clips=4, channels=3, layout="NHWC")
    assert rgb.clips.shape == (4, 8, 32, 32, 3)
    np.testing.assert_array_equal(rgb.clips, np.repeat(data.clips[:4].transpose(0, 1, 3, 4, 2), 3, axis=-1))
    clip, label = data[3]
    np.testing.assert_array_equal(clip, data.clips[3])
    assert label == data.labels[3]


def test_seeded_split_apart_and_fewer_clips_are_the_first_of_more():
    a, b = MovingDigits("train", num_clips=20, size=24), MovingDigits("train", num_clips=60, size=24)
    np.testing.assert_array_equal(a.clips, b.clips[:20])
    np.testing.assert_array_equal(a.labels, b.labels[:20])
    other = MovingDigits("train", num_clips=20, size=24, seed=1)
    assert not np.array_equal(a.clips, other.clips)
    assert not np.array_equal(a.clips, MovingDigits("test", num_clips=20, size=24).clips)


def test_loader_batches_clips():
    clips, labels = next(iter(DataLoader(MovingDigits("test", num_clips=8, size=24), batch_size=4,
                                         device_prefetch=0)))
    assert clips.shape == (4, 8, 1, 24, 24) and labels.shape == (4,)


@pytest.mark.parametrize("kwargs, message", [
    ({"split": "val"}, r"MovingDigits: split expects one of \['train', 'test', 'all'\], got 'val'"),
    ({"size": 21}, r"MovingDigits: size expects at least 22 \(an 8-pixel digit moving 2 pixels for 7 frames\), "
                   r"got 21"),
    ({"num_clips": 7}, r"MovingDigits: num_clips expects an even number .* got 7"),
    ({"num_frames": 1}, r"MovingDigits: num_frames expects an int >= 2, got 1"),
    ({"speed": 0}, r"MovingDigits: speed expects an int >= 1, got 0"),
    ({"channels": 2}, r"MovingDigits: channels expects 1 or 3, got 2"),
    ({"layout": "NTCHW"}, r"MovingDigits: layout expects 'NCHW' or 'NHWC', got 'NTCHW'"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MovingDigits(**kwargs)
