"""temporal_shift beyond the op table: Paddle's documented pad-slice-concat formula, the channel
counts at awkward ratios, dtypes, gradients, symbolic frame counts, errors that name the op, its
traits and what pruning makes of them."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
import paddlejax.nn.functional as F
import paddlejax.ops as ops
from paddlejax.ops.traits import traits_of

X = np.random.default_rng(0).normal(size=(6, 8, 3, 2)).astype(np.float32)  # 2 clips of 3 frames, 8 channels


def paddle_formula(x, seg_num):
    """Paddle's documentation for shift_ratio 1/4: pad T by one frame each side, then
    ``concat(xp[:, :T, :C/4], xp[:, 2:T+2, C/4:C/2], xp[:, 1:T+1, C/2:])`` on the channel axis."""
    n, c = x.shape[0] // seg_num, x.shape[1]
    xp = np.pad(x.reshape(n, seg_num, *x.shape[1:]), ((0, 0), (1, 1), (0, 0), (0, 0), (0, 0)))
    out = np.concatenate([xp[:, :seg_num, :c // 4], xp[:, 2:seg_num + 2, c // 4:c // 2],
                          xp[:, 1:seg_num + 1, c // 2:]], axis=2)
    return out.reshape(x.shape)


def frame_of(out, x, seg_num):
    """For each (output frame, channel), the input frame it holds within its clip: -1 for back
    (t - 1), +1 for forward (t + 1), 0 for unshifted, None for zero; checked against ``x``."""
    moves = {}
    for ch in range(x.shape[1]):
        for d in (-1, 1, 0):
            src = np.arange(x.shape[0]) + d
            inside = (np.arange(x.shape[0]) % seg_num + d >= 0) & (np.arange(x.shape[0]) % seg_num + d < seg_num)
            want = np.where(inside[:, None, None], x[np.clip(src, 0, len(x) - 1), ch], 0)
            if np.array_equal(np.asarray(out[:, ch]), want):
                moves[ch] = -d if d else 0  # channel reads frame t + d: it moved forward in time by -d
                break
    return [moves.get(ch) for ch in range(x.shape[1])]


def test_matches_paddles_documented_formula():
    np.testing.assert_array_equal(ops.temporal_shift(X, seg_num=3), paddle_formula(X, 3))
    np.testing.assert_array_equal(F.temporal_shift(X, 3), paddle_formula(X, 3))


@pytest.mark.parametrize("channels, ratio, moved", [
    (8, 0.25, [1, 1, -1, -1, 0, 0, 0, 0]),       # c1 = 2, c2 = 4
    (6, 0.25, [1, -1, -1, 0, 0, 0]),             # c1 = int(1.5) = 1, c2 = int(3.0) = 3: not 2 * c1
    (3, 0.2, [-1, 0, 0]),                        # c1 = int(0.6) = 0: nothing from the previous frame
    (4, 0.49, [1, -1, -1, 0]),                   # c1 = int(1.96) = 1, c2 = int(3.92) = 3
    (2, 0.1, [0, 0]),                            # too few channels: nothing moves
])
def test_which_channels_move(channels, ratio, moved):
    x = np.random.default_rng(1).normal(size=(6, channels, 2, 2)).astype(np.float32) + 5  # no zeros
    # +1: the channel holds the previous frame (moved forward in time); -1: the next one
    assert frame_of(ops.temporal_shift(x, seg_num=3, shift_ratio=ratio), x, 3) == moved


def test_channel_counts_are_truncated_float32_products_as_in_paddle():
    # 2 * 50 * 0.29 is 28.999999999999996 in float64 but 29.0 in float32: Paddle shifts 29 - 14 channels forward
    x = np.random.default_rng(2).normal(size=(4, 50, 1, 1)).astype(np.float32) + 5
    moved = frame_of(ops.temporal_shift(x, seg_num=2, shift_ratio=0.29), x, 2)
    assert moved == [1] * 14 + [-1] * 15 + [0] * 21


def test_single_frame_clips_zero_the_shifted_channels():
    y = np.asarray(ops.temporal_shift(X, seg_num=1))
    assert not y[:, :4].any()
    np.testing.assert_array_equal(y[:, 4:], X[:, 4:])


def test_nhwc_is_nchw_transposed():
    nhwc = ops.temporal_shift(X.transpose(0, 2, 3, 1), seg_num=2, shift_ratio=0.125, data_format="NHWC")
    np.testing.assert_array_equal(np.asarray(nhwc).transpose(0, 3, 1, 2),
                                  ops.temporal_shift(X, seg_num=2, shift_ratio=0.125))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.int32])
def test_other_dtypes_move_exactly(dtype):
    x = jnp.asarray(X * 10).astype(dtype)
    y = ops.temporal_shift(x, seg_num=3)
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), paddle_formula(np.asarray(x, np.float32), 3))


def test_gradient_is_the_opposite_shift():
    w = np.random.default_rng(3).normal(size=X.shape).astype(np.float32)
    g = jax.grad(lambda x: jnp.sum(w * ops.temporal_shift(x, seg_num=3)))(X)
    # <w, S x> = <S^T w, x>: the back-moved channels of w move forward and vice versa
    clips = w.reshape(2, 3, *w.shape[1:])
    want = np.zeros_like(clips)
    want[:, :-1, :2] = clips[:, 1:, :2]
    want[:, 1:, 2:4] = clips[:, :-1, 2:4]
    want[:, :, 4:] = clips[:, :, 4:]
    np.testing.assert_array_equal(g, want.reshape(w.shape))


def test_symbolic_frame_counts_must_be_whole_clips():
    clips = jax.ShapeDtypeStruct(jax.export.symbolic_shape("3*b, 8, 3, 2"), jnp.float32)
    assert jax.eval_shape(lambda x: ops.temporal_shift(x, seg_num=3), clips).shape == clips.shape
    with pytest.raises(ValueError, match=r"temporal_shift: input 'x' expects a first dimension of N \* seg_num "
                                         r"frames \(seg_num=3\)"):
        pj.trace(lambda x: ops.temporal_shift(x, seg_num=3), pj.InputSpec((None, 8, 3, 2)))


@pytest.mark.parametrize("call, message", [
    (lambda: ops.temporal_shift(X[:4], seg_num=3),
     r"temporal_shift: input 'x' expects a first dimension of N \* seg_num frames \(seg_num=3\), got \(4, 8, 3, 2\)"),
    (lambda: ops.temporal_shift(X, seg_num=0), r"temporal_shift: attribute 'seg_num' expects values >= 1, got 0"),
    (lambda: ops.temporal_shift(X, seg_num=3, shift_ratio=0.5),
     r"temporal_shift: attribute 'shift_ratio' expects a ratio in \(0, 0.5\), got 0.5"),
    (lambda: ops.temporal_shift(X, seg_num=3, shift_ratio=0),
     r"temporal_shift: attribute 'shift_ratio' expects a ratio in \(0, 0.5\), got 0.0"),
    (lambda: ops.temporal_shift(X, seg_num=3, data_format="NCDHW"),
     r"temporal_shift: attribute 'data_format' expects one of \['NCHW', 'NHWC'\]"),
    (lambda: ops.temporal_shift(X[0], seg_num=1), r"temporal_shift: input 'x' expects rank 4, got shape \(8, 3, 2\)"),
    (lambda: jax.jit(lambda x: ops.temporal_shift(x, seg_num=4))(X), r"temporal_shift: input 'x' expects a first"),
])
def test_errors_name_the_op(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_traits():
    t = traits_of("temporal_shift")
    assert t.layout_sensitive and not t.pointwise and not t.reshaping and not t.has("commutes_with_quantize")
    assert t.channel_rule({}) is None  # which channels move depends on how many there are
    assert not t.couples_batch({}) and t.saved_for_backward == ()


def test_pruning_leaves_the_shifted_channels_alone():
    from paddlejax.slim.pruning.groups import ChannelGraph

    params = {"w1": np.ones((8, 2, 3, 3), np.float32), "w2": np.ones((4, 8, 3, 3), np.float32)}

    def groups(shift):
        def net(p, x):
            y = ops.relu(ops.conv2d(x, p["w1"]))
            return ops.conv2d(ops.temporal_shift(y, seg_num=2) if shift else y, p["w2"])

        return [g.producers for g in ChannelGraph(pj.trace(net, pj.InputSpec((4, 2, 8, 8)), params=params)).groups()]

    assert groups(shift=False) == [("w1",)] and groups(shift=True) == []
