"""The ``sparse_embedding`` op on a mesh: lookups and gradients equal one whole table's, for any
spread of ids over the devices (all bound for one device included), and ``hash_bucket``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import paddlejax as pj
from paddlejax.distributed import collective_stats

V, D = 64, 4


def split_table(mesh, table):
    return jax.device_put(table, NamedSharding(mesh, P(mesh.axis_names[:-1] if "mp" in mesh.axis_names
                                                       else mesh.axis_names)))


def objective(lookup):
    return lambda table, ids: jnp.sum(jnp.sin(lookup(ids, table)) * jnp.arange(1.0, table.shape[1] + 1))


@pytest.mark.parametrize("shape, names", [((8,), ("dp",)), ((2, 4), ("inter", "intra")), ((4, 2), ("dp", "mp"))])
@pytest.mark.parametrize("spread", ["random", "one device", "repeated"])
def test_lookups_and_gradients_equal_one_table(shape, names, spread):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), names)
    table = jax.random.normal(jax.random.key(0), (V, D))
    ids = {"random": jax.random.randint(jax.random.key(1), (16, 3), 0, V),
           "one device": jnp.arange(48).reshape(16, 3) % 8,  # every row on device 0
           "repeated": jnp.full((16, 3), 37)}[spread]
    whole = objective(lambda i, t: pj.ops.embedding(i, t))
    split = objective(lambda i, t: pj.ops.sparse_embedding(i, t))
    with jax.set_mesh(mesh):
        sharded = split_table(mesh, table)
        out = jax.jit(lambda i, t: pj.ops.sparse_embedding(i, t))(ids, sharded)
        grad = jax.jit(jax.grad(split))(sharded, ids)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(pj.ops.embedding(ids, table)))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(whole)(table, ids)), rtol=1e-6, atol=1e-6)
    assert grad.sharding.spec == sharded.sharding.spec  # each device keeps its rows' gradient


def test_ids_and_rows_travel_by_all_to_all_and_the_table_never_moves():
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    table = jnp.zeros((8192, 16))
    ids = jnp.zeros((64, 4), jnp.int32)
    with jax.set_mesh(mesh):
        compiled = jax.jit(jax.grad(objective(lambda i, t: pj.ops.sparse_embedding(i, t)))).lower(
            split_table(mesh, table), ids).compile()
    stats = collective_stats(compiled)
    # ids out and rows back; the rows' gradients go out again to their owners (the ids are kept)
    assert stats["all-to-all"] == 3
    assert stats.get("all-gather", 0) == 0 and stats.get("all-reduce", 0) == 0


def test_padding_out_of_range_and_negative_ids_read_as_one_table_does():
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    table = jax.random.normal(jax.random.key(0), (V, D))
    ids = jnp.array([[0, 5, -1, 64, 70, -65, 3, 0]] * 8)
    with jax.set_mesh(mesh):
        out = jax.jit(lambda i, t: pj.ops.sparse_embedding(i, t, padding_idx=5))(ids, split_table(mesh, table))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(pj.ops.embedding(ids, table, padding_idx=5)))
    assert np.isnan(np.asarray(out)[0, 3]).all() and (np.asarray(out)[0, 1] == 0).all()


def test_a_table_the_devices_do_not_divide_is_refused_by_name():
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="table of 60 rows does not split evenly over the 8"):
        jax.jit(lambda i, t: pj.ops.sparse_embedding(i, t))(jnp.zeros((8, 2), jnp.int32), jnp.zeros((60, 4)))


def test_a_batch_the_devices_do_not_divide_is_refused_by_name():
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="batch of 6 rows of ids does not split evenly over the 8"):
        jax.jit(lambda i, t: pj.ops.sparse_embedding(i, t))(jnp.zeros((6, 2), jnp.int32), jnp.zeros((64, 4)))


def test_the_op_is_one_equation_in_a_program():
    program = pj.trace(lambda i, t: pj.ops.sparse_embedding(i, t, padding_idx=0), jnp.zeros((2, 3), jnp.int32),
                       jnp.zeros((V, D)))
    assert "sparse_embedding" in [op.type for op in program.walk()]
    assert "padding_idx=0" in str(program)


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finaliser, written out in numpy."""
    h = h.astype(np.uint64)
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = ((h ^ (h >> shift)) * mult) & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_hash_bucket_is_murmur3s_finaliser_seeded():
    ids = np.random.default_rng(0).integers(0, 2**31 - 1, 1000).astype(np.int32)
    for seed in (0, 7):
        want = fmix32(ids.astype(np.uint64) ^ (((seed + 1) * 0x9E3779B1) % 2**32)) % 1000
        np.testing.assert_array_equal(np.asarray(pj.ops.hash_bucket(jnp.asarray(ids), buckets=1000, seed=seed)), want)


def test_hash_bucket_spreads_neighbouring_ids_evenly_and_seeds_differ():
    ids = jnp.arange(100_000)
    counts = np.bincount(np.asarray(pj.ops.hash_bucket(ids, buckets=100)), minlength=100)
    assert counts.min() > 850 and counts.max() < 1150  # 1,000 expected per bucket
    same = pj.ops.hash_bucket(ids, buckets=1000, seed=1) == pj.ops.hash_bucket(ids, buckets=1000, seed=2)
    assert float(jnp.mean(same)) < 0.01


def test_hash_bucket_refuses_floats_and_zero_buckets():
    with pytest.raises(ValueError, match="input 'ids' expects a int array"):
        pj.ops.hash_bucket(jnp.ones(3), buckets=10)
    with pytest.raises(ValueError, match="buckets"):
        pj.ops.hash_bucket(jnp.ones(3, jnp.int32), buckets=0)
