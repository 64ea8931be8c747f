"""Graph learning (Paddle's ``paddle.geometric`` and PGL's habits): the message-passing and
segment ops, a :class:`Graph` with ``send`` / ``recv``, neighbour sampling, random walks and
skip-gram node embeddings. The graph layers are in :mod:`paddlejax.nn` (``GCNConv``,
``GATConv``, ``GraphSAGEConv``), the node classifiers in :mod:`paddlejax.models`.

>>> import jax.numpy as jnp, paddlejax as pj
>>> g = pj.geometric.Graph([[0, 1], [1, 2], [2, 0]])
>>> pj.geometric.send_u_recv(jnp.array([1.0, 2.0, 3.0]), g.src, g.dst).tolist()
[3.0, 1.0, 2.0]
"""
from paddlejax.geometric.graph import Graph
from paddlejax.geometric.message import Message, edge_softmax
from paddlejax.geometric.sampling import reindex_graph, sample_neighbors, sample_subgraph
from paddlejax.geometric.skipgram import skipgram_pairs, train_skipgram
from paddlejax.geometric.walks import deepwalk_walks, node2vec_walks
from paddlejax.ops import segment_max, segment_mean, segment_min, segment_sum, send_u_recv, send_ue_recv, send_uv

__all__ = ["Graph", "Message", "edge_softmax", "sample_neighbors", "reindex_graph", "sample_subgraph",
           "deepwalk_walks", "node2vec_walks", "skipgram_pairs", "train_skipgram", "segment_sum", "segment_mean",
           "segment_max", "segment_min", "send_u_recv", "send_ue_recv", "send_uv"]
