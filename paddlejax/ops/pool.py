"""2-D pooling (max / average) with Paddle's attributes.

``exclusive=True`` (Paddle's default) divides average windows by the number of real input
elements they cover; ``exclusive=False`` always divides by ``kh * kw``. ``ceil_mode`` keeps
a last partial window, provided it starts inside the input or its left padding.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.pool import pool2d
>>> pool2d(jnp.ones((1, 2, 5, 5)), pooling_type="max", kernel_size=2, ceil_mode=True).shape
(1, 2, 3, 3)
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax.ops.conv import paddle_padding
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.common import LAYOUTS, attr_error, from_channels_last, to_channels_last


def _ceil_pad(n, k, s, lo, hi):
    """Extra high padding so that ceil_mode's last partial window exists."""
    out = -(-(n + lo + hi - k) // s) + 1
    if (out - 1) * s >= n + lo:  # that window would start in the right padding: drop it
        out -= 1
    return max((out - 1) * s + k - (n + lo + hi), 0)


def _pool_geometry(hw, kernel_size, stride, padding, ceil_mode, global_pooling):
    """Kernel, stride and explicit pads of the pooling windows."""
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
    """Max or average pooling over 2-D windows."""
    xl = to_channels_last(x, data_format)
    k, s, pads = _pool_geometry(xl.shape[1:3], kernel_size, stride, padding, ceil_mode, global_pooling)
    window, strides, full_pads = (1, *k, 1), (1, *s, 1), ((0, 0), *pads, (0, 0))
    if pooling_type == "max":
        # numpy init values: a traced init value makes JAX pick the generic reduce_window,
        # which has no transpose rule (so no jit(grad))
        y = lax.reduce_window(xl, np.array(-np.inf, xl.dtype), lax.max, window, strides, full_pads)
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


pool2d = define(
    "pool2d", _pool2d, inputs=[Input("x", rank=4, dtype="float")],
    attrs={"pooling_type": Attr("str", "max", choices=("max", "avg")),
           "kernel_size": Attr("ints", None, length=2, minimum=1, optional=True),
           "stride": Attr("ints", None, length=2, minimum=1, optional=True),
           "padding": Attr("padding", ((0, 0), (0, 0))),
           "ceil_mode": Attr("bool", False), "global_pooling": Attr("bool", False),
           "exclusive": Attr("bool", True), "data_format": Attr("str", "NCHW", choices=LAYOUTS)},
    flops=_pool_flops)
