"""pj.Model (Paddle's ``paddle.Model``) over the Trainer, and pj.summary, on the digits data."""
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax import nn


@pytest.fixture(scope="module")
def digits():
    return pj.data.Digits("train"), pj.data.Digits("test")


def model(seed=0):
    nn.seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1D(32), nn.ReLU(), nn.Linear(32, 10))
    return pj.Model(net, inputs=pj.InputSpec((-1, 1, 8, 8)), labels=pj.InputSpec((-1,), "int32"))


def test_prepare_fit_evaluate_predict_run_on_the_trainer(digits, capsys):
    train, test = digits
    m = model()
    m.prepare(optax.adam(0.01), "cross_entropy", metrics=["accuracy"])
    m.fit(train, test, batch_size=64, epochs=2, verbose=2)
    assert m.trainer.step == 2 * 23 and m.trainer.epoch == 2  # 1,437 digits in batches of 64
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]
    assert "eval_acc=" in lines[-1]
    results = m.evaluate(test, batch_size=128, verbose=0)
    assert sorted(results) == ["acc", "loss"] and results["acc"] > 0.85
    assert results["acc"] == pytest.approx(m.trainer.history.last("eval", "acc"))
    (logits,) = m.predict(test, batch_size=100)  # samples carry labels: only the image is fed
    assert logits.shape == (360, 10)
    assert np.mean(logits.argmax(-1) == test.labels) == pytest.approx(results["acc"])
    m.network.eval()
    np.testing.assert_allclose(logits, m.network(test.images), rtol=1e-5, atol=1e-5)  # weights written back


def test_save_and_load_the_training_state_or_the_inference_program(digits, tmp_path):
    train, test = digits
    m = model()
    m.prepare(optax.adam(0.01), metrics=["accuracy"])
    m.fit(train, batch_size=128, epochs=1, verbose=0)
    m.save(str(tmp_path / "state"))
    m.save(str(tmp_path / "infer"), training=False)

    fresh = model(seed=1)
    fresh.prepare(optax.adam(0.01), metrics=["accuracy"])
    fresh.load(str(tmp_path / "state"))
    assert fresh.trainer.step == m.trainer.step
    assert fresh.evaluate(test, batch_size=360, verbose=0) == m.evaluate(test, batch_size=360, verbose=0)
    program = pj.load(str(tmp_path / "infer"))
    np.testing.assert_allclose(program(test.images), m.predict(test.images, batch_size=360)[0], rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="is an inference program .*; load it with pj.load"):
        fresh.load(str(tmp_path / "infer"))


def test_fit_with_save_dir_checkpoints_every_epoch_and_load_reads_it(digits, tmp_path):
    train, test = digits
    m = model()
    m.prepare(optax.sgd(0.1), metrics=["accuracy"])
    m.fit(train, batch_size=256, epochs=2, save_dir=str(tmp_path), verbose=0)
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [6, 12]
    assert m.trainer.checkpoints is None  # save_dir was for that call only
    fresh = model(seed=1)
    fresh.prepare(optax.sgd(0.1), metrics=["accuracy"])
    fresh.load(str(tmp_path))
    assert fresh.evaluate(test, batch_size=360, verbose=0) == m.evaluate(test, batch_size=360, verbose=0)


def test_eval_freq_and_save_freq_count_epochs_as_paddle_does(digits, tmp_path):
    train, test = digits
    m = model()
    m.prepare(optax.sgd(0.1), metrics=["accuracy"])
    # Paddle's positional order: train, eval, batch_size, epochs, eval_freq, log_freq, save_dir, save_freq
    m.fit(train, test, 256, 5, 2, 10, str(tmp_path), 2, verbose=0)
    evaluated, _ = m.trainer.history.series("eval", "acc")
    assert evaluated == [6, 18, 30]  # after epochs 1, 3 and 5 (6 steps each)
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [12, 24, 30]
    with pytest.raises(ValueError, match="eval_freq expects a number of epochs >= 1, got 0"):
        m.fit(train, test, batch_size=256, epochs=6, eval_freq=0, verbose=0)


def test_fit_takes_callbacks_for_that_call(digits):
    train, test = digits
    m = model()
    m.prepare(optax.sgd(0.1), metrics=["accuracy"])
    stop = pj.train.EarlyStopping("eval_loss", patience=0, min_delta=10.0)
    m.fit(train, test, batch_size=256, epochs=5, verbose=0, callbacks=[stop])
    assert m.trainer.epoch == 2 and m.trainer.callbacks == []


def test_summary_lists_the_layers_their_output_shapes_and_parameters(capsys):
    totals = model().summary()
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines()[3:-5]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("0", "(Flatten)", "0"), ("1", "(Linear)", "2,080"), ("2", "(BatchNorm1D)", "128"), ("3", "(ReLU)", "0"),
        ("4", "(Linear)", "330")]
    assert "[b, 64]" in table and "[b, 32]" in table and "[b, 10]" in table
    assert totals == {"total_params": 2538, "trainable_params": 2474, "non_trainable_params": 64}
    assert "Trainable params: 2,474" in table and "Non-trainable params: 64" in table
    assert model().summary(input_size=(2, 1, 8, 8)) == totals
    assert "[2, 10]" in capsys.readouterr().out


def test_summary_takes_paddles_input_size_shapes(capsys):
    net = model().network
    totals = pj.summary(net, pj.InputSpec((None, 1, 8, 8)))
    capsys.readouterr()
    assert pj.summary(net, (1, 1, 8, 8)) == totals  # paddle.summary(net, (1, 1, 8, 8))
    assert "[1, 10]" in capsys.readouterr().out
    assert pj.summary(net, input_size=(-1, 1, 8, 8), dtypes="float32") == totals
    assert "[b, 10]" in capsys.readouterr().out
    assert pj.summary(net, [(2, 1, 8, 8)]) == totals
    assert "[2, 10]" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"summary: input_size expects a shape such as \(-1, 4\)"):
        model().summary(input_size=64)
    with pytest.raises(ValueError, match="summary: dtypes expects one dtype or one per input"):
        pj.summary(net, input_size=[(1, 64)], dtypes=["float32", "int32"])

    class Two(nn.Layer):  # two inputs: a shape beside an array, or two shapes with their dtypes
        def __init__(self):
            self.emb, self.fc = nn.Embedding(10, 4), nn.Linear(4, 2)

        def forward(self, x, ids):
            return self.fc(x + self.emb(ids))

    quiet = {"print_fn": lambda table: None}
    want = {"total_params": 50, "trainable_params": 50, "non_trainable_params": 0}
    assert pj.summary(Two(), input_size=[(-1, 4), (-1,)], dtypes=["float32", "int32"], **quiet) == want
    assert pj.summary(Two(), (2, 4), np.zeros(2, np.int32), **quiet) == want
    assert pj.summary(Two(), (2, 4), (2,), dtypes=["float32", "int32"], **quiet) == want


def test_evaluate_and_predict_take_paddles_arguments():
    m = model()
    m.prepare(optax.adam(0.01), "cross_entropy", metrics=["accuracy"])
    x = np.random.default_rng(0).normal(size=(10, 1, 8, 8)).astype("float32")
    y = (x[:, 0, 0, 0] > 0).astype("int32")
    seen = []

    class Seen(pj.train.Callback):
        def on_eval_end(self, trainer, logs):
            seen.append(sorted(logs))

    results = m.evaluate((x, y), batch_size=4, log_freq=1, verbose=0, num_workers=0, callbacks=[Seen()])
    assert seen == [["acc", "loss"]]
    assert m.evaluate((x, y), batch_size=4, verbose=0, num_workers=2) == pytest.approx(results)
    stacked = m.predict(x, batch_size=4, num_workers=2, verbose=0)
    assert [o.shape for o in stacked] == [(10, 10)]
    batches = m.predict(x, batch_size=4, stack_outputs=False, verbose=0, callbacks=[])
    assert [[b.shape for b in out] for out in batches] == [[(4, 10), (4, 10), (2, 10)]]
    np.testing.assert_allclose(np.concatenate(batches[0]), stacked[0], rtol=1e-6)


def test_misuse_is_named():
    m = model()
    with pytest.raises(RuntimeError, match=r"Model: call prepare\(optimizer, loss, metrics\) first"):
        m.fit(pj.data.Digits("test"))
    m.prepare()
    with pytest.raises(ValueError, match="verbose expects 0 .*, 1 .* or 2 .*, got 3"):
        m.fit(pj.data.Digits("test"), verbose=3)
    with pytest.raises(TypeError, match="Model: inputs expects pj.InputSpec or a list of them, got tuple"):
        pj.Model(m.network, inputs=[(None, 64)])
    with pytest.raises(ValueError, match="give the model inputs=pj.InputSpec"):
        pj.Model(m.network).summary()
