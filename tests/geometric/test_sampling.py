"""Neighbour sampling: sample sizes are respected, only real in-neighbours come back, without
repeats and uniformly; reindexing follows Paddle's example; multi-hop subgraphs hold real edges
and pad to one shape."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from paddlejax.geometric import Graph, reindex_graph, sample_neighbors, sample_subgraph

CLUB = Graph.from_networkx(nx.karate_club_graph())
ROW, COLPTR = CLUB.to_csc()
EDGE_SET = set(map(tuple, CLUB.edges.tolist()))


def in_neighbours(v):
    return ROW[COLPTR[v]:COLPTR[v + 1]]


@pytest.mark.parametrize("size", [1, 3, 10, -1])
def test_samples_respect_the_size_and_are_distinct_real_neighbours(size):
    nodes = np.arange(34)
    neighbors, count = sample_neighbors(ROW, COLPTR, nodes, size, seed=0)
    degree = np.diff(COLPTR)
    np.testing.assert_array_equal(count, degree if size == -1 else np.minimum(degree, size))
    assert neighbors.size == count.sum()
    for v, picked in zip(nodes, np.split(neighbors, np.cumsum(count)[:-1])):
        assert set(picked.tolist()) <= set(in_neighbours(v).tolist())
        assert len(set(picked.tolist())) == len(picked)  # without replacement (karate has no multi-edges)
        if size == -1 or degree[v] <= size:
            assert sorted(picked.tolist()) == sorted(in_neighbours(v).tolist())


def test_sampling_is_seeded_and_uniform_over_the_neighbours():
    hub = 33  # 17 in-neighbours
    a = sample_neighbors(ROW, COLPTR, [hub], 4, seed=5)[0]
    np.testing.assert_array_equal(a, sample_neighbors(ROW, COLPTR, [hub], 4, seed=5)[0])
    rng = np.random.default_rng(0)
    draws = np.concatenate([sample_neighbors(ROW, COLPTR, [hub] * 50, 4, seed=rng)[0] for _ in range(40)])
    frequency = np.array([np.mean(draws == u) for u in in_neighbours(hub)])
    # 8,000 draws: each neighbour's share is 1/17 within a few standard errors (0.0026)
    np.testing.assert_allclose(frequency, 1 / 17, atol=0.012)


def test_edge_ids_come_back_with_the_samples():
    eids = np.arange(ROW.size) + 1000
    neighbors, count, ids = sample_neighbors(ROW, COLPTR, [0, 5], 3, eids=eids, return_eids=True, seed=1)
    np.testing.assert_array_equal(ROW[ids - 1000], neighbors)
    assert all(COLPTR[v] <= i - 1000 < COLPTR[v + 1] for v, i in zip(np.repeat([0, 5], count), ids))


def test_reindex_graph_gives_paddles_documented_example():
    src, dst, nodes = reindex_graph(np.array([0, 1, 2]), np.array([8, 9, 0, 4, 7, 6, 7]), np.array([2, 3, 2]))
    assert src.tolist() == [3, 4, 0, 5, 6, 7, 6]
    assert dst.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert nodes.tolist() == [0, 1, 2, 8, 9, 4, 7, 6]


def test_reindexed_edges_map_back_to_the_sampled_ones():
    seeds = np.array([5, 0, 33])
    neighbors, count = sample_neighbors(ROW, COLPTR, seeds, 4, seed=2)
    src, dst, nodes = reindex_graph(seeds, neighbors, count)
    np.testing.assert_array_equal(nodes[src], neighbors)
    np.testing.assert_array_equal(nodes[dst], np.repeat(seeds, count))
    assert len(set(nodes.tolist())) == len(nodes) and nodes[:3].tolist() == seeds.tolist()


def test_a_sampled_subgraph_holds_real_edges_reaching_the_inputs():
    seeds = np.array([0, 16, 24])
    edges, nodes = sample_subgraph(ROW, COLPTR, seeds, [3, 2], seed=0)
    assert nodes[:3].tolist() == seeds.tolist() and len(set(nodes.tolist())) == len(nodes)
    assert {(int(nodes[u]), int(nodes[v])) for u, v in edges} <= EDGE_SET
    hop1 = edges[np.isin(edges[:, 1], [0, 1, 2])]
    assert len(hop1) == sum(min(len(in_neighbours(v)), 3) for v in seeds)


def test_padded_subgraphs_share_one_shape_and_padding_reaches_no_real_node():
    shapes = set()
    for seed in range(5):
        edges, nodes = sample_subgraph(ROW, COLPTR, [0, 33], [4, 3], seed=seed, pad=True)
        shapes.add((edges.shape, nodes.shape))
        spare = nodes.size - 1
        real = int((nodes >= 0).sum())
        assert np.all(nodes[real:] == -1) and nodes[spare] == -1
        padding = (edges[:, 0] >= real) | (edges[:, 1] >= real)
        assert np.all(edges[padding] == spare)
    assert shapes == {((2 * 4 + 2 * 4 * 3, 2), (2 * (1 + 4 + 12) + 1,))}


BAD = [
    (lambda: sample_neighbors(ROW, COLPTR, [34], 2), r"sample_neighbors: input_nodes expects nodes in \[0, 34\)"),
    (lambda: sample_neighbors(ROW, COLPTR, [0], 0), r"sample_neighbors: sample_size expects a positive int or -1"),
    (lambda: sample_neighbors(ROW, COLPTR[:-1], [0], 2), r"sample_neighbors: colptr expects non-decreasing offsets"),
    (lambda: sample_neighbors(ROW.astype(float), COLPTR, [0]), r"sample_neighbors: row expects a 1-D int array"),
    (lambda: sample_neighbors(ROW, COLPTR, [0], return_eids=True), r"sample_neighbors: return_eids=True needs eids"),
    (lambda: reindex_graph([0, 0], [1], [1, 0]), r"reindex_graph: x expects distinct nodes"),
    (lambda: reindex_graph([0, 1], [1], [1, 1]), r"reindex_graph: count expects one non-negative count per node"),
    (lambda: sample_subgraph(ROW, COLPTR, [0], [2, -1], pad=True), r"sample_subgraph: pad=True needs a bound"),
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_function(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
