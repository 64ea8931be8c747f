"""Neighbour sampling for mini-batch training on large graphs (Paddle 2.3's
``paddle.geometric.sample_neighbors`` and ``reindex_graph``), and :func:`sample_subgraph`,
which chains them hop by hop into the subgraph a GraphSAGE batch runs on.

Sampling is host-side data preparation, as in a data loader: it runs in numpy on a CSC layout
(``row``, ``colptr``: the in-neighbours of node ``v`` are ``row[colptr[v]:colptr[v + 1]]``,
what :meth:`paddlejax.geometric.Graph.to_csc` gives), draws with a seeded
``numpy.random.Generator`` (``seed`` is an int, a generator, or None for fresh entropy) and
returns arrays the jitted model then reads.

>>> import numpy as np
>>> row, colptr = np.array([1, 2, 0, 0, 1]), np.array([0, 2, 3, 5])  # in-neighbours: 0<-1,2  1<-0  2<-0,1
>>> neighbors, count = sample_neighbors(row, colptr, np.array([0, 2]), sample_size=1, seed=0)
>>> count.tolist(), bool(np.isin(neighbors[0], [1, 2])), bool(np.isin(neighbors[1], [0, 1]))
([1, 1], True, True)
>>> src, dst, nodes = reindex_graph(np.array([0, 2]), np.array([1, 0, 1]), np.array([1, 2]))
>>> src.tolist(), dst.tolist(), nodes.tolist()
([2, 0, 2], [0, 1, 1], [0, 2, 1])
"""
from __future__ import annotations

import math

import numpy as np


def _ints(name: str, owner: str, value) -> np.ndarray:
    value = np.asarray(value)
    if value.ndim != 1 or not (np.issubdtype(value.dtype, np.integer) or value.size == 0):
        raise ValueError(f"{owner}: {name} expects a 1-D int array, got {value.dtype}{list(value.shape)}")
    return value.astype(np.int64, copy=False) if value.size == 0 else value


def _segments(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(segment, position)`` of every element of the ranges ``[starts[i], starts[i] + lengths[i])``
    laid end to end: which range it belongs to, and its index into the array the ranges cut."""
    segment = np.repeat(np.arange(len(lengths)), lengths)
    offsets = np.cumsum(lengths) - lengths
    return segment, starts[segment] + np.arange(segment.size) - offsets[segment]


def sample_neighbors(row, colptr, input_nodes, sample_size: int = -1, eids=None, return_eids: bool = False,
                     seed=None):
    """Up to ``sample_size`` in-neighbours of each of ``input_nodes``, drawn without replacement
    (all of them for ``sample_size=-1`` or a node with no more): ``(neighbors, count)``, the
    neighbours of ``input_nodes[i]`` being the ``count[i]`` entries after those of the nodes
    before it. ``return_eids=True`` also returns the sampled edges' ids read from ``eids``
    (aligned with ``row``), as Paddle's does.

    >>> row, colptr = np.array([1, 2, 3, 0]), np.array([0, 3, 4, 4, 4])
    >>> neighbors, count, ids = sample_neighbors(row, colptr, [0, 1, 2], 2, eids=np.arange(4) + 10,
    ...                                          return_eids=True, seed=1)
    >>> count.tolist(), len(set(neighbors[:2].tolist()) & {1, 2, 3}), neighbors[2:].tolist(), ids[2:].tolist()
    ([2, 1, 0], 2, [0], [13])
    """
    owner = "sample_neighbors"
    row, colptr = _ints("row", owner, row), _ints("colptr", owner, colptr)
    nodes = _ints("input_nodes", owner, input_nodes)
    if colptr.size == 0 or colptr[0] != 0 or colptr[-1] != row.size or np.any(np.diff(colptr) < 0):
        raise ValueError(f"{owner}: colptr expects non-decreasing offsets from 0 to len(row) = {row.size}")
    num_nodes = colptr.size - 1
    if nodes.size and (nodes.min() < 0 or nodes.max() >= num_nodes):
        raise ValueError(f"{owner}: input_nodes expects nodes in [0, {num_nodes}), got {nodes.min()} .. {nodes.max()}")
    if isinstance(sample_size, bool) or not isinstance(sample_size, (int, np.integer)) or sample_size == 0 \
            or sample_size < -1:
        raise ValueError(f"{owner}: sample_size expects a positive int or -1 (all neighbours), got {sample_size!r}")
    if return_eids and (eids is None or np.shape(eids) != row.shape):
        raise ValueError(f"{owner}: return_eids=True needs eids, one per entry of row ({row.size}), "
                         f"got {None if eids is None else np.shape(eids)}")
    degree = colptr[nodes + 1] - colptr[nodes]
    count = degree if sample_size == -1 else np.minimum(degree, sample_size)
    segment, position = _segments(colptr[nodes], degree)
    if sample_size != -1:
        # a random rank for every candidate within its node; the `count` lowest ranks are kept
        order = np.lexsort((np.random.default_rng(seed).random(segment.size), segment))
        segment, position = segment[order], position[order]
        rank = np.arange(segment.size) - (np.cumsum(degree) - degree)[segment]
        keep = rank < count[segment]
        position = position[keep]
    out = (row[position], count.astype(row.dtype))
    return (*out, np.asarray(eids)[position]) if return_eids else out


def reindex_graph(x, neighbors, count):
    """Renumber a sampled neighbourhood: ``x`` (distinct nodes) keep the numbers ``0 ..
    len(x) - 1``, the other nodes of ``neighbors`` follow in order of first appearance.
    Returns ``(reindex_src, reindex_dst, out_nodes)``: each sampled edge ``neighbors[j] ->
    x[i]`` (``count[i]`` of them for ``x[i]``) in the new numbers, and the original number of
    every new one (Paddle's ``reindex_graph``).

    >>> [a.tolist() for a in reindex_graph([7, 3], [3, 9, 9, 1], [1, 3])]
    [[1, 2, 2, 3], [0, 1, 1, 1], [7, 3, 9, 1]]
    """
    owner = "reindex_graph"
    x, neighbors, count = _ints("x", owner, x), _ints("neighbors", owner, neighbors), _ints("count", owner, count)
    if count.shape != x.shape or np.any(count < 0) or count.sum() != neighbors.size:
        raise ValueError(f"{owner}: count expects one non-negative count per node of x ({x.size}) adding up to "
                         f"len(neighbors) = {neighbors.size}, got {count.tolist()[:8]}")
    if np.unique(x).size != x.size:
        raise ValueError(f"{owner}: x expects distinct nodes")
    every = np.concatenate([x, neighbors.astype(x.dtype)])
    unique, first = np.unique(every, return_index=True)
    order = np.argsort(first, kind="stable")  # x first, then the new nodes as they appear
    number = np.empty_like(order)
    number[order] = np.arange(order.size)
    reindex_src = number[np.searchsorted(unique, neighbors)]
    reindex_dst = np.repeat(np.arange(x.size), count)
    return reindex_src.astype(x.dtype), reindex_dst.astype(x.dtype), unique[order]


def sample_subgraph(row, colptr, input_nodes, sample_sizes, seed=None, pad: bool = False):
    """The union of a multi-hop sampled neighbourhood of ``input_nodes``: hop ``k`` samples up to
    ``sample_sizes[k]`` in-neighbours of the nodes hop ``k - 1`` reached first. Returns
    ``(edges, nodes)``: ``edges [E, 2]`` (source, destination) in local numbers and ``nodes``, the
    original number of each local node, ``input_nodes`` first (a model's first
    ``len(input_nodes)`` output rows are theirs).

    ``pad=True`` gives every batch of the same size one shape, so a jitted step compiles once:
    ``nodes`` is padded with -1 to the most a batch can reach, ``len(input_nodes) * (1 + s1 +
    s1 s2 + ...)`` plus one spare, and ``edges`` with self-loops on that spare node to the most
    edges; a padding slot's features (read as ``features[nodes]``) never reach a real node.

    >>> row, colptr = np.array([1, 0, 2, 1]), np.array([0, 1, 3, 4])  # a path 0 - 1 - 2
    >>> edges, nodes = sample_subgraph(row, colptr, [0], [1, 1], seed=0)
    >>> edges.tolist(), nodes.tolist()
    ([[1, 0], [2, 1]], [0, 1, 2])
    >>> edges, nodes = sample_subgraph(row, colptr, [0], [1, 1], seed=0, pad=True)
    >>> edges.shape, nodes.tolist()
    ((2, 2), [0, 1, 2, -1])
    """
    sizes = [int(s) for s in sample_sizes]
    if pad and any(s < 1 for s in sizes):
        raise ValueError(f"sample_subgraph: pad=True needs a bound on every hop (sample sizes >= 1), got {sizes}")
    rng = np.random.default_rng(seed)
    nodes = _ints("input_nodes", "sample_subgraph", input_nodes)
    frontier, sources, targets = nodes, [], []
    for size in sizes:
        neighbors, count = sample_neighbors(row, colptr, frontier, size, seed=rng)
        known = nodes.size
        src, dst, nodes = reindex_graph(nodes, neighbors,
                                        np.concatenate([np.zeros(known - frontier.size, np.int64), count]))
        sources.append(src)
        targets.append(dst)
        frontier = nodes[known:]
    edges = np.stack([np.concatenate(sources), np.concatenate(targets)], axis=1).astype(np.int64)
    if pad:
        reach = [math.prod(sizes[:k + 1]) * len(input_nodes) for k in range(len(sizes))]
        spare = len(input_nodes) + sum(reach)
        edges = np.concatenate([edges, np.full((sum(reach) - len(edges), 2), spare)])
        nodes = np.concatenate([nodes, np.full(spare + 1 - nodes.size, -1, nodes.dtype)])
    return edges, nodes
