"""Callbacks: hooks the Trainer calls at the start and end of training, epochs, steps and
evaluations, with the latest logs (``{"loss": ..., "eval_acc": ...}``).

During ``fit`` the Trainer calls its own callbacks first, in this order: logging to the history
and TensorBoard (:class:`~paddlejax.train.history.HistoryLogger`), the progress bar
(:class:`~paddlejax.train.progress.ProgressBar`) and checkpoints
(:class:`~paddlejax.train.checkpointing.Checkpointing`); then the ``callbacks`` it was given.

>>> seen = []
>>> cb = LambdaCallback(on_epoch_end=lambda trainer, epoch, logs: seen.append(epoch))
>>> cb.on_epoch_end(None, 0, {}); seen
[0]
"""
from __future__ import annotations

import math


class Callback:
    """Override any of the hooks; each gets the trainer first."""

    def on_train_begin(self, trainer) -> None: ...

    def on_train_end(self, trainer) -> None: ...

    def on_epoch_begin(self, trainer, epoch: int) -> None: ...

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None: ...

    def on_step_end(self, trainer, step: int, logs: dict) -> None:
        """Every ``log_every`` steps (and at an epoch's last), with the step's logs."""

    def on_train_batch_end(self, trainer, step: int) -> None:
        """After every step, logged or not (and after the evaluation ``eval_every`` asks for)."""

    def on_eval_end(self, trainer, logs: dict) -> None: ...


class LambdaCallback(Callback):
    """A callback from functions: ``LambdaCallback(on_step_end=lambda trainer, step, logs: ...)``."""

    def __init__(self, **hooks):
        unknown = set(hooks) - {n for n in dir(Callback) if n.startswith("on_")}
        if unknown:
            raise ValueError(f"LambdaCallback: unknown hook(s) {sorted(unknown)}")
        for name, fn in hooks.items():
            setattr(self, name, fn)


class _Monitor(Callback):
    """Shared by callbacks that watch one logged value for improvement."""

    def __init__(self, monitor: str, mode: str, min_delta: float):
        if mode not in ("min", "max", "auto"):
            raise ValueError(f"mode expects 'min', 'max' or 'auto', got {mode!r}")
        if mode == "auto":
            mode = "min" if "loss" in monitor or "ppl" in monitor else "max"
        self.monitor, self.mode, self.min_delta = monitor, mode, abs(min_delta)
        self.best = math.inf if mode == "min" else -math.inf

    def improved(self, logs: dict) -> bool:
        if self.monitor not in logs:
            raise KeyError(f"{type(self).__name__}: '{self.monitor}' is not logged; available: {sorted(logs)}")
        value = logs[self.monitor]
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best = value
        return better


class EarlyStopping(_Monitor):
    """Stop training when ``monitor`` has not improved for ``patience`` evaluations.

    >>> class T: stop_training = False
    >>> es, t = EarlyStopping("eval_loss", patience=1), T()
    >>> for loss in (1.0, 0.5, 0.6, 0.7):
    ...     es.on_eval_end(t, {"eval_loss": loss})
    >>> t.stop_training, es.best
    (True, 0.5)
    """

    def __init__(self, monitor: str = "eval_loss", patience: int = 3, mode: str = "auto", min_delta: float = 0.0):
        super().__init__(monitor, mode, min_delta)
        self.patience, self.wait = patience, 0

    def on_eval_end(self, trainer, logs):
        if self.improved(logs):
            self.wait = 0
            return
        self.wait += 1
        if self.wait > self.patience:
            trainer.stop_training = True


class BestModel(_Monitor):
    """Save the model whenever ``monitor`` improves: a program + weights (``pj.save``) at ``path``
    that ``pj.load`` runs without the model's code, and beside them ``<path>.best.json`` with the
    monitored value and the step (:attr:`meta_path`).

    >>> import os
    >>> BestModel("out/best").meta_path.replace(os.sep, "/")
    'out/best.best.json'
    """

    def __init__(self, path: str, monitor: str = "eval_acc", mode: str = "auto", min_delta: float = 0.0):
        from paddlejax.io import _paths

        super().__init__(monitor, mode, min_delta)
        self.path = path
        self.meta_path = str(_paths(path)[0].with_suffix(".best.json"))
        self.saved_step: int | None = None

    def on_eval_end(self, trainer, logs):
        if not self.improved(logs):
            return
        import json

        from paddlejax.io import save

        save(trainer.inference_program(), self.path)
        self.saved_step = trainer.step
        with open(self.meta_path, "w") as f:
            json.dump({"monitor": self.monitor, "value": self.best, "step": trainer.step}, f)
