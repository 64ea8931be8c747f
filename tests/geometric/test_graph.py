"""Graph: send / recv against dense adjacency products, degrees, self loops, the CSR / CSC and
sparse views, networkx import, use under jit, and errors that name the argument."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.geometric import Graph, Message

rng = np.random.default_rng(0)
N = 7
EDGES = np.stack([rng.integers(0, N, 20), rng.integers(0, N - 1, 20)], 1)  # node 6 receives nothing
X = rng.normal(size=(N, 3)).astype(np.float32)


def dense(edges, n, weight=None):
    """``A[u, v]``: the edges u -> v counted (or their weights summed)."""
    a = np.zeros((n, n))
    np.add.at(a, (edges[:, 0], edges[:, 1]), 1 if weight is None else weight)
    return a


def send_source(src, dst, edge):
    return {"h": src["h"]}


def test_send_then_recv_sum_and_mean_are_adjacency_products():
    g = Graph(EDGES, N)
    a = dense(EDGES, N)
    msg = g.send(send_source, src_feat={"h": X})
    np.testing.assert_allclose(g.recv("sum", msg)["h"], a.T @ X, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.recv("mean", msg)["h"], a.T @ X / np.maximum(a.sum(0), 1)[:, None], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(g.send_recv(X, "sum"), a.T @ X, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pj.sparse.matmul(pj.sparse.transpose(g.to_sparse(), [1, 0]), X), a.T @ X,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g.to_sparse().to_dense(), a)


def test_edge_weighted_messages_are_weighted_adjacency_products():
    w = rng.random(len(EDGES)).astype(np.float32)
    g = Graph(EDGES, N, edge_feat={"w": w})
    msg = g.send(lambda src, dst, edge: {"h": src["h"] * edge["w"][:, None]}, src_feat={"h": X}, edge_feat=g.edge_feat)
    np.testing.assert_allclose(g.recv(lambda m: m.reduce_sum(m["h"]), msg), dense(EDGES, N, w).T @ X, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(g.to_sparse("w").to_dense(), dense(EDGES, N, w), rtol=1e-6)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_max_and_min_per_node_against_a_loop(reduce):
    g = Graph(EDGES, N)
    got = g.recv(reduce, g.send(lambda src, dst, edge: {"d": src["h"] - dst["h"]}, src_feat={"h": X},
                                dst_feat={"h": X}))["d"]
    for v in range(N):
        into = EDGES[:, 1] == v
        want = getattr(np, reduce)(X[EDGES[into, 0]] - X[v], axis=0) if into.any() else np.zeros(3)
        np.testing.assert_allclose(got[v], want, rtol=1e-6, atol=1e-6)


def test_softmax_over_incoming_edges_sums_to_one_per_receiving_node():
    g = Graph(EDGES, N)
    scores = rng.normal(size=(len(EDGES), 2)).astype(np.float32)
    weights = g.send(lambda src, dst, edge: {"s": edge["s"]}, edge_feat={"s": scores}).reduce_softmax(scores)
    sums = np.zeros((N, 2))
    np.add.at(sums, EDGES[:, 1], np.asarray(weights))
    receivers = np.bincount(EDGES[:, 1], minlength=N) > 0
    np.testing.assert_allclose(sums[receivers], 1.0, rtol=1e-6)
    assert not receivers[N - 1] and np.all(sums[N - 1] == 0)
    v = EDGES[0, 1]
    into = EDGES[:, 1] == v
    np.testing.assert_allclose(np.asarray(weights)[into, 0], np.exp(scores[into, 0]) / np.exp(scores[into, 0]).sum(),
                               rtol=1e-5)


def test_degrees_count_edge_ends():
    g = Graph(EDGES, N)
    np.testing.assert_array_equal(g.indegree(), np.bincount(EDGES[:, 1], minlength=N))
    np.testing.assert_array_equal(g.outdegree(), np.bincount(EDGES[:, 0], minlength=N))
    np.testing.assert_array_equal(g.indegree([6, 0]), np.bincount(EDGES[:, 1], minlength=N)[[6, 0]])


def test_self_loops_are_added_to_every_node_and_removed_from_every_node():
    g = Graph([[0, 1], [1, 1], [2, 0]], edge_feat={"w": np.array([1.0, 2.0, 3.0], np.float32)})
    looped = g.add_self_loops()
    assert looped.edges.tolist() == [[0, 1], [1, 1], [2, 0], [0, 0], [1, 1], [2, 2]]
    assert looped.edge_feat["w"].tolist() == [1.0, 2.0, 3.0, 0.0, 0.0, 0.0]
    plain = looped.remove_self_loops()
    assert plain.edges.tolist() == [[0, 1], [2, 0]] and plain.edge_feat["w"].tolist() == [1.0, 3.0]


def test_csr_and_csc_list_every_edge_once_in_sorted_groups():
    g = Graph(EDGES, N)
    indptr, indices = g.to_csr()
    row, colptr = g.to_csc()
    out_pairs = sorted((u, int(v)) for u in range(N) for v in indices[indptr[u]:indptr[u + 1]])
    in_pairs = sorted((int(u), v) for v in range(N) for u in row[colptr[v]:colptr[v + 1]])
    assert out_pairs == in_pairs == sorted(map(tuple, EDGES.tolist()))
    assert all(np.all(np.diff(indices[indptr[u]:indptr[u + 1]]) >= 0) for u in range(N))


def test_from_networkx_lists_both_directions_and_copies_attributes():
    club = nx.karate_club_graph()
    g = Graph.from_networkx(club, edge_attrs=["weight"])
    assert (g.num_nodes, g.num_edges) == (34, 2 * club.number_of_edges())
    np.testing.assert_array_equal(g.to_sparse("weight").to_dense(), nx.to_numpy_array(club, weight="weight"))
    directed = nx.DiGraph()
    directed.add_nodes_from([("a", {"x": 1.0}), ("b", {"x": 2.0}), ("c", {"x": 3.0})])
    directed.add_edge("c", "a")
    g = Graph.from_networkx(directed, node_attrs=["x"])
    assert g.edges.tolist() == [[2, 0]] and g.node_feat["x"].tolist() == [1.0, 2.0, 3.0]


def test_a_graph_goes_through_jit_as_a_pytree():
    g = Graph(EDGES, N, node_feat={"h": X})

    @jax.jit
    def aggregate(graph):
        msg = graph.send(send_source, src_feat=graph.node_feat)
        return graph.recv("sum", msg)["h"], graph.indegree(), graph.add_self_loops()

    summed, degree, looped = aggregate(g)
    np.testing.assert_allclose(summed, dense(EDGES, N).T @ X, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(degree, g.indegree())
    assert isinstance(looped, Graph) and looped.num_nodes == N and looped.num_edges == len(EDGES) + N
    assert jax.tree_util.keystr(jax.tree_util.tree_leaves_with_path(g)[0][0]) == ".edges"


def test_num_nodes_defaults_to_the_largest_node_plus_one_and_an_empty_graph_works():
    assert Graph([[0, 4]]).num_nodes == 5
    empty = Graph([], num_nodes=3)
    assert empty.num_edges == 0 and empty.send_recv(jnp.ones((3, 2))).tolist() == [[0, 0]] * 3


def test_message_reduce_names_bad_pool_types_and_missing_features():
    msg = Message({"h": jnp.ones(2)}, jnp.array([0, 1]), 2)
    with pytest.raises(ValueError, match=r"Message.reduce: pool_type expects one of"):
        msg.reduce(msg["h"], "prod")
    with pytest.raises(KeyError, match=r"no feature 'x'; it has \['h'\]"):
        msg["x"]


BAD = [
    (lambda: Graph([[0, 1, 2]]), ValueError, r"Graph: edges expects an \[E, 2\] int array"),
    (lambda: Graph([[0.0, 1.0]]), ValueError, r"Graph: edges expects an \[E, 2\] int array"),
    (lambda: Graph([[0, 5]], num_nodes=3), ValueError, r"Graph: edges name nodes outside \[0, 3\)"),
    (lambda: Graph([[0, 1]], num_nodes=-1), ValueError, r"Graph: num_nodes expects an int >= 0"),
    (lambda: Graph([[0, 1]], node_feat={"h": np.ones(3)}), ValueError,
     r"Graph: node_feat\['h'\] expects 2 rows \(one per node\), got shape \(3,\)"),
    (lambda: Graph([[0, 1]], edge_feat=np.ones(1)), TypeError, r"Graph: edge_feat expects a dict"),
    (lambda: Graph([[0, 1]]).send(lambda s, d, e: s, src_feat={"h": np.ones(3)}), ValueError,
     r"Graph: src_feat\['h'\] expects 2 rows"),
    (lambda: Graph([[0, 1]]).send(lambda s, d, e: jnp.ones(1)), TypeError,
     r"Graph.send: message_func must return a dict"),
    (lambda: Graph([[0, 1]]).recv(3, None), TypeError, r"Graph.recv: reduce_func expects a function"),
    (lambda: Graph([[0, 1]]).send_recv(np.ones(3)), ValueError, r"Graph.send_recv: feature expects 2 rows"),
    (lambda: Graph([[0, 1]]).to_sparse("w"), ValueError, r"Graph.to_sparse: weight expects the name of a 1-D"),
    (lambda: jax.jit(lambda e: Graph(e).num_nodes)(jnp.zeros((1, 2), int)), ValueError,
     r"Graph: num_nodes is required when the edges are traced"),
    (lambda: jax.jit(lambda e: Graph(e, 2).to_csr())(jnp.zeros((1, 2), int)), ValueError,
     r"Graph.to_csr needs concrete edges"),
]


@pytest.mark.parametrize("bad,error,match", BAD, ids=[m.split(r"\[")[0][:30] + str(i) for i, (_, _, m) in
                                                     enumerate(BAD)])
def test_bad_graphs_and_calls_raise_clear_errors(bad, error, match):
    with pytest.raises(error, match=match):
        bad()
