"""Data parallel and ZeRO over 8 CPU devices: the same parameters as training on one device,
sharded optimizer state, gradient merge, fused and hierarchical all-reduce in the compiled HLO."""
from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.train import LambdaCallback
from paddlejax.distributed import DataParallel, Strategy, collective_stats, fleet

RNG = np.random.default_rng(0)
PARAMS = {"w1": jnp.asarray(RNG.normal(size=(4, 16)), jnp.float32), "b1": jnp.zeros(16),
          "w2": jnp.asarray(RNG.normal(size=(16, 16)), jnp.float32), "b2": jnp.zeros(16),
          "w3": jnp.asarray(RNG.normal(size=(16, 3)), jnp.float32), "b3": jnp.zeros(3)}
BATCHES = [(jnp.asarray(RNG.normal(size=(16, 4)), jnp.float32), jnp.asarray(RNG.normal(size=(16, 3)), jnp.float32))
           for _ in range(5)]


def mlp_loss(p, batch):
    x, y = batch
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    h = jnp.tanh(h @ p["w2"] + p["b2"])
    return jnp.mean((h @ p["w3"] + p["b3"] - y) ** 2)


def single_device(tx, batches=BATCHES):
    params, opt = PARAMS, tx.init(PARAMS)
    for batch in batches:
        updates, opt = tx.update(jax.grad(mlp_loss)(params, batch), opt, params)
        params = optax.apply_updates(params, updates)
    return params


def data_parallel(strategy, tx, batches=BATCHES):
    dp = DataParallel(strategy)
    state, step = dp.init(PARAMS, tx), dp.train_step(mlp_loss, tx)
    for batch in batches:
        state, _ = step(state, batch)
    return dp, state


def assert_same(got, want):
    for name in want:
        rel = np.max(np.abs(got[name] - want[name])) / np.max(np.abs(want[name]))
        assert rel <= 1e-5, (name, rel)


OPTIMIZERS = {"sgd": lambda: optax.sgd(0.1), "adam": lambda: optax.adam(0.01)}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_five_steps_equal_single_device_training(stage, opt):
    tx = OPTIMIZERS[opt]()
    # stage 3 in three 1 KB buckets (b1+b2+b3+w1 | w2 | w3), the others one bucket per parameter
    fused = {"fuse_all_reduce": True, "fuse_grad_size_in_MB": 1 / 1024} if stage == 3 else {}
    dp, state = data_parallel(Strategy(sharding={"stage": stage}, **fused), tx)
    assert_same(dp.full_params(state["params"]), single_device(tx))


def per_device_shapes(array):
    return {shard.data.shape for shard in array.addressable_shards}


def test_zero_shards_optimizer_state_then_parameters():
    n = sum(p.size for p in PARAMS.values())  # 403, padded to 408 = 8 x 51
    for stage in (1, 2, 3):
        dp, state = data_parallel(Strategy(sharding={"stage": stage}), optax.adam(0.01), BATCHES[:1])
        mu = state["opt"][0].mu
        assert mu.shape == (408,) and per_device_shapes(mu) == {(51,)} and n == 403
        assert len(mu.sharding.device_set) == 8
        params = state["params"]
        if stage == 3:
            assert per_device_shapes(params) == {(51,)}
        else:
            assert per_device_shapes(params["w2"]) == {(16, 16)}


def lowered(strategy, tx=None):
    tx = tx or optax.sgd(0.1)
    dp = DataParallel(strategy)
    return dp.train_step(mlp_loss, tx).lower(dp.init(PARAMS, tx), BATCHES[0])


def test_fused_all_reduce_packs_six_gradients_into_one_collective_with_the_same_result():
    plain, fused = lowered(Strategy()), lowered(Strategy(fuse_all_reduce=True))
    # the program: one all-reduce per gradient (six) and one for the loss, against two
    assert collective_stats(plain.as_text(dialect="hlo"))["all-reduce"] == 7
    assert collective_stats(fused.as_text(dialect="hlo"))["all-reduce"] == 2
    # compiled: XLA's combiner merges both into one instruction, but over 7 arrays against 2
    plain, fused = collective_stats(plain), collective_stats(fused)
    assert (plain["all-reduce buffers"], fused["all-reduce buffers"]) == (7, 2)
    assert plain["all-reduce bytes"] == fused["all-reduce bytes"] == 403 * 4 + 4
    # a bucket limit of 1 KB (the 16x16 kernel alone is 1 KB) splits the gradients over buckets
    small = lowered(Strategy(fuse_all_reduce=True, fuse_grad_size_in_MB=1 / 1024))
    assert collective_stats(small.as_text(dialect="hlo"))["all-reduce"] == 4
    tx = optax.adam(0.01)
    dp, state = data_parallel(Strategy(fuse_all_reduce=True), tx)
    assert_same(state["params"], single_device(tx))


def test_hierarchical_all_reduce_sums_within_then_across_nodes():
    strategy = Strategy(hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2, fuse_all_reduce=True)
    dp, state = data_parallel(strategy, optax.sgd(0.1))
    assert dict(dp.mesh.shape) == {"inter": 2, "intra": 4}
    assert_same(state["params"], single_device(optax.sgd(0.1)))
    hlo = lowered(strategy).compile().as_text()
    groups = {re.search(r"replica_groups=(\{\{.*?\}\}|mesh\[[^]]*\] \{[^}]*\})", line)[1]
              for line in hlo.splitlines() if " all-reduce(" in line}
    # device ids (jax 0.10), or the mesh axes they come from (0.11): within a node, then across
    within, across = "{{0,1,2,3},{4,5,6,7}}", "{{0,4},{1,5},{2,6},{3,7}}"
    if not {within, across} <= groups:
        mesh = "mesh['inter'=2,'intra'=4]"
        assert {f"{mesh} {{'intra'}}", f"{mesh} {{'inter'}}"} <= groups, groups


def test_zero2_reduce_scatters_gradients_bucket_by_bucket_and_zero3_gathers_parameters():
    stats = lambda stage, **fuse: collective_stats(lowered(Strategy(sharding={"stage": stage}, **fuse)))  # noqa: E731
    zero2, zero3 = stats(2), stats(3)
    # one reduce-scatter per parameter, each device receiving 1/8 of the 408 padded floats
    assert (zero2["reduce-scatter"], zero2["reduce-scatter bytes"]) == (6, 51 * 4)
    assert zero2["all-reduce"] == 1  # the loss
    # fused: buckets of fuse_grad_size_in_MB (1 KB: b1+b2+b3+w1 | w2 | w3), the same bytes
    fused = (stats(2, fuse_all_reduce=True), stats(3, fuse_all_reduce=True))
    assert [s["reduce-scatter"] for s in fused] == [1, 1]
    small = stats(2, fuse_all_reduce=True, fuse_grad_size_in_MB=1 / 1024)
    assert (small["reduce-scatter"], small["reduce-scatter bytes"]) == (3, 51 * 4)
    # ZeRO-2 gathers the updated flat vector after the update; ZeRO-3 gathers it before the
    # forward pass and keeps it sharded at rest: one all-gather each, nothing else moved
    assert (zero2["all-gather"], zero2["all-gather bytes"], zero2["collective-permute"]) == (1, 408 * 4, 0)
    assert (zero3["all-gather"], zero3["all-gather bytes"], zero3["reduce-scatter"]) == (1, 408 * 4, 6)


@pytest.mark.parametrize("stage", [0, 2])
def test_bf16_communication_halves_the_gradient_bytes_and_stays_within_bf16_rounding(stage):
    strategy = Strategy(sharding={"stage": stage}, fuse_all_reduce=True)
    # the program as written: XLA's CPU backend widens a bf16 collective back to f32 when it
    # compiles (its collectives sum f32), where GPU and TPU collectives send bf16
    wide, narrow = (collective_stats(lowered(strategy.replace(comm_dtype=c)).as_text(dialect="hlo"))
                    for c in (None, "bfloat16"))
    kind = "reduce-scatter" if stage else "all-reduce"
    # the loss is all-reduced in float32 either way (4 bytes)
    assert narrow[f"{kind} bytes"] - 4 * (not stage) == (wide[f"{kind} bytes"] - 4 * (not stage)) // 2
    want = single_device(optax.sgd(0.1))
    _, state = data_parallel(strategy.replace(comm_dtype="bfloat16"), optax.sgd(0.1))
    got = DataParallel(strategy).full_params(state["params"]) if stage == 3 else state["params"]
    for name in want:  # five steps of gradients each rounded to bf16 (8 significant bits)
        rel = np.max(np.abs(got[name] - want[name])) / np.max(np.abs(want[name]))
        assert rel <= 1e-2, (name, rel)
    assert got["w1"].dtype == jnp.float32


def test_local_sgd_averaging_every_step_is_synchronous_momentum_sgd():
    tx = optax.sgd(0.1, momentum=0.9)  # linear in the gradients: averaging copies = averaging gradients
    _, state = data_parallel(Strategy(localsgd={"k_steps": 1}), tx)
    assert_same(DataParallel(Strategy(localsgd={"k_steps": 1})).full_params(state["params"]), single_device(tx))


def test_local_sgd_copies_drift_apart_between_averages_and_only_parameters_are_communicated():
    strategy, tx = Strategy(localsgd={"k_steps": 3}), optax.sgd(0.1)
    dp = DataParallel(strategy)
    state, step = dp.init(PARAMS, tx), dp.train_step(mlp_loss, tx)
    spread = []
    for batch in BATCHES[:3]:
        state, _ = step(state, batch)
        w = np.asarray(state["params"]["w1"])
        spread.append(float(np.max(np.abs(w - w[0]))))
    assert spread[0] > 0 and spread[1] > 0 and spread[2] == 0.0  # averaged on the third step
    stats = collective_stats(step.lower(state, BATCHES[0]).compile())
    # the loss every step; the six parameters only in the averaging branch
    assert stats["all-reduce"] - stats["all-reduce conditional"] == 1
    assert stats["all-reduce conditional bytes"] == 403 * 4


def test_dgc_sending_everything_is_plain_sgd():
    _, state = data_parallel(Strategy(dgc={"sparsity": 0.0, "momentum": 0.0}), optax.sgd(0.1))
    assert_same(state["params"], single_device(optax.sgd(0.1)))


def test_dgc_sends_a_few_entries_and_keeps_the_rest_so_no_gradient_is_lost():
    # a loss linear in the parameters: its gradients do not depend on them, so whatever DGC has not
    # sent yet (the residuals) is exactly what its parameters lag one device's SGD by
    def linear(p, batch):
        return jnp.mean(batch[0] @ p["w1"]) + jnp.mean(batch[1] * p["b3"])

    strategy, tx = Strategy(dgc={"sparsity": 0.9, "momentum": 0.0}), optax.sgd(0.1)
    dp = DataParallel(strategy)
    params = {"w1": PARAMS["w1"], "b3": PARAMS["b3"]}
    state, step = dp.init(params, tx), dp.train_step(linear, tx)
    sgd, opt = params, tx.init(params)
    for batch in BATCHES:
        state, _ = step(state, batch)
        updates, opt = tx.update(jax.grad(linear)(sgd, batch), opt, sgd)
        sgd = optax.apply_updates(sgd, updates)
    residual = jax.tree.map(lambda v: jnp.mean(v, axis=0), state["merge"]["v"])
    assert_same(jax.tree.map(lambda p, r: p - 0.1 * r, state["params"], residual), sgd)
    assert float(jnp.max(jnp.abs(residual["w1"]))) > 0  # something was held back
    # 7 of w1's 64 entries and 1 of b3's 3 are sent per device and step
    assert int(jnp.sum(state["merge"]["v"]["w1"][0] == 0)) >= 7


def test_dgc_at_high_sparsity_moves_fewer_bytes_than_the_all_reduce():
    dense = collective_stats(lowered(Strategy()))
    sparse = collective_stats(lowered(Strategy(dgc={"sparsity": 0.99})))
    # per gradient 8 devices x k entries x (index + value): k = 1, 1, 3, 1, 1, 1 -> 512 bytes, and the loss
    assert sparse["all-reduce bytes"] == 8 * 8 * 8 + 4 < dense["all-reduce bytes"] == 403 * 4 + 4


@pytest.mark.parametrize("kwargs, message", [
    ({"localsgd": {"k_steps": 2}, "dgc": {}}, "does not combine with the other of localsgd and dgc"),
    ({"dgc": {}, "sharding": {"stage": 2}}, "does not combine with sharding.stage=2"),
    ({"localsgd": {}, "gradient_merge": {"k_steps": 2}}, "does not combine with gradient_merge"),
    ({"dgc": {"sparsity": 1.0}}, r"DGC.sparsity: expected a number in \[0, 1\), got 1.0"),
    ({"localsgd": {"k_steps": 0}}, "LocalSGD.k_steps: expected an int >= 1, got 0"),
])
def test_local_sgd_and_dgc_refuse_what_they_cannot_combine_with(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Strategy(**kwargs)


def test_trainer_with_local_sgd_trains_and_evaluates_the_mean_of_the_copies():
    import paddlejax.nn as pnn

    pnn.seed(0)
    model = pnn.Sequential(pnn.Linear(4, 16), pnn.Tanh(), pnn.Linear(16, 3))
    trainer = pj.Trainer(model, optax.sgd(0.1), loss="mse", progress=False, strategy=Strategy(localsgd={"k_steps": 2}))
    losses = [trainer.train_batch([x], y) for x, y in BATCHES]
    assert losses[-1] < losses[0]
    params = trainer.step_builder.params(trainer.state.params)
    assert params["0.weight"].shape == (4, 16)


def test_comm_dtype_is_checked_and_refused_where_xla_places_the_collectives():
    with pytest.raises(ValueError, match="comm_dtype: expected one of None, 'bfloat16', 'float16', got 'int8'"):
        Strategy(comm_dtype="int8")
    with pytest.raises(ValueError, match="sharded and pipeline steps communicate"):
        Strategy(comm_dtype="bfloat16", tensor_parallel_degree=2)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gradient_merge_of_four_micro_batches_equals_one_step_on_the_whole_batch(stage):
    big = (jnp.concatenate([b[0] for b in BATCHES[:4]]), jnp.concatenate([b[1] for b in BATCHES[:4]]))
    merge = Strategy(sharding={"stage": stage}, gradient_merge={"k_steps": 4})
    dp, state = data_parallel(merge, optax.adam(0.01), BATCHES[:4])
    assert_same(dp.full_params(state["params"]), single_device(optax.adam(0.01), [big]))
    assert int(state["merge"]["count"]) == 4
    dp, state = data_parallel(merge, optax.adam(0.01), BATCHES[:3])  # three micro-steps: no update yet
    for name, value in dp.full_params(state["params"]).items():
        np.testing.assert_array_equal(value, PARAMS[name])


def test_an_optimizer_from_fleet_is_merged_once_not_twice():
    merge = Strategy(gradient_merge={"k_steps": 4})
    dp, state = data_parallel(merge, fleet.distributed_optimizer(optax.adam(0.01), merge), BATCHES[:4])
    _, plain = data_parallel(merge, optax.adam(0.01), BATCHES[:4])
    assert_same(state["params"], plain["params"])


def test_gradient_merge_without_avg_sums_the_micro_batch_gradients():
    big = (jnp.concatenate([b[0] for b in BATCHES[:4]]), jnp.concatenate([b[1] for b in BATCHES[:4]]))
    _, state = data_parallel(Strategy(gradient_merge={"k_steps": 4, "avg": False}), optax.sgd(0.1), BATCHES[:4])
    assert_same(state["params"], single_device(optax.sgd(0.4), [big]))


def test_gradient_merge_communicates_gradients_only_on_the_updating_micro_step():
    """Below stage 2 the six gradient all-reduces sit in the branch of a conditional that runs on
    every k-th step (Paddle's merge; the loss's all-reduce runs every step). Stage 2 reduce-
    scatters every micro-step instead, so that its buffer is a slice."""
    merge = {"k_steps": 4}
    program = lambda strategy: lowered(strategy).as_text(dialect="hlo")  # noqa: E731
    merged, plain = collective_stats(program(Strategy(gradient_merge=merge))), collective_stats(program(Strategy()))
    assert (merged["all-reduce"], merged["all-reduce conditional"]) == (7, 6)
    assert (plain["all-reduce"], plain["all-reduce conditional"]) == (7, 0)
    zero2 = collective_stats(program(Strategy(sharding={"stage": 2}, gradient_merge=merge)))
    assert (zero2["reduce-scatter"], zero2["reduce-scatter conditional"]) == (6, 0)


def test_clip_by_global_norm_is_exact_on_zero_slices():
    for stage in (0, 3):
        dp = DataParallel(Strategy(sharding={"stage": stage}))
        tx = optax.chain(dp.clip_by_global_norm(0.05), optax.sgd(0.1))
        state, step = dp.init(PARAMS, tx), dp.train_step(mlp_loss, tx)
        for batch in BATCHES:
            state, _ = step(state, batch)
        assert_same(dp.full_params(state["params"]),
                    single_device(optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.1))))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_refuses_an_optimizer_that_clips_by_the_norm_of_its_slice(stage):
    """ZeRO updates each device's slice: a clip by the global norm inside the optimizer would
    clip every slice by its own norm, so it is refused and the exact clips are named."""
    clipped = optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5))
    with pytest.raises(ValueError, match=rf"ZeRO stage {stage} .* Trainer\(grad_clip=...\) or "
                                         r"DataParallel.clip_by_global_norm"):
        DataParallel(Strategy(sharding={"stage": stage})).init(PARAMS, clipped)
    DataParallel(Strategy()).init(PARAMS, clipped)  # without ZeRO the update sees whole gradients
    with pytest.raises(ValueError, match="grad_clip"):
        trained(Strategy(sharding={"stage": stage}), clipped, steps=1)


def test_a_batch_the_devices_cannot_share_is_refused():
    dp = DataParallel()
    with pytest.raises(ValueError, match="batch size 12 is not divisible by the data-parallel size 8"):
        dp.shard_batch((jnp.ones((12, 4)), jnp.ones((12, 3))))


class MLP(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.l1, self.l2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def trained(strategy, optimizer, steps=5, **kw):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(steps, 16, 8)).astype(np.float32)
    y = rng.integers(0, 3, (steps, 16)).astype(np.int32)
    trainer = pj.Trainer(MLP(), optimizer, metrics=["accuracy"], progress=False, strategy=strategy, **kw)
    losses = [trainer.train_batch((x[i],), y[i]) for i in range(steps)]
    trainer.sync_model()
    return trainer, losses


@pytest.mark.parametrize("stage", [0, 3])
def test_trainer_with_a_strategy_trains_as_on_one_device(stage):
    strategy = Strategy(sharding={"stage": stage}, fuse_all_reduce=True)
    one, one_losses = trained(None, optax.adam(0.01), grad_clip=1.0)
    many, many_losses = trained(strategy, optax.adam(0.01), grad_clip=1.0)
    np.testing.assert_allclose(many_losses, one_losses, rtol=1e-5)
    assert_same(model_params(many), model_params(one))
    if stage:
        assert per_device_shapes(many.state.params) == {(25,)}  # 8*16 + 16 + 16*3 + 3 = 195 -> 200 / 8
        assert per_device_shapes(jax.tree.leaves(many.state.opt)[1]) == {(25,)}


def model_params(trainer):
    return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(trainer.model, nnx.Param))}


def test_trainer_gradient_merge_from_the_strategy_equals_its_accumulate():
    merged, _ = trained(Strategy(gradient_merge={"k_steps": 4}), optax.sgd(0.1), steps=4)
    plain, _ = trained(None, optax.sgd(0.1), steps=4, accumulate=4)
    assert_same(model_params(merged), model_params(plain))
    assert not np.allclose(model_params(plain)["l1", "kernel"], np.asarray(MLP().l1.kernel.get_value()))


def test_trainer_gradient_merge_without_avg_applies_the_sum_of_the_micro_batches_gradients():
    merge = Strategy(gradient_merge={"k_steps": 4, "avg": False})
    want = model_params(trained(None, optax.sgd(0.4), steps=4, accumulate=4)[0])  # 4 x the mean
    for strategy, optimizer in ((merge, optax.sgd(0.1)), (None, fleet.distributed_optimizer(optax.sgd(0.1), merge))):
        got, _ = trained(strategy, optimizer, steps=4)
        assert got.dp is not None and got.dp.strategy.gradient_merge.avg is False
        assert_same(model_params(got), want)



def test_a_sharded_training_state_checkpoints_and_resumes(tmp_path):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(64, 8)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32)
    strategy = Strategy(sharding={"stage": 3})

    def fit(epochs, folder):
        steps = []
        trainer = pj.Trainer(MLP(), optax.adam(0.01), progress=False, strategy=strategy, log_every=1,
                             checkpoint_dir=str(folder), checkpoint_every=100,
                             callbacks=[LambdaCallback(on_step_end=lambda t, step, logs: steps.append(step))])
        trainer.fit((x, y), epochs=epochs, batch_size=16, shuffle=False)
        return trainer, steps

    fit(1, tmp_path / "run")  # stops after epoch 1, with a checkpoint at step 4
    resumed, steps = fit(2, tmp_path / "run")
    assert steps == [5, 6, 7, 8]  # only the second epoch ran: the sharded state came back from step 4
    assert per_device_shapes(resumed.state.params) == {(25,)}
    uninterrupted, _ = fit(2, tmp_path / "other")
    assert_same(model_params(resumed), model_params(uninterrupted))


def test_evaluate_and_predict_under_a_strategy_equal_one_device_including_a_last_partial_batch():
    one, _ = trained(None, optax.adam(0.01))
    many, _ = trained(Strategy(sharding={"stage": 3}), optax.adam(0.01))
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(20, 8)).astype(np.float32), rng.integers(0, 3, 20).astype(np.int32)
    want, got = one.evaluate((x, y), batch_size=16), many.evaluate((x, y), batch_size=16)  # 16 split, 4 whole
    assert got.keys() == want.keys()
    for key in want:
        assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
    np.testing.assert_allclose(many.predict(x, batch_size=16), one.predict(x, batch_size=16), rtol=1e-5, atol=1e-6)


def bn_model(sync: bool):
    """Conv and linear layers each followed by batch norm (without the bias batch norm cancels)."""
    from paddlejax import nn

    nn.seed(0)
    model = nn.Sequential(nn.Conv2D(3, 4, 3, padding=1, bias_attr=False), nn.BatchNorm2D(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(64, 8, bias_attr=False), nn.BatchNorm1D(8), nn.Tanh(), nn.Linear(8, 3))
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync else model


def bn_trained(model, strategy, optimizer, steps=4):
    rng = np.random.default_rng(4)
    x = (1 + 2 * rng.normal(size=(steps, 16, 3, 4, 4))).astype(np.float32)
    y = rng.integers(0, 3, (steps, 16)).astype(np.int32)
    trainer = pj.Trainer(model, optimizer, progress=False, strategy=strategy)
    losses = [trainer.train_batch((x[i],), y[i]) for i in range(steps)]
    trainer.sync_model()
    return trainer, losses, {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.parametrize("strategy", [Strategy(), Strategy(sharding={"stage": 3}, hierarchical_allreduce=True,
                                                           hierarchical_allreduce_inter_nranks=2)],
                         ids=["dp", "zero3-hierarchical"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_sync_batch_norm_trains_as_on_one_device(opt, strategy):
    _, want_losses, want = bn_trained(bn_model(sync=False), None, OPTIMIZERS[opt]())
    trainer, losses, got = bn_trained(bn_model(sync=True), strategy, OPTIMIZERS[opt]())
    assert trainer.batch_norm == "sync"
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=2e-6)  # parameters and running statistics alike


def test_batch_norm_under_data_parallelism_normalises_each_devices_rows_and_says_so():
    with pytest.warns(UserWarning, match=r"batch norm normalises each device's rows .* nn.SyncBatchNorm"):
        trainer, _, got = bn_trained(bn_model(sync=False), Strategy(), optax.sgd(0.1), steps=1)
    assert trainer.batch_norm == "local"
    _, _, want = bn_trained(bn_model(sync=False), None, optax.sgd(0.1), steps=1)
    # the running mean is the mean of the devices' (and so the batch's); the variance is not
    np.testing.assert_allclose(got[("1", "mean")], want[("1", "mean")], rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(got[("1", "variance")] - want[("1", "variance")])) > 1e-2
