"""The Trainer: fit/evaluate/predict, optimizer options, EMA, AMP, loss scaling, NaN checks, logs."""
from __future__ import annotations

import json
import re
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.train import BestModel, EarlyStopping, LambdaCallback
from paddlejax.train.checkpoint import CheckpointError


class MLP(nnx.Module):
    def __init__(self, seed=0, din=8, classes=3):
        rngs = nnx.Rngs(seed)
        self.l1 = nnx.Linear(din, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.l2 = nnx.Linear(16, classes, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.bn(self.l1(x))))


def blobs(n=96, din=8, classes=3, seed=0):
    """Three separable Gaussian clusters."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int32)
    centers = rng.normal(size=(classes, din)) * 3
    return (centers[y] + rng.normal(size=(n, din))).astype(np.float32), y


def trainer(**kw):
    kw.setdefault("progress", False)
    return pj.Trainer(MLP(), kw.pop("optimizer", optax.sgd(0.1)), metrics=["accuracy"], **kw)


def test_fit_learns_and_writes_back_into_the_model():
    x, y = blobs()
    t = trainer()
    before = np.asarray(t.model.l1.kernel.get_value()).copy()
    history = t.fit((x, y), eval=(x, y), epochs=5, batch_size=16)
    assert t.step == 5 * 6
    assert t.evaluate((x, y))["acc"] > 0.95
    assert history.last("eval", "acc") == t.evaluate((x, y))["acc"]
    assert not np.array_equal(before, np.asarray(t.model.l1.kernel.get_value()))
    # running statistics moved too (the training program returns them as state updates)
    assert not np.allclose(np.asarray(t.model.bn.mean.get_value()), 0)
    pred = t.predict(x)
    assert pred.shape == (96, 3)
    np.testing.assert_allclose(pred, t.model.eval() or t.model(x), rtol=1e-5, atol=1e-5)


def test_fit_counts_epochs_from_the_first_and_says_when_there_is_nothing_to_train():
    x, y = blobs()
    t = trainer()
    t.fit((x, y), epochs=1, batch_size=16)
    with pytest.warns(UserWarning, match="epochs=1 is the epoch to train up to, and this trainer is at epoch 1 "
                                         "already: nothing to train; pass epochs=2 to train 1 more"):
        t.fit((x, y), epochs=1, batch_size=16)
    assert t.step == 6
    t.fit((x, y), epochs=2, batch_size=16)
    assert t.step == 12


def test_one_step_equals_a_hand_written_optax_step():
    x, y = blobs(16)
    t = trainer(optimizer=optax.sgd(0.1, momentum=0.9))
    model = MLP()
    grads = nnx.grad(lambda m: pj.ops.cross_entropy(m(x), y))(model)
    tx = optax.sgd(0.1, momentum=0.9)
    params = nnx.state(model, nnx.Param)
    updates, _ = tx.update(grads, tx.init(params), params)
    expected = optax.apply_updates(params, updates)
    t.train_batch([x], y)
    t.sync_model()
    np.testing.assert_allclose(t.model.l1.kernel.get_value(), expected["l1"]["kernel"].get_value(), rtol=1e-5,
                               atol=1e-6)


def test_the_train_step_donates_its_state_so_xla_updates_it_in_place():
    x, y = blobs(16)
    t = trainer(optimizer=optax.sgd(0.1, momentum=0.9))
    t.train_batch([x], y)
    old = jax.tree.leaves(t.state)
    compiled = t.compiled_step([x], y)
    state_bytes = sum(a.nbytes for a in old)
    assert compiled.memory_analysis().alias_size_in_bytes == state_bytes  # every state buffer reused
    t.train_batch([x], y)
    assert all(a.is_deleted() for a in old)  # the previous step's state was consumed, not copied


def test_the_gradients_are_checked_for_nan_only_where_something_reads_the_check():
    # a pass over every gradient and a division by a scale of 1 were ~1 % of a ResNet-18 step
    x, y = blobs(16)

    def ops(t, name):
        return t.compiled_step([x], y).as_text().count(f" {name}(")

    assert ops(trainer(), "is-finite") == ops(trainer(amp="bf16"), "is-finite") == 0
    assert ops(trainer(check_nan_inf=True), "is-finite") > 0  # it names the op that failed
    fp16 = trainer(amp="float16")  # dynamic loss scaling skips such steps and unscales the gradients
    assert ops(fp16, "is-finite") > 0 and ops(fp16, "divide") > ops(trainer(), "divide")


def test_compiled_step_is_the_step_train_batch_runs_and_trains_nothing():
    x, y = blobs(64)
    t = trainer()
    compiled = t.compiled_step([x], y)
    assert t.step == 0
    assert compiled.memory_analysis().temp_size_in_bytes > 0
    assert compiled.cost_analysis()  # XLA's FLOP and byte counts
    t.train_batch([x], y)
    assert t.step == 1


class Deep(nnx.Module):
    def __init__(self, layers=6, width=32):
        rngs = nnx.Rngs(0)
        self.layers = nnx.List([nnx.Linear(8 if i == 0 else width, width, rngs=rngs) for i in range(layers)])
        self.head = nnx.Linear(width, 3, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return self.head(x)


def test_recompute_plans_checkpoint_segments_that_keep_less_and_change_no_number():
    x, y = blobs(64)
    plain, remat = (pj.Trainer(Deep(), optax.sgd(0.1), progress=False, strategy=pj.distributed.Strategy(recompute=r))
                    for r in (False, True))
    losses = [(plain.train_batch([x], y), remat.train_batch([x], y)) for _ in range(3)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-6)
    segments = {op.attrs.get("remat_segment") for op in remat.train_program.walk()} - {None}
    assert len(segments) >= 2  # segments, not one checkpoint around the whole forward pass
    assert not any("remat_segment" in op.attrs for op in plain.train_program.walk())
    assert not any("remat_segment" in op.attrs for op in remat.eval_program.walk())
    stored = pj.passes.memory.stored_bytes
    assert stored(remat.train_program, {"b": 64}) < 0.7 * stored(plain.train_program, {"b": 64})


def test_gradient_accumulation_applies_the_mean_of_the_micro_batches_gradients():
    x, y = blobs(16)
    acc = trainer(accumulate=2)
    acc.train_batch([x[:8]], y[:8])
    acc.train_batch([x[8:]], y[8:])
    acc.sync_model()
    # each micro-batch is normalised by its own batch statistics, as it would be alone
    model = MLP()
    grads = [nnx.grad(lambda m, x, y: pj.ops.cross_entropy(m(x), y))(model, x[i:i + 8], y[i:i + 8]) for i in (0, 8)]
    want = jax.tree.map(lambda p, g0, g1: p - 0.1 * (g0 + g1) / 2, nnx.state(MLP(), nnx.Param), *grads)
    got = nnx.state(acc.model, nnx.Param)
    assert len(jax.tree.leaves(got)) == 6
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)
    assert int(acc.state.step) == 2


def test_gradient_accumulation_without_batch_statistics_is_exact():
    x, y = blobs(16)
    model = lambda: nnx.Linear(8, 3, rngs=nnx.Rngs(0))  # noqa: E731
    big = pj.Trainer(model(), optax.sgd(0.1), progress=False)
    acc = pj.Trainer(model(), optax.sgd(0.1), accumulate=2, progress=False)
    big.train_batch([x], y)
    acc.train_batch([x[:8]], y[:8])
    assert np.array_equal(acc.state.params["kernel"], model().kernel.get_value())  # not applied yet
    acc.train_batch([x[8:]], y[8:])
    np.testing.assert_allclose(acc.state.params["kernel"], big.state.params["kernel"], rtol=1e-5, atol=1e-7)


def test_clipping_and_weight_decay_are_optax_chains():
    x, y = blobs(16)
    t = pj.Trainer(nnx.Linear(8, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), grad_clip=0.01, weight_decay=0.5,
                   progress=False)
    model = nnx.Linear(8, 3, rngs=nnx.Rngs(0))
    params = {"bias": model.bias.get_value(), "kernel": model.kernel.get_value()}

    def loss(p):
        return pj.ops.cross_entropy(x @ p["kernel"] + p["bias"], y)

    tx = optax.chain(optax.clip_by_global_norm(0.01), optax.add_decayed_weights(0.5), optax.sgd(0.1))
    updates, _ = tx.update(jax.grad(loss)(params), tx.init(params), params)
    expected = optax.apply_updates(params, updates)
    t.train_batch([x], y)
    for name in params:
        np.testing.assert_allclose(t.state.params[name], expected[name], rtol=1e-5, atol=1e-7)


def test_ema_follows_paddles_formula_and_is_used_for_evaluation():
    x, y = blobs(32)
    t = trainer(ema=0.9)
    init = dict(t.model_state.values)
    seen = []
    for i in range(3):
        t.train_batch([x], y)
        seen.append(np.asarray(t.state.params["l1.kernel"]))
    ema = np.asarray(init["l1.kernel"])
    for step, p in enumerate(seen):
        decay = min(0.9, (1 + step) / (10 + step))
        ema = decay * ema + (1 - decay) * p
    np.testing.assert_allclose(t.state.ema["l1.kernel"], ema, rtol=1e-5, atol=1e-6)
    weights = t._weights(t.state)
    np.testing.assert_array_equal(weights["l1.kernel"], t.state.ema["l1.kernel"])


def test_learning_rate_schedule_is_logged():
    x, y = blobs(32)
    schedule = optax.linear_schedule(0.1, 0.0, 4)
    t = trainer(optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=schedule), log_every=1)
    t.fit((x, y), epochs=1, batch_size=8)
    steps, lrs = t.history.series("train", "lr")
    assert steps == [1, 2, 3, 4]
    np.testing.assert_allclose(lrs, [0.1, 0.075, 0.05, 0.025], atol=1e-7)  # the rate each step used


def test_bf16_amp_tracks_the_fp32_loss_curve_and_the_program_shows_casts():
    x, y = blobs()
    curves = {}
    for amp in (None, "bf16"):
        t = trainer(amp=amp, log_every=1)
        t.fit((x, y), epochs=3, batch_size=16, shuffle=False)
        curves[amp] = np.array(t.history.series("train", "loss")[1])
    assert curves["bf16"][-1] < 0.5 * curves["bf16"][0]
    np.testing.assert_allclose(curves["bf16"], curves[None], rtol=0.05, atol=0.02)
    text = str(t.train_program)
    assert re.search(r"cast\(%x\w*\) \{dtype=bfloat16\} : bf16\[b,8\]", text)
    assert re.search(r"= lax.dot_general\(.*: bf16\[b,16\]", text)
    assert t.state.params["l1.kernel"].dtype == jnp.float32  # master weights


def test_fp16_overflow_skips_the_update_and_halves_the_scale():
    x, y = blobs(16)
    t = trainer(amp="fp16")
    t.train_batch([x], y)
    assert float(t.state.loss_scale.scale) == 2.0 ** 15
    before = jax.tree.map(np.asarray, t.state.params)
    t.train_batch([np.full_like(x, 1e6)], y)  # float16 overflows (max 65504)
    assert float(t.state.loss_scale.scale) == 2.0 ** 14
    assert int(t.state.loss_scale.good_steps) == 0
    for name, value in before.items():
        np.testing.assert_array_equal(t.state.params[name], value)
    t.train_batch([x], y)
    assert int(t.state.loss_scale.good_steps) == 1
    assert not np.array_equal(t.state.params["l1.kernel"], before["l1.kernel"])


def test_loss_scale_grows_after_enough_good_steps():
    ls = pj.train.LossScale.dynamic(initial=4.0, growth_interval=2)
    ls, _ = ls.adjust(jnp.array(True))
    assert float(ls.scale) == 4.0
    ls, _ = ls.adjust(jnp.array(True))
    assert (float(ls.scale), int(ls.good_steps)) == (8.0, 0)


def test_check_nan_inf_names_the_op_and_source_line():
    class Log(nnx.Module):
        def __init__(self):
            self.l = nnx.Linear(8, 3, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return jnp.log(self.l(x))  # negative logits: NaN

    x, y = blobs(16)
    t = pj.Trainer(Log(), optax.sgd(0.1), check_nan_inf=True, progress=False)
    with pytest.raises(pj.NonFiniteError, match=r"op `%\d+ = lax.log\(%\d+\) : f32\[b,3\]` produced NaN") as e:
        t.train_batch([x], y)
    assert e.value.loc and "test_trainer.py" in e.value.loc


def test_check_nan_inf_blames_the_gradient_when_the_forward_is_finite():
    class Sqrt(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.zeros(3))

        def __call__(self, x):
            return x[:, :3] + jnp.sqrt(self.w)  # finite at 0, derivative infinite

    x, y = blobs(16)
    t = pj.Trainer(Sqrt(), optax.sgd(0.1), check_nan_inf=True, progress=False)
    with pytest.raises(pj.NonFiniteError, match="gradients of w are not"):
        t.train_batch([x], y)


def test_callbacks_early_stopping_and_best_model(tmp_path):
    x, y = blobs()
    events = []
    cb = LambdaCallback(on_epoch_end=lambda tr, e, logs: events.append(("epoch", e, round(logs["eval_acc"], 3))),
                        on_train_begin=lambda tr: events.append("begin"))
    stop = EarlyStopping("eval_loss", patience=0, min_delta=10.0)  # never improves after the first
    best = BestModel(str(tmp_path / "best" / "model"), monitor="eval_acc")
    t = trainer(callbacks=[cb, stop, best])
    t.fit((x, y), eval=(x, y), epochs=10, batch_size=16)
    assert t.epoch == 2 and t.stop_training  # the second evaluation did not improve by 10
    assert events == ["begin", *[("epoch", e, round(a, 3)) for e, a in enumerate(t.history.series("eval", "acc")[1])]]
    steps, accs = t.history.series("eval", "acc")
    assert best.saved_step == steps[int(np.argmax(accs))]
    prog = pj.load(str(tmp_path / "best" / "model"))
    np.testing.assert_allclose(prog(x), t.predict(x), rtol=1e-5, atol=1e-5)


def test_best_model_named_best_keeps_its_metadata_apart_from_the_program(tmp_path):
    x, y = blobs()
    best = BestModel(str(tmp_path / "out" / "best"), monitor="eval_loss")
    t = trainer(callbacks=[best])
    t.fit((x, y), eval=(x, y), epochs=2, batch_size=16)
    np.testing.assert_allclose(pj.load(str(tmp_path / "out" / "best"))(x), t.predict(x), rtol=1e-5, atol=1e-5)
    meta = json.loads((tmp_path / "out" / "best.best.json").read_text())
    assert meta == {"monitor": "eval_loss", "value": t.history.last("eval", "loss"), "step": 12}


def test_progress_bar_shows_loss_rate_and_eta(capsys):
    x, y = blobs()
    t = trainer(progress=True, log_every=2)
    t.fit((x, y), epochs=1, batch_size=16)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "step/s" in err and "loss=" in err and "acc=" in err
    assert re.search(r"<\d\d:\d\d", err)  # tqdm's remaining-time estimate


def test_fit_shows_eval_metrics_in_the_bar_and_a_line_per_epoch(capsys):
    x, y = blobs()
    t = trainer(progress=True)
    t.fit((x, y), eval=(x, y), epochs=2, batch_size=16)
    out, err = capsys.readouterr()
    assert "eval_loss=" in err and "eval_acc=" in err  # the bar's postfix
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]
    last = dict(item.split("=") for item in lines[-1].split(": ")[1].split(" (")[0].split())
    assert sorted(last) == ["acc", "eval_acc", "eval_loss", "loss"]
    assert float(last["eval_acc"]) == pytest.approx(t.history.last("eval", "acc"), abs=1e-3)
    assert float(last["loss"]) == pytest.approx(t.history.last("epoch", "loss"), rel=1e-3)


def test_progress_epoch_prints_the_lines_without_a_bar(capsys):
    x, y = blobs()
    trainer(progress="epoch").fit((x, y), eval=(x, y), epochs=1, batch_size=16)
    out, err = capsys.readouterr()
    assert out.startswith("epoch 1/1: loss=") and "eval_acc=" in out and "step/s" not in err
    with pytest.raises(ValueError, match="progress expects True, False or 'epoch', got 'bar'"):
        trainer(progress="bar")


def _events(path):
    """Scalar (tag, step, value) records of a TensorBoard event file."""
    from tensorboardX.proto import event_pb2

    out = []
    data = path.read_bytes()
    i = 0
    while i < len(data):
        (length,) = struct.unpack("<Q", data[i:i + 8])
        event = event_pb2.Event.FromString(data[i + 12:i + 12 + length])
        i += 12 + length + 4
        for v in event.summary.value:
            out.append((v.tag, event.step, v.simple_value))
    return out


def test_tensorboard_events_and_curve_plot(tmp_path):
    x, y = blobs()
    t = trainer(log_dir=str(tmp_path / "tb"), log_every=3)
    t.fit((x, y), eval=(x, y), epochs=2, batch_size=16)
    t.tensorboard.close()
    (event_file,) = (tmp_path / "tb").iterdir()
    records = _events(event_file)
    tags = {tag for tag, _, _ in records}
    assert {"train/loss", "train/acc", "eval/loss", "eval/acc"} <= tags
    eval_acc = [(s, v) for tag, s, v in records if tag == "eval/acc"]
    assert [s for s, _ in eval_acc] == [6, 12]
    assert eval_acc[-1][1] == pytest.approx(t.history.last("eval", "acc"))
    # drawing the PNG leaves the user's matplotlib as it was: a notebook's inline plots keep working
    import matplotlib
    import matplotlib.pyplot as plt

    before, figures = matplotlib.get_backend(), plt.get_fignums()
    matplotlib.use("svg")
    try:
        png = t.plot(str(tmp_path / "curves.png"))
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == figures
    finally:
        matplotlib.use(before)
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="amp expects"):
        trainer(amp="int8")
    with pytest.raises(ValueError, match="loss expects"):
        pj.Trainer(MLP(), loss="hinge")
    with pytest.raises(ValueError, match="accumulate expects"):
        trainer(accumulate=0)
    with pytest.raises(ValueError, match=r"batches must be \(inputs..., labels\)"):
        trainer().fit(np.zeros((4, 8), np.float32), epochs=1)


class PaddleMLP(pj.nn.Layer):
    """Paddle-style layers, which capture as ``linear`` ops the quantization passes know."""

    def __init__(self):
        self.l1, self.l2 = pj.nn.Linear(8, 16), pj.nn.Linear(16, 3)

    def forward(self, x):
        return self.l2(pj.ops.relu(self.l1(x)))


def test_passes_rewrite_the_programs_and_their_state_trains_and_checkpoints(tmp_path):
    x, y = blobs()
    pj.nn.seed(0)
    t = pj.Trainer(PaddleMLP(), optax.adam(0.01), metrics=["accuracy"], passes="quant_aware", progress=False,
                   checkpoint_dir=str(tmp_path), checkpoint_every=4)
    t.fit((x, y), epochs=2, batch_size=16)
    assert "fake_quantize" in str(t.train_program) and "moving_average_abs_max" in str(t.train_program)
    assert "moving_average_abs_max" not in str(t.eval_program)
    scales = {k: float(v) for k, v in t.state.extra.items() if k.endswith("input_scale")}
    assert sorted(scales) == ["l1.weight.input_scale", "l2.weight.input_scale"]
    np.testing.assert_allclose(scales["l1.weight.input_scale"], np.abs(x).max(), rtol=0.2)
    assert t.evaluate((x, y))["acc"] > 0.9
    resumed = pj.Trainer(PaddleMLP(), optax.adam(0.01), passes="quant_aware", progress=False,
                         checkpoint_dir=str(tmp_path))
    resumed.fit((x, y), epochs=2, batch_size=16)  # restores the finished run: nothing left to train
    assert resumed.step == t.step
    assert {k: float(resumed.state.extra[k]) for k in scales} == scales


def test_a_pass_that_changes_nothing_warns_and_a_misspelt_one_fails():
    x, y = blobs(n=16)
    with pytest.warns(UserWarning, match="pass quant_aware changed nothing in MLP"):
        trainer(passes="quant_aware").train_batch([x], y)  # flax's nnx.Linear traces to lax.dot_general
    with pytest.raises(KeyError, match="unknown pass 'quant_awre'; did you mean quant_aware"):
        trainer(passes=["quant_awre"])


def test_resuming_with_another_optimizer_names_the_state_entries_in_one_line(tmp_path):
    x, y = blobs(32)
    trainer(optimizer=optax.sgd(0.1, momentum=0.9), checkpoint_dir=str(tmp_path)).fit((x, y), epochs=1,
                                                                                         batch_size=16)
    with pytest.raises(CheckpointError) as e:
        trainer(optimizer=optax.adam(0.1), checkpoint_dir=str(tmp_path)).fit((x, y), epochs=2, batch_size=16)
    message = str(e.value)
    assert "\n" not in message and len(message) < 400
    assert message.startswith(f"Trainer: checkpoint step 2 in {tmp_path} does not fit this run's training state "
                              "(only in the checkpoint: opt/0/trace/* (6); only in this run: opt/0/count, "
                              "opt/0/mu/* (6), opt/0/nu/* (6)); resume with the model and optimizer")


def test_resuming_a_resized_model_names_the_variables_whose_shapes_differ(tmp_path):
    x, y = blobs(32)
    pj.Trainer(MLP(), progress=False, checkpoint_dir=str(tmp_path)).fit((x, y), epochs=1, batch_size=16)
    wider = pj.Trainer(MLP(classes=4), progress=False, checkpoint_dir=str(tmp_path))
    with pytest.raises(CheckpointError, match=r"\(other shapes: l2\.bias \(3,\) -> \(4,\), "
                                                         r"l2\.kernel \(16, 3\) -> \(16, 4\)\)"):
        wider.fit((x, y), epochs=2, batch_size=16)


def test_load_brings_checkpointed_weights_to_a_fresh_trainer_without_data(tmp_path):
    x, y = blobs()
    trained = trainer(ema=0.9, checkpoint_dir=str(tmp_path / "run"))
    trained.fit((x, y), epochs=2, batch_size=16)
    fresh = trainer(ema=0.9)
    assert fresh.load(str(tmp_path / "run")) == 12 and fresh.epoch == 2
    assert fresh.evaluate((x, y)) == trained.evaluate((x, y))
    np.testing.assert_array_equal(fresh.predict(x), trained.predict(x))
    np.testing.assert_array_equal(fresh.model.l1.kernel.get_value(), trained.model.l1.kernel.get_value())
    fresh.fit((x, y), epochs=3, batch_size=16)  # training goes on from the loaded epoch
    assert fresh.step == 18

    fresh.save(str(tmp_path / "saved"))
    again = trainer(ema=0.9)
    assert again.load(str(tmp_path / "saved")) == 18
    jax.tree.map(np.testing.assert_array_equal, again.state, fresh.state)
    assert again.load(str(tmp_path / "run"), step=6) == 6 and again.epoch == 1


def test_load_and_save_say_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="Trainer.load: no checkpoint directory at"):
        trainer().load(str(tmp_path / "nothing"))
    with pytest.raises(CheckpointError, match="holds no checkpoint with input specs"):
        trainer().load(str(tmp_path))
    with pytest.raises(RuntimeError, match="Trainer.save: train or evaluate on a batch first"):
        trainer().save(str(tmp_path / "out"))
