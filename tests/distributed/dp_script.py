"""Distributed training of a tiny model with ``fleet`` and the Trainer, over every device of
every process: data parallel, or (``--pipeline``) a 4-stage pipeline.

    python dp_script.py OUT.npz [--pipeline]              # one process, 8 CPU devices
    paddlejax launch --nproc 2 --devices-per-proc 4 dp_script.py OUT.npz [--pipeline]

Data parallel: each process feeds the Trainer only its own rows of the global batch (as a data
loader per rank would); the step averages the gradients over all of them, evaluation sums the
loss over all of them, and prediction returns the process's own rows. Pipeline: the stages span
the processes, and every process feeds the whole batch. Process 0 writes the final parameters,
the evaluation loss and its predictions to OUT.npz.
"""
import os
import sys

import jax

from paddlejax.distributed import Strategy, env, fleet

if env.COORDINATOR not in os.environ:
    jax.config.update("jax_num_cpu_devices", 8)  # outside a launch: 8 host devices in one process
fleet.init()  # joins the launched run: before any JAX work

import numpy as np  # noqa: E402
import optax  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402

BATCH, FEATURES, STEPS = 32, 4, 5
STRATEGIES = {"data": Strategy(fuse_all_reduce=True),
              "pipeline": Strategy(pipeline={"stages": 4, "micro_batches": 4})}


def data():
    """The global batch: every process can make it."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = np.tanh(x @ np.linspace(-1, 1, 2 * FEATURES, dtype=np.float32).reshape(FEATURES, 2))
    return x, y


def train(parallel: str = "data") -> dict:
    """``STEPS`` Adam steps of an MLP (two layers; four for the pipeline) on the global batch;
    then the parameters, the evaluation loss and this process's predictions."""
    nn.seed(0)
    hidden = [nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh()] if parallel == "pipeline" else []
    model = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), *hidden, nn.Linear(8, 2))
    trainer = pj.Trainer(model, optax.adam(0.05), loss="mse", progress=False, strategy=STRATEGIES[parallel])
    x, y = data()
    if parallel == "data":
        rows = BATCH // jax.process_count()
        mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        x, y = x[mine], y[mine]
    for _ in range(STEPS):
        trainer.train_batch((x,), y)
    trainer.sync_model()
    results = {name: np.asarray(value) for name, value in pj.nn.weights.state_dict(model).items()}
    results["eval_loss"] = trainer.evaluate((x, y), batch_size=len(x) // 2)["loss"]
    results["predictions"] = trainer.predict(x, batch_size=len(x) // 2)
    return results


if __name__ == "__main__":
    print(f"process {jax.process_index()} of {jax.process_count()}: "
          f"{jax.local_device_count()} local devices, {fleet.mesh().size} in the mesh; "
          f"GPU ids if any: {env.local_device_ids()}")
    results = train("pipeline" if "--pipeline" in sys.argv else "data")
    if jax.process_index() == 0:
        np.savez(sys.argv[1], **results)
