"""Random walks over a graph's out-edges, the corpus of DeepWalk and node2vec embeddings (PGL's
``deepwalk_sample`` and ``node2vec_sample``).

A walk starts at a given node and steps along out-edges: :func:`deepwalk_walks` to a uniformly
drawn out-neighbour, :func:`node2vec_walks` by node2vec's second-order rule, which weighs the
next node ``x`` after the step ``t -> v`` by ``1/p`` if ``x`` is ``t`` (going back), 1 if ``x`` is
also an out-neighbour of ``t`` (staying close), ``1/q`` otherwise (moving out): a small ``p``
keeps walks local, a small ``q`` sends them outward (depth first). Walks are drawn on the host
with numpy, every walker one step at a time together, from a seeded generator; they come back
as one ``[len(start_nodes), walk_length]`` int64 array, a walk that reaches a node without
out-edges padded with -1 from there on.

>>> import numpy as np
>>> from paddlejax.geometric import Graph
>>> ring = Graph([[0, 1], [1, 2], [2, 3], [3, 0]])  # one way round: every walk is determined
>>> deepwalk_walks(ring, [0, 2], walk_length=5, seed=0).tolist()
[[0, 1, 2, 3, 0], [2, 3, 0, 1, 2]]
"""
from __future__ import annotations

import numpy as np

from paddlejax.geometric.graph import Graph
from paddlejax.geometric.sampling import _segments


def _check(owner: str, graph: Graph, walk_length: int) -> None:
    if not isinstance(graph, Graph):
        raise TypeError(f"{owner}: graph expects a paddlejax.geometric.Graph, got {type(graph).__name__}")
    if isinstance(walk_length, bool) or not isinstance(walk_length, (int, np.integer)) or walk_length < 1:
        raise ValueError(f"{owner}: walk_length expects an int >= 1, got {walk_length!r}")


def deepwalk_walks(graph: Graph, start_nodes, walk_length: int, seed=None) -> np.ndarray:
    """Uniform random walks of ``walk_length`` nodes (the start included) from each of
    ``start_nodes``; -1 after a node without out-edges.

    >>> g = Graph([[0, 1], [0, 2]])
    >>> deepwalk_walks(g, [1, 0], 3, seed=0)[0].tolist()  # node 1 has no out-edges
    [1, -1, -1]
    """
    _check("deepwalk_walks", graph, walk_length)
    return _walk("deepwalk_walks", graph.num_nodes, graph.to_csr(), start_nodes, walk_length, seed, None)


def node2vec_walks(graph: Graph, start_nodes, walk_length: int, p: float = 1.0, q: float = 1.0,
                   seed=None) -> np.ndarray:
    """node2vec's biased random walks (see the module doc for ``p`` and ``q``; ``p = q = 1`` is
    DeepWalk's uniform walk) of ``walk_length`` nodes from each of ``start_nodes``; the first
    step is uniform, and -1 follows a node without out-edges.

    >>> g = Graph([[0, 1], [1, 0], [1, 2], [2, 1]])  # a path 0 - 1 - 2, both ways
    >>> node2vec_walks(g, [0], 5, p=1e-6, q=1.0, seed=0).tolist()  # a tiny p: always straight back
    [[0, 1, 0, 1, 0]]
    """
    _check("node2vec_walks", graph, walk_length)
    for name, value in (("p", p), ("q", q)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not value > 0:
            raise ValueError(f"node2vec_walks: {name} expects a positive number, got {value!r}")
    n = graph.num_nodes
    indptr, indices = graph.to_csr()
    # every edge as one sorted key, so "is x an out-neighbour of t" is one binary search
    keys = np.repeat(np.arange(n), np.diff(indptr)) * n + indices

    def bias(previous, candidate):
        query = previous * n + candidate
        near = keys[np.minimum(np.searchsorted(keys, query), keys.size - 1)] == query
        return np.where(candidate == previous, 1 / p, np.where(near, 1.0, 1 / q))

    return _walk("node2vec_walks", n, (indptr, indices), start_nodes, walk_length, seed, bias)


def _walk(owner: str, num_nodes: int, csr, start_nodes, walk_length: int, seed, bias) -> np.ndarray:
    """Walks over the out-edges ``csr`` (``(indptr, indices)``) stepping to an out-neighbour drawn
    uniformly, or, from the second step on, in proportion to ``bias(previous, candidate)``."""
    nodes = np.asarray(start_nodes, np.int64).reshape(-1)
    if nodes.size and (nodes.min() < 0 or nodes.max() >= num_nodes):
        raise ValueError(f"{owner}: start_nodes expects nodes in [0, {num_nodes}), "
                         f"got {nodes.min()} .. {nodes.max()}")
    walks = np.full((nodes.size, walk_length), -1, np.int64)
    walks[:, 0] = nodes
    indptr, indices = csr
    rng = np.random.default_rng(seed)
    for step in range(1, walk_length):
        current = walks[:, step - 1]
        alive = np.flatnonzero(current >= 0)
        degree = indptr[current[alive] + 1] - indptr[current[alive]]
        alive, degree = alive[degree > 0], degree[degree > 0]
        first = indptr[current[alive]]
        if bias is None or step == 1:
            walks[alive, step] = indices[first + (rng.random(alive.size) * degree).astype(np.int64)]
            continue
        segment, position = _segments(first, degree)
        candidate = indices[position]
        weight = np.cumsum(bias(walks[alive, step - 2][segment], candidate))
        # one uniform draw per walker, placed on its own stretch of the running sum of weights
        end = np.cumsum(degree)
        before = np.where(end > degree, weight[np.maximum(end - degree - 1, 0)], 0.0)
        target = before + rng.random(alive.size) * (weight[end - 1] - before)
        pick = np.clip(np.searchsorted(weight, target, side="right"), end - degree, end - 1)
        walks[alive, step] = candidate[pick]
    return walks
