"""The graph a model passes messages on: :class:`Graph`, in the manner of PGL's ``pgl.Graph``.

A graph has ``num_nodes`` nodes, an ``[E, 2]`` integer edge list of ``(source, destination)``
pairs, and dictionaries of node features (``[num_nodes, ...]`` each) and edge features
(``[E, ...]`` each). Features move along edges in two steps: :meth:`Graph.send` computes a
message per edge from the features at its two ends (and its own), :meth:`Graph.recv` reduces
the messages at the receiving nodes. :meth:`Graph.send_recv` does both for the common case in
one ``send_u_recv`` op.

A graph is a JAX pytree (the edges and features are its leaves, ``num_nodes`` is static), so it
goes into and out of ``jax.jit``. The host-side views (:meth:`to_csr`, :meth:`to_csc`, what the
samplers and random walks read) and :meth:`remove_self_loops` need concrete edges.

>>> import jax.numpy as jnp
>>> g = Graph([[0, 1], [1, 2], [2, 1]], num_nodes=3, node_feat={"h": jnp.array([1.0, 2.0, 3.0])})
>>> msg = g.send(lambda src, dst, edge: {"h": src["h"]}, src_feat=g.node_feat)
>>> g.recv("sum", msg)["h"].tolist()
[0.0, 4.0, 2.0]
>>> g.indegree().tolist(), g.outdegree().tolist()
([0, 2, 1], [1, 1, 1])
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax import ops
from paddlejax.geometric.message import Message


def _check_features(kind: str, features, rows: int, rows_of: str) -> dict:
    if features is None:
        return {}
    if not isinstance(features, dict):
        raise TypeError(f"Graph: {kind} expects a dict of arrays by name, got {type(features).__name__}")
    for name, value in features.items():
        shape = np.shape(value)
        if not shape or shape[0] != rows:
            raise ValueError(f"Graph: {kind}[{name!r}] expects {rows} rows (one per {rows_of}), got shape {shape}")
    return dict(features)


def _gather(features: dict, index) -> dict:
    return {name: jnp.take(jnp.asarray(value), index, axis=0) for name, value in features.items()}


@jax.tree_util.register_pytree_with_keys_class
class Graph:
    """A directed graph: ``edges [E, 2]`` of ``(source, destination)`` node pairs (a list or an
    int array; undirected graphs list both directions), ``num_nodes`` (default: the largest node
    in ``edges`` plus one), and dicts of ``node_feat`` and ``edge_feat`` arrays.

    >>> g = Graph([[0, 1], [0, 2]])
    >>> g.num_nodes, g.num_edges, g.add_self_loops().num_edges
    (3, 2, 5)
    """

    def __init__(self, edges, num_nodes: int | None = None, node_feat: dict | None = None,
                 edge_feat: dict | None = None):
        if not isinstance(edges, jax.core.Tracer):
            edges = np.asarray(edges)
            if edges.size == 0:  # a graph without edges, however it was written
                edges = edges.reshape(0, 2).astype(np.int64)
        if edges.ndim != 2 or edges.shape[1] != 2 or not jnp.issubdtype(edges.dtype, jnp.integer):
            raise ValueError(f"Graph: edges expects an [E, 2] int array of (source, destination) pairs, "
                             f"got {edges.dtype}{list(edges.shape)}")
        concrete = not isinstance(edges, jax.core.Tracer)
        if num_nodes is None:
            if not concrete:
                raise ValueError("Graph: num_nodes is required when the edges are traced")
            num_nodes = int(np.max(edges)) + 1 if edges.size else 0
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 0:
            raise ValueError(f"Graph: num_nodes expects an int >= 0, got {num_nodes!r}")
        if concrete and edges.size and (np.min(edges) < 0 or np.max(edges) >= num_nodes):
            raise ValueError(f"Graph: edges name nodes outside [0, {num_nodes}): "
                             f"{int(np.min(edges))} .. {int(np.max(edges))}")
        self.edges = edges
        self.num_nodes = int(num_nodes)
        self.node_feat = _check_features("node_feat", node_feat, self.num_nodes, "node")
        self.edge_feat = _check_features("edge_feat", edge_feat, edges.shape[0], "edge")

    # -- pytree ----------------------------------------------------------------------------------
    def tree_flatten_with_keys(self):
        keys = jax.tree_util.GetAttrKey
        return ((keys("edges"), self.edges), (keys("node_feat"), self.node_feat),
                (keys("edge_feat"), self.edge_feat)), self.num_nodes

    @classmethod
    def tree_unflatten(cls, num_nodes, children):
        graph = object.__new__(cls)  # leaves may be tracers or placeholders: nothing to check
        graph.edges, graph.node_feat, graph.edge_feat = children
        graph.num_nodes = num_nodes
        return graph

    def __repr__(self) -> str:
        return (f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"node_feat={sorted(self.node_feat)}, edge_feat={sorted(self.edge_feat)})")

    # -- structure -------------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        """The number of edges."""
        return self.edges.shape[0]

    @property
    def src(self):
        """The source node of every edge."""
        return self.edges[:, 0]

    @property
    def dst(self):
        """The destination node of every edge."""
        return self.edges[:, 1]

    def indegree(self, nodes=None):
        """How many edges end at each node (or at ``nodes``), int32.

        >>> Graph([[0, 1], [2, 1]]).indegree([1, 0]).tolist()
        [2, 0]
        """
        return self._degree(self.dst, nodes)

    def outdegree(self, nodes=None):
        """How many edges start at each node (or at ``nodes``), int32.

        >>> Graph([[0, 1], [0, 2]]).outdegree().tolist()
        [2, 0, 0]
        """
        return self._degree(self.src, nodes)

    def _degree(self, ends, nodes):
        degree = ops.segment_sum(jnp.ones(ends.shape, jnp.int32), jnp.asarray(ends), num_segments=self.num_nodes)
        return degree if nodes is None else jnp.take(degree, jnp.asarray(nodes), axis=0)

    def add_self_loops(self) -> Graph:
        """This graph with an edge from every node to itself appended (a node that has one gets
        another); edge features of the new edges are zeros.

        >>> Graph([[0, 1]]).add_self_loops().edges.tolist()
        [[0, 1], [0, 0], [1, 1]]
        """
        xp = np if isinstance(self.edges, np.ndarray) else jnp
        loops = xp.repeat(xp.arange(self.num_nodes, dtype=self.edges.dtype)[:, None], 2, axis=1)
        edge_feat = {name: xp.concatenate([value, xp.zeros((self.num_nodes, *np.shape(value)[1:]),
                                                             np.result_type(value))])
                     for name, value in self.edge_feat.items()}
        return Graph(xp.concatenate([self.edges, loops]), self.num_nodes, self.node_feat, edge_feat)

    def remove_self_loops(self) -> Graph:
        """This graph without its edges from a node to itself (needs concrete edges).

        >>> Graph([[0, 0], [0, 1], [1, 1]]).remove_self_loops().edges.tolist()
        [[0, 1]]
        """
        edges = self._host_edges("remove_self_loops")
        keep = edges[:, 0] != edges[:, 1]
        return Graph(edges[keep], self.num_nodes, self.node_feat,
                     {name: value[keep] for name, value in self.edge_feat.items()})

    def _host_edges(self, method: str) -> np.ndarray:
        if isinstance(self.edges, jax.core.Tracer):
            raise ValueError(f"Graph.{method} needs concrete edges (it runs on the host), not traced ones")
        return np.asarray(self.edges)

    def to_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indptr, indices)``: the out-neighbours of node ``u`` are
        ``indices[indptr[u]:indptr[u + 1]]``, in increasing order (host numpy arrays).

        >>> [a.tolist() for a in Graph([[1, 0], [0, 2], [0, 1]]).to_csr()]
        [[0, 2, 3, 3], [1, 2, 0]]
        """
        edges = self._host_edges("to_csr")
        return _compressed(edges[:, 0], edges[:, 1], self.num_nodes)

    def to_csc(self) -> tuple[np.ndarray, np.ndarray]:
        """``(row, colptr)``: the in-neighbours (sources) of node ``v`` are
        ``row[colptr[v]:colptr[v + 1]]``, in increasing order: the layout
        :func:`~paddlejax.geometric.sample_neighbors` samples from, as Paddle's does.

        >>> [a.tolist() for a in Graph([[1, 0], [0, 2], [2, 0]]).to_csc()]
        [[1, 2, 0], [0, 2, 2, 3]]
        """
        edges = self._host_edges("to_csc")
        pointers, neighbours = _compressed(edges[:, 1], edges[:, 0], self.num_nodes)
        return neighbours, pointers

    def to_sparse(self, weight: str | None = None):
        """The adjacency matrix as a :class:`paddlejax.sparse.SparseCooTensor` ``[num_nodes,
        num_nodes]``: entry ``[u, v]`` counts the edges ``u -> v`` (or sums the edge feature
        ``weight`` over them), so summing received source features is ``A.T @ x``; the layers
        of :mod:`paddlejax.nn.graph_conv` take it in place of the edges.

        >>> Graph([[0, 1], [0, 1], [1, 2]]).to_sparse().to_dense().tolist()
        [[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
        """
        from paddlejax import sparse

        if weight is None:
            data = jnp.ones(self.num_edges, jnp.float32)
        elif weight in self.edge_feat and np.ndim(self.edge_feat[weight]) == 1:
            data = jnp.asarray(self.edge_feat[weight])
        else:
            raise ValueError(f"Graph.to_sparse: weight expects the name of a 1-D edge feature "
                             f"({sorted(self.edge_feat)}), got {weight!r}")
        return sparse.sparse_coo_tensor(jnp.asarray(self.edges).T, data, [self.num_nodes, self.num_nodes])

    @classmethod
    def from_networkx(cls, graph, node_attrs=(), edge_attrs=()) -> Graph:
        """A graph from a networkx graph: nodes numbered in ``graph.nodes`` order, both directions
        of every edge of an undirected graph, and the named node and edge attributes as float32
        features (an edge attribute is copied to both directions).

        >>> import networkx as nx
        >>> g = Graph.from_networkx(nx.path_graph(3))
        >>> g.num_nodes, g.edges.tolist()
        (3, [[0, 1], [1, 2], [1, 0], [2, 1]])
        """
        index = {node: i for i, node in enumerate(graph.nodes)}
        pairs = [(index[u], index[v], data) for u, v, data in graph.edges(data=True)]
        if not graph.is_directed():
            pairs = pairs + [(v, u, data) for u, v, data in pairs]
        edges = np.array([(u, v) for u, v, _ in pairs], np.int64).reshape(-1, 2)
        node_feat = {name: np.array([graph.nodes[node][name] for node in graph.nodes], np.float32)
                     for name in node_attrs}
        edge_feat = {name: np.array([data[name] for _, _, data in pairs], np.float32) for name in edge_attrs}
        return cls(edges, len(index), node_feat, edge_feat)

    # -- message passing -------------------------------------------------------------------------
    def send(self, message_func, src_feat: dict | None = None, dst_feat: dict | None = None,
             edge_feat: dict | None = None) -> Message:
        """A :class:`~paddlejax.geometric.Message`: ``message_func(src, dst, edge)`` called with
        ``src_feat`` read at every edge's source, ``dst_feat`` at its destination and
        ``edge_feat`` (per-edge dicts of arrays, empty where not given) returns the message's
        dict of per-edge features.

        >>> import jax.numpy as jnp
        >>> g = Graph([[0, 1], [1, 0]])
        >>> msg = g.send(lambda s, d, e: {"diff": s["x"] - d["x"]}, src_feat={"x": jnp.array([1.0, 3.0])},
        ...              dst_feat={"x": jnp.array([1.0, 3.0])})
        >>> msg["diff"].tolist()
        [-2.0, 2.0]
        """
        src = _check_features("src_feat", src_feat, self.num_nodes, "node")
        dst = _check_features("dst_feat", dst_feat, self.num_nodes, "node")
        edge = _check_features("edge_feat", edge_feat, self.num_edges, "edge")
        features = message_func(_gather(src, self.src), _gather(dst, self.dst), edge)
        if not isinstance(features, dict):
            raise TypeError(f"Graph.send: message_func must return a dict of per-edge arrays, "
                            f"got {type(features).__name__}")
        return Message(features, self.dst, self.num_nodes)

    def recv(self, reduce_func, msg: Message):
        """Reduce ``msg`` at the receiving nodes: ``reduce_func(msg)`` for a function (PGL's
        ``msg.reduce_sum(msg["h"])`` and friends), or ``"sum"``, ``"mean"``, ``"max"``, ``"min"``
        to reduce every feature of the message, giving a dict of ``[num_nodes, ...]`` arrays.

        >>> import jax.numpy as jnp
        >>> g = Graph([[0, 1], [2, 1]])
        >>> msg = g.send(lambda s, d, e: {"h": s["h"]}, src_feat={"h": jnp.array([1.0, 5.0, 3.0])})
        >>> g.recv("max", msg)["h"].tolist(), g.recv(lambda m: m.reduce_mean(m["h"]), msg).tolist()
        ([0.0, 3.0, 0.0], [0.0, 2.0, 0.0])
        """
        if isinstance(reduce_func, str):
            return {name: msg.reduce(msg[name], reduce_func) for name in msg.keys()}
        if not callable(reduce_func):
            raise TypeError(f"Graph.recv: reduce_func expects a function of the message or one of "
                            f"'sum', 'mean', 'max', 'min', got {reduce_func!r}")
        return reduce_func(msg)

    def send_recv(self, feature, reduce_func: str = "sum"):
        """Every node's ``feature [num_nodes, ...]`` sent along its out-edges and reduced at the
        receivers with ``reduce_func`` (sum, mean, max, min): one ``send_u_recv`` op.

        >>> import jax.numpy as jnp
        >>> Graph([[0, 1], [2, 1]]).send_recv(jnp.array([1.0, 5.0, 3.0]), "mean").tolist()
        [0.0, 2.0, 0.0]
        """
        if not np.shape(feature) or np.shape(feature)[0] != self.num_nodes:
            raise ValueError(f"Graph.send_recv: feature expects {self.num_nodes} rows (one per node), "
                             f"got shape {np.shape(feature)}")
        return ops.send_u_recv(feature, jnp.asarray(self.src), jnp.asarray(self.dst), reduce_op=reduce_func,
                               out_size=self.num_nodes or None)


def _compressed(major, minor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pointers, neighbours)``: ``minor`` grouped by ``major`` node, each group sorted."""
    order = np.lexsort((minor, major))
    pointers = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(major, minlength=num_nodes), out=pointers[1:])
    return pointers, minor[order]
