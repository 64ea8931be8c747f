"""Segment reductions and message passing beyond the op table: Paddle's zero for empty segments,
the number of segments inferred eagerly and required under jit, unsorted ids, integer and
half-precision data, gradients, programs that save and load, and errors that name the op."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
import paddlejax.ops as ops

rng = np.random.default_rng(0)
SEGMENT_OPS = {"sum": ops.segment_sum, "mean": ops.segment_mean, "max": ops.segment_max, "min": ops.segment_min}


def np_segment(data, ids, n, reduce):
    """Segment reductions by numpy's unbuffered ``ufunc.at``; a segment no row falls in reads 0."""
    count = np.bincount(ids, minlength=n)
    out = np.full((n,) + data.shape[1:], {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf}[reduce])
    {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[reduce].at(out, ids, data)
    if reduce == "mean":
        out /= np.maximum(count, 1).reshape((n,) + (1,) * (data.ndim - 1))
    out[count == 0] = 0
    return out


@pytest.mark.parametrize("reduce", list(SEGMENT_OPS))
def test_empty_segments_read_zero_for_every_reduction(reduce):
    data = -1.0 - rng.random((4, 2)).astype(np.float32)  # all negative: a maximum's identity would show
    out = SEGMENT_OPS[reduce](data, np.array([1, 1, 3, 3]), num_segments=6)
    assert np.all(np.asarray(out)[[0, 2, 4, 5]] == 0)
    np.testing.assert_allclose(out, np_segment(data, np.array([1, 1, 3, 3]), 6, reduce), rtol=1e-6)


@pytest.mark.parametrize("reduce", ["max", "min", "sum"])
def test_integer_data_keeps_its_dtype_and_empty_segments_read_zero(reduce):
    data = np.array([[-5, 7], [-2, 3], [9, -8]], np.int32)
    out = SEGMENT_OPS[reduce](data, np.array([0, 0, 2]))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np_segment(data, np.array([0, 0, 2]), 3, reduce))


def test_integer_mean_rounds_toward_zero_as_paddle_divides():
    out = ops.segment_mean(np.array([-7, 2, 7, 2], np.int32), np.array([0, 0, 1, 1]))
    assert out.dtype == np.int32
    assert out.tolist() == [-2, 4]  # -5 / 2 -> -2 (floor would give -3), 9 / 2 -> 4


def test_eager_calls_infer_max_id_plus_one_and_traced_calls_need_num_segments():
    data, ids = rng.random((5, 3)).astype(np.float32), np.array([0, 0, 1, 4, 4])
    assert ops.segment_sum(data, ids).shape == (5, 3)
    assert ops.segment_sum(data[:0], ids[:0]).shape == (0, 3)
    with pytest.raises(ValueError, match=r"segment_sum: attribute 'num_segments' expects an int when segment_ids "
                                         r"is traced"):
        jax.jit(lambda d, i: ops.segment_sum(d, i))(data, ids)
    got = jax.jit(lambda d, i: ops.segment_mean(d, i, num_segments=7))(data, ids)
    np.testing.assert_allclose(got, np_segment(data, ids, 7, "mean"), rtol=1e-6)
    # eager gradients keep the ids concrete, so they infer too
    grad = jax.grad(lambda d: ops.segment_mean(d, ids).sum())(data)
    np.testing.assert_allclose(grad[:, 0], [0.5, 0.5, 1.0, 0.5, 0.5])


def test_ids_beyond_num_segments_are_dropped():
    out = ops.segment_sum(np.ones((3, 1), np.float32), np.array([0, 1, 5]), num_segments=2)
    assert out.tolist() == [[1.0], [1.0]]


@pytest.mark.parametrize("reduce", list(SEGMENT_OPS))
def test_unsorted_ids_give_what_sorted_ones_do(reduce):
    data, ids = rng.normal(size=(9, 2)).astype(np.float32), rng.integers(0, 4, 9)
    order = np.argsort(ids, kind="stable")
    op = SEGMENT_OPS[reduce]
    np.testing.assert_allclose(op(data, ids, num_segments=4), op(data[order], ids[order], num_segments=4), rtol=1e-6)
    got = ops.send_u_recv(data, np.arange(9), ids, reduce_op=reduce, out_size=4)
    np.testing.assert_allclose(got, op(data[order], ids[order], num_segments=4), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("reduce", list(SEGMENT_OPS))
def test_half_precision_keeps_its_dtype_and_matches_float32(dtype, reduce):
    data, ids = rng.normal(size=(40, 3)).astype(np.float32), np.sort(rng.integers(0, 5, 40))
    half = jnp.asarray(data, dtype)
    out = SEGMENT_OPS[reduce](half, ids, num_segments=5)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == jnp.bfloat16 else 2e-3
    np.testing.assert_allclose(np.asarray(out, np.float32), np_segment(np.asarray(half, np.float32), ids, 5, reduce),
                               rtol=tol, atol=tol)
    recv = ops.send_u_recv(half, np.arange(40), ids, reduce_op=reduce, out_size=5)
    np.testing.assert_array_equal(np.asarray(recv, np.float32), np.asarray(out, np.float32))


def test_half_precision_sums_accumulate_in_float32():
    # 4096 + 1 + 1 + ... in float16 rounds every +1 away; accumulated in float32 they add up to 4196
    data = jnp.asarray(np.r_[4096.0, np.ones(100)], jnp.float16)
    assert float(ops.segment_sum(data, np.zeros(101, np.int32), num_segments=1)[0]) == 4196.0


def test_max_gradient_goes_to_the_arg_max_and_an_empty_segment_gets_none():
    data = np.array([[1.0, 9.0], [4.0, 2.0], [3.0, 5.0]], np.float32)
    ids = np.array([0, 0, 2])
    grad = jax.grad(lambda d: (ops.segment_max(d, ids, num_segments=4) * np.arange(1.0, 5.0)[:, None]).sum())(data)
    np.testing.assert_array_equal(grad, [[0, 1], [1, 0], [3, 3]])
    grad = jax.grad(lambda d: ops.segment_min(d, ids, num_segments=4).sum())(data)
    np.testing.assert_array_equal(grad, [[1, 0], [0, 1], [1, 1]])


def dense_adjacency(src, dst, n):
    a = np.zeros((n, n))
    np.add.at(a, (src, dst), 1)
    return a


def test_send_u_recv_sum_and_mean_are_adjacency_products():
    n, x = 6, rng.normal(size=(6, 4)).astype(np.float32)
    src, dst = rng.integers(0, n, 15), rng.integers(0, n - 1, 15)  # node 5 receives nothing
    a = dense_adjacency(src, dst, n)
    np.testing.assert_allclose(ops.send_u_recv(x, src, dst), a.T @ x, rtol=1e-5, atol=1e-6)
    mean = a.T @ x / np.maximum(a.sum(0), 1)[:, None]
    np.testing.assert_allclose(ops.send_u_recv(x, src, dst, reduce_op="mean"), mean, rtol=1e-5, atol=1e-6)
    # the gradient of a sum sends each node's cotangent back along its out-edges
    grad = jax.grad(lambda v: ops.send_u_recv(v, src, dst).sum())(x)
    np.testing.assert_allclose(grad[:, 0], a.sum(1))


def test_out_size_defaults_to_the_node_count_and_may_add_rows():
    x = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    assert ops.send_u_recv(x, np.array([0, 1]), np.array([2, 2])).shape == (3, 2)
    out = ops.send_u_recv(x, np.array([0, 1]), np.array([2, 4]), reduce_op="max", out_size=5)
    assert out.tolist() == [[0, 0], [0, 0], [0, 1], [0, 0], [2, 3]]


def test_send_ue_recv_broadcasts_edge_features_over_heads():
    x = rng.normal(size=(4, 2, 3)).astype(np.float32)  # 2 heads of 3 features
    w = rng.random((5, 2, 1)).astype(np.float32)  # one weight per edge and head
    src, dst = np.array([0, 1, 2, 3, 3]), np.array([1, 1, 0, 0, 2])
    out = ops.send_ue_recv(x, w, src, dst, message_op="mul", reduce_op="sum")
    want = np.zeros((4, 2, 3))
    for e in range(5):
        want[dst[e]] += x[src[e]] * w[e]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_send_uv_reads_both_ends_of_every_edge():
    x, y = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    src, dst = np.array([2, 0, 1]), np.array([0, 0, 2])
    np.testing.assert_allclose(ops.send_uv(x, y, src, dst, message_op="mul"), x[src] * y[dst], rtol=1e-6)
    assert ops.send_uv(x, y[:, :1], src, dst).shape == (3, 2)


def test_a_program_records_one_op_each_and_saves_and_loads(tmp_path):
    x, src, dst = rng.normal(size=(5, 3)).astype(np.float32), rng.integers(0, 5, 7), rng.integers(0, 5, 7)
    seg = np.sort(rng.integers(0, 5, 5))

    def f(x, src, dst, seg):
        h = ops.send_u_recv(x, src, dst, reduce_op="mean")
        e = ops.send_uv(h, h, src, dst, message_op="mul")
        return ops.segment_max(ops.send_ue_recv(h, e, src, dst, message_op="add", reduce_op="min"), seg,
                               num_segments=5)

    prog = pj.trace(f, x, src, dst, seg)
    text = str(prog)
    for op in ("send_u_recv", "send_uv", "send_ue_recv", "segment_max"):
        assert text.count(f"{op}") == 1, text
    assert "num_segments=5" in text and 'reduce_op="mean"' in text
    pj.save(prog, tmp_path / "mp")
    np.testing.assert_allclose(pj.load(tmp_path / "mp")(x, src, dst, seg), f(x, src, dst, seg), rtol=1e-5,
                               atol=1e-6)
    assert str(pj.parse(text)) == text


def test_flops_count_one_operation_per_message_element():
    assert ops.segment_sum.flops([(6, 4), (6,)], [(3, 4)], {}) == 24
    assert ops.send_u_recv.flops([(5, 4), (9,), (9,)], [(5, 4)], {}) == 36
    assert ops.send_ue_recv.flops([(5, 2, 4), (9, 2, 1), (9,), (9,)], [(5, 2, 4)], {}) == 2 * 9 * 8
    assert ops.send_uv.flops([(5, 4), (5, 1), (9,), (9,)], [(9, 4)], {}) == 36


x2, ids2 = np.zeros((3, 2), np.float32), np.array([0, 1, 1])
BAD_CALLS = [
    (lambda: ops.segment_sum(x2 > 0, ids2), r"segment_sum: input 'data' expects an int or float array, got 'bool'"),
    (lambda: ops.segment_mean(x2, ids2[:2]), r"segment_mean: input 'segment_ids' expects shape \(3,\) \(one per row"),
    (lambda: ops.segment_max(x2, ids2.astype(np.float32)), r"segment_max: input 'segment_ids' expects a int array"),
    (lambda: ops.segment_min(x2, ids2, num_segments=-1), r"segment_min: attribute 'num_segments' expects values >= 0"),
    (lambda: ops.send_u_recv(x2, ids2, ids2, reduce_op="prod"), r"send_u_recv: attribute 'reduce_op' expects one of"),
    (lambda: ops.send_u_recv(x2, ids2, ids2[:2]), r"send_u_recv: input 'dst_index' expects shape \(3,\)"),
    (lambda: ops.send_u_recv(x2, ids2[None], ids2), r"send_u_recv: input 'src_index' expects a rank-1 array"),
    (lambda: ops.send_u_recv(x2, ids2, ids2, out_size=0), r"send_u_recv: attribute 'out_size' expects values >= 1"),
    (lambda: ops.send_ue_recv(x2, np.zeros((2, 2), np.float32), ids2, ids2),
     r"send_ue_recv: input 'y' expects one row per edge \(shape \[3, ...\]\)"),
    (lambda: ops.send_ue_recv(x2, np.zeros((3, 3), np.float32), ids2, ids2),
     r"send_ue_recv: input 'y' expects features that broadcast with x's \(2,\)"),
    (lambda: ops.send_ue_recv(x2, np.zeros((3, 2), np.float16), ids2, ids2),
     r"send_ue_recv: input 'y' expects the dtype of 'x' \(float32\), got 'float16'"),
    (lambda: ops.send_ue_recv(x2, x2, ids2, ids2, message_op="max"), r"send_ue_recv: attribute 'message_op'"),
    (lambda: ops.send_uv(x2, np.zeros((3, 3), np.float32), ids2, ids2), r"send_uv: input 'y' expects features that"),
]


@pytest.mark.parametrize("bad,match", BAD_CALLS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD_CALLS)])
def test_bad_calls_raise_naming_op(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
