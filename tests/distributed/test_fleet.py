"""fleet: init, the distributed model and optimizer, and the Trainer they make data parallel."""
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.distributed import Strategy, fleet


def test_three_lines_make_a_trainer_data_parallel():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    fleet.init(Strategy(sharding={"stage": 1}))
    model = fleet.distributed_model(nnx.Linear(4, 2, rngs=nnx.Rngs(0)))
    assert len(model.kernel.get_value().sharding.device_set) == 8
    optimizer = fleet.distributed_optimizer(optax.adam(0.1))
    trainer = pj.Trainer(model, optimizer, metrics=["accuracy"], progress=False)
    assert trainer.dp is not None and trainer.strategy.sharding.stage == 1
    trainer.fit((x, y), epochs=10, batch_size=16)
    assert trainer.evaluate((x, y))["acc"] > 0.9
    mu = trainer.state.opt[0].mu  # ZeRO-1: the flat moment vector, 10 values padded to 16, 2 per device
    assert mu.shape == (16,) and {s.data.shape for s in mu.addressable_shards} == {(2,)}


def test_workers_and_the_stored_strategy():
    fleet.init(Strategy(gradient_merge={"k_steps": 2}))
    assert (fleet.worker_index(), fleet.worker_num()) == (0, 1)
    assert fleet.strategy().gradient_merge.k_steps == 2 and dict(fleet.mesh().shape) == {"dp": 8}
    opt = fleet.distributed_optimizer(optax.sgd(0.1))
    assert isinstance(opt, optax.GradientTransformation) and isinstance(opt.init({"w": np.zeros(2)}),
                                                                      optax.MultiStepsState)


def test_errors():
    with pytest.raises(ValueError, match="is_collective=False"):
        fleet.init(is_collective=False)
    with pytest.raises(ValueError, match="fleet.init: strategy expects a Strategy"):
        fleet.init({"amp": "bf16"})
    with pytest.raises(ValueError, match="pipeline parallelism"):
        pj.Trainer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1),
                   strategy=Strategy(pp_degree=2, sharding={"stage": 2}))


def test_fleet_trains_a_batch_norm_model_with_the_statistics_of_the_whole_batch():
    from paddlejax import nn

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 2, 16).astype("int32")

    def model():
        nn.seed(0)
        return nn.Sequential(nn.Linear(4, 8, bias_attr=False), nn.SyncBatchNorm(8), nn.ReLU(), nn.Linear(8, 2))

    fleet.init(Strategy())
    trainer = pj.Trainer(fleet.distributed_model(model()), fleet.distributed_optimizer(optax.sgd(0.1)),
                         progress=False)
    one = pj.Trainer(model(), optax.sgd(0.1), progress=False)
    np.testing.assert_allclose(trainer.train_batch((x,), y), one.train_batch((x,), y), rtol=1e-6)
    assert trainer.dp is not None and trainer.batch_norm == "sync"
    trainer.sync_model(), one.sync_model()
    np.testing.assert_allclose(trainer.model[1].variance[...], one.model[1].variance[...], rtol=1e-6)
