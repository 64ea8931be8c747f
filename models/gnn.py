"""Node classifiers on graphs (PGL's examples): :class:`GCN`, :class:`GAT`, :class:`GraphSAGE`.

Each maps node features ``x [num_nodes, input_size]`` and ``edges [E, 2]`` (source,
destination pairs, a :class:`paddlejax.geometric.Graph`'s ``edges``) to class logits
``[num_nodes, num_classes]``, and traces to a program of those two inputs.

>>> import jax.numpy as jnp, paddlejax as pj
>>> pj.nn.seed(0)
>>> edges = jnp.array([[0, 1], [1, 0], [1, 2], [2, 1]])
>>> [m(jnp.ones((3, 5)), edges).shape for m in (GCN(5, 2), GAT(5, 2), GraphSAGE(5, 2))]
[(3, 2), (3, 2), (3, 2)]
"""
from __future__ import annotations

import jax

from paddlejax import nn
from paddlejax.nn.args import positive_int


def _depth(model: str, num_layers) -> int:
    return positive_int(model, "num_layers", num_layers, minimum=1)


class GCN(nn.Layer):
    """Kipf and Welling's GCN: ``num_layers`` :class:`~paddlejax.nn.GCNConv` layers of
    ``hidden_size`` features with ReLU between them, ``dropout`` before each.

    >>> import jax.numpy as jnp
    >>> GCN(4, 3, hidden_size=8, num_layers=3)(jnp.ones((2, 4)), jnp.array([[0, 1]])).shape
    (2, 3)
    """

    def __init__(self, input_size: int, num_classes: int, hidden_size: int = 16, num_layers: int = 2,
                 dropout: float = 0.5):
        sizes = [input_size] + [hidden_size] * (_depth("GCN", num_layers) - 1) + [num_classes]
        self.convs = nn.LayerList([nn.GCNConv(a, b) for a, b in zip(sizes, sizes[1:])])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edges):
        for i, conv in enumerate(self.convs):
            x = conv(self.dropout(x), edges)
            if i < len(self.convs) - 1:
                x = nn.functional.relu(x)
        return x


class GAT(nn.Layer):
    """Veličković et al.'s GAT: ``num_layers - 1`` :class:`~paddlejax.nn.GATConv` layers of
    ``num_heads`` concatenated heads of ``hidden_size`` features with ELU, then one head giving
    the logits; ``feat_drop`` and ``attn_drop`` in every layer.

    >>> import jax.numpy as jnp
    >>> GAT(4, 3, hidden_size=2, num_heads=4)(jnp.ones((2, 4)), jnp.array([[0, 1]])).shape
    (2, 3)
    """

    def __init__(self, input_size: int, num_classes: int, hidden_size: int = 8, num_heads: int = 8,
                 num_layers: int = 2, feat_drop: float = 0.6, attn_drop: float = 0.6):
        hidden = [nn.GATConv(input_size if i == 0 else hidden_size * num_heads, hidden_size, feat_drop, attn_drop,
                             num_heads=num_heads) for i in range(_depth("GAT", num_layers) - 1)]
        head = nn.GATConv(hidden_size * num_heads if hidden else input_size, num_classes, feat_drop, attn_drop,
                          num_heads=1)
        self.convs = nn.LayerList([*hidden, head])

    def forward(self, x, edges):
        for conv in self.convs[:-1]:
            x = jax.nn.elu(conv(x, edges))
        return self.convs[-1](x, edges)


class GraphSAGE(nn.Layer):
    """Hamilton et al.'s GraphSAGE: ``num_layers`` :class:`~paddlejax.nn.GraphSAGEConv` layers
    (``aggr_func`` aggregation) of ``hidden_size`` features with ReLU and ``dropout`` between
    them. On a sampled subgraph (:func:`paddlejax.geometric.sample_subgraph`) the first rows of
    the output are the batch's nodes.

    >>> import jax.numpy as jnp
    >>> GraphSAGE(4, 3, aggr_func="max")(jnp.ones((2, 4)), jnp.array([[0, 1]])).shape
    (2, 3)
    """

    def __init__(self, input_size: int, num_classes: int, hidden_size: int = 64, num_layers: int = 2,
                 aggr_func: str = "mean", dropout: float = 0.5):
        sizes = [input_size] + [hidden_size] * (_depth("GraphSAGE", num_layers) - 1) + [num_classes]
        self.convs = nn.LayerList([nn.GraphSAGEConv(a, b, aggr_func) for a, b in zip(sizes, sizes[1:])])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edges):
        for i, conv in enumerate(self.convs):
            x = conv(x, edges)
            if i < len(self.convs) - 1:
                x = self.dropout(nn.functional.relu(x))
        return x
