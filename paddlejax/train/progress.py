"""What a person watching ``fit`` sees: a progress bar per epoch and a line per epoch, as
Paddle's ``Model.fit`` prints them.

>>> class Run: pass
>>> lines = ProgressBar(loader=[], epochs=2, bar=False)
>>> lines.on_epoch_end(Run(), 0, {"loss": 0.41234, "acc": 0.875, "time": 1.23})
epoch 1/2: loss=0.4123 acc=0.875 (1.2 s)
"""
from __future__ import annotations

from paddlejax.train.callbacks import Callback


def shown(logs: dict) -> dict[str, str]:
    """Logged numbers as a progress bar or an epoch line shows them (4 significant digits).

    >>> shown({"loss": 0.123456})
    {'loss': '0.1235'}
    """
    return {k: f"{v:.4g}" for k, v in logs.items()}


class ProgressBar(Callback):
    """A tqdm bar per epoch over the batches of ``loader`` (with ``bar``), its postfix the latest
    logs and evaluation, and after every epoch a line ``epoch 1/5: loss=0.41 acc=0.88
    eval_loss=0.37 eval_acc=0.9 (1.2 s)``. A bar resumed mid-epoch starts at the loader's
    position. The Trainer installs one for each ``fit`` with ``progress`` True or ``"epoch"``."""

    def __init__(self, loader, epochs: int, bar: bool = True):
        self.loader, self.epochs, self.show_bar = loader, epochs, bar
        self.bar = None
        self.logs: dict = {}  # the latest logged step's
        self.eval_logs: dict = {}  # the latest evaluation's

    def on_epoch_begin(self, trainer, epoch):
        if not self.show_bar:
            return
        from tqdm.auto import tqdm

        start = self.loader.state_dict().get("position", 0) if hasattr(self.loader, "state_dict") else 0
        self.bar = tqdm(total=len(self.loader), initial=start, desc=f"epoch {epoch + 1}/{self.epochs}", unit="step",
                        dynamic_ncols=True)

    def on_step_end(self, trainer, step, logs):
        self.logs = logs
        self._postfix()

    def on_train_batch_end(self, trainer, step):
        if self.bar is not None:
            self.bar.update(1)

    def on_eval_end(self, trainer, logs):
        self.eval_logs = logs

    def on_epoch_end(self, trainer, epoch, logs):
        if self.bar is not None:
            self._postfix()
            self.bar.close()
            self.bar = None
        if logs:
            text = " ".join(f"{k}={v}" for k, v in shown(logs).items() if k != "time")
            print(f"epoch {epoch + 1}/{self.epochs}: {text} ({logs.get('time', 0.0):.1f} s)", flush=True)

    def _postfix(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix(shown({**self.logs, **self.eval_logs}), refresh=False)
