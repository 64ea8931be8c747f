"""``temporal_shift`` (Paddle's ``F.temporal_shift``, the Temporal Shift Module of Lin et al.):
a batch of clips laid out as ``[N * T, C, H, W]`` frames (``seg_num`` = T consecutive frames
per clip) in which part of the channels move one frame along time, zero filled at the clip's
ends, so the convolution that follows mixes neighbouring frames at no cost in FLOPs.

With ``c1 = int(C * shift_ratio)`` and ``c2 = int(2 * C * shift_ratio)`` (computed in float32,
as Paddle does), frame ``t`` of the output takes channels ``[0, c1)`` from frame ``t - 1``,
channels ``[c1, c2)`` from frame ``t + 1`` and the rest from frame ``t``.

>>> import jax.numpy as jnp
>>> x = jnp.arange(1.0, 4.0).reshape(3, 1, 1, 1) * jnp.array([1.0, 10.0, 100.0, 1000.0]).reshape(1, 4, 1, 1)
>>> temporal_shift(x, seg_num=3)[:, :, 0, 0].tolist()  # one clip of 3 frames, 4 channels
[[0.0, 20.0, 100.0, 1000.0], [1.0, 30.0, 200.0, 2000.0], [2.0, 0.0, 300.0, 3000.0]]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.ops.common import LAYOUTS, attr_error, channel_axis, input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits


def shifted_channels(channels: int, shift_ratio: float) -> tuple[int, int]:
    """``(c1, c2)``: channels ``[0, c1)`` come from the previous frame, ``[c1, c2)`` from the
    next one. Paddle's kernels compute both in float32 and truncate.

    >>> shifted_channels(6, 0.25), shifted_channels(8, 0.125)
    ((1, 3), (1, 2))
    """
    ratio = np.float32(shift_ratio)
    return int(np.float32(channels) * ratio), int(np.float32(2 * channels) * ratio)


def _temporal_shift(x, *, seg_num, shift_ratio, data_format):
    """``x`` ``[N*T, C, H, W]`` (or ``[N*T, H, W, C]``) with its first ``c1`` channels taken from
    the previous frame of the clip and the next ``c2 - c1`` from the following one, zero at the
    clip's ends."""
    if not 0 < shift_ratio < 0.5:
        raise attr_error("temporal_shift", "shift_ratio", "a ratio in (0, 0.5)", shift_ratio)
    frames = x.shape[0]
    if (frames % seg_num) != 0:  # a symbolic count passes only as a visible multiple (seg_num * b)
        raise input_error("temporal_shift", "x", f"a first dimension of N * seg_num frames (seg_num={seg_num})",
                          tuple(x.shape))
    axis = channel_axis(data_format, 4) + 1  # in the [N, T, ...] view
    c1, c2 = shifted_channels(x.shape[axis - 1], shift_ratio)
    clips = x.reshape(frames // seg_num, seg_num, *x.shape[1:])
    padded = jnp.pad(clips, [(0, 0), (1, 1)] + [(0, 0)] * 3)

    def channels(a, start, stop):
        return jax.lax.slice_in_dim(a, start, stop, axis=axis)

    out = jnp.concatenate([channels(padded[:, :seg_num], 0, c1),       # from frame t - 1
                           channels(padded[:, 2:], c1, c2),             # from frame t + 1
                           channels(clips, c2, clips.shape[axis])], axis=axis)
    return out.reshape(x.shape)


temporal_shift = define(
    "temporal_shift", _temporal_shift, inputs=[Input("x", rank=4)],
    attrs={"seg_num": Attr("int", minimum=1), "shift_ratio": Attr("float", 0.25),
           "data_format": Attr("str", "NCHW", choices=LAYOUTS)},
    flops=lambda ins, outs, attrs: 0,  # data movement
    # Channels are not mixed, but which ones move depends on the channel count (c1, c2 above):
    # pruning channels would move others, so the op ends a channel group (no rule). Rows mix
    # only inside a clip of seg_num rows and a row count of whole clips is enforced, so a batch
    # split or padded by whole clips (a [N, T, ...] program's batch axis) computes the same:
    # not batch-coupled. The zero fill keeps this from commuting with non-decreasing maps.
    traits=Traits(layout_sensitive=True, saved_for_backward=()))
