"""Moving a training state between devices and the host, in one process or several: what a
checkpoint writes (every array whole, on this host) and how it is put back (each array laid out
as the running step lays it out, whatever the layout it was saved from).

In a multi-process run an array may be spread over processes: :func:`host_copy` gathers it (a
collective: every process calls it, in the same order), and :func:`place_like` puts a whole
array back as each process's shards.

>>> import jax.numpy as jnp, numpy as np
>>> old = jnp.zeros(3)
>>> place_like(np.arange(3.0, dtype=np.float32), old).tolist()
[0.0, 1.0, 2.0]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def host_copy(leaf):
    """``leaf`` whole on this host: as it is when this process holds all of it, its local copy
    when every device holds all of it, else gathered from every process."""
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
        return leaf
    if leaf.sharding.is_fully_replicated:
        return leaf.addressable_shards[0].data
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(leaf, tiled=True)


def place_like(value, old):
    """``value`` (a whole array: NumPy or on one device) placed as ``old`` is: sharded like it
    over this process's devices, or, spread over several processes, as this process's shards
    of it; on one device, uncommitted, so that jit may pair it with sharded arrays."""
    if not isinstance(old, jax.Array):
        return value
    if old.is_fully_addressable:
        if len(old.sharding.device_set) > 1:
            return jax.device_put(value, old.sharding)
        return value if _is_key(value) else jnp.asarray(np.asarray(value))
    if _is_key(old):
        data = place_like(np.asarray(jax.random.key_data(value)), jax.random.key_data(old))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(old))
    whole = np.asarray(value)
    return jax.make_array_from_callback(old.shape, old.sharding, lambda index: whole[index])


def require_pinned_host(owner: str, device=None) -> None:
    """Raise ``ValueError`` in the name of ``owner`` unless ``device`` (default: the first) has
    ``pinned_host`` memory, the host memory offloading places arrays in."""
    device = device or jax.devices()[0]
    kinds = {m.kind for m in device.addressable_memories()}
    if "pinned_host" not in kinds:
        raise ValueError(f"{owner}: the {device.platform} backend has no pinned_host memory to offload to "
                         f"(its memories: {', '.join(sorted(kinds))})")
