"""2-D pooling (max / average) with Paddle's attributes, fixed-window and adaptive.

``exclusive=True`` (Paddle's default) divides average windows by the number of real input
elements they cover; ``exclusive=False`` always divides by ``kh * kw``. ``ceil_mode`` keeps
a last partial window, provided it starts inside the input or its left padding.

``pool2d`` has a kernel variant ``"onednn"`` (oneDNN's pooling, :mod:`paddlejax.ops.onednn`:
float32, and max pooling of channels-last int8 and uint8) that the autotuner keeps where it is
faster; its derivatives are the reference kernel's, and what it does not fit runs the reference.

``adaptive_pool2d`` pools into a fixed output grid with Paddle's bins: output ``i`` of an
axis of size ``n`` covers ``[floor(i * n / out), ceil((i + 1) * n / out))``.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.pool import adaptive_pool2d, pool2d
>>> pool2d(jnp.ones((1, 2, 5, 5)), pooling_type="max", kernel_size=2, ceil_mode=True).shape
(1, 2, 3, 3)
>>> adaptive_pool2d(jnp.ones((1, 2, 5, 7)), output_size=(3, None)).shape
(1, 2, 3, 7)
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax.ops import onednn
from paddlejax.ops.conv import paddle_padding
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import LAYOUTS, attr_error, from_channels_last, input_error, to_channels_last


def _ceil_pad(n, k, s, lo, hi):
    """Extra high padding so that ceil_mode's last partial window exists."""
    out = -(-(n + lo + hi - k) // s) + 1
    if (out - 1) * s >= n + lo:  # that window would start in the right padding: drop it
        out -= 1
    return max((out - 1) * s + k - (n + lo + hi), 0)


def pool_geometry(hw, kernel_size, stride, padding, ceil_mode, global_pooling):
    """Kernel, stride and explicit (lo, hi) pads of ``pool2d``'s windows over spatial size ``hw``
    (ceil mode as extra high padding), for whoever must reproduce them (the ONNX exporter).

    >>> pool_geometry((5, 5), (2, 2), None, ((0, 0), (0, 0)), True, False)
    ((2, 2), (2, 2), ((0, 1), (0, 1)))
    """
    if global_pooling:
        return tuple(hw), (1, 1), ((0, 0), (0, 0))
    if kernel_size is None:
        raise attr_error("pool2d", "kernel_size", "2 ints (unless global_pooling)", None)
    stride = kernel_size if stride is None else stride
    pads, _ = paddle_padding(padding, hw, kernel_size, stride, (1, 1))
    if any(n + lo + hi < k for n, (lo, hi), k in zip(hw, pads, kernel_size)):
        raise attr_error("pool2d", "kernel_size", f"a window that fits the padded input {tuple(hw)}", kernel_size)
    if ceil_mode:
        pads = tuple((lo, hi + _ceil_pad(n, k, s, lo, hi)) for n, k, s, (lo, hi) in zip(hw, kernel_size, stride, pads))
    return kernel_size, stride, pads


def _pool2d(x, *, pooling_type, kernel_size, stride, padding, ceil_mode, global_pooling, exclusive, data_format):
    """Max or average pooling over 2-D windows (max pooling of integers too: int8 dataflow)."""
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    if not floating and pooling_type != "max":
        raise input_error("pool2d", "x", "floating values for average pooling", x.dtype)
    xl = to_channels_last(x, data_format)
    k, s, pads = pool_geometry(xl.shape[1:3], kernel_size, stride, padding, ceil_mode, global_pooling)
    window, strides, full_pads = (1, *k, 1), (1, *s, 1), ((0, 0), *pads, (0, 0))
    if pooling_type == "max":
        # numpy init values: a traced init value makes JAX pick the generic reduce_window,
        # which has no transpose rule (so no jit(grad))
        lowest = -np.inf if floating else np.iinfo(xl.dtype).min
        y = lax.reduce_window(xl, np.array(lowest, xl.dtype), lax.max, window, strides, full_pads)
    else:
        y = lax.reduce_window(xl, np.array(0, xl.dtype), lax.add, window, strides, full_pads)
        if exclusive:  # count only the real input elements under each window
            ones = jnp.ones((1, *xl.shape[1:3], 1), xl.dtype)
            y = y / lax.reduce_window(ones, np.array(0, xl.dtype), lax.add, window, strides, full_pads)
        else:
            y = y / math.prod(k)
    return from_channels_last(y, data_format)


def _pool_flops(in_shapes, out_shapes, attrs):
    """One FLOP per window element per output."""
    if attrs.get("global_pooling"):
        return math.prod(in_shapes[0])
    return math.prod(out_shapes[0]) * math.prod(attrs["kernel_size"])


def _explicit_attrs(x, *, pooling_type, kernel_size, stride, padding, ceil_mode, global_pooling, exclusive,
                    data_format):
    """``pool2d``'s attributes for ``x`` with its windows spelled out (kernel, stride, explicit
    pads holding ceil mode's extra ones): the same function, as hashable values."""
    hw = x.shape[1:3] if data_format == "NHWC" else x.shape[2:]
    k, s, pads = pool_geometry(hw, kernel_size, stride, padding, ceil_mode, global_pooling)
    return (("pooling_type", pooling_type), ("kernel_size", tuple(k)), ("stride", tuple(s)),
            ("padding", tuple(map(tuple, pads))), ("ceil_mode", False), ("global_pooling", False),
            ("exclusive", exclusive), ("data_format", data_format))


def _onednn_fits(x, explicit) -> bool:
    """Whether oneDNN's pooling computes ``pool2d`` on ``x`` with the ``explicit`` attributes."""
    a = dict(explicit)
    return onednn.pool2d_fits(x, a["pooling_type"], a["kernel_size"], a["padding"], a["data_format"])


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _by_onednn(x, explicit):
    a = dict(explicit)
    return onednn.pool2d(x, pooling_type=a["pooling_type"], kernel=a["kernel_size"], stride=a["stride"],
                         pads=a["padding"], exclusive=a["exclusive"], data_format=a["data_format"])


@_by_onednn.defjvp
def _by_onednn_jvp(explicit, primals, tangents):
    # the reference kernel's derivative on the same windows: gradients are the reference's exactly
    # (under jit, XLA drops the reference's own forward pass, which nothing reads)
    _, dy = jax.jvp(functools.partial(_pool2d, **dict(explicit)), primals, tangents)
    return _by_onednn(primals[0], explicit), dy


def _pool2d_onednn(x, *, pooling_type, kernel_size, stride, padding, ceil_mode, global_pooling, exclusive,
                   data_format):
    """pool2d by oneDNN's pooling (:func:`paddlejax.ops.onednn.pool2d`), with the reference kernel's
    derivatives; where oneDNN is unavailable or does not fit the case, by the reference kernel."""
    attrs = dict(pooling_type=pooling_type, kernel_size=kernel_size, stride=stride, padding=padding,
                 ceil_mode=ceil_mode, global_pooling=global_pooling, exclusive=exclusive, data_format=data_format)
    explicit = _explicit_attrs(x, **attrs) if onednn.available() and x.ndim == 4 else None
    if explicit is None or not _onednn_fits(x, explicit):
        return _pool2d(x, **attrs)
    return _by_onednn(x, explicit)


# XLA's CPU reduce_window pools at about 20 GB/s on one thread (a small CNN's three 2x2 max pools:
# a fifth of its time on two threads); oneDNN's streams the input on every thread. Taken as 3x
# per byte, and no gain on channels-first data, which oneDNN transposes through a scratchpad: a
# guess that only ranks the variant for timing, which decides.
_ONEDNN_POOL_SPEEDUP = 3


def _pool_estimate(variant, in_shapes, dtypes, attrs, platform):
    """The relative time of ``variant`` on a pool2d of ``in_shapes`` (pooling is memory-bound:
    the bytes it reads and writes, see ``_ONEDNN_POOL_SPEEDUP``), or ``None`` where the oneDNN
    variant computes as the reference does (off the CPU, and where it does not fit), so that
    timing it would teach nothing.

    >>> attrs = {"pooling_type": "max", "kernel_size": (2, 2), "stride": (2, 2), "data_format": "NHWC"}
    >>> (_pool_estimate("onednn", [(32, 16, 16, 64)], ["float32"], attrs, "cpu")
    ...  < _pool_estimate("default", [(32, 16, 16, 64)], ["float32"], attrs, "cpu"))
    True
    >>> _pool_estimate("onednn", [(32, 16, 16, 64)], ["bfloat16"], attrs, "cpu") is None
    True
    """
    x = jax.ShapeDtypeStruct(in_shapes[0], dtypes[0])
    explicit = _explicit_attrs(x, **pool2d.check_attrs(attrs))
    a = dict(explicit)
    nhwc = a["data_format"] == "NHWC"
    hw, planes = (x.shape[1:3], x.shape[0] * x.shape[3]) if nhwc else (x.shape[2:], x.shape[0] * x.shape[1])
    out_hw = [(n + lo + hi - k) // s + 1 for n, (lo, hi), k, s in zip(hw, a["padding"], a["kernel_size"], a["stride"])]
    moved = planes * (math.prod(hw) + math.prod(out_hw)) * x.dtype.itemsize
    if variant != "onednn":
        return _ONEDNN_POOL_SPEEDUP * moved
    if platform != "cpu" or not _onednn_fits(x, explicit):
        return None
    return moved * (1 if nhwc else _ONEDNN_POOL_SPEEDUP)


pool2d = define(
    "pool2d", _pool2d, inputs=[Input("x", rank=4)],
    attrs={"pooling_type": Attr("str", "max", choices=("max", "avg")),
           "kernel_size": Attr("ints", None, length=2, minimum=1, optional=True),
           "stride": Attr("ints", None, length=2, minimum=1, optional=True),
           "padding": Attr("padding", ((0, 0), (0, 0))),
           "ceil_mode": Attr("bool", False), "global_pooling": Attr("bool", False),
           "exclusive": Attr("bool", True), "data_format": Attr("str", "NCHW", choices=LAYOUTS)},
    variants={"onednn": _pool2d_onednn}, requires={"onednn": onednn.available}, estimate=_pool_estimate,
    flops=_pool_flops, traits=Traits(layout_sensitive=True, channels="identity",
                                     commutes_with_quantize=lambda attrs: attrs.get("pooling_type", "max") == "max"))


def _is_size(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


class _OutputSize(Attr):
    """Two output sizes (a single int is used for both); None keeps that input size."""

    def _normalise(self, op, what, value):
        sizes = (value, value) if _is_size(value) else value
        if isinstance(sizes, (tuple, list)) and len(sizes) == 2 and all(v is None or _is_size(v) for v in sizes):
            return tuple(None if v is None else int(v) for v in sizes)
        raise attr_error(op, "output_size", "an int >= 1 or 2 entries, each an int >= 1 or None", value)


def _adaptive_axis(x, axis, out, pooling_type):
    """Pool ``axis`` of ``x`` into ``out`` adaptive bins."""
    n = x.shape[axis]
    reduce = jnp.max if pooling_type == "max" else jnp.mean
    if n % out == 0:  # equal bins: one reshape and one reduction
        return reduce(x.reshape(x.shape[:axis] + (out, n // out) + x.shape[axis + 1:]), axis=axis + 1)
    bins = [reduce(lax.slice_in_dim(x, i * n // out, -(-(i + 1) * n // out), axis=axis), axis=axis, keepdims=True)
            for i in range(out)]
    return jnp.concatenate(bins, axis)


def _adaptive_pool2d(x, *, output_size, pooling_type, data_format):
    """Max or average pooling into an ``output_size`` grid of Paddle's adaptive bins."""
    y = to_channels_last(x, data_format)
    # a 2-D bin is a row range times a column range, so pooling rows then columns is exact
    for axis, out in zip((1, 2), output_size):
        if out is not None:
            y = _adaptive_axis(y, axis, out, pooling_type)
    return from_channels_last(y, data_format)


adaptive_pool2d = define(
    "adaptive_pool2d", _adaptive_pool2d, inputs=[Input("x", rank=4, dtype="float")],
    attrs={"output_size": _OutputSize("ints"), "pooling_type": Attr("str", "avg", choices=("max", "avg")),
           "data_format": Attr("str", "NCHW", choices=LAYOUTS)},
    flops=lambda in_shapes, out_shapes, attrs: math.prod(in_shapes[0]),
    traits=Traits(layout_sensitive=True, channels="identity"))
