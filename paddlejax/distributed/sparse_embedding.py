"""Embedding tables split by rows over the data-parallel devices (the parameter-server use of
Paddle's ``sparse_embedding``, for search and recommendation models whose tables outgrow one
device).

:class:`SparseEmbedding` is an :class:`~paddlejax.nn.Embedding` whose table is marked to be split
by rows over the mesh's batch axes. Trained with ``Strategy(shard_embeddings=True)``, each of
``n`` devices holds ``num_embeddings / n`` rows and the rows' optimizer state; a lookup sends each
id to the device holding its row and the row back (two all-to-alls: the ``sparse_embedding`` op),
and each row's gradient is added up where the row lives. Pair it with a row-wise optimizer
(:func:`paddlejax.optimizer.lazy_adam`, :func:`~paddlejax.optimizer.lazy_adagrad`): a step then
moves only the rows the batch looked up, as Paddle's ``lazy_mode``.

``hash_ids=True`` hashes raw feature values (any int, seen before or not) into the table's
rows first (the ``hash_bucket`` op, seeded per table), as CTR models do with ids that have no
fixed vocabulary.

Off the mesh (one device, evaluation, export) it is a plain embedding, with the same parameter
by the same name. Rows that outgrow every device's memory go to the host tier,
:class:`~paddlejax.distributed.host_table.HostEmbeddingTable`.

>>> import jax.numpy as jnp
>>> emb = SparseEmbedding(1000, 8, hash_ids=True)
>>> emb(jnp.array([[7, 2_000_000_011]])).shape
(1, 2, 8)
>>> emb.weight.get_metadata()["out_sharding"]
(('dp', 'inter', 'intra', 'ep'), None)
"""
from __future__ import annotations

from flax import nnx

from paddlejax import ops
from paddlejax.distributed.tensor_parallel import mark_sharding
from paddlejax.nn import Embedding
from paddlejax.nn.args import arg_error, is_int
from paddlejax.ops.sharded_lookup import ROW_AXES


class SparseEmbedding(Embedding):
    """Rows of ``weight [num_embeddings, embedding_dim]`` looked up by ids, the table split by rows
    over the data-parallel devices (see the module doc). ``hash_ids`` hashes the ids into
    ``[0, num_embeddings)`` first, with ``seed`` (tables sharing ids use different seeds).

    >>> SparseEmbedding(16, 4, padding_idx=0).weight.shape
    (16, 4)
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, hash_ids=False, seed=0, weight_attr=None,
                 *, rngs: nnx.Rngs | None = None):
        super().__init__(num_embeddings, embedding_dim, padding_idx, weight_attr=weight_attr, rngs=rngs)
        if not isinstance(hash_ids, bool):
            raise arg_error("SparseEmbedding", "hash_ids", "a bool", hash_ids)
        if not is_int(seed) or seed < 0:
            raise arg_error("SparseEmbedding", "seed", "an int >= 0", seed)
        self.hash_ids, self.seed = hash_ids, int(seed)
        mark_sharding(self.weight, ROW_AXES, None)

    def forward(self, x):
        if self.hash_ids:
            x = ops.hash_bucket(x, buckets=self.weight.shape[0], seed=self.seed)
        return ops.sparse_embedding(x, self.weight[...], padding_idx=self.padding_idx)
