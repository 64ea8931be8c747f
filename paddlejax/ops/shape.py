"""Shape ops: reshape, transpose, concat, split, slice, pad, cast.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.shape import reshape, split
>>> reshape(jnp.zeros((2, 3, 4)), shape=(0, -1)).shape
(2, 12)
>>> [p.shape for p in split(jnp.zeros((2, 6)), num_or_sections=(1, -1), axis=1)]
[(2, 1), (2, 5)]
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax.ops.common import attr_error, input_error, norm_axis, norm_axes, IntOrInts
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits, always

# ---------------------------------------------------------------------------------------
# Ops


def _reshape(x, *, shape):
    """Paddle reshape: 0 copies the input dimension at that index, one -1 is inferred."""
    if sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise attr_error("reshape", "shape", "sizes >= 0 with at most one -1", shape)
    if any(d == 0 and i >= x.ndim for i, d in enumerate(shape)):
        raise attr_error("reshape", "shape", f"0 (copy) only within the input rank {x.ndim}", shape)
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if -1 in dims:
        # inferred from the input sizes that are not copied, so an empty batch (a copied 0)
        # still determines it
        rest = math.prod(n for i, n in enumerate(x.shape) if i >= len(shape) or shape[i] != 0)
        explicit = math.prod(d for d in shape if d > 0)
        if rest % explicit:
            raise attr_error("reshape", "shape", f"a shape compatible with {x.shape}", shape)
        dims[dims.index(-1)] = rest // explicit
    if math.prod(dims) != x.size:
        raise attr_error("reshape", "shape", f"{x.size} elements like input {x.shape}", shape)
    return jnp.reshape(x, dims)


def _transpose(x, *, perm):
    """Permute the axes of ``x``."""
    if sorted(perm) != list(range(x.ndim)):
        raise attr_error("transpose", "perm", f"a permutation of range({x.ndim})", perm)
    return jnp.transpose(x, perm)


def _concat(*xs, axis):
    """Join arrays along ``axis``; all other dimensions must match."""
    ax = norm_axis("concat", "axis", axis, xs[0].ndim)
    rest = lambda shape: tuple(shape[:ax]) + tuple(shape[ax + 1:])  # noqa: E731
    for i, x in enumerate(xs):
        if x.ndim != xs[0].ndim or rest(x.shape) != rest(xs[0].shape):
            raise input_error("concat", f"x{i}", f"shape {tuple(xs[0].shape)} except along axis {ax}", x.shape)
    return jnp.concatenate(xs, axis=ax)


def _split_sizes(n: int, sections: tuple[int, ...]) -> list[int]:
    if len(sections) == 1:
        parts = sections[0]
        if parts < 1 or n % parts:
            raise attr_error("split", "num_or_sections", f"a divisor of the axis size ({n})", parts)
        return [n // parts] * parts
    if sum(s == -1 for s in sections) > 1 or any(s < -1 for s in sections):
        raise attr_error("split", "num_or_sections", "sizes >= 0 with at most one -1", sections)
    sizes = list(sections)
    if -1 in sizes:
        sizes[sizes.index(-1)] = n - (sum(sizes) + 1)
    if sum(sizes) != n or min(sizes) < 0:
        raise attr_error("split", "num_or_sections", f"sizes summing to the axis size ({n})", sections)
    return sizes


def _split(x, *, num_or_sections, axis):
    """Split ``x`` along ``axis`` into equal parts (a single int) or parts of given sizes."""
    ax = norm_axis("split", "axis", axis, x.ndim)
    bounds = np.cumsum([0] + _split_sizes(x.shape[ax], num_or_sections))
    return tuple(lax.slice_in_dim(x, int(lo), int(hi), axis=ax) for lo, hi in zip(bounds[:-1], bounds[1:]))


def _slice(x, *, axes, starts, ends):
    """Paddle slice: negative starts/ends count from the end, out-of-range bounds clamp."""
    if not len(axes) == len(starts) == len(ends):
        raise attr_error("slice", "starts", f"as many starts and ends as axes ({len(axes)})", (starts, ends))
    lo, hi = [0] * x.ndim, list(x.shape)
    for ax, s, e in zip(norm_axes("slice", "axes", axes, x.ndim), starts, ends):
        n = x.shape[ax]
        s, e = (min(max(v + n if v < 0 else v, 0), n) for v in (s, e))
        lo[ax], hi[ax] = s, max(s, e)
    return lax.slice(x, lo, hi)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "replicate": "edge",
              "circular": "wrap"}


def _pad(x, *, paddings, mode, value):
    """Pad every dimension; ``paddings`` is (low, high) per dimension, first to last."""
    if len(paddings) != 2 * x.ndim:
        raise attr_error("pad", "paddings", f"2 ints per dimension ({2 * x.ndim})", paddings)
    pairs = list(zip(paddings[::2], paddings[1::2]))
    # reflect mirrors without repeating the edge, so it needs pad < size; the others need size > 0
    limit = (lambda n: n - 1) if mode == "reflect" else (lambda n: 0 if n == 0 else math.inf)
    if mode != "constant" and any(max(p) > limit(n) for p, n in zip(pairs, x.shape)):
        raise attr_error("pad", "paddings", f"pads that fit the input dims {x.shape} in mode {mode!r}", paddings)
    if mode == "constant":
        return jnp.pad(x, pairs, constant_values=jnp.asarray(value, x.dtype))
    return jnp.pad(x, pairs, mode=_PAD_MODES[mode])


def _cast(x, *, dtype):
    """Convert ``x`` to ``dtype``."""
    return lax.convert_element_type(x, dtype)


# Their gradients only move elements back: the backward pass reads none of their values.
reshape = define("reshape", _reshape, inputs=[Input("x")], attrs={"shape": Attr("ints")},
                 traits=Traits(reshaping=True, channels="reshaped", identity_if=always, saved_for_backward=(),
                               commutes_with_quantize=True))
transpose = define("transpose", _transpose, inputs=[Input("x")], attrs={"perm": Attr("ints")},
                   traits=Traits(identity_if=lambda attrs: tuple(attrs["perm"]) == tuple(range(len(attrs["perm"]))),
                                 saved_for_backward=(), commutes_with_quantize=True))
concat = define("concat", _concat, inputs=[Input("x", variadic=True)], attrs={"axis": Attr("int", 0)},
                traits=Traits(channels="concatenated", identity_if=always, saved_for_backward=()))
split = define("split", _split, inputs=[Input("x")], outputs=("outs",), multiple_results=True,
               attrs={"num_or_sections": IntOrInts("ints"), "axis": Attr("int", 0)}, traits=Traits())
# a slice or pad that keeps the type keeps every element
slice = define("slice", _slice, inputs=[Input("x")],  # noqa: A001  (Paddle's name)
               attrs={"axes": IntOrInts("ints"), "starts": IntOrInts("ints"), "ends": IntOrInts("ints")},
               traits=Traits(identity_if=always))
pad = define("pad", _pad, inputs=[Input("x")],
             attrs={"paddings": Attr("ints", minimum=0), "mode": Attr("str", "constant", choices=tuple(_PAD_MODES)),
                    "value": Attr("float", 0.0)},
             traits=Traits(identity_if=lambda attrs: not any(attrs["paddings"])))
cast = define("cast", _cast, inputs=[Input("x")], attrs={"dtype": Attr("dtype")},
              traits=Traits(pointwise=True, amp="cast", channels="identity", identity_if=always,
                            saved_for_backward=()))
