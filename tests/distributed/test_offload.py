"""Optimizer state offloaded to host memory between steps (``Strategy(offload_optimizer=True)``):
it waits in ``pinned_host`` memory, trains exactly as when it stays on the devices, under data
parallelism, ZeRO and tensor parallelism, and survives a checkpoint; a backend without host
memory is named."""
from __future__ import annotations

import types

import jax
import numpy as np
import optax
import pytest

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.distributed import ColumnParallelLinear, RowParallelLinear, Strategy
from paddlejax.train import LambdaCallback


class MLP(nn.Layer):
    def __init__(self):
        self.up = ColumnParallelLinear(6, 16, gather_output=False)
        self.down = RowParallelLinear(16, 3, input_is_parallel=True)

    def forward(self, x):
        return self.down(nn.functional.relu(self.up(x)))


def batches(n=3):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(16, 6)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32))
            for _ in range(n)]


def train(strategy, checkpoint_dir=None, resume=False, data=None):
    nn.seed(0)
    trainer = pj.Trainer(MLP(), optax.adam(1e-2), loss="mse", progress=False, strategy=strategy,
                         checkpoint_dir=checkpoint_dir, resume=resume)
    losses = [trainer.train_batch([x], y) for x, y in (data or batches())]
    return trainer, losses


def kinds(tree) -> set:
    return {leaf.sharding.memory_kind for leaf in jax.tree.leaves(tree)}


@pytest.mark.parametrize("options", [{}, {"sharding": {"stage": 1}}, {"tensor_parallel_degree": 2}])
def test_offloaded_optimizer_state_waits_in_host_memory_and_trains_as_resident(options):
    resident, want = train(Strategy(**options))
    offloaded, got = train(Strategy(offload_optimizer=True, **options))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    params = offloaded.step_builder.params(offloaded.state.params)
    for name, value in resident.step_builder.params(resident.state.params).items():
        np.testing.assert_allclose(params[name], value, rtol=1e-6, err_msg=name)
    assert kinds(offloaded.state.opt) == {"pinned_host"} and kinds(offloaded.state.params) == {"device"}
    assert kinds(resident.state.opt) == {"device"}


def test_an_offloaded_state_checkpoints_and_resumes_in_host_memory(tmp_path):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(64, 6)).astype(np.float32), rng.normal(size=(64, 3)).astype(np.float32)

    def fit(epochs, folder):
        nn.seed(0)
        steps = []
        trainer = pj.Trainer(MLP(), optax.adam(1e-2), loss="mse", progress=False, checkpoint_dir=str(folder),
                             strategy=Strategy(offload_optimizer=True), log_every=1,
                             callbacks=[LambdaCallback(on_step_end=lambda t, step, logs: steps.append(step))])
        trainer.fit((x, y), epochs=epochs, batch_size=16, shuffle=False)
        return trainer, steps

    fit(1, tmp_path / "run")  # a checkpoint after the first epoch
    (resumed, steps), (whole, _) = fit(2, tmp_path / "run"), fit(2, tmp_path / "other")
    assert steps == [5, 6, 7, 8]  # only the second epoch ran: the state came back from step 4
    for name, value in whole.state.params.items():
        np.testing.assert_allclose(resumed.state.params[name], value, rtol=1e-6, err_msg=name)
    assert kinds(resumed.state.opt) == {"pinned_host"}


def test_a_backend_without_host_memory_is_named(monkeypatch):
    device = types.SimpleNamespace(platform="tpu", addressable_memories=lambda: [types.SimpleNamespace(kind="device")])
    trainer = pj.Trainer(MLP(), optax.sgd(0.1), loss="mse", progress=False, strategy=Strategy(offload_optimizer=True))
    x, y = batches(1)[0]
    monkeypatch.setattr(jax, "devices", lambda *a: [device])
    with pytest.raises(ValueError, match="the tpu backend has no pinned_host memory to offload to .its memories: device"):
        trainer.train_batch([x], y)
