"""Optimizer state offloaded to host memory between steps (``Strategy(offload_optimizer=True)``):
it waits in ``pinned_host`` memory, trains exactly as when it stays on the devices, under data
parallelism, ZeRO and tensor parallelism, and survives a checkpoint; a backend without host
memory is named. Activations kept for recompute offloaded between the forward and backward
pass (``Strategy(recompute=True, recompute_offload=True)``) train as resident ones."""
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


class ConvBN(nn.Layer):
    """Batch norm updates its statistics in the forward pass: they must come out of the
    offloaded, recomputed segments unchanged."""

    def __init__(self):
        self.convs = nn.LayerList([nn.Conv2D(3 if i == 0 else 8, 8, 3, padding=1) for i in range(3)])
        self.norms = nn.LayerList([nn.BatchNorm2D(8) for _ in range(3)])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            x = nn.functional.relu(norm(conv(x)))
        return self.head(x.mean(axis=(2, 3)))


@pytest.mark.filterwarnings("ignore:data parallel over 8 devices")
@pytest.mark.parametrize("offload", [False, True])
def test_offloaded_recompute_trains_as_resident_activations(offload):
    rng = np.random.default_rng(3)
    data = [(rng.normal(size=(8, 3, 6, 6)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(3)]

    def fit(strategy):
        nn.seed(0)
        trainer = pj.Trainer(ConvBN(), optax.sgd(0.1, momentum=0.9), progress=False, strategy=strategy)
        return trainer, [trainer.train_batch([x], y) for x, y in data]

    (plain, want), (remat, got) = fit(Strategy()), fit(Strategy(recompute=True, recompute_offload=offload))
    np.testing.assert_allclose(got, want, rtol=2e-6)
    state, ref = weights(remat), weights(plain)
    for name, value in ref.items():  # parameters and batch norm statistics
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    marked = [op for op in remat.train_program.walk() if op.attrs.get("remat_offload")]
    assert bool(marked) == offload
    assert all("remat_segment" in op.attrs for op in marked)


def weights(trainer) -> dict:
    trainer.sync_model()
    return nn.state_dict(trainer.model)


def test_recompute_offload_needs_recompute_and_no_pipeline():
    with pytest.raises(ValueError, match="recompute_offload: offloads the activations recompute keeps; set recompute=True"):
        Strategy(recompute_offload=True)
    with pytest.raises(ValueError, match="recompute_offload: pipeline stages recompute their whole forward pass"):
        Strategy(recompute=True, recompute_offload=True, pp_degree=2)
