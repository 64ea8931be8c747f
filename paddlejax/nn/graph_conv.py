"""Graph convolution layers (PGL's ``pgl.nn``): :class:`GCNConv`, :class:`GATConv`,
:class:`GraphSAGEConv`.

Each is called on node features ``x [num_nodes, input_size]`` and ``edges [E, 2]``, the
(source, destination) pairs of a :class:`paddlejax.geometric.Graph` (``graph.edges``), and
returns new features per node; :class:`GCNConv` also takes the graph as a
:mod:`paddlejax.sparse` adjacency matrix (``graph.to_sparse()``, weighted edges allowed). Taking arrays rather than a graph object keeps a traced model a
program of two plain inputs that saves and loads like any other. Messages travel with the
``send_u_recv`` / ``send_ue_recv`` / ``send_uv`` and segment ops, so a trace shows them.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> nn.seed(0)
>>> edges = jnp.array([[0, 1], [1, 0], [1, 2], [2, 1]])
>>> GCNConv(4, 2)(jnp.ones((3, 4)), edges).shape, GATConv(4, 2, num_heads=3)(jnp.ones((3, 4)), edges).shape
((3, 2), (3, 6))
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from paddlejax import ops, sparse
from paddlejax.geometric.message import edge_softmax
from paddlejax.nn.args import arg_error, choice, is_bool, is_number, positive_int, probability
from paddlejax.nn.common import Dropout, Linear
from paddlejax.nn.layer import Layer


def _endpoints(layer: str, x, edges, self_loops: bool):
    """``(src, dst)`` of ``edges`` checked against ``x``, with a loop at every node appended if
    ``self_loops``."""
    if x.ndim != 2:
        raise arg_error(layer, "x", "node features [num_nodes, input_size]", tuple(x.shape))
    edges = jnp.asarray(edges)
    if edges.ndim != 2 or edges.shape[1] != 2 or not jnp.issubdtype(edges.dtype, jnp.integer):
        raise arg_error(layer, "edges", "an [E, 2] int array of (source, destination) pairs",
                        f"{edges.dtype}{list(edges.shape)}")
    src, dst = edges[:, 0], edges[:, 1]
    if self_loops:
        loops = jnp.arange(x.shape[0], dtype=edges.dtype)
        src, dst = jnp.concatenate([src, loops]), jnp.concatenate([dst, loops])
    return src, dst


def _flag(layer: str, name: str, value) -> bool:
    if not is_bool(value):
        raise arg_error(layer, name, "a bool", value)
    return bool(value)


class GCNConv(Layer):
    """Kipf and Welling's graph convolution: ``D^-1/2 (A + I) D^-1/2 X W + b``, with ``A[v, u]``
    the number of edges ``u -> v`` and ``D`` the in-degrees counting the added self-loops.

    ``add_self_loops=False`` leaves the loops out (a node without in-edges is then scaled as if
    it had one); ``norm=False`` sums the neighbours unnormalised. Weight ``[input_size,
    output_size]`` (XavierUniform), bias zeros. ``edges`` may also be a :mod:`paddlejax.sparse`
    adjacency ``[N, N]`` whose values weight the edges (in the sums and the degrees alike).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> conv = GCNConv(3, 2, bias=False)
    >>> edges = jnp.array([[0, 1], [1, 0]])
    >>> conv(jnp.ones((2, 3)), edges).shape
    (2, 2)
    >>> adjacency = pj.geometric.Graph(edges).to_sparse()
    >>> bool(jnp.allclose(conv(jnp.ones((2, 3)), adjacency), conv(jnp.ones((2, 3)), edges)))
    True
    """

    def __init__(self, input_size, output_size, norm=True, add_self_loops=True, bias=True, *,
                 rngs: nnx.Rngs | None = None):
        shape = (positive_int("GCNConv", "input_size", input_size), positive_int("GCNConv", "output_size", output_size))
        self.norm = _flag("GCNConv", "norm", norm)
        self.add_self_loops = _flag("GCNConv", "add_self_loops", add_self_loops)
        self.weight = self.create_parameter(shape, rngs=rngs)
        self.bias = self.create_parameter(shape[1:], is_bias=True, rngs=rngs) if _flag("GCNConv", "bias", bias) \
            else None

    def forward(self, x, edges):
        if isinstance(edges, sparse.SparseTensor):
            return self._on_adjacency(x, edges)
        src, dst = _endpoints("GCNConv", x, edges, self.add_self_loops)
        n = x.shape[0]
        h = ops.matmul(x, self.weight[...])  # project first: fewer features travel when output_size is smaller
        if self.norm:
            degree = ops.segment_sum(jnp.ones(dst.shape, h.dtype), dst, num_segments=n)
            scale = jnp.reciprocal(jnp.sqrt(jnp.maximum(degree, 1)))[:, None]
            h = h * scale
        out = ops.send_u_recv(h, src, dst, reduce_op="sum", out_size=n)
        if self.norm:
            out = out * scale
        return out if self.bias is None else out + self.bias[...]

    def _on_adjacency(self, x, adjacency):
        """The same convolution over a :mod:`paddlejax.sparse` adjacency ``A [N, N]`` (``A[u, v]``
        the weight of ``u -> v``, as ``Graph.to_sparse`` gives): ``A.T`` times the features as
        one sparse product, the degrees its column sums, so weighted edges weigh in both and
        their weights get gradients. Runs under jit and grad; ``pj.trace`` captures the edges form."""
        n = x.shape[0] if x.ndim == 2 else None
        if n is None or tuple(adjacency.shape) != (n, n):
            raise arg_error("GCNConv", "edges", f"an [E, 2] int array or a sparse adjacency [{n}, {n}] for x of shape "
                                                f"{tuple(x.shape)}", f"a sparse tensor of shape {list(adjacency.shape)}")
        incoming = sparse.transpose(adjacency, [1, 0])
        h = ops.matmul(x, self.weight[...])
        loops = 1.0 if self.add_self_loops else 0.0
        if self.norm:
            degree = sparse.matmul(incoming, jnp.ones((n, 1), h.dtype))[:, 0] + loops
            scale = jnp.reciprocal(jnp.sqrt(jnp.maximum(degree, 1)))[:, None]
            h = h * scale
        out = sparse.matmul(incoming, h) + loops * h
        if self.norm:
            out = out * scale
        return out if self.bias is None else out + self.bias[...]


class GATConv(Layer):
    """Graph attention (Veličković et al.): per head, ``h = x W``, an edge ``u -> v`` scores
    ``LeakyReLU(a_src . h_u + a_dst . h_v)``, the scores of a node's incoming edges are
    normalised with a softmax, and the node sums its neighbours' ``h`` by those weights.

    ``num_heads`` heads of ``hidden_size`` features are concatenated (``concat=True``, output
    ``[N, num_heads * hidden_size]``) or averaged (``[N, hidden_size]``). ``feat_drop`` drops
    input features and ``attn_drop`` attention weights while training; ``add_self_loops`` lets
    every node attend to itself. :meth:`attention_weights` returns the normalised weights.

    >>> import jax.numpy as jnp
    >>> conv = GATConv(3, 4, num_heads=2, concat=False)
    >>> conv.eval()
    >>> conv(jnp.ones((5, 3)), jnp.array([[0, 1], [2, 1]])).shape
    (5, 4)
    """

    def __init__(self, input_size, hidden_size, feat_drop=0.6, attn_drop=0.6, num_heads=1, concat=True,
                 negative_slope=0.2, add_self_loops=True, bias=True, *, rngs: nnx.Rngs | None = None):
        size_in = positive_int("GATConv", "input_size", input_size)
        self.hidden_size = positive_int("GATConv", "hidden_size", hidden_size)
        self.num_heads = positive_int("GATConv", "num_heads", num_heads)
        self.concat = _flag("GATConv", "concat", concat)
        self.add_self_loops = _flag("GATConv", "add_self_loops", add_self_loops)
        if not is_number(negative_slope) or negative_slope < 0:
            raise arg_error("GATConv", "negative_slope", "a number >= 0", negative_slope)
        self.negative_slope = float(negative_slope)
        self.feat_drop = Dropout(probability("GATConv", "feat_drop", feat_drop), rngs=rngs)
        self.attn_drop = Dropout(probability("GATConv", "attn_drop", attn_drop), rngs=rngs)
        self.weight = self.create_parameter((size_in, self.num_heads * self.hidden_size), rngs=rngs)
        self.attn_src = self.create_parameter((self.num_heads, self.hidden_size), rngs=rngs)
        self.attn_dst = self.create_parameter((self.num_heads, self.hidden_size), rngs=rngs)
        out = self.num_heads * self.hidden_size if self.concat else self.hidden_size
        self.bias = self.create_parameter((out,), is_bias=True, rngs=rngs) if _flag("GATConv", "bias", bias) else None

    def _attend(self, x, edges):
        """``(h [N, heads, hidden], src, dst, weights [E, heads])``, the weights before dropout."""
        src, dst = _endpoints("GATConv", x, edges, self.add_self_loops)
        h = ops.matmul(self.feat_drop(x), self.weight[...]).reshape(x.shape[0], self.num_heads, self.hidden_size)
        score_src = jnp.sum(h * self.attn_src[...], axis=-1)
        score_dst = jnp.sum(h * self.attn_dst[...], axis=-1)
        scores = ops.leaky_relu(ops.send_uv(score_src, score_dst, src, dst, message_op="add"),
                                negative_slope=self.negative_slope)
        return h, src, dst, edge_softmax(scores, dst, x.shape[0])

    def attention_weights(self, x, edges):
        """``(src, dst, weights [E', num_heads])``: every edge the layer attends over (the
        self-loops appended last) and its normalised attention weight, before dropout; the
        weights into each node sum to 1 per head.

        >>> import jax.numpy as jnp
        >>> conv = GATConv(3, 2, num_heads=2)
        >>> conv.eval()
        >>> src, dst, w = conv.attention_weights(jnp.ones((2, 3)), jnp.array([[0, 1]]))
        >>> dst.tolist(), w.shape
        ([1, 0, 1], (3, 2))
        """
        _, src, dst, weights = self._attend(x, edges)
        return src, dst, weights

    def forward(self, x, edges):
        h, src, dst, weights = self._attend(x, edges)
        out = ops.send_ue_recv(h, self.attn_drop(weights)[..., None], src, dst, message_op="mul", reduce_op="sum",
                               out_size=x.shape[0])
        out = out.reshape(x.shape[0], -1) if self.concat else jnp.mean(out, axis=1)
        return out if self.bias is None else out + self.bias[...]


class GraphSAGEConv(Layer):
    """GraphSAGE (Hamilton et al.): ``x W_self + b + aggr(neighbours' x) W_neigh``, the
    neighbours being the sources of a node's in-edges and ``aggr_func`` one of ``"mean"``,
    ``"sum"``, ``"max"``, ``"min"`` (0 for a node without in-edges). ``normalize=True`` scales each
    output row to unit length. Sub-layers ``self_linear`` (with the bias) and ``neigh_linear``.

    >>> import jax.numpy as jnp
    >>> GraphSAGEConv(3, 5, aggr_func="max")(jnp.ones((4, 3)), jnp.array([[0, 1], [2, 1]])).shape
    (4, 5)
    """

    def __init__(self, input_size, hidden_size, aggr_func="mean", normalize=False, bias=True, *,
                 rngs: nnx.Rngs | None = None):
        self.aggr_func = choice("GraphSAGEConv", "aggr_func", aggr_func, ("mean", "sum", "max", "min"))
        self.normalize = _flag("GraphSAGEConv", "normalize", normalize)
        sizes = (positive_int("GraphSAGEConv", "input_size", input_size),
                 positive_int("GraphSAGEConv", "hidden_size", hidden_size))
        self.self_linear = Linear(*sizes, bias_attr=None if _flag("GraphSAGEConv", "bias", bias) else False, rngs=rngs)
        self.neigh_linear = Linear(*sizes, bias_attr=False, rngs=rngs)

    def forward(self, x, edges):
        src, dst = _endpoints("GraphSAGEConv", x, edges, self_loops=False)
        neighbours = ops.send_u_recv(x, src, dst, reduce_op=self.aggr_func, out_size=x.shape[0])
        out = self.self_linear(x) + self.neigh_linear(neighbours)
        if self.normalize:
            out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out
