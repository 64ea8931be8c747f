"""One table of op cases, each checked five ways: against an independent numpy/jax reference,
under jit (and as exactly one jaxpr equation), gradients (float64 finite differences), vmap
against a python loop, and shard_map over a CPU mesh against per-shard eager calls."""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P
from jax.test_util import check_grads

import paddlejax.ops as ops

sys.path.insert(0, str(Path(__file__).parent))  # the detection ops' loop references beside this file
from detection_reference import (np_deform_conv, np_grid_sample, np_roi_align, np_sigmoid_focal_loss,  # noqa: E402
                                 np_unfold, np_yolo_box, padded_nms, python_multiclass_nms)

_rng = np.random.default_rng(0)


def rand(*shape, low=None):
    """Seeded float32 normal samples (or uniform in [low, low + 1) to stay off kinks/poles)."""
    x = _rng.normal(size=shape) if low is None else low + _rng.random(size=shape)
    return np.asarray(x, np.float32)


def ints(high, *shape):
    return _rng.integers(0, high, size=shape).astype(np.int32)


@dataclasses.dataclass
class Case:
    op: ops.OpDef
    args: tuple
    attrs: dict
    ref: object  # ref(*args) -> expected output(s), computed independently of the kernel
    diff: tuple  # indices of differentiable inputs
    batched: tuple  # indices of inputs sharded / vmapped along a new or existing axis 0
    tol: float


def case(op, args, ref, attrs=None, diff=(0,), batched=(0,), tol=1e-5, id="", marks=()):
    c = Case(op, tuple(args), dict(attrs or {}), ref, diff, batched, tol)
    return pytest.param(c, id=f"{op.name}{'-' + id if id else ''}", marks=marks)


# ---------------------------------------------------------------------------------------
# numpy references


def np_conv(x, w, stride=(1, 1), pads=((0, 0), (0, 0)), dil=(1, 1), groups=1):
    """NCHW / OIHW convolution as a sum over kernel taps, in float64 numpy."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
    o, cg, kh, kw = w.shape
    ho = (xp.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (xp.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((x.shape[0], o, ho, wo))
    og = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, g * cg:(g + 1) * cg, i * dil[0]::stride[0], j * dil[1]::stride[1]][:, :, :ho, :wo]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", tap, w[g * og:(g + 1) * og, :, i, j])
    return out


def np_conv_transpose(x, w, stride, pads, out_pad=(0, 0), dil=(1, 1), groups=1):
    """Transposed conv as a scatter of every input pixel times the kernel, then a crop."""
    n, cin, h, wd = x.shape
    _, og, kh, kw = w.shape
    full = np.zeros((n, og * groups, (h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + out_pad[0],
                     (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + out_pad[1]))
    cg = cin // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, i, j])
                full[:, g * og:(g + 1) * og, i * dil[0]:i * dil[0] + (h - 1) * stride[0] + 1:stride[0],
                     j * dil[1]:j * dil[1] + (wd - 1) * stride[1] + 1:stride[1]] += contrib
    (t, b), (l, r) = pads
    return full[:, :, t:full.shape[2] - b, l:full.shape[3] - r]


def np_conv_nd(x, w, stride, pads, groups=1):
    """Channels-first grouped convolution in any number of spatial dims, over sliding windows, float64."""
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]  # [n, c, *out, *kernel]
    n, (out_c, cg) = x.shape[0], w.shape[:2]
    out, taps = "xyz"[:nd], "ijk"[:nd]
    y = np.einsum(f"ngc{out}{taps},goc{taps}->ngo{out}", win.reshape(n, groups, cg, *win.shape[2:]),
                  w.reshape(groups, out_c // groups, cg, *w.shape[2:]))
    return y.reshape(n, out_c, *y.shape[3:])


def np_interpolate(x, out, mode, align_corners=False, align_mode=0, scale=None):
    """Channels-first resize by Paddle's documented formulas, one output index at a time:
    source ``ratio * j`` (half-pixel ``ratio * (j + 0.5) - 0.5``, clamped at 0, for align_mode 0);
    as in Paddle's kernels, the ratio is 0 for an axis resized to 1."""
    y = x.astype(np.float64)
    for ax, o in enumerate(out, start=2):
        n = y.shape[ax]
        ratio = ((n - 1) / (o - 1) if align_corners else (1 / scale[ax - 2] if scale else n / o)) if o > 1 else 0
        rows = []
        for j in range(o):
            if mode == "nearest":
                rows.append(np.take(y, min(int(ratio * j), n - 1), axis=ax))
                continue
            src = max(ratio * (j + 0.5) - 0.5, 0) if align_mode == 0 and not align_corners else ratio * j
            lo = int(src)
            lam = src - lo
            rows.append((1 - lam) * np.take(y, lo, axis=ax) + lam * np.take(y, min(lo + 1, n - 1), axis=ax))
        y = np.stack(rows, axis=ax)
    return y


def np_pool(x, kind, k, s, pads=((0, 0), (0, 0)), ceil=False, exclusive=True):
    """NCHW pooling by explicit windows (Paddle's window bounds and divisors)."""
    def size(n, k, s, lo, hi):
        o = (-(-(n + lo + hi - k) // s) if ceil else (n + lo + hi - k) // s) + 1
        return o - 1 if ceil and (o - 1) * s >= n + lo else o

    h, w = x.shape[2:]
    (pt, pb), (pl, pr) = pads
    ho, wo = size(h, k[0], s[0], pt, pb), size(w, k[1], s[1], pl, pr)
    out = np.zeros(x.shape[:2] + (ho, wo))
    for a in range(ho):
        for b in range(wo):
            h0, w0 = a * s[0] - pt, b * s[1] - pl
            win = x[:, :, max(h0, 0):min(h0 + k[0], h), max(w0, 0):min(w0 + k[1], w)]
            if kind == "max":
                out[:, :, a, b] = win.max((2, 3))
            else:
                out[:, :, a, b] = win.sum((2, 3)) / (win.shape[2] * win.shape[3] if exclusive else k[0] * k[1])
    return out


def np_log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def np_norm(x, axes, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)


def np_cross_entropy(logits, label, ignore=-100, smooth=0.0, reduction="mean"):
    """Hard-label cross entropy over the last axis."""
    logp = np_log_softmax(logits)
    keep = label != ignore
    picked = -np.take_along_axis(logp, np.where(keep, label, 0)[..., None], -1)[..., 0]
    loss = np.where(keep, (1 - smooth) * picked - smooth * logp.mean(-1), 0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / max(keep.sum(), 1)}[reduction]


def np_weighted_nll(logp, label, weight, ignore=-100, reduction="mean"):
    """Class-weighted negative log likelihood with the class axis last: mean divides by the
    weights of the counted entries."""
    keep = label != ignore
    safe = np.where(keep, label, 0)
    w = np.where(keep, weight[safe], 0)
    loss = -np.take_along_axis(logp, safe[..., None], -1)[..., 0] * w
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / w.sum()}[reduction]


def np_attention(q, k, v, mask=None, causal=False, scale=None):
    logits = np.einsum("bqhd,bkhd->bhqk", q, k).astype(np.float64) * (scale or 1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        logits = np.where(mask, logits, -1e30) if mask.dtype == bool else logits + mask
    if causal:
        logits = np.where(np.tril(np.ones(logits.shape[-2:], bool)), logits, -1e30)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


def np_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def bn_ref(x, rm, rv, w, b, axis, training, momentum=0.9):
    axes = tuple(i for i in range(x.ndim) if i != axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    if training:
        mean, var = x.mean(axes), x.var(axes)
        return (np_norm(x, axes) * w.reshape(shape) + b.reshape(shape),
                momentum * rm + (1 - momentum) * mean, momentum * rv + (1 - momentum) * var)
    out = (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)
    return out, rm, rv


def np_group_norm(x, groups, w, b):
    n, c = x.shape[:2]
    y = np_norm(x.reshape(n, groups, -1), (2,)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * w.reshape(shape) + b.reshape(shape)


def np_spectral_norm(w, u, v, dim=0, iters=0, eps=1e-12):
    """(w / sigma, u, v) after ``iters`` power iterations on w with ``dim`` first, flattened to 2-D, in float64."""
    mat = np.moveaxis(w.astype(np.float64), dim, 0).reshape(w.shape[dim], -1)
    u, v = u.astype(np.float64), v.astype(np.float64)
    for _ in range(iters):
        v = mat.T @ u / (np.linalg.norm(mat.T @ u) + eps)
        u = mat @ v / (np.linalg.norm(mat @ v) + eps)
    return w / (u @ mat @ v), u, v


def np_adaptive_pool(x, out, kind):
    """NCHW adaptive pooling over Paddle's bins [floor(i*n/out), ceil((i+1)*n/out)); None keeps a size."""
    h, w = x.shape[2:]
    oh, ow = (n if o is None else o for n, o in zip((h, w), out))
    res = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, i * h // oh:-(-(i + 1) * h // oh), j * w // ow:-(-(j + 1) * w // ow)]
            res[:, :, i, j] = win.max((2, 3)) if kind == "max" else win.mean((2, 3))
    return res


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_lstm_cell(gx, gh, state):
    i, f, g, o = np.split(gx + gh, 4)
    c = np_sigmoid(f) * state[1] + np_sigmoid(i) * np.tanh(g)
    return np_sigmoid(o) * np.tanh(c), c


def np_gru_cell(gx, gh, state):
    (xr, xz, xc), (hr, hz, hc) = np.split(gx, 3), np.split(gh, 3)
    r, z = np_sigmoid(xr + hr), np_sigmoid(xz + hz)
    c = np.tanh(xc + r * hc)
    return ((state[0] - c) * z + c,)


def np_rnn(cell, x, state, w_ih, w_hh, b_ih, b_hh, lengths=None, reverse=False):
    """One recurrent layer, one sequence at a time over its valid steps only (the rest of the
    output stays zero); returns (out, *final states)."""
    batch, time, _ = x.shape
    lengths = np.full(batch, time) if lengths is None else lengths
    out = np.zeros((batch, time, w_hh.shape[1]))
    finals = []
    for n in range(batch):
        s = tuple(v[n].astype(np.float64) for v in state)
        steps = range(lengths[n])
        for t in (reversed(steps) if reverse else steps):
            s = cell(x[n, t] @ w_ih.T + b_ih, s[0] @ w_hh.T + b_hh, s)
            out[n, t] = s[0]
        finals.append(s)
    return (out, *(np.stack(f) for f in zip(*finals)))


def np_segment(data, ids, n, reduce):
    """Rows of ``data`` reduced per segment ``0 .. n - 1``, one segment at a time; 0 for an empty one."""
    out = np.zeros((n,) + data.shape[1:])
    for s in range(n):
        if (ids == s).any():
            out[s] = getattr(np, reduce)(data[ids == s].astype(np.float64), axis=0)
    return out


def np_message(x, y, src, dst, op):
    """Per-edge messages ``x[src] <op> y`` (``y`` already one row per edge)."""
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](x[src], y)


def np_temporal_shift(x, seg_num, ratio=0.25, nhwc=False):
    """Paddle's CPU kernel, one frame and channel at a time: channel c of frame t reads frame
    t - 1 (c < c1), t + 1 (c < c2) or t of its clip, zero outside it; c1, c2 truncated float32 products."""
    y = x.transpose(0, 3, 1, 2) if nhwc else x
    c = y.shape[1]
    c1, c2 = int(np.float32(c) * np.float32(ratio)), int(np.float32(2 * c) * np.float32(ratio))
    out = np.zeros_like(y)
    for i in range(y.shape[0]):
        t = i % seg_num
        for ch in range(c):
            src = t - 1 if ch < c1 else t + 1 if ch < c2 else t
            if 0 <= src < seg_num:
                out[i, ch] = y[i - t + src, ch]
    return out.transpose(0, 2, 3, 1) if nhwc else out


# ---------------------------------------------------------------------------------------
# The table

x_img, w_conv, b_conv = rand(2, 4, 6, 5), rand(6, 2, 3, 3), rand(6)
w_dw = rand(8, 1, 3, 3)
w_t = rand(4, 3, 3, 2)
logits, labels = rand(4, 5), ints(5, 4)
labels_ig = labels.copy()
labels_ig[1] = -100
soft = np.exp(rand(4, 5))
soft /= soft.sum(-1, keepdims=True)
class_w = rand(5, low=0.5)
x_vol = rand(2, 2, 3, 4, 3)
nll_logp = np.asarray(np_log_softmax(rand(4, 5, 3), 1), np.float32)
nll_label = ints(5, 4, 3)
nll_label[0, 1] = -100
q, k, v = rand(2, 3, 2, 4), rand(2, 5, 2, 4), rand(2, 5, 2, 4)
bool_mask = _rng.random((2, 1, 3, 5)) > 0.3
bool_mask[..., 0] = True  # every query keeps a key
key = np.asarray(jax.random.PRNGKey(42))
rm, rv = rand(4), rand(4, low=0.5)
gw, gb = rand(4), rand(4)
ids = ints(7, 2, 3)
table = rand(7, 5)
keys = np.stack([np.asarray(jax.random.PRNGKey(i)) for i in range(4)])
xs, lens = rand(2, 4, 3), np.array([4, 2], np.int32)
h0s, c0s = rand(2, 5), rand(2, 5)
lstm_w = (rand(20, 3), rand(20, 5), rand(20), rand(20))
gru_w = (rand(15, 3), rand(15, 5), rand(15), rand(15))
# detection and sampling, drawn from a generator of their own so the draws above stay as they were
_det = np.random.default_rng(1)
det_x, det_w = _det.normal(size=(2, 4, 6, 5)).astype(np.float32), _det.normal(size=(6, 2, 3, 3)).astype(np.float32)
det_offset = (1.5 * _det.normal(size=(2, 36, 3, 3))).astype(np.float32)
det_mask = _det.random((2, 18, 3, 3), np.float32)
roi_boxes = np.array([[1, 2, 9, 11], [-3, -2, 5, 4], [4, 1, 13.5, 12], [0, 0, 30, 20]], np.float32)
grid = _det.uniform(-1.3, 1.3, (2, 3, 4, 2)).astype(np.float32)
yolo_head, yolo_size = _det.normal(size=(2, 16, 3, 4)).astype(np.float32), np.array([[40, 50], [30, 60]], np.int32)
nms_boxes = np.concatenate([_det.uniform(0, 1, (2, 6, 2)), _det.uniform(1, 1.5, (2, 6, 2))], -1).astype(np.float32)
nms_scores = _det.random((2, 3, 6), np.float32).round(1)  # rounded: ties
NMS = dict(score_threshold=0.15, nms_top_k=4, keep_top_k=5, nms_threshold=0.4)

CASES = [
    # conv
    case(ops.conv2d, (x_img, w_conv, b_conv), lambda x, w, b: np_conv(x, w, groups=2) + b[:, None, None],
         {"groups": 2}, diff=(0, 1, 2), tol=1e-4),
    case(ops.conv2d, (x_img, w_conv[:, :, :2]), lambda x, w: np_conv(x, w, (2, 1), ((1, 1), (2, 0)), (2, 1), 2),
         {"groups": 2, "stride": (2, 1), "padding": [1, 1, 2, 0], "dilation": (2, 1)}, diff=(0, 1), tol=1e-4,
         id="strided"),
    case(ops.conv2d, (x_img.transpose(0, 2, 3, 1), rand(3, 4, 2, 2)),
         lambda x, w: np_conv(x.transpose(0, 3, 1, 2), w, pads=((0, 1), (0, 1))).transpose(0, 2, 3, 1),
         {"padding": "SAME", "data_format": "NHWC"}, diff=(0, 1), tol=1e-4, id="nhwc-same"),
    case(ops.depthwise_conv2d, (x_img, w_dw, rand(8)), lambda x, w, b: np_conv(x, w, pads=((1, 1), (1, 1)),
         groups=4) + b[:, None, None], {"padding": 1}, diff=(0, 1, 2), tol=1e-4),
    case(ops.conv1d, (rand(2, 4, 9), rand(6, 2, 3), rand(6)),
         lambda x, w, b: np_conv_nd(x, w, (2,), ((1, 2),), groups=2) + b[:, None],
         {"groups": 2, "stride": 2, "padding": (1, 2)}, diff=(0, 1, 2), tol=1e-4),
    case(ops.conv1d, (rand(2, 9, 4), rand(3, 4, 2)),
         lambda x, w: np_conv_nd(x.transpose(0, 2, 1), w, (1,), ((0, 1),)).transpose(0, 2, 1),
         {"padding": "SAME", "data_format": "NLC"}, diff=(0, 1), tol=1e-4, id="nlc-same"),
    case(ops.conv3d, (x_vol, rand(3, 2, 2, 3, 2), rand(3)),
         lambda x, w, b: np_conv_nd(x, w, (1, 2, 1), ((1, 1),) * 3) + b[:, None, None, None],
         {"stride": (1, 2, 1), "padding": 1}, diff=(0, 1, 2), tol=1e-4),
    case(ops.conv3d, (x_vol.transpose(0, 2, 3, 4, 1), rand(4, 1, 2, 2, 2)),
         lambda x, w: np_conv_nd(x.transpose(0, 4, 1, 2, 3), w, (1, 1, 1), ((1, 0), (0, 1), (1, 1)),
                                 groups=2).transpose(0, 2, 3, 4, 1),
         {"padding": ((1, 0), (0, 1), (1, 1)), "groups": 2, "data_format": "NDHWC"}, diff=(0, 1), tol=1e-4,
         id="ndhwc-grouped"),
    case(ops.conv2d_transpose, (x_img, w_t), lambda x, w: np_conv_transpose(x, w, (2, 1), ((1, 0), (0, 1)), (1, 0)),
         {"stride": (2, 1), "padding": ((1, 0), (0, 1)), "output_padding": (1, 0)}, diff=(0, 1), tol=1e-4),
    case(ops.conv2d_transpose, (x_img, rand(4, 2, 2, 3), rand(4)),
         lambda x, w, b: np_conv_transpose(x, w, (1, 2), ((0, 0), (1, 1)), dil=(2, 1), groups=2) + b[:, None, None],
         {"stride": (1, 2), "padding": (0, 1), "dilation": (2, 1), "groups": 2}, diff=(0, 1, 2), tol=1e-4,
         id="grouped"),
    # resize
    case(ops.interpolate, (x_img,), lambda x: np_interpolate(x, (12, 10), "nearest", scale=(2, 2)),
         {"scale_factor": 2.0}),
    case(ops.interpolate, (x_img,), lambda x: np_interpolate(x, (4, 7), "bilinear"),
         {"size": (4, 7), "mode": "bilinear"}, id="bilinear-half-pixel"),
    case(ops.interpolate, (x_img.transpose(0, 2, 3, 1),),
         lambda x: np_interpolate(x.transpose(0, 3, 1, 2), (9, 3), "bilinear", align_corners=True).transpose(0, 2, 3, 1),
         {"size": (9, 3), "mode": "bilinear", "align_corners": True, "data_format": "NHWC"}, id="align-corners-nhwc"),
    case(ops.interpolate, (rand(2, 3, 4),), lambda x: np_interpolate(x, (6,), "linear", align_mode=1, scale=(1.5,)),
         {"scale_factor": 1.5, "mode": "linear", "align_mode": 1, "data_format": "NCW"}, id="linear-align-mode-1"),
    case(ops.interpolate, (x_vol,), lambda x: np_interpolate(x, (6, 4, 1), "trilinear", scale=(2, 1, 0.5)),
         {"scale_factor": (2, 1, 0.5), "mode": "trilinear", "data_format": "NCDHW"}, id="trilinear"),
    # norm
    case(ops.batch_norm, (x_img, rm, rv, gw, gb), lambda *a: bn_ref(*a, axis=1, training=False),
         diff=(0, 1, 2, 3, 4), tol=1e-4, id="infer"),
    case(ops.batch_norm, (x_img.transpose(0, 2, 3, 1), rm, rv, gw, gb), lambda *a: bn_ref(*a, axis=3, training=True),
         {"training": True, "data_format": "NHWC"}, diff=(0, 3, 4), tol=1e-4, id="train-nhwc"),
    case(ops.batch_norm, (rand(4, 4), rm, rv), lambda x, m, v: bn_ref(x, m, v, np.ones(4), np.zeros(4), 1, True),
         {"training": True}, tol=1e-4, id="rank2"),
    case(ops.layer_norm, (x_img, rand(6, 5), rand(6, 5)), lambda x, w, b: np_norm(x, (2, 3)) * w + b,
         {"begin_norm_axis": 2}, diff=(0, 1, 2), tol=1e-4),
    case(ops.layer_norm, (rand(2, 3, 4),), lambda x: np_norm(x, (2,)), tol=1e-4, id="noaffine"),
    case(ops.group_norm, (x_img, gw, gb), lambda x, w, b: np_group_norm(x, 2, w, b), {"groups": 2},
         diff=(0, 1, 2), tol=1e-4),
    case(ops.group_norm, (x_img.transpose(0, 2, 3, 1), gw, gb),
         lambda x, w, b: np_group_norm(x.transpose(0, 3, 1, 2), 4, w, b).transpose(0, 2, 3, 1),
         {"groups": 4, "data_format": "NHWC"}, diff=(0, 1, 2), tol=1e-4, id="nhwc"),
    # gradients treat u and v as constants: exact without power iteration, which is checked without gradients
    case(ops.spectral_norm, (rand(4, 3, 2), rand(4), rand(6)), np_spectral_norm, {"power_iters": 0},
         batched=(0, 1), tol=1e-4),
    case(ops.spectral_norm, (rand(4, 3, 2), rand(3), rand(8)), lambda *a: np_spectral_norm(*a, dim=1, iters=3),
         {"dim": 1, "power_iters": 3}, diff=(), batched=(0, 2), tol=1e-4, id="dim1-iterated"),
    # math
    case(ops.linear, (rand(2, 3, 4), rand(4, 5), rand(5)), lambda x, w, b: x @ w + b, diff=(0, 1, 2), tol=1e-5),
    case(ops.matmul, (rand(2, 3, 4), rand(4, 5)), lambda x, y: x @ y, diff=(0, 1)),
    case(ops.matmul, (rand(2, 4, 3), rand(1, 5, 4)), lambda x, y: x.swapaxes(-1, -2) @ y.swapaxes(-1, -2),
         {"transpose_x": True, "transpose_y": True}, diff=(0, 1), id="transposed"),
    case(ops.matmul, (rand(2, 4), rand(4)), lambda x, y: x @ y, diff=(0, 1), id="vector"),
    *[case(op, (rand(2, 3, low=0.5), rand(3, low=1.0)), ref, diff=(0, 1))
      for op, ref in [(ops.elementwise_add, np.add), (ops.elementwise_sub, np.subtract),
                      (ops.elementwise_mul, np.multiply), (ops.elementwise_div, np.divide),
                      (ops.elementwise_max, np.maximum), (ops.elementwise_min, np.minimum),
                      (ops.elementwise_pow, np.power)]],
    case(ops.elementwise_add, (rand(2, 1, 3), rand(4, 1)), np.add, diff=(0, 1), id="broadcast"),
    case(ops.embedding, (ids, table), lambda i, t: t[i], diff=(1,)),
    case(ops.embedding, (ids, table), lambda i, t: np.where((i == 5)[..., None], 0, t[i]), {"padding_idx": -2},
         diff=(1,), id="padding"),
    # activations
    case(ops.relu, (rand(2, 5),), lambda x: np.maximum(x, 0)),
    case(ops.relu6, (3 * rand(2, 5),), lambda x: np.clip(x, 0, 6)),
    case(ops.gelu, (rand(2, 5),), np_gelu),
    case(ops.gelu, (rand(2, 5),), lambda x: jax.nn.gelu(x, approximate=True), {"approximate": True}, id="tanh"),
    case(ops.sigmoid, (rand(2, 5),), lambda x: 1 / (1 + np.exp(-x))),
    case(ops.tanh, (rand(2, 5),), np.tanh),
    case(ops.silu, (rand(2, 5),), lambda x: x / (1 + np.exp(-x))),
    case(ops.leaky_relu, (rand(2, 5),), lambda x: np.where(x > 0, x, 0.2 * x), {"negative_slope": 0.2}),
    case(ops.hard_swish, (2 * rand(2, 5),), lambda x: x * np.clip(x + 3, 0, 6) / 6),
    case(ops.hard_sigmoid, (5 * rand(2, 5),), lambda x: np.clip(x / 6 + 0.5, 0, 1), {"slope": 1 / 6}),
    case(ops.hard_sigmoid, (5 * rand(2, 5),), lambda x: np.clip(0.2 * x + 0.5, 0, 1), {"slope": 0.2}, id="onnx"),
    case(ops.softmax, (rand(2, 3, 4),), lambda x: np.exp(np_log_softmax(x, 1)), {"axis": 1}),
    case(ops.log_softmax, (rand(2, 5),), np_log_softmax),
    case(ops.prelu, (x_img, rand(4)), lambda x, w: np.where(x > 0, x, w[:, None, None] * x), diff=(0, 1)),
    case(ops.prelu, (x_img.transpose(0, 2, 3, 1), rand(4)), lambda x, w: np.where(x > 0, x, w * x),
         {"data_format": "NHWC"}, diff=(0, 1), id="nhwc"),
    case(ops.prelu, (rand(2, 5), rand(1)), lambda x, w: np.maximum(x, 0) + w * np.minimum(x, 0), diff=(0, 1),
         id="shared"),
    # pool
    case(ops.pool2d, (x_img,), lambda x: np_pool(x, "max", (2, 2), (2, 2)), {"kernel_size": 2}),
    case(ops.pool2d, (x_img,), lambda x: np_pool(x, "avg", (3, 2), (2, 2), ((1, 1), (0, 0)), ceil=True),
         {"pooling_type": "avg", "kernel_size": (3, 2), "stride": 2, "padding": (1, 0), "ceil_mode": True},
         id="avg-ceil", tol=1e-5),
    case(ops.pool2d, (x_img.transpose(0, 2, 3, 1),),
         lambda x: np_pool(x.transpose(0, 3, 1, 2), "avg", (3, 3), (1, 1), ((1, 1), (1, 1)),
                           exclusive=False).transpose(0, 2, 3, 1),
         {"pooling_type": "avg", "kernel_size": 3, "stride": 1, "padding": 1, "exclusive": False,
          "data_format": "NHWC"}, id="avg-inclusive-nhwc"),
    case(ops.pool2d, (x_img,), lambda x: x.max((2, 3), keepdims=True), {"global_pooling": True}, id="global"),
    case(ops.adaptive_pool2d, (x_img,), lambda x: np_adaptive_pool(x, (3, 2), "avg"), {"output_size": (3, 2)}),
    case(ops.adaptive_pool2d, (x_img.transpose(0, 2, 3, 1),),
         lambda x: np_adaptive_pool(x.transpose(0, 3, 1, 2), (4, None), "max").transpose(0, 2, 3, 1),
         {"output_size": (4, None), "pooling_type": "max", "data_format": "NHWC"}, id="max-nhwc"),
    # loss
    case(ops.cross_entropy, (logits, labels_ig), lambda x, y: np_cross_entropy(x, y), batched=(0, 1)),
    case(ops.cross_entropy, (logits, labels[:, None]),
         lambda x, y: np_cross_entropy(x, y[:, 0], smooth=0.1, reduction="none")[:, None],
         {"label_smoothing": 0.1, "reduction": "none"}, batched=(0, 1), id="smooth-none"),
    case(ops.cross_entropy, (logits, soft), lambda x, y: -(y * np_log_softmax(x)).sum(),
         {"soft_label": True, "reduction": "sum"}, diff=(0, 1), batched=(0, 1), id="soft"),
    case(ops.cross_entropy, (rand(2, 3, 4), ints(3, 2, 4)),
         lambda x, y: np_cross_entropy(x.transpose(0, 2, 1), y), {"axis": 1}, batched=(0, 1), id="axis1"),
    case(ops.cross_entropy, (logits, labels_ig, class_w), lambda x, y, w: np_weighted_nll(np_log_softmax(x), y, w),
         diff=(0, 2), batched=(0, 1), id="weighted"),
    case(ops.cross_entropy, (soft, labels, class_w), lambda p, y, w: np_weighted_nll(np.log(p), y, w, reduction="sum"),
         {"use_softmax": False, "reduction": "sum"}, diff=(0, 2), batched=(0, 1), id="probabilities"),
    case(ops.cross_entropy, (logits, soft, class_w),
         lambda x, y, w: (-(y * np_log_softmax(x)).sum(-1) * (y @ w)).sum() / (y @ w).sum(),
         {"soft_label": True}, diff=(0, 1, 2), batched=(0, 1), id="soft-weighted"),
    case(ops.nll_loss, (nll_logp, nll_label, class_w),
         lambda x, y, w: np_weighted_nll(x.transpose(0, 2, 1), y, w), diff=(0, 2), batched=(0, 1)),
    case(ops.nll_loss, (nll_logp[..., 0], nll_label[..., 0]),
         lambda x, y: np_weighted_nll(x, y, np.ones(5), reduction="none"), {"reduction": "none"}, batched=(0, 1),
         id="none"),
    # random
    case(ops.dropout, (rand(4, 6), key), lambda x, k: np.where(jax.random.bernoulli(k, 0.7, x.shape), x / 0.7, 0),
         {"p": 0.3}),
    case(ops.dropout, (rand(4, 6), key), lambda x, k: np.where(jax.random.bernoulli(k, 0.5, (4, 1)), 2 * x, 0),
         {"axis": 0}, id="axis"),
    case(ops.split_key, (keys,), lambda k: tuple(np.stack(v) for v in zip(*map(jax.random.split, k))), diff=()),
    # rnn
    case(ops.lstm, (xs, h0s, c0s, *lstm_w), lambda x, h, c, *w: np_rnn(np_lstm_cell, x, (h, c), *w),
         diff=tuple(range(7)), batched=(0, 1, 2), tol=1e-4),
    case(ops.lstm, (xs, h0s, c0s, *lstm_w, lens),
         lambda x, h, c, *w: np_rnn(np_lstm_cell, x, (h, c), *w, reverse=True), {"is_reverse": True},
         diff=tuple(range(7)), batched=(0, 1, 2, 7), tol=1e-4, id="reverse-lengths"),
    case(ops.gru, (xs, h0s, *gru_w, lens), lambda x, h, *w: np_rnn(np_gru_cell, x, (h,), *w),
         diff=tuple(range(6)), batched=(0, 1, 6), tol=1e-4, id="lengths"),
    case(ops.gru, (xs, h0s, *gru_w), lambda x, h, *w: np_rnn(np_gru_cell, x, (h,), *w, reverse=True),
         {"is_reverse": True}, diff=tuple(range(6)), batched=(0, 1), tol=1e-4, id="reverse"),
    # shape
    case(ops.reshape, (rand(2, 3, 4),), lambda x: x.reshape(2, 4, 3), {"shape": (0, -1, 3)}),
    case(ops.transpose, (rand(2, 3, 4),), lambda x: x.transpose(0, 2, 1), {"perm": (0, 2, 1)}),
    case(ops.concat, (rand(2, 3), rand(2, 1), rand(2, 2)), lambda *xs: np.concatenate(xs, 1), {"axis": -1},
         diff=(0, 1, 2), batched=(0, 1, 2)),
    case(ops.split, (rand(2, 6),), lambda x: tuple(np.split(x, 3, 1)), {"num_or_sections": 3, "axis": 1}),
    case(ops.split, (rand(2, 6),), lambda x: (x[:, :1], x[:, 1:4], x[:, 4:]), {"num_or_sections": (1, -1, 2),
         "axis": 1}, id="sections"),
    case(ops.slice, (rand(2, 5, 4),), lambda x: x[:, 1:-1, -3:], {"axes": (1, 2), "starts": (1, -3),
         "ends": (-1, 100)}),
    case(ops.pad, (rand(2, 3, 4),), lambda x: np.pad(x, ((0, 0), (1, 2), (0, 1)), constant_values=1.5),
         {"paddings": (0, 0, 1, 2, 0, 1), "value": 1.5}),
    case(ops.pad, (rand(2, 3, 4),), lambda x: np.pad(x, ((0, 0), (2, 1), (1, 3)), mode="reflect"),
         {"paddings": (0, 0, 2, 1, 1, 3), "mode": "reflect"}, id="reflect"),
    case(ops.pad, (rand(2, 3, 4),), lambda x: np.pad(x, ((0, 0), (0, 2), (3, 0)), mode="edge"),
         {"paddings": (0, 0, 0, 2, 3, 0), "mode": "edge"}, id="edge"),
    case(ops.cast, (rand(2, 3),), lambda x: x.astype(np.float64), {"dtype": "float64"}, id="float",
         marks=pytest.mark.filterwarnings("ignore:Explicitly requested dtype")),
    case(ops.cast, (3 * rand(2, 3),), lambda x: x.astype(np.int32), {"dtype": np.int32}, diff=(), id="int"),
    # reduce
    case(ops.reduce_sum, (rand(2, 3, 4),), lambda x: x.sum((1, 2)), {"axis": (-1, 1)}),
    case(ops.reduce_mean, (rand(2, 3, 4),), lambda x: x.mean(2, keepdims=True), {"axis": 2, "keepdim": True}),
    case(ops.reduce_max, (rand(2, 3, 4),), lambda x: x.max(), id="all"),
    # attention
    case(ops.scaled_dot_product_attention, (q, k, v), np_attention, diff=(0, 1, 2), batched=(0, 1, 2), tol=1e-5),
    case(ops.scaled_dot_product_attention, (q, k, v, bool_mask),
         lambda *a: np_attention(*a, causal=True, scale=0.3), {"is_causal": True, "scale": 0.3}, diff=(0, 1, 2),
         batched=(0, 1, 2, 3), id="causal-boolmask"),
    case(ops.scaled_dot_product_attention, (q, k, v, rand(3, 5)), np_attention, diff=(0, 1, 2, 3),
         batched=(0, 1, 2), id="additive"),
    # detection and sampling
    case(ops.deformable_conv2d, (det_x, det_offset, det_w, det_mask, rand(6)),
         lambda *a: np_deform_conv(*a, (2, 2), (1, 1), (1, 1), 2, 2),
         {"stride": 2, "padding": 1, "deformable_groups": 2, "groups": 2}, diff=(0, 1, 2, 3, 4), batched=(0, 1, 3),
         tol=1e-4),
    case(ops.deformable_conv2d, (det_x, 2 * rand(2, 12, 8, 6), rand(3, 4, 3, 2)),
         lambda x, o, w: np_deform_conv(x, o, w, padding=(3, 1), dilation=(2, 1)),
         {"padding": (3, 1), "dilation": (2, 1)}, diff=(0, 1, 2), batched=(0, 1), tol=1e-4, id="v1-dilated"),
    case(ops.roi_align, (rand(2, 3, 6, 7), roi_boxes, np.array([2, 2], np.int32)),
         lambda x, b, n: np_roi_align(x, b, n, (2, 3), 0.5), {"output_size": (2, 3), "spatial_scale": 0.5},
         batched=(0, 1, 2)),
    case(ops.roi_align, (rand(2, 3, 6, 7), roi_boxes, np.array([2, 2], np.int32)),
         lambda x, b, n: np_roi_align(x, b, n, (3, 2), 0.5, 2, False),
         {"output_size": (3, 2), "spatial_scale": 0.5, "sampling_ratio": 2, "aligned": False}, batched=(0, 1, 2),
         id="ratio2-unaligned"),
    case(ops.grid_sample, (rand(2, 3, 5, 4), grid), np_grid_sample, diff=(0, 1), batched=(0, 1)),
    case(ops.grid_sample, (rand(2, 3, 5, 4), grid),
         lambda x, g: np_grid_sample(x, g, "bilinear", "reflection", False),
         {"padding_mode": "reflection", "align_corners": False}, diff=(0, 1), batched=(0, 1), id="reflection"),
    case(ops.grid_sample, (rand(2, 3, 5, 4), grid), lambda x, g: np_grid_sample(x, g, "nearest", "border"),
         {"mode": "nearest", "padding_mode": "border"}, batched=(0, 1), id="nearest-border"),
    case(ops.yolo_box, (yolo_head, yolo_size), lambda x, s: np_yolo_box(x, s, (10, 13, 16, 30), 3, 0.4, 8),
         {"anchors": (10, 13, 16, 30), "class_num": 3, "conf_thresh": 0.4, "downsample_ratio": 8}, batched=(0, 1),
         tol=1e-4),
    case(ops.unfold, (rand(2, 3, 5, 6),), lambda x: np_unfold(x, (2, 3), (2, 1), (1, 0, 0, 2), (1, 2)),
         {"kernel_sizes": (2, 3), "strides": (2, 1), "paddings": (1, 0, 0, 2), "dilations": (1, 2)}),
    case(ops.einsum, (rand(2, 3, 4), rand(2, 4, 5)), lambda a, b: np.einsum("bij,bjk->bik", a, b),
         {"equation": "bij,bjk->bik"}, diff=(0, 1), batched=(0, 1)),
    case(ops.einsum, (rand(2, 3, 4), rand(4, 5)), lambda a, w: np.einsum("...ij,jk", a, w), {"equation": "...ij,jk"},
         diff=(0, 1), id="implicit"),
    case(ops.sigmoid_focal_loss, (3 * rand(4, 5), rand(4, 5, low=0.0), rand(1, low=2.0)), np_sigmoid_focal_loss,
         diff=(0, 1, 2), batched=(0, 1)),
    case(ops.sigmoid_focal_loss, (3 * rand(4, 5), (rand(4, 5) > 0).astype(np.float32)),
         lambda x, y: np_sigmoid_focal_loss(x, y, alpha=0.5, gamma=1.5, reduction="none"),
         {"alpha": 0.5, "gamma": 1.5, "reduction": "none"}, batched=(0, 1), id="none"),
    # selection: no gradient to check
    case(ops.multiclass_nms, (nms_boxes, nms_scores), lambda b, s: padded_nms(python_multiclass_nms(b, s, **NMS), 5),
         NMS, diff=(), batched=(0, 1)),
    # segment reductions (segments 2 and 4 empty) and message passing (node 4 receives nothing)
    *[case(op, (rand(6, 3), np.array([0, 0, 1, 3, 3, 3], np.int32)), lambda d, i, r=r: np_segment(d, i, 5, r),
           {"num_segments": 5}, batched=(0, 1))
      for op, r in [(ops.segment_sum, "sum"), (ops.segment_mean, "mean"), (ops.segment_max, "max"),
                    (ops.segment_min, "min")]],
    case(ops.segment_max, (ints(9, 6, 2) - 4, np.array([0, 2, 2, 2, 3, 3], np.int32)),
         lambda d, i: np_segment(d, i, 4, "max"), {"num_segments": 4}, diff=(), batched=(0, 1), id="int"),
    *[case(ops.send_u_recv, (rand(5, 3), ints(5, 8), ints(4, 8)), lambda x, s, d, r=r: np_segment(x[s], d, 6, r),
           {"reduce_op": r, "out_size": 6}, batched=(1, 2), id=r) for r in ("sum", "mean", "max", "min")],
    case(ops.send_ue_recv, (rand(5, 3), rand(8, 1), ints(5, 8), ints(4, 8)),
         lambda x, y, s, d: np_segment(np_message(x, y, s, d, "mul"), d, 5, "mean"),
         {"message_op": "mul", "reduce_op": "mean"}, diff=(0, 1), batched=(1, 2, 3)),
    case(ops.send_ue_recv, (rand(5, 3), rand(8, 3), ints(5, 8), ints(4, 8)),
         lambda x, y, s, d: np_segment(np_message(x, y, s, d, "sub"), d, 5, "max"),
         {"message_op": "sub", "reduce_op": "max"}, diff=(0, 1), batched=(1, 2, 3), id="sub-max"),
    case(ops.send_uv, (rand(5, 3), rand(4, 3, low=1.0), ints(5, 8), ints(4, 8)),
         lambda x, y, s, d: np_message(x, y[d], s, d, "div"), {"message_op": "div"}, diff=(0, 1), batched=(2, 3)),
    # video: one clip per shard; 6 channels at 0.25 shift 1 back and int(3.0) - 1 = 2 forward
    case(ops.temporal_shift, (rand(4, 6, 2, 3),), lambda x: np_temporal_shift(x, 2), {"seg_num": 2}),
    case(ops.temporal_shift, (rand(6, 2, 3, 8),), lambda x: np_temporal_shift(x, 3, 0.125, nhwc=True),
         {"seg_num": 3, "shift_ratio": 0.125, "data_format": "NHWC"}, id="nhwc"),
    case(ops.conv2d_pool, (x_img, w_conv, b_conv),
         lambda x, w, b: np_pool(np.maximum(np_conv(x, w, pads=((1, 1), (1, 1)), groups=2) + b[:, None, None], 0),
                                 "avg", (3, 3), (2, 2), ((1, 1), (1, 1)), ceil=True),
         {"groups": 2, "padding": 1, "act": "relu", "pooling_type": "avg", "pool_size": 3, "pool_stride": 2,
          "pool_padding": 1, "ceil_mode": True}, diff=(0, 1, 2), tol=1e-4),
]


BATCHED = [p for p in CASES if p.values[0].batched]

# ---------------------------------------------------------------------------------------
# Helpers


def call(c, *args):
    return c.op(*args, **c.attrs)


def assert_close(got, want, tol):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tol, atol=tol)


def second_example(a):
    """A different but equally valid example for a batch: the input with all axes reversed."""
    return np.flip(a, tuple(range(np.ndim(a)))).copy()


def stack(trees):
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


# ---------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(c):
    assert_close(call(c, *c.args), c.ref(*c.args), c.tol)


@pytest.mark.parametrize("c", CASES)
def test_jit_and_single_equation(c):
    assert_close(jax.jit(lambda *a: call(c, *a))(*c.args), call(c, *c.args), 1e-6)
    jaxpr = jax.make_jaxpr(lambda *a: call(c, *a))(*c.args)
    assert [e.primitive.name for e in jaxpr.eqns] == [c.op.name]


@pytest.mark.parametrize("c", [p for p in CASES if p.values[0].diff])  # all but casts to int
def test_grads(c):
    with jax.enable_x64(True):
        args = [jnp.asarray(a, jnp.float64) if np.issubdtype(np.asarray(a).dtype, np.floating) else jnp.asarray(a)
                for a in c.args]

        def f(*diff_args):
            full = list(args)
            for i, a in zip(c.diff, diff_args):
                full[i] = a
            return call(c, *full)

        diff = [args[i] for i in c.diff]
        check_grads(f, diff, order=1, modes=("rev",), atol=1e-5, rtol=1e-5)

        def loss(*d):
            return sum(jnp.sum(o) for o in jax.tree.leaves(f(*d)))

        argnums = tuple(range(len(diff)))
        assert_close(jax.jit(jax.grad(loss, argnums))(*diff), jax.grad(loss, argnums)(*diff), 1e-8)


@pytest.mark.parametrize("c", BATCHED)
def test_vmap(c):
    examples = [c.args, [second_example(a) if i in c.batched else a for i, a in enumerate(c.args)]]
    batched = [np.stack([e[i] for e in examples]) if i in c.batched else a for i, a in enumerate(c.args)]
    in_axes = [0 if i in c.batched else None for i in range(len(c.args))]
    got = jax.vmap(lambda *a: call(c, *a), in_axes=in_axes)(*batched)
    assert_close(got, stack([call(c, *e) for e in examples]), 1e-5)


@pytest.mark.parametrize("c", BATCHED)
def test_shard_map(c):
    n = 2
    mesh = Mesh(np.array(jax.devices()[:n]), ("d",))
    in_specs = tuple(P("d") if i in c.batched else P() for i in range(len(c.args)))

    def body(*a):  # a leading per-shard axis lets every output (even a scalar) be concatenated
        return jax.tree.map(lambda o: o[None], call(c, *a))

    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P("d")))(*c.args)
    shards = [[np.split(a, n)[s] if i in c.batched else a for i, a in enumerate(c.args)] for s in range(n)]
    assert_close(got, stack([call(c, *s) for s in shards]), 1e-5)


def test_max_pooling_of_int8_pads_with_the_lowest_int8():
    x = -np.arange(1, 17, dtype=np.int8).reshape(1, 1, 4, 4)  # all negative: a zero pad would win
    y = ops.pool2d(x, pooling_type="max", kernel_size=(2, 2), stride=(2, 2), padding=((1, 1), (1, 1)))
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, ops.pool2d(x.astype(np.float32), pooling_type="max", kernel_size=(2, 2),
                                                stride=(2, 2), padding=((1, 1), (1, 1))).astype(np.int8))


def test_average_pooling_of_integers_is_refused():
    with pytest.raises(ValueError, match="floating values for average pooling"):
        ops.pool2d(np.ones((1, 1, 4, 4), np.int8), pooling_type="avg", kernel_size=(2, 2))
