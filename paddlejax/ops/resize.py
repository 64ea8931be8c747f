"""Resizing: ``interpolate`` (Paddle's ``F.interpolate``), nearest or (bi/tri)linear.

The output size is ``size``, or ``floor(in * scale_factor)`` per spatial axis. Output index
``j`` of an axis reads the input at ``src = ratio * j`` where ``ratio`` is
``(in - 1) / (out - 1)`` with ``align_corners``, else ``1 / scale_factor`` (or ``in / out``
when ``size`` is given). ``nearest`` takes ``floor(src)``; the linear modes interpolate
between the two neighbours of ``src``, which with ``align_mode=0`` (Paddle's default, when
not ``align_corners``) is the half-pixel ``ratio * (j + 0.5) - 0.5`` clamped at 0. As in
Paddle's kernels, an axis resized to 1 reads index 0, and an input already of the output size
is returned as it is (even when a ``scale_factor`` such as 1.1 rounds down to it).

>>> import jax.numpy as jnp
>>> from paddlejax.ops.resize import interpolate
>>> interpolate(jnp.array([[[0.0, 1.0]]]), scale_factor=2.0, mode="nearest", data_format="NCW").tolist()
[[[0.0, 0.0, 1.0, 1.0]]]
>>> interpolate(jnp.array([[[0.0, 1.0]]]), size=3, mode="linear", align_corners=True,
...             data_format="NCW").tolist()
[[[0.0, 0.5, 1.0]]]
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from paddlejax.ops.common import IntOrInts, attr_error, from_channels_last, input_error, to_channels_last
from paddlejax.ops.registry import Attr, Input, _fail, define
from paddlejax.ops.traits import Traits

RESIZE_LAYOUTS = ("NCW", "NWC", "NCHW", "NHWC", "NCDHW", "NDHWC")
# The linear mode of each input rank (Paddle refuses the others).
_LINEAR_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


class _Floats(Attr):
    """A positive float or a tuple of positive floats."""

    def _normalise(self, op, what, value):
        items = (value,) if isinstance(value, (int, float, np.integer, np.floating)) else value
        if (isinstance(items, (tuple, list)) and items
                and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                        and math.isfinite(v) and v > 0 for v in items)):
            return tuple(float(v) for v in items)
        raise _fail(op, what, "a positive float or a tuple of them", value)


def _per_axis(name, values, n):
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise attr_error("interpolate", name, f"1 or {n} values (one per spatial axis)", values)
    return values


def _out_sizes(spatial, size, scale_factor):
    """``(out size, ratio without align_corners)`` per spatial axis."""
    if (size is None) == (scale_factor is None):
        raise attr_error("interpolate", "size", "exactly one of size and scale_factor to be given",
                         (size, scale_factor))
    if size is not None:
        sizes = _per_axis("size", size, len(spatial))
        return sizes, [n / m for n, m in zip(spatial, sizes)]
    scales = _per_axis("scale_factor", scale_factor, len(spatial))
    sizes = tuple(int(n * s) for n, s in zip(spatial, scales))
    if min(sizes) < 1:
        raise attr_error("interpolate", "scale_factor", f"output sizes >= 1 from input {tuple(spatial)}",
                         scale_factor)
    return sizes, [1 / s for s in scales]


def _resize_axis(x, axis, out, ratio, mode, align_corners, align_mode):
    """``x`` resized along ``axis`` to ``out`` (indices are static: sizes are known)."""
    n = x.shape[axis]
    j = np.arange(out, dtype=np.float64)
    if out == 1:  # Paddle reads index 0 for a size-1 output, whatever the mode
        ratio = 0.0
    elif align_corners:
        ratio = (n - 1) / (out - 1)
    if mode == "nearest":
        return jnp.take(x, np.minimum(np.floor(ratio * j).astype(np.int32), n - 1), axis=axis)
    half_pixel = align_mode == 0 and not align_corners
    src = np.maximum(ratio * (j + 0.5) - 0.5, 0) if half_pixel else ratio * j
    lo = np.minimum(np.floor(src).astype(np.int32), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    shape = [1] * x.ndim
    shape[axis] = out
    frac = jnp.asarray((src - lo).reshape(shape), x.dtype)
    return jnp.take(x, lo, axis=axis) * (1 - frac) + jnp.take(x, hi, axis=axis) * frac


def _interpolate(x, *, size, scale_factor, mode, align_corners, align_mode, data_format):
    """Resize the spatial axes of ``x`` by nearest or (bi/tri)linear interpolation."""
    if len(data_format) != x.ndim:
        raise attr_error("interpolate", "data_format", f"a layout of rank {x.ndim} "
                         f"({', '.join(f for f in RESIZE_LAYOUTS if len(f) == x.ndim)})", data_format)
    if mode != "nearest" and mode != _LINEAR_MODES[x.ndim]:
        raise attr_error("interpolate", "mode", f"'nearest' or {_LINEAR_MODES[x.ndim]!r} for a rank-{x.ndim} input",
                         mode)
    if mode == "nearest" and align_corners:
        raise attr_error("interpolate", "align_corners", "False with mode='nearest' (as in Paddle)", align_corners)
    xl = to_channels_last(x, data_format)
    if not all(isinstance(n, (int, np.integer)) for n in xl.shape[1:-1]):
        raise input_error("interpolate", "x", f"fixed spatial sizes ({data_format}; the batch size may be symbolic)",
                          tuple(x.shape))
    sizes, ratios = _out_sizes(xl.shape[1:-1], size, scale_factor)
    if tuple(sizes) == tuple(xl.shape[1:-1]):  # Paddle copies an input already of the output size
        return x
    y = xl if mode == "nearest" else xl.astype(jnp.promote_types(x.dtype, jnp.float32))
    for axis, (out, ratio) in enumerate(zip(sizes, ratios), start=1):
        y = _resize_axis(y, axis, out, ratio, mode, align_corners, align_mode)
    return from_channels_last(y.astype(x.dtype), data_format)


interpolate = define(
    "interpolate", _interpolate, inputs=[Input("x", rank=(3, 4, 5), dtype="float")],
    attrs={"size": IntOrInts("ints", None, optional=True, minimum=1),
           "scale_factor": _Floats("floats", None, optional=True),
           "mode": Attr("str", "nearest", choices=("nearest", *_LINEAR_MODES.values())),
           "align_corners": Attr("bool", False), "align_mode": Attr("int", 0, choices=(0, 1)),
           "data_format": Attr("str", "NCHW", choices=RESIZE_LAYOUTS)},
    flops=lambda ins, outs, attrs: 4 * math.prod(outs[0]),
    traits=Traits(layout_sensitive=True, channels="identity"))
