"""Paddle's ``paddle.nn.functional``: activations, convolutions, pooling, normalisation,
losses, padding, resizing and embedding as functions, with Paddle's argument names and
defaults. Each calls the op library where the op exists (``conv2d``, ``cross_entropy``,
``interpolate``, ...), so a trace shows the op; the simple losses are written in ``jax.numpy``.

>>> import jax.numpy as jnp, paddlejax.nn.functional as F
>>> F.relu(jnp.array([-1.0, 2.0])).tolist()
[0.0, 2.0]
>>> F.interpolate(jnp.ones((1, 3, 4, 4)), scale_factor=2, mode="bilinear").shape
(1, 3, 8, 8)
>>> round(float(F.mse_loss(jnp.array([1.0, 2.0]), jnp.array([1.0, 4.0]))), 4)
2.0

Losses take ``reduction`` ``"mean"`` (the default), ``"sum"`` or ``"none"``; they compute in
at least float32 and return the input's dtype (float32 for integer input).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax import ops
from paddlejax.nn import random
from paddlejax.nn.args import arg_error, choice, is_int, is_number, positive_int, probability
from paddlejax.nn.conv import conv2d_transpose_to, spatial_padding
from paddlejax.ops.conv import CONV_LAYOUTS
from paddlejax.ops.common import channel_axis

# ---------------------------------------------------------------------------------------
# Activations


def relu(x):
    """``max(x, 0)``."""
    return ops.relu(x)


def relu6(x):
    """``min(max(x, 0), 6)``."""
    return ops.relu6(x)


def gelu(x, approximate=False):
    """Gaussian error linear unit: exact erf form, or the tanh form if ``approximate``."""
    return ops.gelu(x, approximate=approximate)


def sigmoid(x):
    """``1 / (1 + exp(-x))``."""
    return ops.sigmoid(x)


def tanh(x):
    """Hyperbolic tangent."""
    return ops.tanh(x)


def silu(x):
    """``x * sigmoid(x)``."""
    return ops.silu(x)


def hardswish(x):
    """``x * relu6(x + 3) / 6``."""
    return ops.hard_swish(x)


def leaky_relu(x, negative_slope=0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
    return ops.leaky_relu(x, negative_slope=negative_slope)


def prelu(x, weight, data_format="NCHW"):
    """``x`` where positive, ``weight * x`` elsewhere; ``weight`` has 1 element or one per channel.

    >>> prelu(jnp.array([[-2.0, -2.0]]), jnp.array([0.5, 0.25]), data_format="NC").tolist()
    [[-1.0, -0.5]]
    """
    return ops.prelu(x, weight, data_format=data_format)


def _cast(x, dtype):
    return x if dtype is None else x.astype(dtype)


def softmax(x, axis=-1, dtype=None):
    """``exp(x) / sum(exp(x))`` along ``axis``; ``dtype`` casts ``x`` first, as in Paddle."""
    return ops.softmax(_cast(x, dtype), axis=axis)


def log_softmax(x, axis=-1, dtype=None):
    """``log(softmax(x))`` along ``axis``, computed stably; ``dtype`` casts ``x`` first."""
    return ops.log_softmax(_cast(x, dtype), axis=axis)


# ---------------------------------------------------------------------------------------
# Convolution and linear


def _conv(op, ndim, x, weight, bias, stride, padding, dilation, groups, data_format):
    data_format = choice(op.name, "data_format", data_format, CONV_LAYOUTS[ndim])
    args = (x, weight) if bias is None else (x, weight, bias)
    return op(*args, stride=stride, padding=spatial_padding(op.name, padding, data_format), dilation=dilation,
              groups=groups, data_format=data_format)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, data_format="NCL"):
    """1-D convolution with Paddle's ``weight [out_c, in_c / groups, k]`` (see :class:`~paddlejax.nn.Conv1D`).

    >>> conv1d(jnp.ones((1, 2, 5)), jnp.ones((3, 2, 3)), padding=1).shape
    (1, 3, 5)
    """
    return _conv(ops.conv1d, 1, x, weight, bias, stride, padding, dilation, groups, data_format)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, data_format="NCHW"):
    """2-D convolution with Paddle's ``weight [out_c, in_c / groups, kh, kw]``; ``padding`` takes
    Paddle's forms (see :class:`~paddlejax.nn.Conv2D`)."""
    return _conv(ops.conv2d, 2, x, weight, bias, stride, padding, dilation, groups, data_format)


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, data_format="NCDHW"):
    """3-D convolution with Paddle's ``weight [out_c, in_c / groups, kd, kh, kw]``."""
    return _conv(ops.conv3d, 3, x, weight, bias, stride, padding, dilation, groups, data_format)


def conv2d_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     data_format="NCHW", output_size=None):
    """Transposed 2-D convolution with Paddle's ``weight [in_c, out_c / groups, kh, kw]``;
    ``output_size`` (``[h, w]``, instead of ``output_padding``) picks among the output sizes a
    strided convolution can produce (see :class:`~paddlejax.nn.Conv2DTranspose`).

    >>> conv2d_transpose(jnp.ones((1, 2, 3, 3)), jnp.ones((2, 1, 3, 3)), stride=2, output_size=[8, 8]).shape
    (1, 1, 8, 8)
    """
    args = (x, weight) if bias is None else (x, weight, bias)
    attrs = dict(stride=stride, padding=spatial_padding("conv2d_transpose", padding, data_format),
                 output_padding=output_padding, groups=groups, dilation=dilation, data_format=data_format)
    if output_size is None:
        return ops.conv2d_transpose(*args, **attrs)
    if output_padding not in (0, (0, 0), [0, 0]):
        raise arg_error("conv2d_transpose", "output_padding", "0 when output_size is given", output_padding)
    return conv2d_transpose_to("conv2d_transpose", args, ops.conv2d_transpose.check_attrs(attrs), output_size)


def linear(x, weight, bias=None):
    """``x @ weight + bias`` with Paddle's ``weight [in_features, out_features]``."""
    return ops.linear(x, weight) if bias is None else ops.linear(x, weight, bias)


def embedding(x, weight, padding_idx=None, sparse=False):
    """Rows of ``weight`` picked by integer ids ``x``; the ``padding_idx`` row reads as zeros
    and gets no gradient. ``sparse`` is accepted for compatibility (gradients are dense)."""
    if not isinstance(sparse, bool):
        raise arg_error("embedding", "sparse", "a bool", sparse)
    return ops.embedding(x, weight, padding_idx=padding_idx)


def one_hot(x, num_classes):
    """float32 one-hot vectors of integer ids ``x`` (a new last axis of ``num_classes``).

    >>> one_hot(jnp.array([0, 2]), 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise arg_error("one_hot", "x", "an int array of class ids", jnp.result_type(x))
    return jax.nn.one_hot(x, positive_int("one_hot", "num_classes", num_classes), dtype=jnp.float32)


# ---------------------------------------------------------------------------------------
# Pooling: the layers validate and call the ops


def max_pool2d(x, kernel_size, stride=None, padding=0, return_mask=False, ceil_mode=False, data_format="NCHW"):
    """Max pooling over ``kernel_size`` windows (see :class:`~paddlejax.nn.MaxPool2D`)."""
    from paddlejax.nn.pooling import MaxPool2D

    return MaxPool2D(kernel_size, stride, padding, return_mask, ceil_mode, data_format)(x)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, exclusive=True, divisor_override=None,
               data_format="NCHW"):
    """Average pooling (see :class:`~paddlejax.nn.AvgPool2D`)."""
    from paddlejax.nn.pooling import AvgPool2D

    return AvgPool2D(kernel_size, stride, padding, ceil_mode, exclusive, divisor_override, data_format)(x)


def adaptive_avg_pool2d(x, output_size, data_format="NCHW"):
    """Average pooling into an ``output_size`` grid with Paddle's adaptive bins."""
    return ops.adaptive_pool2d(x, output_size=output_size, pooling_type="avg", data_format=data_format)


def adaptive_max_pool2d(x, output_size, return_mask=False):
    """Max pooling into an ``output_size`` grid with Paddle's adaptive bins."""
    if return_mask:
        raise arg_error("adaptive_max_pool2d", "return_mask", "False (max-pooling indices are not supported)",
                        return_mask)
    return ops.adaptive_pool2d(x, output_size=output_size, pooling_type="max")


def _adaptive_pool1d(name, x, output_size, pooling_type):
    if x.ndim != 3:
        raise ValueError(f"{name}: input 'x' expects rank 3 [N, C, L], got shape {tuple(x.shape)}")
    # one row of a 2-D adaptive pool: the bins along L are the same
    y = ops.adaptive_pool2d(x[:, :, None, :], output_size=(1, positive_int(name, "output_size", output_size)),
                            pooling_type=pooling_type)
    return y[:, :, 0, :]


def adaptive_avg_pool1d(x, output_size):
    """Average pooling of ``x [N, C, L]`` into ``output_size`` adaptive bins along L.

    >>> adaptive_avg_pool1d(jnp.arange(6.0).reshape(1, 1, 6), 2).tolist()
    [[[1.0, 4.0]]]
    """
    return _adaptive_pool1d("adaptive_avg_pool1d", x, output_size, "avg")


def adaptive_max_pool1d(x, output_size, return_mask=False):
    """Max pooling of ``x [N, C, L]`` into ``output_size`` adaptive bins along L."""
    if return_mask:
        raise arg_error("adaptive_max_pool1d", "return_mask", "False (max-pooling indices are not supported)",
                        return_mask)
    return _adaptive_pool1d("adaptive_max_pool1d", x, output_size, "max")


# ---------------------------------------------------------------------------------------
# Dropout and normalisation


def dropout(x, p=0.5, axis=None, training=True, mode="upscale_in_train", *, key=None):
    """Zero elements with probability ``p`` while ``training`` (Paddle's modes, see
    :class:`~paddlejax.nn.Dropout`).

    The mask comes from ``key`` (a raw ``uint32[2]`` key), else from the next key of the
    global stream (:func:`paddlejax.nn.seed`); under ``jax.jit`` that key is fixed when
    tracing, so pass ``key`` (or use the :class:`~paddlejax.nn.Dropout` layer, which carries
    its own) for a fresh mask per step.
    """
    p = probability("dropout", "p", p)
    if key is None:
        key = jax.random.key_data(random.next_key(stream="dropout"))
    return ops.dropout(x, key, p=p, training=training, mode=mode, axis=axis)


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.9, epsilon=1e-05,
               data_format="NCHW", use_global_stats=None):
    """Batch norm over all axes but the channel one, with batch statistics while ``training``
    (unless ``use_global_stats``) and the running ones otherwise. Returns the output only:
    arrays are immutable, so the running statistics are not updated (the BatchNorm layers
    keep and update them)."""
    use_batch = training if use_global_stats is None else not use_global_stats
    if weight is None and bias is not None:
        weight = jnp.ones_like(bias)
    out, _, _ = ops.batch_norm(x, running_mean, running_var, weight, bias, epsilon=epsilon, momentum=momentum,
                               training=use_batch, data_format=data_format)
    return out


def layer_norm(x, normalized_shape, weight=None, bias=None, epsilon=1e-05):
    """Normalise over the trailing ``normalized_shape`` axes (flat or shaped ``weight`` / ``bias``).

    >>> layer_norm(jnp.array([[1.0, 3.0]]), 2).round(4).tolist()  # -+1 / sqrt(1 + epsilon)
    [[-1.0, 1.0]]
    """
    shape = (normalized_shape,) if is_int(normalized_shape) else tuple(normalized_shape)
    if len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise arg_error("layer_norm", "normalized_shape", f"the trailing dims of x {tuple(x.shape)}", normalized_shape)
    if weight is None and bias is not None:
        weight = jnp.ones_like(bias)
    affine = [a for a in (weight, bias) if a is not None]
    return ops.layer_norm(x, *affine, epsilon=epsilon, begin_norm_axis=x.ndim - len(shape))


# ---------------------------------------------------------------------------------------
# Padding and resizing

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad_paddings(name, pad, ndim, data_format):
    """The pad op's ``paddings`` (a low, high pair per dim, first to last) for Paddle's
    spatial ``pad`` ``[left, right, top, bottom, front, back]`` (last spatial dim first) of a
    rank-``ndim + 2`` input in ``data_format``; an int pads every side.

    >>> pad_paddings("Pad2D", [1, 2, 3, 4], 2, "NCHW")
    (0, 0, 0, 0, 3, 4, 1, 2)
    """
    data_format = choice(name, "data_format", data_format, CONV_LAYOUTS[ndim])
    pad = (pad,) * (2 * ndim) if is_int(pad) else pad
    if not isinstance(pad, (list, tuple)) or len(pad) != 2 * ndim or not all(is_int(p) and p >= 0 for p in pad):
        raise arg_error(name, "padding", f"an int or {2 * ndim} ints >= 0 (left, right, top, bottom, ...)", pad)
    pairs = [(int(pad[2 * i]), int(pad[2 * i + 1])) for i in reversed(range(ndim))]  # first spatial dim first
    c = channel_axis(data_format, ndim + 2)
    dims = [(0, 0)] * (ndim + 2)
    for i, axis in enumerate(a for a in range(1, ndim + 2) if a != c):
        dims[axis] = pairs[i]
    return tuple(v for p in dims for v in p)


def pad(x, pad, mode="constant", value=0.0, data_format="NCHW"):
    """Pad ``x`` like Paddle's ``F.pad``: with ``mode="constant"`` and ``2 * x.ndim`` pads,
    every dim is padded first to last; otherwise ``pad`` covers the spatial dims of a rank 3-5
    input from the last one (``[left, right, top, bottom, front, back]``). Modes:
    ``"constant"`` (``value``), ``"reflect"``, ``"replicate"``, ``"circular"``.

    >>> pad(jnp.ones((1, 1, 2, 2)), [1, 0, 0, 1]).shape
    (1, 1, 3, 3)
    >>> pad(jnp.arange(3.0).reshape(1, 1, 3), [2, 1], mode="reflect", data_format="NCL").tolist()
    [[[2.0, 1.0, 0.0, 1.0, 2.0, 1.0]]]
    """
    mode = choice("pad", "mode", mode, PAD_MODES)
    if mode == "constant" and isinstance(pad, (list, tuple)) and len(pad) == 2 * x.ndim:
        return ops.pad(x, paddings=tuple(pad), mode=mode, value=value)
    if x.ndim not in (3, 4, 5):
        raise arg_error("pad", "pad", f"{2 * x.ndim} ints (mode='constant') for a rank-{x.ndim} input", pad)
    paddings = pad_paddings("pad", pad, x.ndim - 2, data_format)
    return ops.pad(x, paddings=paddings, mode=mode, value=value)


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=False, align_mode=0,
                data_format="NCHW"):
    """Resize the spatial axes of ``x`` (rank 3, 4 or 5) to ``size`` or by ``scale_factor``:
    ``mode`` ``"nearest"``, ``"linear"`` (3-D), ``"bilinear"`` (4-D) or ``"trilinear"``
    (5-D), with Paddle's ``align_corners`` and ``align_mode`` (see
    :mod:`paddlejax.ops.resize`). ``data_format`` must fit the rank (``"NCW"`` for 3-D).
    """
    return ops.interpolate(x, size=size, scale_factor=scale_factor,
                           mode=mode.lower() if isinstance(mode, str) else mode, align_corners=align_corners,
                           align_mode=align_mode, data_format=data_format)


upsample = interpolate


def temporal_shift(x, seg_num, shift_ratio=0.25, data_format="NCHW"):
    """Shift part of the channels of ``x`` (``[N * seg_num, C, H, W]`` frames, clip by clip)
    one frame along time, as the Temporal Shift Module does: the first ``C * shift_ratio``
    channels come from the previous frame, the next ``C * shift_ratio`` from the following one,
    zero at the clip's ends (see :mod:`paddlejax.ops.video`).

    >>> y = temporal_shift(jnp.ones((4, 8, 2, 2)), seg_num=2)
    >>> y[0, :, 0, 0].tolist()  # the first frame has no previous one
    [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    return ops.temporal_shift(x, seg_num=seg_num, shift_ratio=shift_ratio, data_format=data_format)


# ---------------------------------------------------------------------------------------
# Losses

REDUCTIONS = ("mean", "sum", "none")


def _out_dtype(dtype):
    """A loss's dtype: the input's if it is a float, else float32 (an int loss would truncate)."""
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.dtype(jnp.float32)


def _reduce(name, loss, reduction, dtype):
    reduction = choice(name, "reduction", reduction, REDUCTIONS)
    if reduction == "mean":
        loss = jnp.mean(loss)
    elif reduction == "sum":
        loss = jnp.sum(loss)
    return loss.astype(_out_dtype(dtype))


def _pair(name, input, label):
    """``input`` and ``label`` in at least float32, checked to have one shape."""
    if jnp.shape(input) != jnp.shape(label):
        raise ValueError(f"{name}: input 'label' expects the shape of 'input' {tuple(jnp.shape(input))}, "
                         f"got {tuple(jnp.shape(label))}")
    dtype = jnp.promote_types(jnp.result_type(input), jnp.float32)
    return jnp.asarray(input, dtype), jnp.asarray(label, dtype)


def cross_entropy(input, label, weight=None, ignore_index=-100, reduction="mean", soft_label=False, axis=-1,
                  use_softmax=True, label_smoothing=0.0):
    """Softmax cross entropy (Paddle's arguments; see :mod:`paddlejax.ops.loss`): hard or
    ``soft_label`` targets, a class ``weight``, ``ignore_index``, ``label_smoothing``, and
    ``use_softmax=False`` for probabilities instead of logits.

    >>> round(float(cross_entropy(jnp.zeros((2, 4)), jnp.array([1, 3]))), 4)
    1.3863
    """
    extra = () if weight is None else (weight,)
    return ops.cross_entropy(input, label, *extra, soft_label=soft_label, ignore_index=ignore_index,
                             label_smoothing=label_smoothing, axis=axis, use_softmax=use_softmax, reduction=reduction)


def nll_loss(input, label, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log likelihood of log-probabilities ``input [N, C, *d]`` at ``label [N, *d]``;
    with a class ``weight``, ``"mean"`` divides by the summed weights of the counted entries."""
    extra = () if weight is None else (weight,)
    return ops.nll_loss(input, label, *extra, ignore_index=ignore_index, reduction=reduction)


def mse_loss(input, label, reduction="mean"):
    """``(input - label) ** 2``, reduced."""
    x, y = _pair("mse_loss", input, label)
    return _reduce("mse_loss", jnp.square(x - y), reduction, jnp.result_type(input))


def l1_loss(input, label, reduction="mean"):
    """``|input - label|``, reduced."""
    x, y = _pair("l1_loss", input, label)
    return _reduce("l1_loss", jnp.abs(x - y), reduction, jnp.result_type(input))


def smooth_l1_loss(input, label, reduction="mean", delta=1.0):
    """Paddle's smooth L1 (Huber) loss: ``0.5 d^2`` where ``|d| < delta``, else
    ``delta * (|d| - 0.5 * delta)``, for ``d = input - label``.

    >>> smooth_l1_loss(jnp.array([0.5, 3.0]), jnp.zeros(2), reduction="none").tolist()
    [0.125, 2.5]
    """
    if not is_number(delta) or delta <= 0:
        raise arg_error("smooth_l1_loss", "delta", "a positive number", delta)
    x, y = _pair("smooth_l1_loss", input, label)
    d = jnp.abs(x - y)
    loss = jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce("smooth_l1_loss", loss, reduction, jnp.result_type(input))


def kl_div(input, label, reduction="mean", log_target=False):
    """Kullback-Leibler divergence of log-probabilities ``input`` from ``label``:
    ``label * (log(label) - input)`` (0 where ``label <= 0``), or ``exp(label) * (label -
    input)`` with ``log_target``. ``reduction`` also takes ``"batchmean"`` (sum / batch size).

    >>> round(float(kl_div(jnp.log(jnp.array([0.5, 0.5])), jnp.array([0.25, 0.75]), "sum")), 4)
    0.1308
    """
    reduction = choice("kl_div", "reduction", reduction, (*REDUCTIONS, "batchmean"))
    x, y = _pair("kl_div", input, label)
    if log_target:
        loss = jnp.exp(y) * (y - x)
    else:
        positive = y > 0
        loss = jnp.where(positive, y * (jnp.log(jnp.where(positive, y, 1)) - x), 0)
    if reduction == "batchmean":
        return (jnp.sum(loss) / (x.shape[0] if x.ndim else 1)).astype(_out_dtype(jnp.result_type(input)))
    return _reduce("kl_div", loss, reduction, jnp.result_type(input))


def _fitted(name, arg, weight, like):
    """``weight`` in ``like``'s dtype, checked to broadcast to ``like``'s shape."""
    weight = jnp.asarray(weight, like.dtype)
    try:
        fits = jnp.broadcast_shapes(weight.shape, like.shape) == like.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{name}: input '{arg}' expects a shape that broadcasts to {tuple(like.shape)}, "
                         f"got {tuple(weight.shape)}")
    return weight


def _weighted(name, loss, weight):
    return loss if weight is None else loss * _fitted(name, "weight", weight, loss)


def binary_cross_entropy(input, label, weight=None, reduction="mean"):
    """``-weight * (label * log(input) + (1 - label) * log(1 - input))`` for probabilities
    ``input``; each log is clipped at -100, as in Paddle, so 0 and 1 give finite losses."""
    x, y = _pair("binary_cross_entropy", input, label)
    loss = -(y * jnp.maximum(jnp.log(x), -100) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100))
    return _reduce("binary_cross_entropy", _weighted("binary_cross_entropy", loss, weight), reduction,
                   jnp.result_type(input))


def binary_cross_entropy_with_logits(logit, label, weight=None, reduction="mean", pos_weight=None):
    """Sigmoid cross entropy from logits, computed stably: ``-weight * (pos_weight * label *
    log(sigmoid(logit)) + (1 - label) * log(1 - sigmoid(logit)))``; ``pos_weight`` (one per
    class, broadcast along the last axis) weighs the positive term.

    >>> round(float(binary_cross_entropy_with_logits(jnp.zeros(2), jnp.array([0.0, 1.0]))), 4)  # log 2
    0.6931
    """
    name = "binary_cross_entropy_with_logits"
    x, y = _pair(name, logit, label)
    log_weight = 1 if pos_weight is None else 1 + (_fitted(name, "pos_weight", pos_weight, y) - 1) * y
    # -log(sigmoid(x)) = log(1 + exp(-|x|)) + max(-x, 0)
    loss = (1 - y) * x + log_weight * (jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0))
    return _reduce(name, _weighted(name, loss, weight), reduction, jnp.result_type(logit))


__all__ = [
    "relu", "relu6", "gelu", "sigmoid", "tanh", "silu", "hardswish", "leaky_relu", "prelu", "softmax", "log_softmax",
    "conv1d", "conv2d", "conv3d", "conv2d_transpose", "linear", "embedding", "one_hot",
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool1d",
    "adaptive_max_pool1d", "dropout", "batch_norm", "layer_norm", "pad", "interpolate", "upsample",
    "temporal_shift",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div", "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
]
