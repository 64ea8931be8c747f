"""Mixture of experts: GShard/Switch routing against a token-by-token reference (capacity, drops,
gates, the load-balancing loss), and expert parallelism over 8 CPU devices that trains as one
device does, each device holding its share of the experts, tokens moved by all-to-all."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.distributed import Strategy, collective_stats
from paddlejax.distributed.moe import MoELayer, balance_loss, routing


def reference_routing(probs: np.ndarray, top_k: int, capacity: int):
    """Token by token, first choices of every token before second choices, as GShard queues them."""
    t, e = probs.shape
    dispatch, combine = np.zeros((t, e, capacity)), np.zeros((t, e, capacity))
    filled, dropped = np.zeros(e, int), 0
    order = np.argsort(-probs, axis=1)[:, :top_k]
    gates = np.take_along_axis(probs, order, axis=1)
    if top_k > 1:
        gates = gates / gates.sum(axis=1, keepdims=True)
    for k in range(top_k):
        for token in range(t):
            expert = order[token, k]
            if filled[expert] < capacity:
                dispatch[token, expert, filled[expert]] = 1
                combine[token, expert, filled[expert]] = gates[token, k]
            else:
                dropped += 1
            filled[expert] += 1
    return dispatch, combine, dropped, np.minimum(filled, capacity)


@pytest.mark.parametrize("top_k, capacity", [(1, 2), (1, 16), (2, 3), (2, 16)])
def test_routing_matches_a_token_by_token_queue(top_k, capacity):
    probs = jax.nn.softmax(jnp.asarray(np.random.default_rng(top_k + capacity).normal(size=(12, 4)) * 2), axis=1)
    dispatch, combine, _, dropped, load = routing(probs, top_k, capacity)
    want = reference_routing(np.asarray(probs, np.float64), top_k, capacity)
    np.testing.assert_array_equal(dispatch, want[0])
    np.testing.assert_allclose(combine, want[1], rtol=1e-6)
    assert int(dropped) == want[2] and load.tolist() == want[3].tolist()


def test_the_load_balancing_loss_is_one_when_even_and_num_experts_when_one_expert_takes_all():
    even = jnp.asarray(np.eye(4)[np.arange(8) % 4] * 0.7 + 0.075)  # each expert first for 2 of 8 tokens
    assert float(balance_loss(routing(even, 1, 8)[2])) == pytest.approx(1.0)
    skewed = jnp.tile(jnp.array([[1.0, 0.0, 0.0, 0.0]]), (8, 1))
    assert float(balance_loss(routing(skewed, 1, 8)[2])) == pytest.approx(4.0)


class MoENet(nn.Layer):
    def __init__(self, experts=8, top_k=2, capacity_factor=8.0):
        self.inp = nn.Linear(6, 16)
        self.moe = MoELayer(16, 32, num_experts=experts, top_k=top_k, capacity_factor=capacity_factor)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        y, aux = self.moe(h)
        return self.out(h + y), aux


def loss(outputs, labels):
    logits, aux = outputs
    return jnp.mean(nn.functional.cross_entropy(logits, labels, reduction="none")) + 0.01 * aux


def batches(n=3):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(16, 5, 6)).astype(np.float32), rng.integers(0, 3, (16, 5)).astype(np.int32))
            for _ in range(n)]


def train(strategy, **model):
    nn.seed(0)
    trainer = pj.Trainer(MoENet(**model), optax.sgd(0.1), loss=loss, progress=False, strategy=strategy)
    return trainer, [trainer.train_batch([x], y) for x, y in batches()]


@pytest.fixture(scope="module")
def one_device():
    return train(None)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_parallel_training_equals_one_device(one_device, ep):
    want, want_losses = one_device
    trainer, losses = train(Strategy(expert_parallel_degree=ep))
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5)
    for name, value in want.state.params.items():
        np.testing.assert_allclose(trainer.state.params[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
    w1 = trainer.state.params["moe.w1"]
    assert w1.addressable_shards[0].data.shape == (8 // ep, 16, 32)  # its share of the experts
    assert dict(trainer.step_builder.mesh.shape) == {"dp": 8 // ep, "ep": ep}


def test_tokens_reach_their_experts_by_all_to_all():
    trainer, _ = train(Strategy(expert_parallel_degree=4))
    x, y = batches(1)[0]
    placed = trainer.step_builder.place((jnp.asarray(x),), jnp.asarray(y))
    stats = collective_stats(trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed), *placed).compile())
    assert stats["all-to-all"] >= 2  # there and back, forward and backward


def test_the_program_records_the_expert_split_and_the_forward_pass_counts_dropped_tokens():
    nn.seed(0)
    model = MoENet(top_k=1, capacity_factor=0.5)
    program = pj.to_static(model, pj.InputSpec((None, 5, 6)))
    assert 'param @moe.w1 {sharding=("ep", None, None)}' in str(program)
    trainer = pj.Trainer(model, optax.sgd(0.1), loss=loss, progress=False, strategy=Strategy(expert_parallel_degree=2))
    x, y = batches(1)[0]
    trainer.train_batch([x], y)
    # 80 tokens over 8 devices, each routing its 10 as a group: capacity ceil(0.5 * 10 / 8) = 1 slot an
    # expert a device, so at most 8 tokens an expert; the counts are summed over the devices
    dropped, load = int(trainer.state.extra["moe.dropped"]), trainer.state.extra["moe.load"]
    assert dropped == 80 - int(load.sum()) > 0 and int(load.max()) <= 8


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 3}, "top_k.*1 \\(Switch\\) or 2 \\(GShard\\)"),
    ({"capacity_factor": 0}, "capacity_factor.*a number > 0"),
    ({"num_experts": 0}, "num_experts"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoELayer(8, 16, **{"num_experts": 4, **kwargs})


def test_a_wrong_width_is_refused():
    with pytest.raises(ValueError, match="MoELayer: input expects 8 features"):
        MoELayer(8, 16, num_experts=4)(jnp.ones((2, 6)))


def test_capacity_is_per_expert_for_the_tokens_of_a_call():
    layer = MoELayer(8, 16, num_experts=4, top_k=2, capacity_factor=1.25)
    assert layer.capacity(10) == math.ceil(1.25 * 10 * 2 / 4) == 7


@pytest.mark.parametrize("split, concat", [(0, 0), (0, 1), (1, 0), (2, 1)])
def test_hierarchical_all_to_all_delivers_what_the_flat_one_does_in_two_steps(split, concat):
    from jax.sharding import Mesh, PartitionSpec as P

    from paddlejax.distributed.collectives import all_to_all

    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("inter", "intra"))
    x = jnp.asarray(np.random.default_rng(split * 3 + concat).normal(size=(8 * 8, 16, 8)), jnp.float32)

    def exchange(hierarchical):
        f = lambda x: all_to_all(x, ("inter", "intra"), split, concat, hierarchical)  # noqa: E731
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(("inter", "intra")), out_specs=P(("inter", "intra"))))

    flat, two_step = exchange(False), exchange(True)
    np.testing.assert_array_equal(two_step(x), flat(x))
    hlo = two_step.lower(x).compile().as_text()
    assert collective_stats(hlo)["all-to-all"] == 2 and collective_stats(flat.lower(x).compile())["all-to-all"] == 1
    # within each node of 4, then between the 2 nodes
    assert "replica_groups={{0,1,2,3},{4,5,6,7}}" in hlo and "replica_groups={{0,4},{1,5},{2,6},{3,7}}" in hlo


@pytest.mark.parametrize("hierarchical", [False, True])
def test_explicit_expert_parallelism_inside_shard_map_equals_routing_each_devices_tokens_alone(hierarchical):
    from jax.sharding import Mesh, PartitionSpec as P

    nn.seed(0)
    layer = MoELayer(8, 16, num_experts=8, top_k=2, capacity_factor=1.0)
    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("inter", "intra"))
    axes = ("inter", "intra")
    x = jnp.asarray(np.random.default_rng(1).normal(size=(8 * 6, 8)), jnp.float32)
    weights = layer.weights()
    run = jax.jit(jax.shard_map(lambda x, w: layer.expert_parallel(x, w, axes, hierarchical)[0], mesh=mesh,
                                in_specs=(P(axes), P(axes)), out_specs=P(axes)))
    got = run(x, weights)
    # one device, each device's 6 tokens routed as their own group (capacity from 6 tokens)
    want = jnp.concatenate([layer(x[i * 6:(i + 1) * 6])[0] for i in range(8)])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
