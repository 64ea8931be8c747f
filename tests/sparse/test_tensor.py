"""COO and CSR tensors: construction in Paddle's layout, conversions, coalescing, empty tensors,
index and value dtypes, jit, and the errors bad input gets."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse

import paddlejax as pj
from paddlejax import sparse


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_coo_holds_paddle_layout_and_duplicates_add(coo, index_dtype, dtype):
    indices, values, dense = coo((4, 5), 9, index_dtype=index_dtype, dtype=dtype)
    x = sparse.sparse_coo_tensor(indices, values, [4, 5])
    assert x.is_sparse_coo() and not x.is_sparse_csr() and x.shape == (4, 5) and x.nnz() == 9
    assert x.dtype == dtype and jnp.issubdtype(x.indices().dtype, jnp.integer)
    np.testing.assert_array_equal(x.indices(), indices)  # [sparse_dim, nnz]
    np.testing.assert_array_equal(np.asarray(x.values(), np.float32), np.asarray(values, np.float32))
    np.testing.assert_allclose(np.asarray(x.to_dense(), np.float32), np.asarray(dense, np.float32), rtol=1e-2)


def test_int64_indices_and_float64_values_stay_so_with_x64(coo):
    with jax.enable_x64(True):
        indices, values, dense = coo((3, 4), 5, dtype=np.float64, index_dtype=np.int64)
        x = sparse.sparse_coo_tensor(indices, values, [3, 4])
        assert x.indices().dtype == np.int64 and x.dtype == np.float64
        np.testing.assert_array_equal(x.to_dense(), dense)
        assert x.to_sparse_csr().crows().dtype == np.int64


def test_shape_is_inferred_from_concrete_indices_and_dense_dims(coo):
    indices, values, dense = coo((3, 4, 2), 5, dense_dims=1)
    x = sparse.sparse_coo_tensor(indices, values)
    assert x.shape == (int(indices[0].max()) + 1, int(indices[1].max()) + 1, 2)
    assert x.sparse_dim == 2 and x.dense_dim == 1
    np.testing.assert_allclose(x.to_dense(), dense[:x.shape[0], :x.shape[1]])


def test_csr_matches_scipy_and_converts_both_ways():
    crows, cols, values = [0, 2, 2, 3], [0, 3, 1], [1.0, 2.0, 3.0]
    x = sparse.sparse_csr_tensor(crows, cols, values, [3, 4])
    want = scipy.sparse.csr_matrix((values, cols, crows), shape=(3, 4)).toarray()
    np.testing.assert_array_equal(x.to_dense(), want)
    assert x.is_sparse_csr() and x.nnz() == 3
    coo = x.to_sparse_coo()
    np.testing.assert_array_equal(coo.indices(), [[0, 0, 2], [0, 3, 1]])
    back = coo.to_sparse_csr()
    np.testing.assert_array_equal(back.crows(), crows)
    np.testing.assert_array_equal(back.cols(), cols)


def test_dense_to_csr_and_coo_agree_with_scipy(coo):
    _, _, dense = coo((5, 6), 8, seed=3)
    want = scipy.sparse.csr_matrix(dense)
    x = sparse.to_sparse_csr(jnp.asarray(dense))
    np.testing.assert_array_equal(x.crows(), want.indptr)
    np.testing.assert_array_equal(x.cols(), want.indices)
    np.testing.assert_array_equal(x.values(), want.data)
    y = sparse.to_sparse_coo(jnp.asarray(dense), 2)
    want_coo = want.tocoo()
    np.testing.assert_array_equal(y.indices(), np.stack([want_coo.row, want_coo.col]))
    np.testing.assert_array_equal(y.to_sparse_csr().crows(), want.indptr)


def test_hybrid_coo_from_dense_stores_rows():
    dense = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]], np.float32)
    x = sparse.to_sparse_coo(jnp.asarray(dense), sparse_dim=1)
    np.testing.assert_array_equal(x.indices(), [[1, 3]])
    np.testing.assert_array_equal(x.values(), dense[[1, 3]])
    np.testing.assert_array_equal(x.to_dense(), dense)


def test_coalesce_sums_duplicates_and_sorts(coo):
    indices, values, dense = coo((4, 5), 12, seed=1)
    x = sparse.sparse_coo_tensor(indices, values, [4, 5]).coalesce()
    distinct = np.unique(np.ravel_multi_index(tuple(indices), (4, 5)))
    assert x.nnz() == len(distinct)
    np.testing.assert_array_equal(np.ravel_multi_index(tuple(np.asarray(x.indices())), (4, 5)), distinct)
    np.testing.assert_allclose(x.values(), dense.ravel()[distinct], rtol=1e-6)


def test_coalesce_under_jit_keeps_nnz_and_pads_past_the_end(coo):
    indices, values, dense = coo((4, 5), 6, seed=2)
    x = jax.jit(sparse.coalesce)(sparse.sparse_coo_tensor(indices, values, [4, 5]))
    assert x.nnz() == 6
    distinct = len(np.unique(np.ravel_multi_index(tuple(indices), (4, 5))))
    np.testing.assert_array_equal(np.asarray(x.indices())[:, distinct:].T, [[4, 5]] * (6 - distinct))
    np.testing.assert_allclose(x.to_dense(), dense, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda t: t.to_sparse_csr().to_dense())(x), dense, rtol=1e-6)


def test_empty_tensors():
    x = sparse.sparse_coo_tensor(np.zeros((2, 0), np.int32), np.zeros((0,), np.float32), [3, 4])
    assert x.nnz() == 0 and x.coalesce().nnz() == 0
    np.testing.assert_array_equal(x.to_dense(), np.zeros((3, 4)))
    np.testing.assert_array_equal(x.to_sparse_csr().crows(), [0, 0, 0, 0])
    np.testing.assert_array_equal(sparse.to_sparse_csr(jnp.zeros((2, 2))).crows(), [0, 0, 0])
    np.testing.assert_array_equal(sparse.matmul(x, jnp.ones((4, 2))), np.zeros((3, 2)))
    assert sparse.add(x, x).nnz() == 0 and sparse.sum(x).to_dense().tolist() == [0.0]


def test_tensors_are_pytrees_through_jit(coo):
    indices, values, dense = coo((3, 3), 4)
    x = sparse.sparse_coo_tensor(indices, values, [3, 3])
    y = jax.jit(lambda t: sparse.neg(t))(x)
    assert isinstance(y, sparse.SparseCooTensor) and y.nnz() == 4
    np.testing.assert_allclose(y.to_dense(), -dense)
    built = jax.jit(lambda v: sparse.sparse_coo_tensor(indices, v, [3, 3]).to_dense())(values)
    np.testing.assert_allclose(built, dense)
    csr = sparse.to_sparse_csr(jnp.asarray(dense))
    np.testing.assert_allclose(jax.jit(lambda t: t.to_dense())(csr), dense)


def test_with_values_and_cast(coo):
    indices, values, dense = coo((3, 4), 5)
    x = sparse.sparse_coo_tensor(indices, values, [3, 4])
    np.testing.assert_allclose(x.with_values(x.values() * 2).to_dense(), 2 * dense)
    y = sparse.cast(x, index_dtype=jnp.int8, value_dtype=jnp.bfloat16)
    assert y.indices().dtype == jnp.int8 and y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y.to_dense(), np.float32), dense, atol=1e-2)


def test_jax_arrays_are_accepted_and_lazy_import():
    from jax.experimental import sparse as jsparse
    bcoo = jsparse.BCOO.fromdense(jnp.eye(2))
    assert sparse.is_sparse_coo(bcoo) and sparse.is_sparse_csr(jsparse.BCSR.fromdense(jnp.eye(2)))
    assert not sparse.is_sparse_coo(jnp.eye(2))
    np.testing.assert_array_equal(sparse.relu(bcoo).to_dense(), np.eye(2))
    assert pj.sparse is sparse


@pytest.mark.parametrize("call, error, words", [
    (lambda: sparse.sparse_coo_tensor([[0.0, 1.0]], [1.0, 2.0], [2]), TypeError, "sparse_coo_tensor: indices"),
    (lambda: sparse.sparse_coo_tensor([[0, 1]], [1.0], [2]), ValueError, "one row per index"),
    (lambda: sparse.sparse_coo_tensor([[0, 3]], [1.0, 2.0], [3]), ValueError, "out of range"),
    (lambda: sparse.sparse_coo_tensor([[0, 1]], [1.0, 2.0], [2, 2]), ValueError, "does not fit"),
    (lambda: jax.jit(lambda i: sparse.sparse_coo_tensor(i, jnp.ones(2)).to_dense())(jnp.array([[0, 1]])),
     ValueError, "shape is required"),
    (lambda: sparse.sparse_csr_tensor([0, 1], [0], [1.0], [2, 2]), ValueError, r"rows \+ 1"),
    (lambda: sparse.sparse_csr_tensor([0, 2, 1], [0], [1.0], [2, 2]), ValueError, "rise from 0"),
    (lambda: sparse.sparse_csr_tensor([0, 1, 1], [5], [1.0], [2, 2]), ValueError, "cols out of range"),
    (lambda: sparse.sparse_csr_tensor([0, 1], [0], [1.0], [1, 2, 2]), ValueError, "only 2-D"),
    (lambda: jax.jit(lambda d: sparse.to_sparse_coo(d).to_dense())(jnp.eye(2)), ValueError, "pass nnz="),
    (lambda: sparse.to_sparse_coo(jnp.eye(2), 3), ValueError, "sparse_dim must be"),
    (lambda: sparse.to_sparse_csr(jnp.ones((2, 2, 2))), ValueError, "to_sparse_csr: needs a 2-D"),
    (lambda: sparse.to_sparse_csr(sparse.to_sparse_coo(jnp.eye(2), 1)), ValueError, "both dims sparse"),
    (lambda: sparse.to_sparse_coo(jnp.eye(2), 2).with_values(jnp.ones(3)), ValueError, "with_values"),
    (lambda: sparse.coalesce(jnp.eye(2)), TypeError, "coalesce: expects a sparse tensor"),
    (lambda: sparse.cast(sparse.to_sparse_coo(jnp.eye(2)), index_dtype=jnp.float32), TypeError, "cast: index_dtype"),
])
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error, match=words):
        call()
