"""Click-through-rate models (PaddleRec's): :class:`WideDeep` and :class:`DeepFM`, over the 13
dense and 26 categorical features of Criteo-shaped logs
(:class:`~paddlejax.data.SyntheticCriteo`).

The categorical features arrive as raw values and are hashed into one shared table of
``sparse_feature_number`` rows (:class:`~paddlejax.distributed.sparse_embedding.SparseEmbedding`,
``hash_ids=True``), so a value never seen in training still has a row. Under
``Strategy(shard_embeddings=True)`` the tables are split by rows over the devices; pair them
with :func:`~paddlejax.optimizer.lazy_adam` or :func:`~paddlejax.optimizer.lazy_adagrad`. A model
returns one click logit per sample (train with ``loss="bce_with_logits"``, measure ``Auc(from_logits=True)``).

>>> import numpy as np, paddlejax as pj
>>> model = DeepFM(sparse_feature_number=1024, sparse_feature_dim=4, layer_sizes=(16,))
>>> model(np.zeros((2, 13), np.float32), np.arange(52, dtype=np.int32).reshape(2, 26)).shape
(2,)
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from paddlejax import nn
from paddlejax.distributed.sparse_embedding import SparseEmbedding


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers = []
    for cin, cout in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))


class _CTRModel(nn.Layer):
    """The parts both models share: a weight per category (first order), a vector per category
    (``sparse_feature_dim``), and a dense linear term."""

    def __init__(self, sparse_feature_number: int, sparse_feature_dim: int, dense_feature_dim: int, num_field: int):
        self.num_field, self.dense_feature_dim = num_field, dense_feature_dim
        self.first = SparseEmbedding(sparse_feature_number, 1, hash_ids=True)
        self.embedding = SparseEmbedding(sparse_feature_number, sparse_feature_dim, hash_ids=True)
        self.dense_first = nn.Linear(dense_feature_dim, 1)

    def _check(self, dense, sparse) -> None:
        if dense.shape[-1:] != (self.dense_feature_dim,) or sparse.shape[-1:] != (self.num_field,):
            raise ValueError(f"{type(self).__name__}: expects dense [batch, {self.dense_feature_dim}] and sparse "
                             f"[batch, {self.num_field}], got {tuple(dense.shape)} and {tuple(sparse.shape)}")

    def linear(self, dense, sparse):
        """The first-order logit ``[batch]``: a weight per category plus a linear dense part."""
        return jnp.sum(self.first(sparse)[..., 0], axis=-1) + self.dense_first(dense)[..., 0]


class WideDeep(_CTRModel):
    """Wide & Deep (Cheng et al. 2016): a wide linear part over every feature plus a deep MLP over
    the categories' vectors and the dense features.

    >>> import numpy as np
    >>> WideDeep(1024, 4, layer_sizes=(16,))(np.zeros((3, 13), np.float32), np.zeros((3, 26), np.int32)).shape
    (3,)
    """

    def __init__(self, sparse_feature_number: int = 1_000_001, sparse_feature_dim: int = 9,
                 dense_feature_dim: int = 13, num_field: int = 26, layer_sizes: Sequence[int] = (512, 256, 128, 32)):
        super().__init__(sparse_feature_number, sparse_feature_dim, dense_feature_dim, num_field)
        self.deep = _mlp((num_field * sparse_feature_dim + dense_feature_dim, *layer_sizes, 1))

    def __call__(self, dense, sparse):
        self._check(dense, sparse)
        vectors = self.embedding(sparse).reshape(sparse.shape[0], -1)
        return self.linear(dense, sparse) + self.deep(jnp.concatenate([vectors, dense], axis=-1))[..., 0]


class DeepFM(_CTRModel):
    """DeepFM (Guo et al. 2017): a factorisation machine (first-order weights plus every pair of
    fields' vectors' dot products, the dense features given vectors of their own, scaled by their
    values) and an MLP over the same vectors, summed into one logit.

    >>> import numpy as np
    >>> DeepFM(1024, 4, layer_sizes=(16,))(np.zeros((3, 13), np.float32), np.zeros((3, 26), np.int32)).shape
    (3,)
    """

    def __init__(self, sparse_feature_number: int = 1_000_001, sparse_feature_dim: int = 9,
                 dense_feature_dim: int = 13, num_field: int = 26, layer_sizes: Sequence[int] = (512, 256, 128, 32)):
        super().__init__(sparse_feature_number, sparse_feature_dim, dense_feature_dim, num_field)
        self.dense_vectors = self.create_parameter((dense_feature_dim, sparse_feature_dim), None)
        self.dnn = _mlp(((num_field + dense_feature_dim) * sparse_feature_dim, *layer_sizes, 1))

    def __call__(self, dense, sparse):
        self._check(dense, sparse)
        dense_vectors = self.dense_vectors[...] * dense[..., None]
        vectors = jnp.concatenate([self.embedding(sparse), dense_vectors], axis=1)  # [batch, fields, k]
        pairs = 0.5 * jnp.sum(jnp.square(jnp.sum(vectors, axis=1)) - jnp.sum(jnp.square(vectors), axis=1), axis=-1)
        deep = self.dnn(vectors.reshape(vectors.shape[0], -1))[..., 0]
        return self.linear(dense, sparse) + pairs + deep
