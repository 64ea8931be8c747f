"""Messages on edges and their reduction at the receiving nodes: :class:`Message` (what
:meth:`paddlejax.geometric.Graph.send` returns, as PGL's) and :func:`edge_softmax`.

A message holds one row per edge for each of its named features and knows each edge's
receiving node, so it can reduce any per-edge value to one row per node with the segment ops
(sum, mean, max, min: a node that receives nothing reads 0) or normalise it over each node's
incoming edges with a softmax.

>>> import jax.numpy as jnp
>>> msg = Message({"h": jnp.array([1.0, 2.0, 4.0])}, dst=jnp.array([0, 0, 2]), num_nodes=3)
>>> msg.reduce_sum(msg["h"]).tolist(), msg.reduce_max(msg["h"]).tolist()
([3.0, 0.0, 4.0], [2.0, 0.0, 4.0])
>>> [round(w, 3) for w in msg.reduce_softmax(msg["h"]).tolist()]
[0.269, 0.731, 1.0]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax import ops

REDUCERS = {"sum": ops.segment_sum, "mean": ops.segment_mean, "max": ops.segment_max, "min": ops.segment_min}


def edge_softmax(logits, dst, num_nodes: int):
    """A softmax of ``logits [E, ...]`` over the edges into each node: the values of the edges
    that share ``dst`` sum to 1 (each feature column apart, e.g. per attention head).

    >>> edge_softmax(jnp.array([0.0, 0.0, 5.0]), jnp.array([1, 1, 0]), 2).tolist()
    [0.5, 0.5, 1.0]
    """
    # softmax does not change when a node's logits shift together: the largest is taken off for
    # range only, and no gradient needs to flow through it
    peak = jax.lax.stop_gradient(ops.segment_max(logits, dst, num_segments=num_nodes))
    weights = jnp.exp(logits - jnp.take(peak, dst, axis=0))
    total = ops.segment_sum(weights, dst, num_segments=num_nodes)
    return weights / jnp.take(total, dst, axis=0)


class Message:
    """Per-edge features (a dict by name) with the node each edge delivers to.

    ``msg["h"]`` reads a feature; ``reduce_sum`` / ``reduce_mean`` / ``reduce_max`` /
    ``reduce_min`` (or ``reduce(value, "sum")``) reduce any per-edge array to ``[num_nodes,
    ...]``; ``reduce_softmax`` normalises it over each node's incoming edges.

    >>> msg = Message({"w": jnp.ones((2, 3))}, dst=jnp.array([1, 1]), num_nodes=2)
    >>> msg.reduce_mean(msg["w"]).tolist(), list(msg.keys())
    ([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], ['w'])
    """

    def __init__(self, features: dict, dst, num_nodes: int):
        self._features = dict(features)
        self.dst = dst
        self.num_nodes = num_nodes

    def __getitem__(self, name: str):
        try:
            return self._features[name]
        except KeyError:
            raise KeyError(f"Message: no feature {name!r}; it has {sorted(self._features)}") from None

    def keys(self):
        """The names of the message's features."""
        return self._features.keys()

    def reduce(self, value, pool_type: str = "sum"):
        """``value [E, ...]`` reduced by receiving node with ``pool_type`` (sum, mean, max, min)."""
        if pool_type not in REDUCERS:
            raise ValueError(f"Message.reduce: pool_type expects one of {list(REDUCERS)}, got {pool_type!r}")
        return REDUCERS[pool_type](value, self.dst, num_segments=self.num_nodes)

    def reduce_sum(self, value):
        """The sum of ``value`` over each node's incoming edges (0 where none arrive)."""
        return self.reduce(value, "sum")

    def reduce_mean(self, value):
        """The mean of ``value`` over each node's incoming edges (0 where none arrive)."""
        return self.reduce(value, "mean")

    def reduce_max(self, value):
        """The maximum of ``value`` over each node's incoming edges (0 where none arrive)."""
        return self.reduce(value, "max")

    def reduce_min(self, value):
        """The minimum of ``value`` over each node's incoming edges (0 where none arrive)."""
        return self.reduce(value, "min")

    def reduce_softmax(self, value):
        """``value`` normalised with a softmax over each node's incoming edges (:func:`edge_softmax`)."""
        return edge_softmax(value, self.dst, self.num_nodes)
