"""ZeRO's layout: parameters, gradients and optimizer state as one flat vector split over the
data-parallel devices, bucket by bucket.

The parameters are flattened (``ravel_pytree``, in their tree order) and cut into buckets of
consecutive parameters -- one per parameter, or up to ``bucket_mb`` megabytes each. Every bucket
is zero-padded to a multiple of the device count and device ``i`` owns its ``i``-th piece. The
*sharded vector* lists device 0's pieces, then device 1's, and so on, so that a
``NamedSharding`` over the data-parallel axes places on every device exactly the pieces it owns,
and a reduce-scatter of bucket ``b`` hands device ``i`` its piece of ``b``: one collective per
bucket, each of which XLA can start as soon as that bucket's gradients are ready.

>>> import jax.numpy as jnp
>>> layout = FlatLayout({"a": jnp.arange(3.0), "b": jnp.arange(4.0, 9.0)}, devices=2)
>>> layout.chunks, layout.length      # "a": 3 -> 4 = 2 x 2, "b": 5 -> 6 = 2 x 3
((2, 3), 10)
>>> layout.shard({"a": jnp.arange(3.0), "b": jnp.arange(4.0, 9.0)}).tolist()
[0.0, 1.0, 4.0, 5.0, 6.0, 2.0, 0.0, 7.0, 8.0, 0.0]
>>> layout.tree(layout.shard({"a": jnp.arange(3.0), "b": jnp.arange(4.0, 9.0)}))["b"].tolist()
[4.0, 5.0, 6.0, 7.0, 8.0]
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from paddlejax.distributed.collectives import buckets


class FlatLayout:
    """The ZeRO layout of ``params`` over ``devices`` devices, one bucket per parameter or
    (``bucket_mb``) buckets of at most that many megabytes."""

    def __init__(self, params, devices: int, bucket_mb: float | None = None):
        flat, self._unravel = ravel_pytree(params)
        self.devices, self.dtype = devices, flat.dtype
        leaves = [jax.ShapeDtypeStruct(np.shape(p), flat.dtype) for p in jax.tree.leaves(params)]
        groups = buckets(leaves, bucket_mb) if bucket_mb is not None else [[i] for i in range(len(leaves))]
        self.lengths = tuple(sum(leaves[i].size for i in group) for group in groups)
        self.chunks = tuple(math.ceil(n / devices) for n in self.lengths)

    @property
    def length(self) -> int:
        """Elements of the sharded vector (padding included)."""
        return self.devices * sum(self.chunks)

    def _buckets(self, tree) -> list[jax.Array]:
        """``tree`` flattened and cut into buckets, each padded to ``devices`` equal pieces."""
        flat, _ = ravel_pytree(tree)
        ends = np.cumsum(self.lengths)
        return [jnp.pad(flat[end - n:end], (0, chunk * self.devices - n))
                for n, end, chunk in zip(self.lengths, ends, self.chunks)]

    def shard(self, tree) -> jax.Array:
        """``tree`` (shaped like the parameters) as the sharded vector."""
        rows = [bucket.reshape(self.devices, chunk) for bucket, chunk in zip(self._buckets(tree), self.chunks)]
        return jnp.concatenate(rows, axis=1).reshape(-1)

    def tree(self, vector: jax.Array):
        """The parameters' tree back from the whole sharded vector."""
        rows = jnp.split(vector.reshape(self.devices, -1), np.cumsum(self.chunks)[:-1], axis=1)
        return self._unravel(jnp.concatenate([row.reshape(-1)[:n] for row, n in zip(rows, self.lengths)]))

    def local(self, tree, index) -> jax.Array:
        """Device ``index``'s pieces of ``tree`` (inside ``shard_map``, from a whole tree)."""
        return lax.dynamic_index_in_dim(self.shard(tree).reshape(self.devices, -1), index, keepdims=False)

    def reduce_scatter(self, tree, axes) -> jax.Array:
        """This device's pieces of the sum of every device's ``tree`` over ``axes`` (inside
        ``shard_map``): one reduce-scatter per bucket."""
        return jnp.concatenate([lax.psum_scatter(bucket, axes, tiled=True) for bucket in self._buckets(tree)])
