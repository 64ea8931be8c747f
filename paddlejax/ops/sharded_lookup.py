"""``sparse_embedding``: an embedding lookup whose table may be split by rows over the devices that
split the batch (the parameter-server use of Paddle's ``sparse_embedding``, on the mesh).

Without a mesh, or on a mesh of tensor-parallel or pipeline axes only, it is ``embedding``. Where
the surrounding ``jax.set_mesh`` has batch axes (``"dp"``, ``"inter"``/``"intra"``, ``"ep"``), the
kernel runs under ``shard_map`` over them: device ``d`` of ``n`` holds rows
``[d * V/n, (d + 1) * V/n)`` and its share of the batch's ids, and

1. buckets its ids by the device owning each row (``[n, ids]``: every id could be bound for one
   device, so nothing is ever dropped),
2. sends each bucket to its owner (an all-to-all of ids),
3. reads the rows it was asked for from its shard,
4. sends them back (an all-to-all of rows) and puts them in the ids' order.

The gradient takes the same road back (JAX transposes each all-to-all into another): every row's
gradient is added up on the device that owns the row, and no dense table gradient is ever
communicated. Ids outside ``[-V, V)`` read NaN rows, as ``embedding``'s do.

>>> import jax.numpy as jnp
>>> table = jnp.arange(12.0).reshape(6, 2)
>>> sparse_embedding(jnp.array([[5, 0]]), table).tolist()
[[[10.0, 11.0], [0.0, 1.0]]]
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from paddlejax.ops.math import _embedding, mask_padding
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.sharding import batch_axes, laid_out
from paddlejax.ops.traits import Traits

# the order the mesh lays these out in, so a table marked with them splits as the kernel reads it
ROW_AXES = ("dp", "inter", "intra", "ep")


def buckets(ids, rows: int, devices: int):
    """Where each of ``ids [N]`` travels: ``(owner, slot, local)`` — the device holding its row
    (``rows`` rows a device), its place in the ``[devices, N]`` buffer sent there, and its row
    on that device (``rows``, out of range, for an id outside the table). Negative ids count
    from the end, as ``jnp.take``'s do.

    >>> [a.tolist() for a in buckets(jnp.array([5, 0, 4, 1]), rows=3, devices=2)]
    [[1, 0, 1, 0], [0, 0, 1, 1], [2, 0, 1, 1]]
    """
    ids = jnp.where(ids < 0, ids + rows * devices, ids)
    valid = (ids >= 0) & (ids < rows * devices)
    owner = jnp.where(valid, ids // rows, 0)
    local = jnp.where(valid, ids - owner * rows, rows)
    hits = owner[:, None] == jnp.arange(devices)[None, :]
    slot = jnp.take_along_axis(jnp.cumsum(hits, axis=0) - 1, owner[:, None], axis=1)[:, 0]
    return owner, slot, local


def _lookup(ids, shard, axes: tuple[str, ...]):
    """This device's ``ids`` looked up in the table split over ``axes`` (inside ``shard_map``)."""
    devices = math.prod(lax.axis_size(a) for a in axes)
    flat = ids.reshape(-1)
    owner, slot, local = buckets(flat, shard.shape[0], devices)
    send = jnp.full((devices, flat.shape[0]), shard.shape[0], flat.dtype).at[owner, slot].set(local)
    asked = lax.all_to_all(send, axes, 0, 0, tiled=True)
    rows = jnp.take(shard, asked, axis=0, mode="fill", fill_value=jnp.nan)
    back = lax.all_to_all(rows, axes, 0, 0, tiled=True)
    return back[owner, slot].reshape(*ids.shape, shard.shape[1])


def _sparse_embedding(ids, weight, *, padding_idx):
    """Rows of ``weight`` picked by ``ids``, the table split by rows over the mesh's batch axes
    (see the module doc); the ``padding_idx`` row reads as zeros and gets no gradient."""
    axes = batch_axes()
    if not axes or ids.ndim == 0:
        return _embedding(ids, weight, padding_idx=padding_idx)
    mesh = jax.sharding.get_abstract_mesh()
    devices = math.prod(mesh.shape[a] for a in axes)
    if weight.shape[0] % devices:
        raise ValueError(f"sparse_embedding: a table of {weight.shape[0]} rows does not split evenly over the "
                         f"{devices} devices of mesh axes {axes}")
    if ids.shape[0] % devices:
        raise ValueError(f"sparse_embedding: a batch of {ids.shape[0]} rows of ids does not split evenly over the "
                         f"{devices} devices of mesh axes {axes}")
    out = jax.shard_map(lambda i, w: _lookup(i, w, axes), in_specs=(P(axes), P(axes)), out_specs=P(axes),
                        axis_names=set(axes))(laid_out(ids, P(axes)), laid_out(weight, P(axes)))
    return mask_padding("sparse_embedding", ids, out, weight.shape[0], padding_idx)

sparse_embedding = define(
    "sparse_embedding", _sparse_embedding,
    inputs=[Input("ids", dtype="int"), Input("weight", rank=2, dtype="float")],
    attrs={"padding_idx": Attr("int", None, optional=True)},
    traits=Traits(channels="produced", channel_axis=lambda attrs, rank: rank - 1, batch_coupled=True))
