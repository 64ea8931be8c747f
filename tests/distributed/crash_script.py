"""Rank 1 raises after joining the run; the other ranks block in a collective waiting for it.

    paddlejax launch --nproc 2 crash_script.py
"""
import numpy as np

from paddlejax.distributed.env import init_from_env

process_id, _ = init_from_env()

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if process_id == 1:
    raise RuntimeError("rank 1 cannot read its shard")
mesh = Mesh(np.array(jax.devices()), ("dp",))
local = np.ones((jax.local_device_count(),), np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("dp")), local, (mesh.size,))
print("sum", float(x.sum()))  # never: rank 1 does not take part
