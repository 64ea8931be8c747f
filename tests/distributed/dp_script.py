"""Data-parallel training of a tiny model with ``fleet`` and the Trainer, over every device of
every process.

    python dp_script.py OUT.npz              # one process, 8 CPU devices
    paddlejax launch --nproc 2 --devices-per-proc 4 dp_script.py OUT.npz

Each process feeds the Trainer only its own rows of the global batch (as a data loader per rank
would); the step averages the gradients over all of them, evaluation sums the loss over all of
them. Process 0 writes the final parameters, the evaluation loss and the predictions for its own
rows to OUT.npz.
"""
import os
import sys

import jax

from paddlejax.distributed import Strategy, env, fleet

if env.COORDINATOR not in os.environ:
    jax.config.update("jax_num_cpu_devices", 8)  # outside a launch: 8 host devices in one process
STRATEGY = Strategy(fuse_all_reduce=True)
fleet.init(STRATEGY)  # joins the launched run: before any JAX work

import numpy as np  # noqa: E402
import optax  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402

BATCH, FEATURES, STEPS = 32, 4, 5


def data():
    """The global batch: every process can make it, but feeds only its own rows."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = np.tanh(x @ np.linspace(-1, 1, 2 * FEATURES, dtype=np.float32).reshape(FEATURES, 2))
    return x, y


def train() -> dict:
    """``STEPS`` Adam steps of a two-layer MLP on the global batch, with ``STRATEGY``; then the
    parameters, the evaluation loss and this process's predictions."""
    nn.seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 2))
    trainer = pj.Trainer(model, optax.adam(0.05), loss="mse", progress=False, strategy=STRATEGY)
    rows = BATCH // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    x, y = (a[mine] for a in data())
    for _ in range(STEPS):
        trainer.train_batch((x,), y)
    trainer.sync_model()
    results = {name: np.asarray(value) for name, value in pj.nn.weights.state_dict(model).items()}
    results["eval_loss"] = trainer.evaluate((x, y), batch_size=rows // 2)["loss"]
    results["predictions"] = trainer.predict(x, batch_size=rows // 2)
    return results


if __name__ == "__main__":
    print(f"process {jax.process_index()} of {jax.process_count()}: "
          f"{jax.local_device_count()} local devices, {fleet.mesh().size} in the mesh; "
          f"GPU ids if any: {env.local_device_ids()}")
    params = train()
    if jax.process_index() == 0:
        np.savez(sys.argv[1], **params)
