"""Reading an image at fractional pixel positions: ``grid_sample`` (Paddle's ``F.grid_sample``)
and the interpolation helpers that deformable convolution and ``roi_align`` share.

A position is read through *taps*: the pixels along one axis that it touches, each with a
weight (:func:`linear_taps` for linear interpolation, :func:`nearest_taps` for the nearest
pixel). :func:`gather_taps` combines a row and a column tap list into a 2-D read, a pixel
outside the image counting as zero.

``grid_sample`` takes a grid ``[N, Ho, Wo, 2]`` of ``(x, y)`` positions in ``[-1, 1]``
(-1 the first pixel, 1 the last: at their centres with ``align_corners``, at their outer edges
without). ``padding_mode`` says what a position outside the image reads: ``zeros``, the
``border`` pixel, or the image mirrored at its border (``reflection``). ``nearest`` rounds a
position half away from zero, as Paddle's CPU kernel does.

>>> import jax.numpy as jnp
>>> image = jnp.arange(4.0).reshape(1, 1, 2, 2)
>>> grid_sample(image, jnp.array([[[[0.0, 0.0], [1.0, -1.0]]]])).tolist()  # the centre, the top right
[[[[1.5, 1.0]]]]
>>> grid_sample(image, jnp.array([[[[2.0, 0.0]]]]), padding_mode="border").tolist()
[[[[2.0]]]]
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from paddlejax.ops.common import input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits


def linear_taps(coord):
    """The two pixels along an axis that linear interpolation at ``coord`` reads, as
    ``((index, weight), (index + 1, weight))`` arrays shaped like ``coord`` (indices as floats,
    possibly outside the image).

    >>> [(float(i), float(w)) for i, w in linear_taps(jnp.float32(2.25))]
    [(2.0, 0.75), (3.0, 0.25)]
    """
    low = jnp.floor(coord)
    frac = coord - low
    return (low, 1 - frac), (low + 1, frac)


def nearest_taps(coord):
    """The one pixel nearest to ``coord``, halves rounded away from zero, with weight 1.

    >>> [(float(i), float(w)) for i, w in nearest_taps(jnp.float32(-1.5))]
    [(-2.0, 1.0)]
    """
    return ((jnp.sign(coord) * jnp.floor(jnp.abs(coord) + 0.5), jnp.ones_like(coord)),)


def gather_taps(images, batch, taps_y, taps_x):
    """``sum image[batch][:, y, x] * weight_y * weight_x`` over the row taps ``taps_y`` and the
    column taps ``taps_x`` (all arrays of one shape ``S``, or broadcasting to it, like the image
    indices ``batch``), reading 0 for a pixel outside the image. ``images`` is ``[N, C, H, W]``;
    the result is ``[*S, C]``, channels last (one gathered row of channels per tap).

    >>> images = jnp.arange(8.0).reshape(2, 1, 2, 2)
    >>> gather_taps(images, jnp.array([1]), linear_taps(jnp.array([0.5])), linear_taps(jnp.array([1.0]))).tolist()
    [[6.0]]
    """
    n, c, h, w = images.shape
    rows = jnp.moveaxis(images, 1, -1).reshape(n * h * w, c)
    out = 0
    for iy, wy in taps_y:
        for ix, wx in taps_x:
            inside = (iy >= 0) & (iy <= h - 1) & (ix >= 0) & (ix <= w - 1)
            row, col = jnp.clip(iy, 0, h - 1).astype(jnp.int32), jnp.clip(ix, 0, w - 1).astype(jnp.int32)
            index = (batch * h + row) * w + col
            weight = jnp.where(inside, wy * wx, 0).astype(images.dtype)
            out = out + jnp.take(rows, index, axis=0) * weight[..., None]
    return out


def _reflect(coord, low, span):
    """``coord`` mirrored back and forth into ``[low, low + span / 2]``: the image and its
    mirror images laid side by side with period ``span``."""
    folded = jnp.mod(jnp.abs(coord - low), span)
    return jnp.minimum(folded, span - folded) + low


def _source(g, size: int, padding_mode: str, align_corners: bool):
    """Pixel coordinates of the normalised grid coordinates ``g`` along an axis of ``size``."""
    if align_corners:
        coord = (g + 1) / 2 * (size - 1)
    else:
        coord = ((g + 1) * size - 1) / 2
    if padding_mode == "reflection":
        if align_corners:  # mirrored about the outer pixels' centres
            coord = _reflect(coord, 0, 2 * (size - 1)) if size > 1 else jnp.zeros_like(coord)
        else:  # mirrored about the image's edges, half a pixel further out
            coord = _reflect(coord, -0.5, 2 * size)
    if padding_mode in ("border", "reflection"):
        coord = jnp.clip(coord, 0, size - 1)
    return coord


# Jitted so that eager calls reuse one compiled kernel per shape and attributes, not dispatch
# its many small operations one by one. Under tracing it is just a nested call.
@functools.partial(jax.jit, static_argnames=("mode", "padding_mode", "align_corners"))
def _grid_sample(x, grid, *, mode, padding_mode, align_corners):
    """``x`` ``[N, C, H, W]`` read at the ``(x, y)`` positions of ``grid`` ``[N, Ho, Wo, 2]``
    (normalised to ``[-1, 1]``): output ``[N, C, Ho, Wo]``."""
    n, _, h, w = x.shape
    if grid.shape[0] != n or grid.shape[-1] != 2:
        raise input_error("grid_sample", "grid", f"shape [{n}, Ho, Wo, 2] ((x, y) positions per image of x)",
                          tuple(grid.shape))
    g = grid.astype(jnp.promote_types(grid.dtype, jnp.float32))  # pixel positions need float32's mantissa
    gx = _source(g[..., 0], w, padding_mode, align_corners)
    gy = _source(g[..., 1], h, padding_mode, align_corners)
    taps = linear_taps if mode == "bilinear" else nearest_taps
    out = gather_taps(x, jnp.arange(n).reshape(n, 1, 1), taps(gy), taps(gx))
    return jnp.moveaxis(out, -1, 1)


grid_sample = define(
    "grid_sample", _grid_sample,
    inputs=[Input("x", rank=4, dtype="float"), Input("grid", rank=4, dtype="float")],
    attrs={"mode": Attr("str", "bilinear", choices=("bilinear", "nearest")),
           "padding_mode": Attr("str", "zeros", choices=("zeros", "border", "reflection")),
           "align_corners": Attr("bool", True)},
    # each output element: 4 taps of a multiply-add and the weights
    flops=lambda ins, outs, attrs: 8 * math.prod(outs[0]),
    traits=Traits(saved_for_backward=("operands",)))
