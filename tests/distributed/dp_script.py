"""Data-parallel SGD of a tiny linear model over every device of every process.

    python dp_script.py OUT.npz              # one process, 8 CPU devices
    paddlejax launch --nproc 2 --devices-per-proc 4 dp_script.py OUT.npz

Each process feeds only its own slice of the global batch; gradients are summed over the
"dp" mesh axis. Process 0 writes the final parameters to OUT.npz.
"""
import sys

from paddlejax.distributed.env import init_from_env

if init_from_env() is None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

BATCH, FEATURES, STEPS, LR = 32, 4, 5, 0.1


def data():
    """The global batch: every process can make it, but feeds only its own rows."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = x @ np.arange(1, FEATURES + 1, dtype=np.float32)[:, None] + 0.5
    return x, y


def train(mesh: Mesh) -> dict:
    """``STEPS`` SGD steps of ``y = x @ w + b`` on the global batch, data parallel over ``mesh``."""
    def local_step(params, x, y):
        # varying copies: differentiating the replicated parameters would already sum over "dp"
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "dp", to="varying"), params)
        grads = jax.grad(lambda p: jnp.sum((x @ p["w"] + p["b"] - y) ** 2) / BATCH)(local)
        grads = jax.lax.psum(grads, "dp")
        return jax.tree.map(lambda p, g: p - LR * g, params, grads)

    step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=P()))
    rows = NamedSharding(mesh, P("dp"))
    per_process = BATCH // jax.process_count()
    mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
    x, y = (jax.make_array_from_process_local_data(rows, a[mine], a.shape) for a in data())
    params = jax.device_put({"w": np.zeros((FEATURES, 1), np.float32), "b": np.zeros((1,), np.float32)},
                            NamedSharding(mesh, P()))
    for _ in range(STEPS):
        params = step(params, x, y)
    return {k: np.asarray(v) for k, v in params.items()}


if __name__ == "__main__":
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    print(f"process {jax.process_index()} of {jax.process_count()}: "
          f"{jax.local_device_count()} local devices, {mesh.size} in the mesh")
    params = train(mesh)
    if jax.process_index() == 0:
        np.savez(sys.argv[1], **params)
