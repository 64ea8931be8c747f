"""Message passing over edge lists (Paddle 2.3's ``paddle.geometric.send_u_recv``,
``send_ue_recv`` and ``send_uv``): each edge ``e`` carries a message from node
``src_index[e]`` to node ``dst_index[e]``, and a node reduces the messages it receives.

- ``send_u_recv(x, src, dst)``: the message is ``x[src]``; node ``d`` receives the reduction
  (``reduce_op``: sum, mean, max, min) of its incoming messages;
- ``send_ue_recv(x, y, src, dst)``: the message is ``x[src] <message_op> y[e]`` with the edge
  features ``y`` (add, sub, mul, div; broadcasting over the feature axes), then reduced;
- ``send_uv(x, y, src, dst)``: one output row per edge, ``x[src] <message_op> y[dst]``.

Received outputs have ``out_size`` rows (default ``x.shape[0]``, as in Paddle), which is
static, so these ops jit and trace as they are. A node that receives nothing reads 0 for every
reduction; edges whose destination lies outside ``[0, out_size)`` are dropped, and sources must
name rows of ``x``. Edges may come in any order. Sums and means of float16 / bfloat16
accumulate in float32.

>>> import jax.numpy as jnp
>>> x = jnp.array([[0.0, 2.0], [1.0, 4.0], [2.0, 6.0]])
>>> src, dst = jnp.array([0, 1, 2, 0]), jnp.array([1, 2, 1, 0])
>>> send_u_recv(x, src, dst, reduce_op="sum").tolist()
[[0.0, 2.0], [2.0, 8.0], [1.0, 4.0]]
>>> send_uv(x, x, src, dst, message_op="sub").tolist()
[[-1.0, -2.0], [-1.0, -2.0], [1.0, 2.0], [0.0, 0.0]]
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from paddlejax.ops.common import input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.segment import REDUCTIONS, check_ids, check_numeric, segment_reduce
from paddlejax.ops.traits import Traits

MESSAGE_OPS = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.true_divide}


def _edges(op: str, src_index, dst_index) -> None:
    if src_index.ndim != 1:
        raise input_error(op, "src_index", "a rank-1 array of source nodes", tuple(src_index.shape))
    check_ids(op, "dst_index", dst_index, src_index.shape[0], "one per entry of 'src_index'")


def _same_dtype(op: str, x, y) -> None:
    if y.dtype != x.dtype:
        raise input_error(op, "y", f"the dtype of 'x' ({x.dtype})", str(y.dtype))


def _rows(v, rank: int):
    """``v`` with unit axes inserted after its first, to ``rank`` axes (numpy's broadcasting, row axis kept)."""
    return v.reshape(v.shape[:1] + (1,) * (rank - v.ndim) + v.shape[1:])


def _combine(op: str, message_op: str, a, b, rows: str):
    """``a <message_op> b`` row by row, the feature axes broadcasting; an error names ``op`` and ``y``."""
    try:
        features = jnp.broadcast_shapes(a.shape[1:], b.shape[1:])
    except ValueError:
        raise input_error(op, "y", f"features that broadcast with x's {tuple(a.shape[1:])} "
                          f"(shape [{rows}, ...])", tuple(b.shape)) from None
    return MESSAGE_OPS[message_op](_rows(a, len(features) + 1), _rows(b, len(features) + 1))


def _send_u_recv(x, src_index, dst_index, *, reduce_op, out_size):
    """Node ``d`` receives the ``reduce_op`` of ``x[src_index[e]]`` over the edges ``e`` into it:
    output ``[out_size or x.shape[0], *x.shape[1:]]``, 0 where nothing arrives."""
    check_numeric("send_u_recv", "x", x)
    _edges("send_u_recv", src_index, dst_index)
    messages = jnp.take(x, src_index, axis=0)
    return segment_reduce(messages, dst_index, out_size or x.shape[0], reduce_op)


def _send_ue_recv(x, y, src_index, dst_index, *, message_op, reduce_op, out_size):
    """Node ``d`` receives the ``reduce_op`` of ``x[src_index[e]] <message_op> y[e]`` over the
    edges ``e`` into it: output ``[out_size or x.shape[0], *features]`` with x's and y's feature
    axes broadcast, 0 where nothing arrives."""
    check_numeric("send_ue_recv", "x", x)
    _edges("send_ue_recv", src_index, dst_index)
    _same_dtype("send_ue_recv", x, y)
    if y.ndim == 0 or y.shape[0] != src_index.shape[0]:
        raise input_error("send_ue_recv", "y", f"one row per edge (shape [{src_index.shape[0]}, ...])",
                          tuple(y.shape))
    messages = _combine("send_ue_recv", message_op, jnp.take(x, src_index, axis=0), y, "num_edges")
    return segment_reduce(messages, dst_index, out_size or x.shape[0], reduce_op)


def _send_uv(x, y, src_index, dst_index, *, message_op):
    """One row per edge ``e``: ``x[src_index[e]] <message_op> y[dst_index[e]]``, x's and y's
    feature axes broadcast."""
    check_numeric("send_uv", "x", x)
    _edges("send_uv", src_index, dst_index)
    _same_dtype("send_uv", x, y)
    if y.ndim == 0:
        raise input_error("send_uv", "y", "node features of rank >= 1", tuple(y.shape))
    return _combine("send_uv", message_op, jnp.take(x, src_index, axis=0), jnp.take(y, dst_index, axis=0),
                    "num_nodes")


_X = Input("x", rank=tuple(range(1, 9)))
_INDICES = [Input("src_index", dtype="int"), Input("dst_index", dtype="int")]
_REDUCE = {"reduce_op": Attr("str", "sum", choices=REDUCTIONS),
           "out_size": Attr("int", None, optional=True, minimum=1, doc="output rows; None: x.shape[0]")}
_MESSAGE = {"message_op": Attr("str", "add", choices=tuple(MESSAGE_OPS))}
# every op mixes the rows of x (a node's output reads its neighbours'): padding or chunking them changes it
_RECV = Traits(reduction=True, batch_coupled=True)


def _per_message(ops_per_element: int):
    """FLOPs: ``ops_per_element`` per element of the per-edge messages (the op's widest array)."""
    def flops(ins, outs, attrs):
        edges = ins[-1][0]
        features = max((math.prod(s[1:]) for s in [*ins[:-2], *outs]), default=1)
        return ops_per_element * edges * features

    return flops


send_u_recv = define("send_u_recv", _send_u_recv, inputs=[_X, *_INDICES], attrs=_REDUCE,
                     flops=_per_message(1), traits=_RECV)
send_ue_recv = define("send_ue_recv", _send_ue_recv, inputs=[_X, Input("y"), *_INDICES],
                      attrs={**_MESSAGE, **_REDUCE}, flops=_per_message(2), traits=_RECV)
send_uv = define("send_uv", _send_uv, inputs=[_X, Input("y"), *_INDICES], attrs=_MESSAGE,
                 flops=_per_message(1), traits=Traits(batch_coupled=True))
