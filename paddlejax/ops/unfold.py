"""``unfold`` (Paddle's ``F.unfold``, im2col): the sliding ``kh x kw`` blocks of an NCHW image
laid out as columns, ``[N, C * kh * kw, L]`` with ``L = Ho * Wo`` blocks in row-major order and
each column ordered (channel, kernel row, kernel column) -- the layout a convolution's OIHW
weight, flattened per output channel, multiplies.

``paddings`` is an int, ``[pad_h, pad_w]`` or ``[top, left, bottom, right]`` (Paddle's order).

>>> import jax.numpy as jnp
>>> unfold(jnp.arange(9.0).reshape(1, 1, 3, 3), kernel_sizes=2).tolist()
[[[0.0, 1.0, 3.0, 4.0], [1.0, 2.0, 4.0, 5.0], [3.0, 4.0, 6.0, 7.0], [4.0, 5.0, 7.0, 8.0]]]
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from paddlejax.ops.common import attr_error
from paddlejax.ops.registry import Attr, Input, _is_int, define
from paddlejax.ops.traits import Traits


class _Paddings(Attr):
    """Paddle's unfold paddings: an int, ``[pad_h, pad_w]`` or ``[top, left, bottom, right]``,
    kept as the four."""

    def _normalise(self, op, what, value):
        value = super()._normalise(op, what, (value,) if _is_int(value) else value)
        if len(value) not in (1, 2, 4):
            raise attr_error(op, "paddings", "an int, [pad_h, pad_w] or [top, left, bottom, right]", value)
        return value * (4 // len(value))


def _unfold(x, *, kernel_sizes, strides, paddings, dilations):
    """The ``kernel_sizes`` blocks of ``x`` ``[N, C, H, W]`` as columns: ``[N, C*kh*kw, Ho*Wo]``."""
    n, c, h, w = x.shape
    top, left, bottom, right = paddings
    padded = jnp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    out_hw = [(size - d * (k - 1) - 1) // s + 1
              for size, k, s, d in zip(padded.shape[2:], kernel_sizes, strides, dilations)]
    if min(out_hw) <= 0:
        raise attr_error("unfold", "kernel_sizes", f"(dilated) blocks that fit the padded input "
                         f"{tuple(padded.shape[2:])}", kernel_sizes)
    # one strided slice per kernel tap: exact for any dtype, where a patch convolution rounds
    taps = [lax.slice(padded, (0, 0, i * dilations[0], j * dilations[1]),
                      (n, c, i * dilations[0] + (out_hw[0] - 1) * strides[0] + 1,
                       j * dilations[1] + (out_hw[1] - 1) * strides[1] + 1), (1, 1, *strides))
            for i in range(kernel_sizes[0]) for j in range(kernel_sizes[1])]
    return jnp.stack(taps, axis=2).reshape(n, -1, out_hw[0] * out_hw[1])


unfold = define(
    "unfold", _unfold, inputs=[Input("x", rank=4)],
    attrs={"kernel_sizes": Attr("ints", length=2, minimum=1), "strides": Attr("ints", (1, 1), length=2, minimum=1),
           "paddings": _Paddings("ints", (0, 0, 0, 0), minimum=0),
           "dilations": Attr("ints", (1, 1), length=2, minimum=1)},
    flops=lambda ins, outs, attrs: 0,  # data movement
    traits=Traits(saved_for_backward=()))
