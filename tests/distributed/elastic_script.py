"""ZeRO-2 training that checkpoints every 2 steps and resumes from its checkpoint on whatever
number of processes and devices it is started with.

    python elastic_script.py CKPT OUT.npz [--stop-at K] [--crash-at K]      # one process, 4 devices
    paddlejax launch [--elastic] --nproc N --devices-per-proc D elastic_script.py CKPT OUT.npz ...

``--stop-at K`` ends training after step K (a checkpoint is saved as it ends); ``--crash-at K``
kills rank 1 at step K on the first start of an elastic run (``PADDLEJAX_RESTART_COUNT`` 0).
Each process feeds its own rows of each global batch of 24. Process 0 writes the parameters it
resumed with (``resumed.*``, when it resumed), the final parameters and the last step to OUT.npz.
"""
import os
import sys

import jax

from paddlejax.distributed import Strategy, env, fleet

if env.COORDINATOR not in os.environ:
    jax.config.update("jax_num_cpu_devices", 4)
fleet.init()

import numpy as np  # noqa: E402
import optax  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402
from paddlejax.train.callbacks import Callback  # noqa: E402
from paddlejax.train.placement import host_copy  # noqa: E402

BATCH, STEPS = 24, 6


class Interrupt(Callback):
    """Records the parameters training resumed from; stops or kills the run at a step."""

    def __init__(self, stop_at, crash_at):
        self.stop_at, self.crash_at, self.resumed = stop_at, crash_at, None

    def on_train_batch_end(self, trainer, step):
        if step == self.crash_at and jax.process_index() == 1 and os.environ.get(env.RESTART_COUNT) == "0":
            os._exit(7)  # killed mid-run: no checkpoint of its own
        if step == self.stop_at:
            trainer.stop_training = True


class Resumed(Callback):
    """After the Checkpointing callback's ``on_train_begin`` (installed before this one)."""

    def __init__(self):
        self.params, self.step = None, None

    def on_train_begin(self, trainer):
        if trainer.state is not None and int(trainer.state.step) > 0:
            self.step = int(trainer.state.step)
            self.params = whole_params(trainer)


def whole_params(trainer) -> dict:
    return {n: np.asarray(host_copy(v)) for n, v in trainer.step_builder.params(trainer.state.params).items()}


def rows():
    """This process's rows of every global batch, in step order."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 4)).astype(np.float32)
    y = np.tanh(x @ np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2))
    share = BATCH // jax.process_count()
    mine = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[jax.process_index() * share:][:share]
                           for s in range(STEPS)])
    return x[mine], y[mine], share


def main(ckpt, out, stop_at=None, crash_at=None):
    nn.seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    interrupt, resumed = Interrupt(stop_at, crash_at), Resumed()
    trainer = pj.Trainer(model, optax.adam(0.05), loss="mse", progress=False, checkpoint_dir=ckpt,
                         checkpoint_every=2, strategy=Strategy(sharding={"stage": 2}), callbacks=[interrupt])
    x, y, share = rows()
    trainer.callbacks.append(resumed)
    trainer.fit((x, y), epochs=1, batch_size=share, shuffle=False)
    params = whole_params(trainer)
    if jax.process_index() == 0:
        extra = {f"resumed.{n}": v for n, v in (resumed.params or {}).items()}
        np.savez(out, step=int(trainer.state.step), resumed_step=resumed.step or 0, **params, **extra)


if __name__ == "__main__":
    argv = sys.argv[1:]
    option = lambda name: int(argv[argv.index(name) + 1]) if name in argv else None  # noqa: E731
    main(argv[0], argv[1], option("--stop-at"), option("--crash-at"))
