"""A small training run for the resume test: ``python resume_run.py OUT.npz [CHECKPOINT_DIR]``.

Prints ``step N`` after every step (slowed down so a test can kill it mid-run) and saves the
final parameters and state to OUT.npz.
"""
import sys
import time

import numpy as np
import optax

import paddlejax as pj
from paddlejax.train import LambdaCallback


def model():
    pj.nn.seed(0)
    return pj.nn.Sequential(pj.nn.Linear(64, 32), pj.nn.BatchNorm1D(32), pj.nn.ReLU(), pj.nn.Dropout(0.3),
                            pj.nn.Linear(32, 10))


def main(out, checkpoint_dir=None):
    data = pj.data.Digits("train", layout="NCHW")
    x, y = data.images.reshape(len(data), -1), data.labels

    def tick(trainer, step, logs):
        print(f"step {step}", flush=True)
        time.sleep(0.05)

    trainer = pj.Trainer(model(), optax.adam(1e-3), metrics=["accuracy"], ema=0.9, progress=False, log_every=1,
                         callbacks=[LambdaCallback(on_step_end=tick)], checkpoint_dir=checkpoint_dir,
                         checkpoint_every=4, keep_checkpoints=2)
    trainer.fit((x, y), epochs=2, batch_size=128, shuffle=True, seed=3)
    state = pj.train.trainer.jax.tree_util.tree_flatten_with_path(trainer.state)[0]
    np.savez(out, **{pj.train.trainer.jax.tree_util.keystr(p): np.asarray(v) for p, v in state})


if __name__ == "__main__":
    main(*sys.argv[1:])
