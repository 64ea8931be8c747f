"""Segment reductions (Paddle's ``paddle.geometric.segment_sum`` / ``_mean`` / ``_max`` / ``_min``):
the rows of ``data`` that share a segment id reduced to one output row.

Output row ``s`` reduces the rows ``i`` with ``segment_ids[i] == s``; a segment no row falls in
reads 0 for every reduction, as in Paddle (not -inf for the maximum). Ids need not be sorted
(Paddle asks for sorted ids; any order gives the same result here), and ids outside
``[0, num_segments)`` are dropped.

The number of output rows is the ``num_segments`` attribute. Paddle infers it as
``max(segment_ids) + 1``, which only concrete ids can give: an eager call may leave it out and
gets exactly that, while under ``jax.jit``, ``vmap`` or tracing into a program the output shape
must be known before the ids are, so there it is required (a ValueError says so). Eager
gradients need no ``num_segments`` either: the ids stay concrete.

Sums and means of float16 / bfloat16 data accumulate in float32 and round once at the end; an
integer mean divides as Paddle's kernels do, rounding toward zero. Gradients flow to ``data``:
a maximum's (minimum's) to the rows that attain it, shared equally between ties, as
``jax.ops.segment_max`` gives.

>>> import jax.numpy as jnp
>>> data = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
>>> segment_sum(data, jnp.array([0, 0, 1])).tolist()
[[4.0, 6.0], [5.0, 6.0]]
>>> segment_max(data, jnp.array([0, 0, 2]), num_segments=4).tolist()  # segments 1 and 3 are empty
[[3.0, 4.0], [0.0, 0.0], [5.0, 6.0], [0.0, 0.0]]
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.ops.common import attr_error, input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits

REDUCTIONS = ("sum", "mean", "max", "min")


def check_numeric(op: str, name: str, x) -> None:
    """A ValueError naming ``op`` and input ``name`` unless ``x`` holds ints or floats.

    >>> check_numeric("segment_sum", "data", jnp.array([True]))
    Traceback (most recent call last):
    ...
    ValueError: segment_sum: input 'data' expects an int or float array, got 'bool'
    """
    dtype = jnp.result_type(x)
    if not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)):
        raise input_error(op, name, "an int or float array", str(dtype))


def check_ids(op: str, name: str, ids, rows: int, why: str) -> None:
    """A ValueError unless ``ids`` is a rank-1 array of ``rows`` entries (``why`` says whose).

    >>> check_ids("segment_sum", "segment_ids", jnp.zeros(2, int), 3, "one per row of 'data'")
    Traceback (most recent call last):
    ...
    ValueError: segment_sum: input 'segment_ids' expects shape (3,) (one per row of 'data'), got (2,)
    """
    if ids.ndim != 1 or ids.shape[0] != rows:
        raise input_error(op, name, f"shape ({rows},) ({why})", tuple(ids.shape))


def _accumulator(dtype):
    """The type a sum of ``dtype`` values is accumulated in: float32 for the half-width floats."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def segment_reduce(data, ids, num_segments: int, reduce: str):
    """``data`` rows reduced by segment (any order of ``ids``); empty segments read 0.

    The kernels of the segment and message-passing ops share it.

    >>> segment_reduce(jnp.array([1, 2, 7]), jnp.array([1, 1, 0]), 3, "mean").tolist()
    [7, 1, 0]
    """
    if reduce in ("sum", "mean"):
        acc = _accumulator(data.dtype)
        total = jax.ops.segment_sum(data.astype(acc), ids, num_segments)
        if reduce == "sum":
            return total.astype(data.dtype)
        count = jax.ops.segment_sum(jnp.ones(ids.shape, acc), ids, num_segments)
        count = jnp.broadcast_to(jnp.maximum(count, 1).reshape(count.shape + (1,) * (data.ndim - 1)), total.shape)
        divide = jax.lax.div if jnp.issubdtype(acc, jnp.integer) else jnp.true_divide  # lax.div rounds toward 0
        return divide(total, count).astype(data.dtype)
    extreme = (jax.ops.segment_max if reduce == "max" else jax.ops.segment_min)(data, ids, num_segments)
    filled = jax.ops.segment_sum(jnp.ones(ids.shape, jnp.int32), ids, num_segments) > 0
    return jnp.where(filled.reshape(filled.shape + (1,) * (data.ndim - 1)), extreme, jnp.zeros((), data.dtype))


def _num_segments(op: str, ids, num_segments: int | None) -> int:
    if num_segments is not None:
        return num_segments
    if isinstance(ids, jax.core.Tracer):
        raise attr_error(op, "num_segments", "an int when segment_ids is traced (under jit, vmap or pj.trace the "
                         "number of output rows must be static; eager calls infer max(segment_ids) + 1)", None)
    ids = np.asarray(ids)
    return max(int(ids.max()) + 1, 0) if ids.size else 0


def _segment_op(reduce: str):
    name = f"segment_{reduce}"

    def kernel(data, segment_ids, *, num_segments):
        check_numeric(name, "data", data)
        check_ids(name, "segment_ids", segment_ids, data.shape[0], "one per row of 'data'")
        return segment_reduce(data, segment_ids, _num_segments(name, segment_ids, num_segments), reduce)

    kernel.__name__ = name
    kernel.__doc__ = (f"The {reduce} of the rows of ``data`` sharing a segment id: output ``[num_segments, "
                      f"*data.shape[1:]]``, 0 for an empty segment (see the module doc).")
    return define(name, kernel, inputs=[Input("data", rank=tuple(range(1, 9))), Input("segment_ids", dtype="int")],
                  attrs={"num_segments": Attr("int", None, optional=True, minimum=0,
                                              doc="output rows; eager calls may leave it to max(ids) + 1")},
                  flops=lambda ins, outs, attrs: math.prod(ins[0]),
                  # an output row mixes input rows: padding or chunking the rows changes it
                  traits=Traits(reduction=True, batch_coupled=True))


segment_sum = _segment_op("sum")
segment_mean = _segment_op("mean")
segment_max = _segment_op("max")
segment_min = _segment_op("min")
