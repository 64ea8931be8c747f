"""Step builders: one per strategy behind one interface, each giving the single-device update."""
from __future__ import annotations

import logging

import jax
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax import nn
from paddlejax.distributed import Strategy
from paddlejax.train.steps import StepBuilder, step_builder
from paddlejax.train.steps.data_parallel import DataParallelStep
from paddlejax.train.steps.pipeline_parallel import PipelineParallelStep
from paddlejax.train.steps.single import SingleDeviceStep


def bn_model():
    """Batch norm after a linear layer without bias (batch norm cancels a bias: its gradient would
    be rounding noise, which adam scales up to full steps)."""
    nn.seed(0)
    return nn.Sequential(nn.Linear(8, 16, bias_attr=False), nn.BatchNorm1D(16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3))


def tiled_batch():
    """32 rows: one chunk of 4 rows, 8 times. Every device's rows (8 data-parallel devices, or 2
    pipeline micro-batches over 4 replicas) are then that chunk, so batch norm's per-device
    statistics are the whole batch's and each strategy must give one device's update exactly."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 8)).astype(np.float32) * 2 + 1
    y = rng.integers(0, 3, 4).astype(np.int32)
    return np.tile(x, (8, 1)), np.tile(y, 8)


def trained(strategy, steps=2):
    x, y = tiled_batch()
    trainer = pj.Trainer(bn_model(), optax.adam(0.05), progress=False, strategy=strategy)
    losses = [trainer.train_batch((x,), y) for _ in range(steps)]
    builder = trainer.step_builder
    return builder, losses, {**builder.params(trainer.state.params), **trainer.state.extra}


STRATEGIES = {
    "data parallel": (Strategy(), DataParallelStep),
    "ZeRO-3": (Strategy(sharding={"stage": 3}), DataParallelStep),
    "pipeline": (Strategy(pp_degree=2, pipeline={"stages": 2, "micro_batches": 2}), PipelineParallelStep),
    "pipeline ZeRO-1": (Strategy(pp_degree=2, pipeline={"stages": 2, "micro_batches": 2}, sharding={"stage": 1}),
                        PipelineParallelStep),
}


@pytest.mark.filterwarnings("ignore:data parallel over 8 devices")
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_step_builder_gives_the_single_device_update_on_a_batch_norm_model(name):
    strategy, kind = STRATEGIES[name]
    single, want_losses, want = trained(None)
    builder, losses, got = trained(strategy)
    assert isinstance(single, SingleDeviceStep) and isinstance(builder, kind)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert sorted(got) == sorted(want) and {"1.mean", "1.variance"} <= set(got)
    for key in want:  # the parameters and the running statistics alike
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.filterwarnings("ignore:data parallel over 8 devices")
@pytest.mark.parametrize("name", sorted(STRATEGIES) + ["tensor parallel", "one device"])
def test_only_the_first_step_compiles(name, caplog):
    # the state the step returns is laid out as the state it was given: the step count,
    # batch-norm statistics and dropout's key too, which the builders' init does not place
    others = {"tensor parallel": Strategy(tensor_parallel_degree=2), "one device": None}
    strategy = others[name] if name in others else STRATEGIES[name][0]
    nn.seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias_attr=False), nn.BatchNorm1D(16), nn.Dropout(0.2), nn.Tanh(),
                          nn.Linear(16, 3))
    trainer = pj.Trainer(model, optax.adam(0.05), progress=False, strategy=strategy)
    x, y = tiled_batch()
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        trainer.train_batch((x,), y)
        assert any("Compiling" in r.getMessage() and "step" in r.getMessage() for r in caplog.records)
        caplog.clear()
        for _ in range(2):
            trainer.train_batch((x,), y)
    assert [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()] == []


def test_the_builder_is_chosen_once_from_the_strategy():
    assert isinstance(step_builder(None), SingleDeviceStep)
    assert isinstance(step_builder(Strategy()), DataParallelStep)
    assert isinstance(step_builder(Strategy(pp_degree=4)), PipelineParallelStep)
    merged = step_builder(Strategy(), accumulate=4, avg=False)
    assert (merged.dp.k_steps, merged.dp.strategy.gradient_merge.avg) == (4, False)
    assert all(issubclass(cls, StepBuilder) for cls in (SingleDeviceStep, DataParallelStep, PipelineParallelStep))


def test_data_parallel_merges_gradients_itself_so_its_optimizer_does_not():
    plain = optax.sgd(0.1)
    assert step_builder(Strategy(), accumulate=4).optimizer(plain, None, None, accumulate=4) is plain
    assert isinstance(SingleDeviceStep().optimizer(plain, None, None, accumulate=4), optax.MultiSteps)


def test_a_pipeline_refuses_zero_stages_above_one():
    with pytest.raises(ValueError, match=r"sharding.stage=2 \(ZeRO\) cannot be combined with pipeline"):
        step_builder(Strategy(pp_degree=2, sharding={"stage": 2}))
