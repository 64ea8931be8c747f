"""The host tier: an embedding table in pinned_host memory trained by pull and push moves exactly as
a device table under the row-wise optimizers does, touching only the rows a batch looked up."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paddlejax.distributed.host_table import HostEmbeddingTable
from paddlejax.optimizer import lazy_adagrad, lazy_adam

V, D = 200, 4


def batches(n=4):
    rng = np.random.default_rng(0)
    return [(jnp.asarray(rng.integers(0, 60, (16, 3)), jnp.int32), jnp.asarray(rng.integers(0, 2, 16), jnp.float32))
            for _ in range(n)]


def loss(vectors, labels, w):
    logits = jnp.sum(vectors, axis=(1, 2)) * w
    return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits)


@pytest.mark.parametrize("name, dense", [("adagrad", lazy_adagrad(0.1)), ("adam", lazy_adam(0.1)),
                                         ("sgd", optax.sgd(0.1))])
def test_pull_and_push_train_as_a_device_table_with_the_row_wise_optimizer(name, dense):
    table = HostEmbeddingTable(V, D, optimizer=name, learning_rate=0.1)
    device = {"emb": jnp.asarray(table.read(np.arange(V)))}
    state = dense.init(device)
    for ids, labels in batches():
        pulled = table.pull(ids)
        table.push(pulled, jax.grad(lambda rows: loss(pulled.lookup(rows), labels, 0.5))(pulled.rows))
        grads = jax.grad(lambda p: loss(jnp.take(p["emb"], ids, axis=0), labels, 0.5))(device)
        updates, state = dense.update(grads, state, device)
        device = optax.apply_updates(device, updates)
    np.testing.assert_allclose(table.read(np.arange(V)), np.asarray(device["emb"]), rtol=2e-5, atol=1e-6)


def test_rows_no_batch_pulled_never_move_and_everything_stays_in_host_memory():
    table = HostEmbeddingTable(V, D, optimizer="adam", learning_rate=0.1)
    before = table.read(np.arange(V))
    for ids, labels in batches(2):
        pulled = table.pull(ids)
        table.push(pulled, jax.grad(lambda rows: loss(pulled.lookup(rows), labels, 1.0))(pulled.rows))
    after = table.read(np.arange(V))
    np.testing.assert_array_equal(after[60:], before[60:])  # ids were drawn below 60
    assert not np.allclose(after[:60], before[:60])
    assert {table.rows.sharding.memory_kind, *(s.sharding.memory_kind for s in table.state.values())} == {"pinned_host"}
    np.testing.assert_array_equal(np.asarray(table.state["mu"])[60:], 0.0)


def test_a_pull_brings_each_distinct_id_once():
    table = HostEmbeddingTable(V, D)
    pulled = table.pull(jnp.array([[5, 5, 9], [9, 5, 1]]))
    real = np.asarray(pulled.ids) < V
    assert sorted(np.asarray(pulled.ids)[real].tolist()) == [1, 5, 9]
    np.testing.assert_array_equal(np.asarray(pulled.lookup()), table.read(np.array([[5, 5, 9], [9, 5, 1]])))


@pytest.mark.parametrize("ids, message", [(jnp.array([0, 200]), r"ids must lie in \[0, 200\), got \[0, 200\]"),
                                          (jnp.array([-1]), r"ids must lie in \[0, 200\)"),
                                          (jnp.ones(2), "ids expects an int array")])
def test_bad_ids_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        HostEmbeddingTable(V, D).pull(ids)


def test_gradients_of_another_shape_are_refused_and_the_table_is_unchanged():
    table = HostEmbeddingTable(V, D)
    before = table.read(np.arange(V))
    with pytest.raises(ValueError, match=r"grads expects the pulled rows' shape \(3, 4\), got \(2, 4\)"):
        table.push(table.pull(jnp.array([1, 2, 3])), np.ones((2, 4)))
    np.testing.assert_array_equal(table.read(np.arange(V)), before)


def test_a_backend_without_host_memory_is_named():
    device = types.SimpleNamespace(platform="tpu", addressable_memories=lambda: [types.SimpleNamespace(kind="device")])
    with pytest.raises(ValueError, match="HostEmbeddingTable: the tpu backend has no pinned_host memory"):
        HostEmbeddingTable(V, D, device=device)
