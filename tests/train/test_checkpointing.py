"""Checkpoints of a Trainer's state: the Checkpointing callback's saves and resume, and the
on-disk layout, which still reads checkpoints written before the state was typed."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax.train import checkpointing
from paddlejax.train.checkpoint import CheckpointManager
from paddlejax.train.state import TrainState


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def trainer(**kw):
    return pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.adam(0.05), progress=False, **kw)


def test_fit_saves_every_n_steps_after_every_save_freq_epochs_and_at_the_end(tmp_path):
    t = trainer(checkpoint_dir=str(tmp_path), checkpoint_every=3, keep_checkpoints=None)
    t.fit(data(), epochs=3, batch_size=16, save_freq=2)  # 4 steps an epoch
    # steps 3, 6, 9, 12 by checkpoint_every; 8 after the second epoch; 12 is also the end
    assert t.checkpoints.all_steps() == [3, 6, 8, 9, 12]


def test_a_stopped_run_saves_its_last_step(tmp_path):
    stop = pj.train.LambdaCallback(on_step_end=lambda tr, step, logs: setattr(tr, "stop_training", step == 5))
    t = trainer(checkpoint_dir=str(tmp_path), checkpoint_every=100, callbacks=[stop], log_every=1)
    t.fit(data(), epochs=3, batch_size=16)
    assert t.step == 5 and t.checkpoints.all_steps() == [4, 5]  # the first epoch's end, and the stop
    assert t.checkpoints.read_meta()["epoch"] == 1  # stopped part-way through the second epoch


def test_fit_resumes_where_the_checkpoint_left_off(tmp_path):
    first = trainer(checkpoint_dir=str(tmp_path))
    first.fit(data(), epochs=1, batch_size=16)
    first.checkpoints.close()
    again = trainer(checkpoint_dir=str(tmp_path))
    again.fit(data(), epochs=2, batch_size=16)
    assert again.step == 8 and again.epoch == 2
    off = trainer(checkpoint_dir=str(tmp_path / "other"), resume=False)
    off.fit(data(), epochs=1, batch_size=16)
    assert off.step == 4


def test_the_state_round_trips_through_a_checkpoint_as_a_train_state(tmp_path):
    trained = trainer(ema=0.9, amp="fp16")
    trained.fit(data(), epochs=1, batch_size=16)
    trained.save(str(tmp_path))
    fresh = trainer(ema=0.9, amp="fp16")
    assert fresh.load(str(tmp_path)) == 4
    assert isinstance(fresh.state, TrainState) and fresh.state.loss_scale.is_dynamic
    jax.tree.map(np.testing.assert_array_equal, fresh.state, trained.state)


def legacy_save(path, state: TrainState, specs, epoch):
    """A checkpoint as the Trainer wrote it when its state was a dict of these seven entries."""
    legacy = {"params": state.params, "extra": state.extra, "opt": state.opt, "merge": state.merge,
              "ema": state.ema, "loss_scale": state.loss_scale, "step": state.step}
    flat, _ = jax.tree_util.tree_flatten_with_path(legacy)
    names = {jax.tree_util.keystr(p, simple=True, separator="/"): list(np.shape(v)) for p, v in flat}
    leaves = {f"{i:05d}": leaf for i, leaf in enumerate(jax.tree.leaves(legacy))}
    meta = {"epoch": epoch, "loader": None, "state": names,
            "inputs": [[list(s.shape), jnp.dtype(s.dtype).name] for s in specs]}
    with CheckpointManager(path, async_save=False) as manager:
        manager.save(int(state.step), leaves, meta=meta, force=True)


def test_a_checkpoint_of_the_untyped_dict_state_still_loads(tmp_path):
    trained = trainer(ema=0.9)
    trained.fit(data(), epochs=2, batch_size=16)
    legacy_save(str(tmp_path), trained.state, trained.specs, trained.epoch)
    assert checkpointing.entries(trained.state) == CheckpointManager(str(tmp_path)).read_meta()["state"]
    fresh = trainer(ema=0.9)
    assert fresh.load(str(tmp_path)) == 8 and fresh.epoch == 2
    jax.tree.map(np.testing.assert_array_equal, fresh.state, trained.state)
    np.testing.assert_array_equal(fresh.predict(data()[0]), trained.predict(data()[0]))
