"""Graph convolution layers against dense numpy formulas: GCN's normalised adjacency, GAT's
attention (weights summing to 1 over each node's incoming edges), GraphSAGE's aggregators; and
their programs, gradients, vmap and argument errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn

rng = np.random.default_rng(0)
N = 6
_pairs = np.array([(u, v) for u in range(N) for v in range(u + 1, N) if rng.random() < 0.4])
SYMMETRIC = np.concatenate([_pairs, _pairs[:, ::-1]])  # undirected, no self loops
DIRECTED = np.array([[0, 1], [0, 2], [1, 2], [3, 2], [2, 2], [4, 0], [4, 0]])  # a loop, a double edge; 5 alone
X = rng.normal(size=(N, 4)).astype(np.float32)


def incoming(edges, n, loops=True):
    """``M[v, u]``: how many edges u -> v, plus the identity when ``loops``."""
    m = np.zeros((n, n))
    np.add.at(m, (edges[:, 1], edges[:, 0]), 1)
    return m + np.eye(n) if loops else m


@pytest.mark.parametrize("edges", [SYMMETRIC, DIRECTED], ids=["symmetric", "directed"])
def test_gcn_is_the_normalised_adjacency_product(edges):
    nn.seed(0)
    conv = nn.GCNConv(4, 3)
    conv.bias.set_value(jnp.arange(3.0))
    a_hat = incoming(edges, N)
    d = np.diag(a_hat.sum(1) ** -0.5)
    want = d @ a_hat @ d @ X @ np.asarray(conv.weight[...]) + np.arange(3.0)
    np.testing.assert_allclose(conv(X, edges), want, rtol=1e-5, atol=1e-5)


def test_gcn_without_loops_or_normalisation():
    nn.seed(0)
    w = np.asarray(nn.GCNConv(4, 3).weight[...])
    plain = nn.GCNConv(4, 3, norm=False, bias=False)
    plain.weight.set_value(w)
    np.testing.assert_allclose(plain(X, SYMMETRIC), incoming(SYMMETRIC, N) @ X @ w, rtol=1e-5, atol=1e-5)
    loopless = nn.GCNConv(4, 3, add_self_loops=False, bias=False)
    loopless.weight.set_value(w)
    a = incoming(DIRECTED, N, loops=False)
    d = np.diag(np.maximum(a.sum(1), 1) ** -0.5)  # node without in-edges: scaled as if it had one
    np.testing.assert_allclose(loopless(X, DIRECTED), d @ a @ d @ X @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"add_self_loops": False}, {"norm": False}])
def test_gcn_on_a_sparse_adjacency_equals_the_edges_form_and_learns_edge_weights(options):
    nn.seed(0)
    conv = nn.GCNConv(4, 3, **options)
    adjacency = pj.geometric.Graph(DIRECTED, num_nodes=N).to_sparse()  # a loop and a double edge
    np.testing.assert_allclose(jax.jit(conv)(X, adjacency), conv(X, DIRECTED), rtol=1e-5, atol=1e-5)
    # weighted edges: the dense formula with the weighted adjacency, weighted degrees too
    weights = jnp.asarray(rng.uniform(0.5, 2.0, len(DIRECTED)), jnp.float32)
    weighted = pj.sparse.sparse_coo_tensor(DIRECTED.T, weights, [N, N])
    a = np.zeros((N, N))
    np.add.at(a, (DIRECTED[:, 1], DIRECTED[:, 0]), np.asarray(weights))
    a += 0.0 if options.get("add_self_loops") is False else np.eye(N)
    d = np.diag(np.maximum(a.sum(1), 1) ** -0.5) if options.get("norm", True) else np.eye(N)
    want = d @ a @ d @ X @ np.asarray(conv.weight[...]) + np.asarray(conv.bias[...])
    np.testing.assert_allclose(conv(X, weighted), want, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda w: conv(X, weighted.with_values(w)).sum())(weights)
    assert grad.shape == weights.shape and bool(jnp.all(jnp.isfinite(grad))) and float(jnp.abs(grad).max()) > 0
    with pytest.raises(ValueError, match=r"GCNConv: argument 'edges' expects an \[E, 2\] int array or a sparse adjacency \[6, 6\]"):
        conv(X, pj.sparse.sparse_coo_tensor(DIRECTED.T, weights, [N + 1, N + 1]))


def np_gat(conv, x, edges, leaky=0.2):
    """GAT by the paper's formulas, one node and head at a time, self loops added."""
    heads, size = conv.num_heads, conv.hidden_size
    h = (x @ np.asarray(conv.weight[...])).reshape(len(x), heads, size)
    a_src, a_dst = np.asarray(conv.attn_src[...]), np.asarray(conv.attn_dst[...])
    edges = np.concatenate([edges, np.repeat(np.arange(len(x))[:, None], 2, 1)])
    out = np.zeros((len(x), heads, size))
    for v in range(len(x)):
        sources = edges[edges[:, 1] == v, 0]
        for k in range(heads):
            e = h[sources, k] @ a_src[k] + h[v, k] @ a_dst[k]
            e = np.where(e > 0, e, leaky * e)
            alpha = np.exp(e - e.max()) / np.exp(e - e.max()).sum()
            out[v, k] = alpha @ h[sources, k]
    return out


@pytest.mark.parametrize("concat", [True, False])
def test_gat_matches_the_paper_and_its_weights_sum_to_one_per_node(concat):
    nn.seed(1)
    conv = nn.GATConv(4, 3, num_heads=2, concat=concat)
    conv.eval()
    want = np_gat(conv, X, DIRECTED)
    want = want.reshape(N, -1) if concat else want.mean(1)
    np.testing.assert_allclose(conv(X, DIRECTED), want, rtol=1e-4, atol=1e-5)
    src, dst, weights = conv.attention_weights(X, DIRECTED)
    assert weights.shape == (len(DIRECTED) + N, 2) and np.all(np.asarray(weights) > 0)
    sums = np.zeros((N, 2))
    np.add.at(sums, np.asarray(dst), np.asarray(weights))
    np.testing.assert_allclose(sums, 1.0, rtol=1e-6)


def test_gat_drops_attention_only_while_training():
    nn.seed(2)
    conv = nn.GATConv(4, 3, feat_drop=0.0, attn_drop=0.5, num_heads=2)
    first, second = conv(X, SYMMETRIC), conv(X, SYMMETRIC)
    assert not np.allclose(first, second)  # a fresh dropout mask per call
    conv.eval()
    np.testing.assert_allclose(conv(X, SYMMETRIC), np_gat(conv, X, SYMMETRIC).reshape(N, -1), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("aggr", ["mean", "sum", "max", "min"])
def test_graphsage_adds_its_own_and_its_aggregated_neighbours_features(aggr):
    nn.seed(3)
    conv = nn.GraphSAGEConv(4, 5, aggr_func=aggr)
    conv.self_linear.bias.set_value(jnp.ones(5))
    neighbours = np.zeros_like(X)
    for v in range(N):
        sources = DIRECTED[DIRECTED[:, 1] == v, 0]
        if len(sources):
            neighbours[v] = getattr(np, aggr)(X[sources], axis=0)
    want = X @ np.asarray(conv.self_linear.weight[...]) + 1 + neighbours @ np.asarray(conv.neigh_linear.weight[...])
    np.testing.assert_allclose(conv(X, DIRECTED), want, rtol=1e-5, atol=1e-5)
    unit = nn.GraphSAGEConv(4, 5, aggr_func=aggr, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit(X, DIRECTED), axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: nn.GCNConv(4, 3), lambda: nn.GATConv(4, 3, num_heads=2),
                                  lambda: nn.GraphSAGEConv(4, 3, aggr_func="max")], ids=["gcn", "gat", "sage"])
def test_layers_trace_save_load_and_differentiate(make, round_trip):
    nn.seed(4)
    layer = make()
    layer.eval()
    text = round_trip(layer, X, SYMMETRIC, tol=1e-5)
    assert "send_u" in text  # messages travel by the message-passing ops
    grads = nnx.grad(lambda m: jnp.sum(m(X, SYMMETRIC) ** 2))(layer)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(np.all(np.isfinite(g)) and np.any(g != 0) for g in leaves)


def test_a_batch_of_feature_sets_on_one_graph_vmaps():
    nn.seed(5)
    conv = nn.GCNConv(4, 3)
    xs = rng.normal(size=(3, N, 4)).astype(np.float32)
    np.testing.assert_allclose(jax.vmap(lambda x: conv(x, SYMMETRIC))(xs),
                               np.stack([conv(x, SYMMETRIC) for x in xs]), rtol=1e-5, atol=1e-6)


BAD = [
    (lambda: nn.GCNConv(4, 3)(X, SYMMETRIC.T), r"GCNConv: argument 'edges' expects an \[E, 2\] int array"),
    (lambda: nn.GCNConv(4, 3)(X, SYMMETRIC.astype(np.float32)), r"GCNConv: argument 'edges' expects an \[E, 2\]"),
    (lambda: nn.GCNConv(4, 3)(X[None], SYMMETRIC), r"GCNConv: argument 'x' expects node features"),
    (lambda: nn.GCNConv(0, 3), r"GCNConv: argument 'input_size' expects an int >= 1"),
    (lambda: nn.GATConv(4, 3, num_heads=0), r"GATConv: argument 'num_heads' expects an int >= 1"),
    (lambda: nn.GATConv(4, 3, attn_drop=1.5), r"GATConv: argument 'attn_drop' expects a probability"),
    (lambda: nn.GATConv(4, 3, concat="yes"), r"GATConv: argument 'concat' expects a bool"),
    (lambda: nn.GraphSAGEConv(4, 3, aggr_func="lstm"), r"GraphSAGEConv: argument 'aggr_func' expects one of"),
    (lambda: nn.GraphSAGEConv(4, 0), r"GraphSAGEConv: argument 'hidden_size' expects an int >= 1"),
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_layer(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
