"""What a training run logs: a history of scalars, TensorBoard event files and a curves plot,
and the callbacks that write them during ``fit`` (:class:`HistoryLogger`, :class:`PlotCurves`).

>>> h = History()
>>> h.log("train", 1, {"loss": 2.0}); h.log("train", 2, {"loss": 1.0}); h.log("eval", 2, {"loss": 1.5})
>>> h.series("train", "loss")
([1, 2], [2.0, 1.0])
"""
from __future__ import annotations

import collections
import math
import os

from paddlejax._extras import new_figure, require
from paddlejax.train.callbacks import Callback
from paddlejax.train.state import learning_rate


class History:
    """Scalars by phase (``"train"``, ``"eval"``, ``"epoch"``) and name, each a list of (step, value)."""

    def __init__(self):
        self.records: dict[str, dict[str, list[tuple[int, float]]]] = collections.defaultdict(
            lambda: collections.defaultdict(list))

    def log(self, phase: str, step: int, values: dict) -> None:
        for name, value in values.items():
            self.records[phase][name].append((int(step), float(value)))

    def series(self, phase: str, name: str) -> tuple[list[int], list[float]]:
        pairs = self.records.get(phase, {}).get(name, [])
        return [s for s, _ in pairs], [v for _, v in pairs]

    def last(self, phase: str, name: str) -> float | None:
        pairs = self.records.get(phase, {}).get(name)
        return pairs[-1][1] if pairs else None

    def plot(self, path: str) -> str:
        """Write one panel per metric (train and eval curves over steps) to a PNG at ``path``."""
        fig = new_figure("History.plot")  # first: without matplotlib the error names the extra
        names = sorted({n for phase in ("train", "eval") for n in self.records.get(phase, {})} - {"lr"})
        if not names:
            raise ValueError("History.plot: nothing has been logged yet")
        cols = min(len(names), 3)
        rows = math.ceil(len(names) / cols)
        fig.set_size_inches(4.5 * cols, 3.4 * rows)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax, name in zip(axes.flat, names):
            for phase, style in (("train", "-"), ("eval", "o-")):
                steps, values = self.series(phase, name)
                if steps:
                    ax.plot(steps, values, style, label=phase, markersize=3)
            ax.set_title(name)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend()
        for ax in list(axes.flat)[len(names):]:
            ax.axis("off")
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        return path


class TensorBoard:
    """Scalars as TensorBoard event files under ``log_dir`` (tags ``phase/name``), via tensorboardX."""

    def __init__(self, log_dir: str):
        tensorboardX = require("tensorboardX", extra="plot", feature="pj.train.TensorBoard")
        self.writer = tensorboardX.SummaryWriter(log_dir)

    def log(self, phase: str, step: int, values: dict) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"{phase}/{name}", float(value), int(step))

    def close(self) -> None:
        self.writer.close()


class HistoryLogger(Callback):
    """Logs a run into ``history`` (and ``tensorboard`` when given): the training logs with the
    learning rate at every logged step (phase ``"train"``), each evaluation (``"eval"``, at the
    step it ran after) and each epoch's summary (``"epoch"``, by epoch). The Trainer installs
    one for its :attr:`~paddlejax.Trainer.history` (and ``log_dir``).

    >>> class Run: step = 3
    >>> logger = HistoryLogger(History())
    >>> logger.on_eval_end(Run(), {"eval_loss": 0.5}); logger.history.series("eval", "loss")
    ([3], [0.5])
    """

    def __init__(self, history: History, tensorboard: TensorBoard | None = None):
        self.history, self.tensorboard = history, tensorboard

    def _log(self, phase: str, step: int, values: dict) -> None:
        self.history.log(phase, step, values)
        if self.tensorboard is not None:
            self.tensorboard.log(phase, step, values)

    def on_step_end(self, trainer, step, logs):
        lr = learning_rate(trainer.state.opt)
        self._log("train", step, logs if lr is None else {**logs, "lr": lr})

    def on_eval_end(self, trainer, logs):
        self._log("eval", trainer.step, {k.removeprefix("eval_"): v for k, v in logs.items()})

    def on_epoch_end(self, trainer, epoch, logs):
        self.history.log("epoch", epoch, logs)


class PlotCurves(Callback):
    """Redraws the training curves (:meth:`History.plot` of the trainer's history) into the PNG
    at ``path`` after every epoch, so a long run can be watched from a file viewer.

    >>> PlotCurves("runs/curves.png").path
    'runs/curves.png'
    """

    def __init__(self, path: str = "curves.png"):
        self.path = path

    def on_epoch_end(self, trainer, epoch, logs):
        trainer.history.plot(self.path)
