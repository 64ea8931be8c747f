"""History, TensorBoard and the callbacks that log a run into them."""
from __future__ import annotations

import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax.train.history import History, HistoryLogger, PlotCurves


def test_the_logger_records_steps_with_the_learning_rate_evaluations_and_epochs():
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.1, 0.0, 8))
    t = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), tx, metrics=["accuracy"], progress=False, log_every=2)
    history = t.fit((x, y), eval=(x, y), epochs=2, batch_size=8)
    assert history is t.history
    steps, rates = history.series("train", "lr")
    assert steps == [2, 4, 6, 8]
    np.testing.assert_allclose(rates, [0.0875, 0.0625, 0.0375, 0.0125], rtol=1e-6)  # the rate each step used
    assert sorted(history.records["train"]) == ["acc", "loss", "lr"]
    assert history.series("eval", "acc")[0] == [4, 8]  # by the step the evaluation followed
    assert sorted(history.records["epoch"]) == ["acc", "eval_acc", "eval_loss", "loss", "time"]
    assert history.series("epoch", "loss")[0] == [0, 1]


def test_the_logger_strips_the_eval_prefix_and_plot_curves_draws_the_history(tmp_path):
    class Run:
        step = 5
        history = History()

    logger = HistoryLogger(Run.history)
    logger.on_eval_end(Run, {"eval_loss": 0.25, "eval_acc": 0.5})
    assert Run.history.series("eval", "acc") == ([5], [0.5])
    png = tmp_path / "curves.png"
    PlotCurves(str(png)).on_epoch_end(Run, 0, {})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
