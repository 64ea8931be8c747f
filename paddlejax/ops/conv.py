"""Convolutions: conv1d, conv2d, conv3d, depthwise_conv2d and conv2d_transpose with Paddle's
weight layouts.

conv weights are ``[out_c, in_c / groups, *kernel]`` (OIHW for conv2d) and conv2d_transpose
weights ``[in_c, out_c / groups, kh, kw]`` for either ``data_format``. ``padding="SAME"``
follows Paddle: pads are computed from the undilated kernel and dilation is then ignored.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.conv import conv1d, conv2d
>>> conv2d(jnp.ones((1, 3, 8, 8)), jnp.ones((4, 3, 3, 3)), stride=2, padding=1).shape
(1, 4, 4, 4)
>>> conv1d(jnp.ones((1, 10, 3)), jnp.ones((4, 3, 3)), data_format="NLC").shape
(1, 8, 4)

An input whose channels do not match the weight is named with its layout, and the other
layout is suggested when the input fits it:

>>> conv2d(jnp.ones((1, 8, 8, 3)), jnp.ones((4, 3, 3, 3)))
Traceback (most recent call last):
...
ValueError: conv2d: input 'x' (1, 8, 8, 3) has 8 channels on axis 1 (data_format='NCHW'), but 'weight' (4, 3, 3, 3) takes 3; the input looks like NHWC data: pass data_format='NHWC'
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax.ops import onednn
from paddlejax.ops.activation import fused_activation, fused_activation_attrs, nonnegative_act
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits, data_format_axis
from paddlejax.ops.common import (LAYOUTS, attr_error, channel_axis, from_channels_last, input_error,
                                 to_channels_last)


def same_padding(in_hw, k_hw, stride, dilation) -> tuple:
    """``(lo, hi)`` pads per spatial dim that give ``ceil(n / stride)`` outputs, the odd one at the
    end (TensorFlow's and Keras's "same", ONNX's SAME_UPPER).

    >>> same_padding((8, 7), (3, 3), (2, 2), (1, 2))
    ((0, 1), (2, 2))
    """
    pads = []
    for n, k, s, d in zip(in_hw, k_hw, stride, dilation):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def paddle_padding(padding, in_hw, k_hw, stride, dilation):
    """Explicit ``(lo, hi)`` pads per spatial dim and the dilation to use, resolving SAME/VALID
    the way Paddle does (SAME uses the undilated kernel and resets dilation to 1)."""
    if padding == "VALID":
        return ((0, 0),) * len(in_hw), dilation
    if padding == "SAME":
        undilated = (1,) * len(dilation)
        return same_padding(in_hw, k_hw, stride, undilated), undilated
    return padding, dilation


def _spatial(x, data_format):
    return tuple(x.shape[2:] if channel_axis(data_format, x.ndim) == 1 else x.shape[1:-1])


def _add_bias(y, bias, data_format):
    if bias is None:
        return y
    shape = [1] * y.ndim
    shape[channel_axis(data_format, y.ndim)] = -1
    return y + bias.reshape(shape)


def _other_layout(data_format: str) -> str:
    """The same layout with channels moved to the other end (``NCHW`` <-> ``NHWC``)."""
    if data_format[1] == "C":
        return data_format[0] + data_format[2:] + "C"
    return data_format[0] + "C" + data_format[1:-1]


def channel_mismatch(op, x, data_format, weight, takes: str, fits) -> ValueError:
    """The error for an input ``x`` whose channel count is not what ``weight`` takes (described
    by ``takes``); when the channels of the other layout would ``fits(count)``, it says to pass
    that ``data_format`` (the usual cause: NHWC data into an NCHW model)."""
    axis = channel_axis(data_format, x.ndim)
    other = _other_layout(data_format)
    hint = ""
    if fits(x.shape[channel_axis(other, x.ndim)]):
        hint = f"; the input looks like {other} data: pass data_format={other!r}"
    return ValueError(f"{op}: input 'x' {tuple(x.shape)} has {x.shape[axis]} channels on axis {axis} "
                      f"(data_format={data_format!r}), but 'weight' {tuple(weight.shape)} takes {takes}{hint}")


def _check_conv(op, x, weight, bias, stride, padding, dilation, groups, data_format):
    """Validate shapes against attributes; returns explicit pads and dilation. ``groups`` None
    is depthwise: one group per input channel."""
    cin = x.shape[channel_axis(data_format, x.ndim)]
    cout, cin_g, *kernel = weight.shape
    if weight.dtype != x.dtype:
        raise input_error(op, "weight", f"the dtype of 'x' ({x.dtype}); cast one of them", str(weight.dtype))
    if groups is None:
        if cin_g != 1:
            raise input_error(op, "weight", "shape [in_c * multiplier, 1, kh, kw]", weight.shape)
        if cout % cin:
            raise channel_mismatch(op, x, data_format, weight, f"a divisor of {cout} (out_c = in_c * multiplier)",
                                   lambda c: cout % c == 0)
        groups = cin
    elif cin_g * groups != cin:
        other_cin = x.shape[channel_axis(_other_layout(data_format), x.ndim)]
        if cin % groups and other_cin != cin_g * groups:
            raise attr_error(op, "groups", f"a divisor of the input channels ({cin})", groups)
        takes = f"{cin_g * groups}" + (f" ({cin_g} per group, groups={groups})" if groups > 1 else "")
        raise channel_mismatch(op, x, data_format, weight, takes, lambda c: c == cin_g * groups)
    if cout % groups:
        raise input_error(op, "weight", f"shape [out_c (a multiple of {groups}), {cin // groups}, *kernel]",
                          weight.shape)
    if bias is not None and bias.shape != (cout,):
        raise input_error(op, "bias", f"shape ({cout},)", bias.shape)
    pads, dil = paddle_padding(padding, _spatial(x, data_format), kernel, stride, dilation)
    for n, (lo, hi), k, d in zip(_spatial(x, data_format), pads, kernel, dil):
        if n + lo + hi < d * (k - 1) + 1:
            raise attr_error(op, "padding", f"a padded input at least as large as the (dilated) kernel "
                             f"{tuple(kernel)}; input is {tuple(x.shape)}", padding)
    return pads, dil, groups


# Implementations share one signature: (x, weight, stride, pads, dilation, groups, data_format).

def _lax_conv(x, w, stride, pads, dil, groups, fmt, preferred_element_type=None):
    """Convolution with Paddle's ``[out_c, in_c / groups, *kernel]`` weight (OIHW in 2-D), via
    lax.conv_general_dilated."""
    weight_format = "OI" + fmt.replace("N", "").replace("C", "")
    return lax.conv_general_dilated(x, w, stride, pads, rhs_dilation=dil,
                                    dimension_numbers=(fmt, weight_format, fmt), feature_group_count=groups,
                                    preferred_element_type=preferred_element_type)


def _lax_bf16(x, w, stride, pads, dil, groups, fmt):
    """2-D convolution with x and weight rounded to bfloat16, accumulated in float32.

    A reduced-precision variant: the result is returned in x's dtype and agrees with the
    reference to about 1e-2 relative (bfloat16 keeps 8 mantissa bits).
    """
    y = _lax_conv(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), stride, pads, dil, groups, fmt,
                  preferred_element_type=jnp.float32)
    return y.astype(x.dtype)


def _lax_nhwc(x, w, stride, pads, dil, groups, fmt):
    """2-D convolution computed in NHWC/HWIO layout (the TPU/GPU-friendly one)."""
    y = lax.conv_general_dilated(to_channels_last(x, fmt), jnp.transpose(w, (2, 3, 1, 0)), stride, pads,
                                 rhs_dilation=dil, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 feature_group_count=groups)
    return from_channels_last(y, fmt)


def _grouped_matmul(cols, w, groups):
    """``[N, Ho, Wo, groups*K] x [out_c, K]`` per group -> ``[N, Ho, Wo, out_c]``."""
    n, ho, wo, _ = cols.shape
    cols = cols.reshape(n, ho, wo, groups, -1)
    y = jnp.einsum("nhwgk,gok->nhwgo", cols, w.reshape(groups, w.shape[0] // groups, -1))
    return y.reshape(n, ho, wo, -1)


def _im2col(x, w, stride, pads, dil, groups, fmt):
    """2-D convolution as patch extraction followed by one (grouped) matmul."""
    patches = lax.conv_general_dilated_patches(to_channels_last(x, fmt), w.shape[2:], stride, pads,
                                               rhs_dilation=dil, dimension_numbers=("NHWC", "OIHW", "NHWC"))
    # patches are ordered (channel, kh, kw), matching the OIHW weight flattened per output channel
    return from_channels_last(_grouped_matmul(patches, w, groups), fmt)


def _taps(x, w_hw, stride, pads, dil, fmt):
    """``((i, j), slice)`` per kernel tap: the channels-last input window that tap ``(i, j)``
    multiplies, strided to the output grid."""
    xp = jnp.pad(to_channels_last(x, fmt), ((0, 0), *pads, (0, 0)))
    out_hw = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(xp.shape[1:3], w_hw, stride, dil)]
    for i in range(w_hw[0]):
        for j in range(w_hw[1]):
            start = (0, i * dil[0], j * dil[1], 0)
            limit = (xp.shape[0], start[1] + (out_hw[0] - 1) * stride[0] + 1,
                     start[2] + (out_hw[1] - 1) * stride[1] + 1, xp.shape[3])
            yield (i, j), lax.slice(xp, start, limit, (1, *stride, 1))


def _shifted_matmul(x, w, stride, pads, dil, groups, fmt):
    """2-D convolution as a sum over kernel taps of strided-slice matmuls (no patch buffer)."""
    taps = _taps(x, w.shape[2:], stride, pads, dil, fmt)
    y = sum(_grouped_matmul(tap, w[:, :, i, j], groups) for (i, j), tap in taps)
    return from_channels_last(y, fmt)


def _depthwise_shifted(x, w, stride, pads, dil, groups, fmt):
    """Depthwise convolution as a sum over kernel taps of elementwise products (no matmul).

    Output channel ``o`` reads input channel ``o // multiplier``, so with a channel
    multiplier above 1 the input channels are repeated first.
    """
    multiplier = w.shape[0] // groups
    if multiplier > 1:
        x = jnp.repeat(x, multiplier, axis=channel_axis(fmt, 4))
    y = sum(tap * w[:, 0, i, j] for (i, j), tap in _taps(x, w.shape[2:], stride, pads, dil, fmt))
    return from_channels_last(y, fmt)


# Winograd F(2x2, 3x3) transforms (Lavin & Gray 2015): a 2x2 output tile is A^T [(G g G^T) * (B^T d B)] A
# for a 3x3 kernel g and the 4x4 input tile d, with * elementwise.
_WINOGRAD_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32)
_WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float32)
_WINOGRAD_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float32)


def winograd_applies(weight_shape, stride, dilation, groups, dtype) -> bool:
    """Whether the ``winograd`` variant computes by Winograd (else it falls back to lax.conv):
    float32, a 3x3 kernel, stride 1, dilation 1 and one group.

    >>> winograd_applies((8, 4, 3, 3), (1, 1), (1, 1), 1, "float32")
    True
    >>> winograd_applies((8, 4, 3, 3), (2, 2), (1, 1), 1, "float32")
    False
    """
    return (tuple(weight_shape[2:]) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)
            and groups == 1 and jnp.dtype(dtype) == jnp.float32)


def _combine(matrix, items):
    """``matrix @ items`` for a small constant matrix and a list of arrays, as sums of the
    arrays: zero coefficients are skipped and +-1 become additions and subtractions."""
    rows = []
    for coefficients in matrix:
        acc = None
        for c, item in zip(coefficients, items):
            if c == 0:
                continue
            if acc is None:
                acc = item if c == 1 else -item if c == -1 else c * item
            else:
                acc = acc + item if c == 1 else acc - item if c == -1 else acc + c * item
        rows.append(acc)
    return rows


def _winograd(x, w, stride, pads, dil, groups, fmt):
    """2-D convolution by Winograd's minimal filtering F(2x2, 3x3) for float32 3x3 kernels with
    stride 1, dilation 1 and one group; any other convolution falls back to lax.conv, so this is
    always the op's function.

    The padded channels-last input is cut into 4x4 tiles at stride 2 (the odd last row or
    column of outputs is computed on extra zero padding and cropped), each tile goes through
    ``B^T d B``, the 16 transformed positions multiply the transformed weight ``G g G^T`` in
    one batched matmul ``[16, tiles, in_c] x [16, in_c, out_c]``, and ``A^T m A`` gives the
    2x2 output tiles. It does 16 instead of 36 multiplications per 2x2 output tile and input
    channel; the transforms' additions round differently from a direct convolution, so results
    agree with the reference to about 1e-4 relative (to the output's magnitude).
    """
    if not winograd_applies(w.shape, stride, dil, groups, x.dtype):
        return _lax_conv(x, w, stride, pads, dil, groups, fmt)
    x = to_channels_last(x, fmt)
    n, h, wd, _ = x.shape
    out_hw = [size + lo + hi - 2 for size, (lo, hi) in zip((h, wd), pads)]
    tiles = [-(-size // 2) for size in out_hw]
    # pad to 2 * tiles + 2 rows and columns, so every tile is whole
    xp = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *((lo, hi + 2 * t - o, 0) for (lo, hi), t, o
                                                           in zip(pads, tiles, out_hw)), (0, 0, 0)])
    # d[a][b]: element (a, b) of every tile, [n, tiles_h, tiles_w, in_c]
    d = [[xp[:, a:a + 2 * tiles[0]:2, b:b + 2 * tiles[1]:2] for b in range(4)] for a in range(4)]
    cols = [_combine(_WINOGRAD_BT, [d[a][b] for a in range(4)]) for b in range(4)]   # cols[b][i]: (B^T d)[i, b]
    v = jnp.stack([t for i in range(4) for t in _combine(_WINOGRAD_BT, [cols[b][i] for b in range(4)])])
    with jax.ensure_compile_time_eval():  # frozen weights: transformed here once, not by XLA's slow constant folding
        u = jnp.einsum("ia,jb,oxab->ijxo", _WINOGRAD_G, _WINOGRAD_G, w).reshape(16, w.shape[1], w.shape[0])
    m = jnp.einsum("pnhwc,pco->pnhwo", v, u)   # the one batched matmul, p = 4 i + j
    m = [[m[4 * i + j] for j in range(4)] for i in range(4)]
    rows = [_combine(_WINOGRAD_AT, [m[i][j] for i in range(4)]) for j in range(4)]   # rows[j][r]
    y = jnp.stack([jnp.stack(_combine(_WINOGRAD_AT, [rows[j][r] for j in range(4)]), axis=3)
                   for r in range(2)], axis=2)   # [n, tiles_h, 2 (r), tiles_w, 2 (s), out_c]
    y = y.reshape(n, 2 * tiles[0], 2 * tiles[1], -1)[:, :out_hw[0], :out_hw[1]]
    return from_channels_last(y, fmt)


def _conv_kernel(op, impl, doc=None):
    """An op kernel around ``impl``: validation, Paddle padding, bias and the fused activation
    are common to all."""

    def kernel(x, weight, bias=None, *, stride, padding, dilation, data_format, groups=None, act=None,
               act_alpha=None):
        pads, dil, groups = _check_conv(op, x, weight, bias, stride, padding, dilation, groups, data_format)
        y = _add_bias(impl(x, weight, stride, pads, dil, groups, data_format), bias, data_format)
        return fused_activation(y, act, act_alpha)

    kernel.__doc__ = doc or impl.__doc__
    kernel.__name__ = f"{op}_{impl.__name__.strip('_')}"
    return kernel


def _onednn_kernel(op):
    """The op by oneDNN (:mod:`paddlejax.ops.onednn`): bias and activation fused into the
    convolution; where oneDNN is unavailable or does not fit the case, by lax.conv."""
    fallback = _conv_kernel(op, _lax_conv)

    def kernel(x, weight, bias=None, *, stride, padding, dilation, data_format, groups=None, act=None,
               act_alpha=None):
        if not (onednn.conv2d_fits(x, weight, data_format, act) and onednn.available()):
            return fallback(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                            data_format=data_format, groups=groups, act=act, act_alpha=act_alpha)
        pads, dil, groups = _check_conv(op, x, weight, bias, stride, padding, dilation, groups, data_format)
        return onednn.conv2d(x, weight, bias, stride=stride, pads=pads, dilation=dil, groups=groups,
                             data_format=data_format, act=act, act_alpha=act_alpha)

    kernel.__name__ = f"{op}_onednn"
    return kernel


def _conv_flops(in_shapes, out_shapes, attrs):
    """2 * N * Ho * Wo * out_c * (in_c / groups) * kh * kw (and likewise in 1-D and 3-D)."""
    return 2 * math.prod(out_shapes[0]) * math.prod(in_shapes[1][1:])


# The cost model that ranks a conv's kernels before any is timed (the autotuner times the top
# few): the fraction of the platform's peak FLOP rate each kernel reaches on convolutions, and
# the FLOPs per byte at which the platform turns from memory- to compute-bound. Rough on
# purpose: it only has to put the likely winners first, and the autotuner's cache refines it
# with what it measures. CPU: ResNet-18's convolutions timed on a 2-core AVX-512 EPYC.
_EFFICIENCY = {"cpu": {"onednn": 0.6, "im2col": 0.1, "shifted_matmul": 0.07,
                       "depthwise_shifted": 0.1},
               "gpu": {"default": 0.6, "lax_nhwc": 0.6, "lax_bf16": 1.2, "winograd": 0.3}}
_DEFAULT_EFFICIENCY = 0.3
_BALANCE = {"cpu": 10.0, "gpu": 50.0}


def _conv_estimate(variant, in_shapes, dtypes, attrs, platform):
    """The relative time of ``variant`` on a conv of ``in_shapes`` on ``platform`` (FLOPs at the
    kernel's efficiency plus bytes moved at the platform's balance), or ``None`` where the
    variant computes exactly as the reference kernel does (lax.conv in NHWC on an NHWC op;
    Winograd where it does not apply), so that timing it would teach nothing.

    >>> shapes = [(32, 16, 16, 128), (128, 128, 3, 3)]
    >>> attrs = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1), "groups": 1,
    ...          "data_format": "NHWC"}
    >>> _conv_estimate("lax_nhwc", shapes, ["float32"] * 2, attrs, "cpu") is None
    True
    >>> (_conv_estimate("onednn", shapes, ["float32"] * 2, attrs, "cpu")
    ...  < _conv_estimate("default", shapes, ["float32"] * 2, attrs, "cpu")
    ...  < _conv_estimate("im2col", shapes, ["float32"] * 2, attrs, "cpu"))
    True
    """
    x, w = in_shapes[0], in_shapes[1]
    fmt = attrs.get("data_format", "NCHW")
    channels_last = channel_axis(fmt, len(x)) != 1
    k_hw = tuple(w[2:])
    stride = tuple(attrs.get("stride") or (1,) * len(k_hw))
    pads, dil = paddle_padding(attrs.get("padding") or ((0, 0),) * len(k_hw),
                               tuple(x[1:-1] if channels_last else x[2:]), k_hw, stride,
                               tuple(attrs.get("dilation") or (1,) * len(k_hw)))
    out_hw = [(n + lo + hi - d * (k - 1) - 1) // s + 1
              for n, (lo, hi), k, s, d in zip(x[1:-1] if channels_last else x[2:], pads, k_hw, stride, dil)]
    taps, cin, cout = math.prod(k_hw), x[-1] if channels_last else x[1], w[0]
    groups = cin // w[1]
    itemsize = jnp.dtype(dtypes[0]).itemsize
    pixels = x[0] * math.prod(out_hw)
    flops = 2 * pixels * cout * math.prod(w[1:])
    moved = math.prod(x) + math.prod(w) + pixels * cout
    if variant == "lax_nhwc":
        if channels_last:
            return None
        moved += 2 * (math.prod(x) + pixels * cout)  # the transposes in and out
    elif variant == "im2col":
        moved += 2 * pixels * cin * taps  # the patch buffer, written then read
    elif variant in ("shifted_matmul", "depthwise_shifted"):
        moved += taps * (pixels * cin + 2 * pixels * cout)  # each tap's slice, and the running sum
    elif variant == "winograd":
        if not (winograd_applies(w, stride, dil, groups, dtypes[0]) and len(k_hw) == 2):
            return None
        tiles = x[0] * math.prod(-(-n // 2) for n in out_hw)
        flops = 2 * 16 * tiles * cin * cout  # 16 products per 2x2 output tile: 4/9 of the direct FLOPs
        # the 16 planes of transformed input and output tiles, each written and read in
        # several passes (fitted: Winograd wins on ResNet's 4x4 and 8x8 maps, loses from 16x16)
        moved += 8 * 2 * 16 * tiles * (cin + cout)
    elif variant == "lax_bf16":
        moved //= 2
    elif variant == "onednn" and not onednn.conv2d_fits(jax.ShapeDtypeStruct(x, dtypes[0]),
                                                        jax.ShapeDtypeStruct(w, dtypes[1]), fmt, attrs.get("act")):
        return None
    efficiency = _EFFICIENCY.get(platform, {}).get(variant, _DEFAULT_EFFICIENCY)
    return flops / efficiency + moved * itemsize * _BALANCE.get(platform, _BALANCE["cpu"])


_VARIANTS = {"lax_nhwc": _lax_nhwc, "im2col": _im2col, "shifted_matmul": _shifted_matmul}
# Variants computing in a narrower type than their inputs (tried only when that is allowed).
_REDUCED_PRECISION = {"lax_bf16": _lax_bf16}
_CONV2D_VARIANTS = {**_VARIANTS, "winograd": _winograd, **_REDUCED_PRECISION}
# Only for one filter group per input channel, which depthwise_conv2d guarantees.
_DEPTHWISE_VARIANTS = {**_VARIANTS, "depthwise_shifted": _depthwise_shifted, **_REDUCED_PRECISION}


# Paddle's channels-first and channels-last layouts by number of spatial dimensions.
CONV_LAYOUTS = {1: ("NCL", "NLC"), 2: LAYOUTS, 3: ("NCDHW", "NDHWC")}


def _conv_attrs(ndim=2, **extra):
    return {"stride": Attr("ints", (1,) * ndim, length=ndim, minimum=1),
            "padding": Attr("padding", ((0, 0),) * ndim, length=ndim),
            "dilation": Attr("ints", (1,) * ndim, length=ndim, minimum=1),
            **extra,
            "data_format": Attr("str", CONV_LAYOUTS[ndim][0], choices=CONV_LAYOUTS[ndim])}


def _grouped(attrs) -> str:
    return "grouped" if attrs.get("groups", 1) > 1 else "consumed"


def _define_conv(name, doc, variants, ndim=2, traits=None, **extra):
    kernels = {v: _conv_kernel(name, impl) for v, impl in variants.items()}
    if ndim == 2:
        kernels["onednn"] = _onednn_kernel(name)
    return define(name, _conv_kernel(name, _lax_conv, doc),
                  inputs=[Input("x", rank=ndim + 2, dtype="float"), Input("weight", rank=ndim + 2, dtype="float"),
                          Input("bias", rank=1, dtype="float", optional=True)],
                  attrs={**_conv_attrs(ndim, **extra), **fused_activation_attrs()},
                  variants=kernels, requires={"onednn": onednn.available} if ndim == 2 else None,
                  reduced_precision=set(variants) & set(_REDUCED_PRECISION), flops=_conv_flops,
                  estimate=_conv_estimate if ndim == 2 else None,
                  traits=traits or Traits(amp="white", layout_sensitive=True, channels=_grouped,
                                          saved_for_backward=("operands",)))


# The int8 kernels cover 2-D convolutions: those are quantizable, their weight OIHW.
_CONV2D_TRAITS = dict(amp="white", layout_sensitive=True, weight="weight", weight_out_axis=lambda attrs, rank: 0,
                      channel_axis=data_format_axis, weight_in_axis=lambda attrs, rank: 1,
                      saved_for_backward=("operands",), nonnegative=nonnegative_act)


conv2d = _define_conv("conv2d", "2-D convolution (cross-correlation), weight [out_c, in_c/groups, kh, kw].",
                      _CONV2D_VARIANTS, traits=Traits(channels=_grouped, **_CONV2D_TRAITS),
                      groups=Attr("int", 1, minimum=1))
depthwise_conv2d = _define_conv("depthwise_conv2d", "Depthwise 2-D convolution (groups = in_c), "
                                "weight [in_c * multiplier, 1, kh, kw].", _DEPTHWISE_VARIANTS,
                                traits=Traits(channels="grouped", **_CONV2D_TRAITS))
conv1d = _define_conv("conv1d", "1-D convolution (cross-correlation), weight [out_c, in_c/groups, k].", {},
                      ndim=1, groups=Attr("int", 1, minimum=1))
conv3d = _define_conv("conv3d", "3-D convolution (cross-correlation), weight [out_c, in_c/groups, kd, kh, kw].",
                      {}, ndim=3, groups=Attr("int", 1, minimum=1))


def _conv2d_transpose(x, weight, bias=None, *, stride, padding, output_padding, dilation, groups, data_format):
    """Transposed 2-D convolution (the input-gradient of conv2d), weight [in_c, out_c/groups, kh, kw]."""
    op = "conv2d_transpose"
    cin = x.shape[channel_axis(data_format, 4)]
    wcin, cout_g, kh, kw = weight.shape
    if wcin != cin:
        raise channel_mismatch(op, x, data_format, weight, f"{wcin} (its first dim)", lambda c: c == wcin)
    if cin % groups:
        raise attr_error(op, "groups", f"a divisor of the input channels ({cin})", groups)
    if bias is not None and bias.shape != (cout_g * groups,):
        raise input_error(op, "bias", f"shape ({cout_g * groups},)", bias.shape)
    pads, dil = paddle_padding(padding, _spatial(x, data_format), (kh, kw), stride, dilation)
    if any(p >= max(s, d) for p, s, d in zip(output_padding, stride, dil)):
        raise attr_error(op, "output_padding", f"values smaller than max(stride, dilation) {stride}/{dil}",
                         output_padding)
    out_hw = [(n - 1) * s - lo - hi + d * (k - 1) + 1 + o for n, s, (lo, hi), k, d, o
              in zip(_spatial(x, data_format), stride, pads, (kh, kw), dil, output_padding)]
    if any(n <= 0 for n in out_hw):  # one size at a time: symbolic sizes do not order among themselves
        raise attr_error(op, "padding", f"pads leaving a positive output size (would be {out_hw})", padding)
    # A transposed conv is a conv over the stride-dilated input with the kernel flipped and
    # its in/out channel roles swapped (per group).
    w = weight.reshape(groups, cin // groups, cout_g, kh, kw).swapaxes(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, kh, kw)[:, :, ::-1, ::-1]
    conv_pads = [(d * (k - 1) - lo, d * (k - 1) - hi + extra)
                 for (lo, hi), k, d, extra in zip(pads, (kh, kw), dil, output_padding)]
    y = lax.conv_general_dilated(x, w, (1, 1), conv_pads, lhs_dilation=stride, rhs_dilation=dil,
                                 dimension_numbers=(data_format, "OIHW", data_format), feature_group_count=groups)
    return _add_bias(y, bias, data_format)


conv2d_transpose = define(
    "conv2d_transpose", _conv2d_transpose,
    inputs=[Input("x", rank=4, dtype="float"), Input("weight", rank=4, dtype="float"),
            Input("bias", rank=1, dtype="float", optional=True)],
    attrs=_conv_attrs(output_padding=Attr("ints", (0, 0), length=2, minimum=0), groups=Attr("int", 1, minimum=1)),
    flops=lambda in_shapes, out_shapes, attrs: 2 * math.prod(in_shapes[0]) * math.prod(in_shapes[1][1:]),
    traits=Traits(amp="white", layout_sensitive=True, channels=_grouped))
