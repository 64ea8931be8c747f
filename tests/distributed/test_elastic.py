"""Elastic training: checkpoints hold the state in a layout no device count decides, so a run saved
under one strategy (ZeRO stage, pipeline stages) or on N processes resumes under another or on M,
with the same parameters;
``paddlejax launch --elastic`` restarts a failed run, which resumes from its checkpoint."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax import nn
from paddlejax.distributed import Strategy

HERE = pathlib.Path(__file__).parent
SCRIPT = HERE / "elastic_script.py"


def trainer(strategy, folder, dropout=False):
    nn.seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), *([nn.Dropout(0.1)] if dropout else []), nn.Linear(16, 2))
    return pj.Trainer(model, optax.adam(0.05), loss="mse", progress=False, checkpoint_dir=str(folder),
                      strategy=strategy)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    return x, np.tanh(x[:, :2])


def whole(t) -> dict:
    return {n: np.asarray(v) for n, v in t.step_builder.params(t.state.params).items()}


def adam_moments(t) -> dict:
    """The first moments by parameter name, whatever the layout (a ZeRO flat vector is cut up)."""
    portable = t.step_builder.portable(t.state)
    mu = next(s.mu for s in jax.tree.leaves(portable.opt, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu"))
    return {n: np.asarray(v) for n, v in mu.items()}


@pytest.mark.parametrize("saved, resumed", [
    (Strategy(sharding={"stage": 2}, fuse_all_reduce=True, fuse_grad_size_in_MB=1e-4), Strategy()),
    (Strategy(), Strategy(sharding={"stage": 3})),
    (Strategy(sharding={"stage": 3}), None),
    (Strategy(sharding={"stage": 1}), Strategy(sharding={"stage": 2}, gradient_merge={"k_steps": 1})),
])
def test_a_checkpoint_resumes_under_another_layout_with_the_same_state(saved, resumed, tmp_path):
    first = trainer(saved, tmp_path)
    for seed in range(3):
        first.train_batch([batch(seed)[0]], batch(seed)[1])
    first.save(str(tmp_path / "ckpt"))
    second = trainer(resumed, tmp_path / "other")
    second.load(str(tmp_path / "ckpt"))
    assert int(second.state.step) == 3
    for name, value in whole(first).items():
        np.testing.assert_array_equal(whole(second)[name], value, err_msg=name)  # bit for bit
        np.testing.assert_array_equal(adam_moments(second)[name], adam_moments(first)[name], err_msg=name)
    # and it trains on from there as the first run does
    x, y = batch(7)
    assert second.train_batch([x], y) == pytest.approx(first.train_batch([x], y), rel=1e-5)


def test_a_dropout_models_key_survives_a_change_of_layout(tmp_path):
    first = trainer(Strategy(sharding={"stage": 2}), tmp_path, dropout=True)
    first.train_batch([batch()[0]], batch()[1])
    first.save(str(tmp_path / "ckpt"))
    second = trainer(Strategy(sharding={"stage": 3}), tmp_path / "other", dropout=True)
    second.load(str(tmp_path / "ckpt"))
    assert "2.key" in first.state.extra
    for name, value in first.state.extra.items():
        np.testing.assert_array_equal(np.asarray(second.state.extra[name]), np.asarray(value), err_msg=name)
    x, y = batch(3)  # the same masks next (each device's own): the same loss
    assert second.train_batch([x], y) == pytest.approx(first.train_batch([x], y), rel=1e-5)


def test_local_sgds_per_device_copies_refuse_another_layout_by_name(tmp_path):
    first = trainer(Strategy(localsgd={"k_steps": 2}), tmp_path)
    first.train_batch([batch()[0]], batch()[1])
    first.save(str(tmp_path / "ckpt"))
    with pytest.raises(pj.train.checkpoint.CheckpointError, match="does not fit this run's training state"):
        trainer(Strategy(), tmp_path / "other").load(str(tmp_path / "ckpt"))


def launch(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "paddlejax.cli.main", "launch", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    return result


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run in one process on 4 devices, never stopped."""
    folder = tmp_path_factory.mktemp("reference")
    result = subprocess.run([sys.executable, str(SCRIPT), folder / "ckpt", folder / "out.npz"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(np.load(folder / "out.npz"))


def parameters(results: dict, prefix: str = "") -> dict:
    return {k[len(prefix):]: v for k, v in results.items() if k.startswith(prefix) and k.endswith(("weight", "bias"))
            and (prefix or not k.startswith("resumed."))}


def test_a_run_of_two_processes_resumes_on_three_with_the_same_parameters(uninterrupted, tmp_path):
    launch("--nproc", 2, "--devices-per-proc", 2, "--log-dir", tmp_path / "log", SCRIPT, tmp_path / "ckpt",
           tmp_path / "first.npz", "--stop-at", 3, cwd=tmp_path)
    launch("--nproc", 3, "--devices-per-proc", 1, "--log-dir", tmp_path / "log2", SCRIPT, tmp_path / "ckpt",
           tmp_path / "second.npz", cwd=tmp_path)
    first, second = dict(np.load(tmp_path / "first.npz")), dict(np.load(tmp_path / "second.npz"))
    assert (int(first["step"]), int(second["resumed_step"]), int(second["step"])) == (3, 3, 6)
    # ZeRO-2 over 4 devices saved, over 3 resumed: the optimizer state was cut up anew
    for name, value in parameters(first).items():
        np.testing.assert_array_equal(parameters(second, "resumed.")[name], value, err_msg=name)
    for name, value in parameters(uninterrupted).items():
        np.testing.assert_allclose(parameters(second)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_elastic_launch_restarts_a_killed_run_which_resumes_from_its_checkpoint(uninterrupted, tmp_path):
    result = launch("--elastic", "--max-restarts", 2, "--nproc", 2, "--devices-per-proc", 2, "--log-dir",
                    tmp_path / "log", SCRIPT, tmp_path / "ckpt", tmp_path / "out.npz", "--crash-at", 5, cwd=tmp_path)
    # rank 1 dies; rank 0 may fail on the broken connection before the launcher sees rank 1 gone
    assert "exited with code" in result.stderr and "restarting all 2 ranks (restart 1 of 2)" in result.stderr
    assert "restart 2 of 2" not in result.stderr
    out = dict(np.load(tmp_path / "out.npz"))
    assert (int(out["resumed_step"]), int(out["step"])) == (4, 6)  # the checkpoint of step 4, saved every 2
    for name, value in parameters(uninterrupted).items():
        np.testing.assert_allclose(parameters(out)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)



def pipelined(stages, **kw):
    return Strategy(pp_degree=stages, pipeline={"stages": stages, "micro_batches": 2}, **kw)


def deep_trainer(strategy):
    nn.seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 2))
    return pj.Trainer(model, optax.adam(0.05), loss="mse", progress=False, strategy=strategy)


@pytest.mark.parametrize("saved, resumed", [(pipelined(4), Strategy()), (pipelined(2, sharding={"stage": 1}),
                                                                          pipelined(4)),
                                             (Strategy(sharding={"stage": 2}), pipelined(2))])
def test_a_pipelines_checkpoint_resumes_with_other_stages_or_none(saved, resumed, tmp_path):
    first = deep_trainer(saved)
    for seed in range(2):
        first.train_batch([batch(seed)[0]], batch(seed)[1])
    first.save(str(tmp_path / "ckpt"))
    second = deep_trainer(resumed)
    second.load(str(tmp_path / "ckpt"))
    for name, value in whole(first).items():
        np.testing.assert_array_equal(whole(second)[name], value, err_msg=name)
        np.testing.assert_array_equal(adam_moments(second)[name], adam_moments(first)[name], err_msg=name)
    x, y = batch(7)
    assert second.train_batch([x], y) == pytest.approx(first.train_batch([x], y), rel=1e-5)
