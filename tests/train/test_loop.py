"""The fit loop: which hooks fire, in which order, and the Trainer's own callbacks before the user's."""
from __future__ import annotations

import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax.train import LambdaCallback
from paddlejax.train.checkpointing import Checkpointing
from paddlejax.train.history import HistoryLogger
from paddlejax.train.loop import FitLoop
from paddlejax.train.progress import ProgressBar

HOOKS = ("train_begin", "epoch_begin", "step_end", "train_batch_end", "eval_end", "epoch_end", "train_end")


def recorder(seen: list) -> LambdaCallback:
    return LambdaCallback(**{f"on_{h}": (lambda h: lambda trainer, *args: seen.append((h, *args)))(h)
                             for h in HOOKS})


def data(n=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def trainer(**kw):
    kw.setdefault("progress", False)
    return pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), **kw)


def test_hooks_fire_in_order_with_their_arguments():
    seen = []
    t = trainer(callbacks=[recorder(seen)], log_every=2)
    t.fit(data(), eval=data(), epochs=2, batch_size=8, eval_every=3)  # 4 steps an epoch
    names = [event[0] for event in seen]
    epoch = ["epoch_begin", "train_batch_end", "step_end", "train_batch_end", "eval_end", "train_batch_end",
             "step_end", "train_batch_end"]
    assert names == ["train_begin", *epoch, "eval_end", "epoch_end",
                     *["epoch_begin", "train_batch_end", "step_end", "eval_end", "train_batch_end",
                       "train_batch_end", "step_end", "train_batch_end", "eval_end", "epoch_end"],
                     "train_end"]
    assert [args for name, *args in seen if name == "train_batch_end"] == [[s] for s in range(1, 9)]
    assert [args[0] for name, *args in seen if name == "step_end"] == [2, 4, 6, 8]
    epoch_ends = [args for name, *args in seen if name == "epoch_end"]
    assert [e for e, _ in epoch_ends] == [0, 1]
    assert sorted(epoch_ends[0][1]) == ["eval_loss", "loss", "time"]


def test_the_trainers_own_callbacks_come_from_its_arguments_and_run_before_the_users(tmp_path):
    loop = FitLoop(trainer(checkpoint_dir=str(tmp_path), progress="epoch"), loader=[], eval_loader=None,
                   epochs=1, eval_every=None, eval_freq=1, save_freq=1)
    assert [type(cb) for cb in loop.installed] == [HistoryLogger, ProgressBar, Checkpointing]
    assert [type(cb) for cb in FitLoop(trainer(), [], None, 1, None, 1, 1).installed] == [HistoryLogger]
    # so a user's hook already finds the step in the history
    logged = []
    t = trainer(log_every=1, callbacks=[LambdaCallback(
        on_step_end=lambda tr, step, logs: logged.append(tr.history.last("train", "loss") == logs["loss"]))])
    t.fit(data(), epochs=1, batch_size=8)
    assert logged == [True] * 4
