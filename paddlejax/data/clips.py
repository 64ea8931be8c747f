"""Generated video clips for models that must see time: :class:`MovingDigits`, scikit-learn's
8x8 digits moving across a blank canvas, labelled by the direction they move in.

>>> clips = MovingDigits("test", num_frames=4, size=16)
>>> clips[0][0].shape, clips.class_names
((4, 1, 16, 16), ('right', 'left', 'down', 'up'))
"""
from __future__ import annotations

import numpy as np

from paddlejax.data.datasets import ArrayDataset, Digits, _check_split

DIRECTIONS = ("right", "left", "down", "up")
# (row, column) step of each direction; reversing a clip turns label k into k ^ 1
_STEPS = np.array([(0, 1), (0, -1), (1, 0), (-1, 0)])
_DIGIT = 8  # side of a scikit-learn digit
_SPLIT_STREAMS = {"train": 1, "test": 2, "all": 3}  # each split draws from its own random stream


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"MovingDigits: {name} expects an int >= {minimum}, got {value!r}")
    return int(value)


class MovingDigits(ArrayDataset):
    """Clips of ``num_frames`` frames in which one digit moves ``speed`` pixels per frame across
    a ``size`` x ``size`` black canvas, in a straight line; the label is the direction
    (:data:`DIRECTIONS`: 0 right, 1 left, 2 down, 3 up).

    The clips come in pairs: clip ``2k + 1`` is clip ``2k`` played backwards, with the opposite
    direction. A model that ignores the order of frames (one averaging per-frame predictions)
    gives both the same answer, so it gets at most one of each pair right: at most 50 % here,
    where guessing gets 25 %; telling the two apart needs the frames' order.

    The digits are those of :class:`~paddlejax.data.Digits`' ``split`` (held-out clips show
    held-out digits): pair ``k`` shows digit image ``k`` (cycling; by default one pair per
    image). The axis, start and placement are drawn with ``seed``, differently per split, pair
    by pair, so fewer clips are the first of more. Frames
    are float32 in [0, 1] with ``channels`` copies of the grey value (3 for stems made for RGB);
    a sample is ``(clip, label)``, the clip ``[T, C, H, W]`` (``layout="NCHW"``) or
    ``[T, H, W, C]`` (``"NHWC"``); ``arrays()`` gives ``(clips, labels)``, and ``digits`` the digit
    each clip shows.

    >>> data = MovingDigits("train", num_clips=6, num_frames=3, size=12, speed=2)
    >>> clips, labels = data.arrays()
    >>> clips.shape, labels.tolist()
    ((6, 3, 1, 12, 12), [2, 3, 2, 3, 0, 1])
    >>> bool((clips[1] == clips[0][::-1]).all())
    True
    """

    class_names = DIRECTIONS
    num_classes = len(DIRECTIONS)

    def __init__(self, split: str = "train", num_clips: int | None = None, num_frames: int = 8, size: int = 32,
                 speed: int = 2, channels: int = 1, layout: str = "NCHW", seed: int = 0):
        self.split = _check_split("MovingDigits", split)
        self.num_frames = _positive_int("num_frames", num_frames, 2)
        self.speed = _positive_int("speed", speed)
        self.size = _positive_int("size", size)
        travel = (self.num_frames - 1) * self.speed
        if self.size < _DIGIT + travel:
            raise ValueError(f"MovingDigits: size expects at least {_DIGIT + travel} (an 8-pixel digit moving "
                             f"{self.speed} pixels for {self.num_frames - 1} frames), got {size!r}")
        if channels not in (1, 3):
            raise ValueError(f"MovingDigits: channels expects 1 or 3, got {channels!r}")
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"MovingDigits: layout expects 'NCHW' or 'NHWC', got {layout!r}")
        digits = Digits(split)
        num_clips = 2 * len(digits) if num_clips is None else _positive_int("num_clips", num_clips, 2)
        if num_clips % 2:
            raise ValueError(f"MovingDigits: num_clips expects an even number (clips come in time-reversed pairs), "
                             f"got {num_clips}")
        self.layout = layout
        pairs = num_clips // 2
        rng = np.random.default_rng([seed, _SPLIT_STREAMS[split]])
        # one row per pair, drawn pair by pair so that fewer clips are the first of more:
        # right or down (the pair's other clip goes back), start along the motion and across it
        draws = np.array([rng.integers((0, 0, 0), (2, self.size - _DIGIT - travel + 1, self.size - _DIGIT + 1))
                          for _ in range(pairs)]).reshape(pairs, 3)
        forward, along, across = 2 * draws[:, 0], draws[:, 1], draws[:, 2]
        which = np.arange(pairs) % len(digits)
        frames = np.zeros((pairs, self.num_frames, self.size, self.size), np.float32)
        for k in range(pairs):
            start = (across[k], along[k]) if forward[k] == 0 else (along[k], across[k])
            for t in range(self.num_frames):
                row, col = np.array(start) + t * self.speed * _STEPS[forward[k]]
                frames[k, t, row:row + _DIGIT, col:col + _DIGIT] = digits.images[which[k], 0]
        clips = np.stack([frames, frames[:, ::-1]], axis=1).reshape(num_clips, self.num_frames, 1, self.size, self.size)
        clips = np.repeat(clips, channels, axis=2)
        self.clips = clips if layout == "NCHW" else clips.transpose(0, 1, 3, 4, 2).copy()
        self.labels = np.stack([forward, forward + 1], axis=1).reshape(-1).astype(np.int32)
        self.digits = np.repeat(digits.labels[which], 2)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(clips, labels)``, the whole split, in sample order."""
        return self.clips, self.labels
