"""Random walks: every step follows an edge, dead ends pad with -1, DeepWalk steps uniformly,
and node2vec's p and q bias the steps exactly as its rule says (checked statistically, seeded)."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from paddlejax.geometric import Graph, deepwalk_walks, node2vec_walks

CLUB = Graph.from_networkx(nx.karate_club_graph())
EDGE_SET = set(map(tuple, CLUB.edges.tolist()))


def steps(walks):
    a, b = walks[:, :-1].ravel(), walks[:, 1:].ravel()
    return a[b >= 0], b[b >= 0]


@pytest.mark.parametrize("walk", [lambda g, s, n: deepwalk_walks(g, s, n, seed=0),
                                  lambda g, s, n: node2vec_walks(g, s, n, p=0.5, q=2.0, seed=0)],
                         ids=["deepwalk", "node2vec"])
def test_walks_only_step_along_edges(walk):
    start = np.repeat(np.arange(34), 3)
    walks = walk(CLUB, start, 12)
    assert walks.shape == (102, 12) and walks.dtype == np.int64
    np.testing.assert_array_equal(walks[:, 0], start)
    assert np.all(walks >= 0)  # karate has no dead ends
    assert set(zip(*(s.tolist() for s in steps(walks)))) <= EDGE_SET


def test_a_walk_stops_at_a_node_without_out_edges():
    g = Graph([[0, 1], [1, 2]])  # 2 has no out-edges
    for walks in (deepwalk_walks(g, [0, 2], 5, seed=0), node2vec_walks(g, [0, 2], 5, q=0.5, seed=0)):
        assert walks.tolist() == [[0, 1, 2, -1, -1], [2, -1, -1, -1, -1]]


def test_walks_are_seeded():
    a = node2vec_walks(CLUB, np.arange(34), 8, p=0.3, q=3.0, seed=7)
    np.testing.assert_array_equal(a, node2vec_walks(CLUB, np.arange(34), 8, p=0.3, q=3.0, seed=7))
    assert not np.array_equal(a, node2vec_walks(CLUB, np.arange(34), 8, p=0.3, q=3.0, seed=8))


def test_deepwalk_steps_to_each_out_neighbour_equally_often():
    walks = deepwalk_walks(CLUB, np.full(17_000, 33), 2, seed=0)
    neighbours = CLUB.to_csr()[1][CLUB.to_csr()[0][33]:CLUB.to_csr()[0][34]]
    share = np.array([np.mean(walks[:, 1] == u) for u in neighbours])
    np.testing.assert_allclose(share, 1 / len(neighbours), atol=0.01)  # standard error 0.0018


@pytest.mark.parametrize("p,q", [(0.25, 4.0), (4.0, 0.25), (1.0, 1.0)])
def test_node2vec_second_steps_follow_the_return_in_out_weights(p, q):
    # walks 0 -> 1 -> x: x = 0 weighs 1/p, a common neighbour of 0 and 1 weighs 1, others 1/q
    walks = node2vec_walks(CLUB, np.zeros(60_000, int), 3, p=p, q=q, seed=1)
    after = walks[walks[:, 1] == 1, 2]  # about 3,750 walks went to member 1 first
    indptr, indices = CLUB.to_csr()
    of = {v: set(indices[indptr[v]:indptr[v + 1]].tolist()) for v in (0, 1)}
    candidates = sorted(of[1])
    weight = np.array([1 / p if x == 0 else 1.0 if x in of[0] else 1 / q for x in candidates])
    share = np.array([np.mean(after == x) for x in candidates])
    np.testing.assert_allclose(share, weight / weight.sum(), atol=0.025)


def test_extreme_p_and_q_give_backtracking_and_outward_walks():
    grid = Graph.from_networkx(nx.convert_node_labels_to_integers(nx.grid_2d_graph(8, 8)))  # no triangles
    start = np.arange(64).repeat(20)
    back = node2vec_walks(grid, start, 10, p=1e-3, q=1.0, seed=0)
    assert np.mean(back[:, 2:] == back[:, :-2]) > 0.99  # a tiny p: straight back every time
    out = node2vec_walks(grid, start, 10, p=1.0, q=1e-3, seed=0)
    assert np.mean(out[:, 2:] == out[:, :-2]) < 0.01  # a tiny q: never back while another way is open
    # moving outward goes further: the mean grid distance covered after 9 steps
    coords = np.array(list(nx.grid_2d_graph(8, 8).nodes))
    reach = {name: np.abs(coords[w[:, -1]] - coords[w[:, 0]]).sum(1).mean() for name, w in
             (("back", back), ("out", out), ("uniform", deepwalk_walks(grid, start, 10, seed=0)))}
    assert reach["back"] <= 1.0 < reach["uniform"] < reach["out"] - 0.5  # measured 1.0, 2.9, 3.9


BAD = [
    (lambda: deepwalk_walks(CLUB, [34], 3), ValueError, r"deepwalk_walks: start_nodes expects nodes in \[0, 34\)"),
    (lambda: deepwalk_walks(CLUB, [0], 0), ValueError, r"deepwalk_walks: walk_length expects an int >= 1"),
    (lambda: deepwalk_walks(CLUB.edges, [0], 3), TypeError, r"deepwalk_walks: graph expects a paddlejax.geometric"),
    (lambda: node2vec_walks(CLUB, [0], 3, p=0), ValueError, r"node2vec_walks: p expects a positive number"),
    (lambda: node2vec_walks(CLUB, [0], 3, q=-1.0), ValueError, r"node2vec_walks: q expects a positive number"),
]


@pytest.mark.parametrize("bad,error,match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_function(bad, error, match):
    with pytest.raises(error, match=match):
        bad()
