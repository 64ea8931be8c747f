"""The progress bar and the epoch lines a person watching fit sees."""
from __future__ import annotations

from paddlejax.train.progress import ProgressBar, shown


class Loader(list):
    """A training loader resumed at its third batch."""

    def state_dict(self):
        return {"position": 2}


def test_the_bar_starts_at_the_loaders_position_and_shows_the_latest_logs(capsys):
    bar = ProgressBar(Loader(range(5)), epochs=3)
    bar.on_epoch_begin(None, 1)
    bar.on_step_end(None, 3, {"loss": 0.5})
    bar.on_eval_end(None, {"eval_acc": 0.75})
    bar.on_train_batch_end(None, 3)
    assert (bar.bar.n, bar.bar.total, bar.bar.desc) == (3, 5, "epoch 2/3")
    bar.on_epoch_end(None, 1, {"loss": 0.5, "eval_acc": 0.75, "time": 2.0})
    out, err = capsys.readouterr()
    assert "loss=0.5, eval_acc=0.75" in err
    assert out == "epoch 2/3: loss=0.5 eval_acc=0.75 (2.0 s)\n"


def test_epoch_lines_alone_and_numbers_to_four_digits(capsys):
    lines = ProgressBar(Loader(), epochs=1, bar=False)
    lines.on_epoch_begin(None, 0)
    assert lines.bar is None
    lines.on_epoch_end(None, 0, {})  # an epoch that ran no step prints nothing
    assert capsys.readouterr().out == ""
    assert shown({"loss": 1234.5678, "acc": 0.9}) == {"loss": "1235", "acc": "0.9"}
