"""The epoch loop of ``Trainer.fit``: steps over the training data, evaluations, and the
callbacks' hooks around them (the Trainer's own logging, progress and checkpoint callbacks
first, then the user's).

>>> import numpy as np, optax, paddlejax as pj
>>> from flax import nnx
>>> from paddlejax.train import LambdaCallback
>>> x, y = np.ones((8, 4), "float32"), np.zeros(8, "int32")
>>> seen = []
>>> hooks = {f"on_{h}": (lambda h: lambda trainer, *args: seen.append(h))(h)
...          for h in ("train_begin", "epoch_begin", "step_end", "train_batch_end", "eval_end", "epoch_end",
...                    "train_end")}
>>> trainer = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), progress=False,
...                      callbacks=[LambdaCallback(**hooks)], log_every=2)
>>> _ = trainer.fit((x, y), eval=(x, y), epochs=1, batch_size=4)
>>> seen
['train_begin', 'epoch_begin', 'train_batch_end', 'step_end', 'train_batch_end', 'eval_end', 'epoch_end', 'train_end']
"""
from __future__ import annotations

import time
import warnings

from paddlejax.train import checkpointing
from paddlejax.train import metrics as metrics_lib
from paddlejax.train.callbacks import Callback
from paddlejax.train.history import HistoryLogger
from paddlejax.train.progress import ProgressBar


class FitLoop:
    """One ``fit`` call of ``trainer``: ``epochs`` over ``loader``, evaluating on ``eval_loader``
    after the first epoch and every ``eval_freq`` epochs from there (and every ``eval_every``
    steps if set), checkpointing every ``save_freq`` epochs. It runs the trainer's own step
    (``_run_step``, with the running metric sums) rather than ``train_batch``, which would wait
    for every step's loss."""

    def __init__(self, trainer, loader, eval_loader, epochs: int, eval_every: int | None, eval_freq: int,
                 save_freq: int):
        self.trainer, self.loader, self.eval_loader, self.epochs = trainer, loader, eval_loader, epochs
        self.eval_every, self.eval_freq = eval_every, eval_freq
        self.installed = self._installed(save_freq)

    def _installed(self, save_freq: int) -> list[Callback]:
        """The trainer's own callbacks for this run, from its arguments: logs, progress, checkpoints."""
        t = self.trainer
        installed: list[Callback] = [HistoryLogger(t.history, t.tensorboard)]
        if t.progress:
            installed.append(ProgressBar(self.loader, self.epochs, bar=t.progress is True))
        if t.checkpoints is not None:
            installed.append(checkpointing.Checkpointing(t.checkpoints, self.loader, save_freq, t.resume))
        return installed

    def call(self, hook: str, *args) -> None:
        """Call ``hook`` on every callback, the installed ones first."""
        for cb in [*self.installed, *self.trainer.callbacks]:
            getattr(cb, hook)(self.trainer, *args)

    def run(self) -> None:
        t = self.trainer
        t.stop_training = False
        try:
            self.call("on_train_begin")
            if t.epoch >= self.epochs:  # after an earlier fit, or resumed from a finished run
                warnings.warn(f"Trainer.fit: epochs={self.epochs} is the epoch to train up to, and this trainer is at "
                              f"epoch {t.epoch} already: nothing to train; pass epochs={t.epoch + self.epochs} "
                              f"to train {self.epochs} more", stacklevel=3)
            while t.epoch < self.epochs and not t.stop_training:
                self._epoch()
        finally:
            if t.checkpoints is not None:
                t.checkpoints.wait()  # a save under way is made durable even when training fails
            t.sync_model()
        self.call("on_train_end")

    def _epoch(self) -> None:
        t, loader = self.trainer, self.loader
        epoch = t.epoch
        self.call("on_epoch_begin", epoch)
        start = loader.state_dict().get("position", 0) if hasattr(loader, "state_dict") else 0
        sums, tic = None, time.perf_counter()
        for i, batch in enumerate(loader, start=start):
            inputs, labels = t._split(batch)
            t.build(*inputs)
            sums = t._zero_sums(inputs, labels) if sums is None else sums
            t.state, sums, loss, _ = t._run_step(sums, inputs, labels)
            step = t.step
            if (i + 1) % t.log_every == 0 or i + 1 == len(loader):
                logs = {"loss": float(loss), **metrics_lib.results(t.metrics, sums)}
                logs.pop("loss_avg", None)
                self.call("on_step_end", step, logs)
            if self.eval_loader is not None and self.eval_every and step % self.eval_every == 0:
                self._evaluate()
            self.call("on_train_batch_end", step)
            if t.stop_training:
                break
        else:
            t.epoch += 1
        logs = {**metrics_lib.results(t.metrics, sums), "time": time.perf_counter() - tic} if sums else {}
        if self.eval_loader is not None and t.epoch > epoch and epoch % self.eval_freq == 0:
            logs.update(self._evaluate())
        self.call("on_epoch_end", epoch, logs)

    def _evaluate(self) -> dict:
        logs = {f"eval_{k}": v for k, v in self.trainer.evaluate(self.eval_loader).items()}
        self.call("on_eval_end", logs)
        return logs
