"""Reductions: reduce_sum, reduce_mean, reduce_max over some axes (all when ``axis`` is None
or empty, as in Paddle).

>>> import jax.numpy as jnp
>>> from paddlejax.ops.reduce import reduce_sum
>>> reduce_sum(jnp.ones((2, 3)), axis=1, keepdim=True).tolist()
[[3.0], [3.0]]
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import IntOrInts, norm_axes


def _reduction(name: str, fn, doc: str, amp: str = "gray"):
    def kernel(x, *, axis, keepdim):
        axes = None if not axis else norm_axes(name, "axis", axis, x.ndim)
        return fn(x, axis=axes, keepdims=keepdim)

    kernel.__doc__ = doc
    kernel.__name__ = name
    return define(name, kernel, inputs=[Input("x")],
                  attrs={"axis": IntOrInts("ints", None, optional=True), "keepdim": Attr("bool", False)},
                  flops=lambda ins, outs, attrs: math.prod(ins[0]), traits=Traits(reduction=True, amp=amp, channels="reduced"))


# sums and means lose low-precision bits as they grow: Paddle keeps them in float32
reduce_sum = _reduction("reduce_sum", jnp.sum, "Sum over ``axis``.", amp="black")
reduce_mean = _reduction("reduce_mean", jnp.mean, "Mean over ``axis``.", amp="black")
reduce_max = _reduction("reduce_max", jnp.max, "Maximum over ``axis``.")
