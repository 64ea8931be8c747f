"""ZeRO's flat layout: buckets padded to the device count, device-major pieces, exact round trips."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from paddlejax.distributed.zero import FlatLayout

TREE = {"a": jnp.arange(5.0), "b": jnp.arange(100.0, 112.0).reshape(3, 4), "c": jnp.asarray([7.0])}


def test_one_bucket_per_parameter_pads_each_to_the_device_count():
    layout = FlatLayout(TREE, devices=4)
    assert layout.lengths == (5, 12, 1) and layout.chunks == (2, 3, 1) and layout.length == 24
    pieces = layout.shard(TREE).reshape(4, -1)
    np.testing.assert_array_equal(pieces[0], [0, 1, 100, 101, 102, 7])  # device 0: a[0:2], b[0:3], c[0]
    np.testing.assert_array_equal(pieces[3], [0, 0, 109, 110, 111, 0])  # padding at each bucket's end
    restored = layout.tree(layout.shard(TREE))
    assert all(np.array_equal(restored[k], TREE[k]) for k in TREE)


def test_buckets_of_a_size_hold_consecutive_parameters():
    layout = FlatLayout(TREE, devices=4, bucket_mb=60 / 2**20)  # 15 floats: a + b > 15 -> a | b + c
    assert layout.lengths == (5, 13) and layout.chunks == (2, 4)
    layout = FlatLayout(TREE, devices=4, bucket_mb=1.0)
    assert layout.lengths == (18,) and layout.length == 20
    restored = layout.tree(layout.shard(TREE))
    assert all(np.array_equal(restored[k], TREE[k]) for k in TREE)


def test_each_device_gets_its_pieces_and_the_sum_of_everyones_by_reduce_scatter():
    mesh = Mesh(jax.devices()[:4], ("dp",))
    layout = FlatLayout(TREE, devices=4, bucket_mb=60 / 2**20)

    def per_device(tree):
        index = jax.lax.axis_index("dp")
        mine = jax.tree.map(lambda x: x * (index + 1), tree)  # device i holds (i + 1) x TREE
        return layout.local(tree, index), layout.reduce_scatter(mine, "dp")

    local, summed = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=(P("dp"), P("dp"))))(
        jax.device_put(TREE, NamedSharding(mesh, P())))
    np.testing.assert_array_equal(local, layout.shard(TREE))
    np.testing.assert_allclose(summed, 10 * layout.shard(TREE))  # 1 + 2 + 3 + 4
