"""Elementwise functions, arithmetic, sums, transposes and reshapes of sparse tensors against the
same numpy computation on the dense arrays, in both formats, eagerly and under jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paddlejax import sparse

UNARY = {"abs": np.abs, "neg": np.negative, "square": np.square, "sin": np.sin, "tan": np.tan,
         "asin": np.arcsin, "atan": np.arctan, "sinh": np.sinh, "tanh": np.tanh, "asinh": np.arcsinh,
         "atanh": np.arctanh, "expm1": np.expm1, "log1p": np.log1p, "deg2rad": np.deg2rad,
         "rad2deg": np.rad2deg, "relu": lambda v: np.maximum(v, 0), "relu6": lambda v: np.clip(v, 0, 6),
         "isnan": np.isnan}


def coalesced(coo, shape=(4, 5), nnz=8, seed=0, **kw):
    indices, values, dense = coo(shape, nnz, seed=seed, **kw)
    return sparse.sparse_coo_tensor(indices, values, list(shape)).coalesce(), dense


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_dense(coo, name):
    x, dense = coalesced(coo)
    for fmt in (x, x.to_sparse_csr()):
        y = getattr(sparse, name)(fmt)
        assert y.nnz() == x.nnz() and y.is_sparse_csr() == fmt.is_sparse_csr()
        np.testing.assert_allclose(y.to_dense(), UNARY[name](dense), rtol=2e-6, atol=1e-6)


def test_sqrt_pow_leaky_relu_and_bfloat16(coo):
    x, dense = coalesced(coo)
    np.testing.assert_allclose(sparse.sqrt(sparse.abs(x)).to_dense(), np.sqrt(np.abs(dense)), rtol=1e-6)
    np.testing.assert_allclose(sparse.pow(x, 3).to_dense(), dense ** 3, rtol=1e-5)
    np.testing.assert_allclose(sparse.leaky_relu(x, 0.2).to_dense(), np.where(dense > 0, dense, 0.2 * dense),
                               rtol=1e-6)
    xb = sparse.cast(x, value_dtype=jnp.bfloat16)
    assert sparse.tanh(xb).dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(sparse.tanh(xb).to_dense(), np.float32), np.tanh(dense), atol=1e-2)
    with pytest.raises(ValueError, match="pow: factor must be > 0"):
        sparse.pow(x, 0)


@pytest.mark.parametrize("name, op", [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply)])
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_binary_on_different_patterns_with_duplicates(coo, name, op, fmt):
    ia, va, a = coo((4, 5), 7, seed=1)
    ib, vb, b = coo((4, 5), 6, seed=2)
    x, y = sparse.sparse_coo_tensor(ia, va, [4, 5]), sparse.sparse_coo_tensor(ib, vb, [4, 5])
    if fmt == "csr":
        x, y = x.to_sparse_csr(), y.to_sparse_csr()
    out = getattr(sparse, name)(x, y)
    union = np.unique(np.concatenate([np.ravel_multi_index(tuple(i), (4, 5)) for i in (ia, ib)]))
    assert out.is_sparse_csr() == (fmt == "csr") and out.nnz() == len(union)
    np.testing.assert_allclose(out.to_dense(), op(a, b), rtol=1e-6, atol=1e-7)
    jitted = jax.jit(getattr(sparse, name))(x, y)
    assert jitted.nnz() == x.nnz() + y.nnz()
    np.testing.assert_allclose(jitted.to_dense(), op(a, b), rtol=1e-6, atol=1e-7)


def test_divide_same_pattern_and_padding_stays_finite(coo):
    x, dense = coalesced(coo)
    other = x.with_values(x.values() * 0 + 4.0)
    want = np.where(dense != 0, dense / 4.0, 0.0)
    np.testing.assert_allclose(sparse.divide(x, other).to_dense(), want, rtol=1e-6)
    jitted = jax.jit(sparse.divide)(x, other)
    assert np.isfinite(np.asarray(jitted.values())).all()
    np.testing.assert_allclose(jitted.to_dense(), want, rtol=1e-6)


@pytest.mark.parametrize("y", [2.5, np.arange(1.0, 6.0), np.arange(1.0, 5.0)[:, None],
                               np.arange(1.0, 21.0).reshape(4, 5)])
def test_multiply_and_divide_by_dense_keep_the_pattern(coo, y):
    x, dense = coalesced(coo)
    for fmt in (x, x.to_sparse_csr()):
        prod, quot = sparse.multiply(fmt, jnp.asarray(y, jnp.float32)), sparse.divide(fmt, jnp.asarray(y, jnp.float32))
        assert prod.nnz() == quot.nnz() == x.nnz()
        np.testing.assert_allclose(prod.to_dense(), dense * y, rtol=1e-6)
        np.testing.assert_allclose(quot.to_dense(), dense / y, rtol=1e-6)


def test_gcn_normalisation_by_degree_vectors(coo):
    """D^-1/2 A D^-1/2 from a row sum and two broadcasting multiplies, never dense."""
    indices, values, dense = coo((6, 6), 10, seed=4, duplicates=False)
    a = sparse.sparse_coo_tensor(indices, np.abs(values) + 0.5, [6, 6])
    dense = np.asarray(a.to_dense())
    deg = np.asarray(sparse.sum(a, axis=1).to_dense())
    scale = (1 / np.sqrt(np.maximum(deg, 1e-30)) * (deg > 0)).astype(np.float32)
    norm = sparse.multiply(sparse.multiply(a, scale[:, None]), scale[None, :])
    np.testing.assert_allclose(norm.to_dense(), scale[:, None] * dense * scale[None, :], rtol=1e-6)


@pytest.mark.parametrize("axis, keepdim", [(None, False), (None, True), (0, False), (1, True), (-1, False),
                                           ((0, 2), False), ((1, 2), True)])
def test_sum_matches_numpy(coo, axis, keepdim):
    indices, values, dense = coo((3, 4, 2), 9, seed=5)
    x = sparse.sparse_coo_tensor(indices, values, [3, 4, 2])
    want = np.sum(dense, axis=axis, keepdims=keepdim)
    want = want.reshape(1) if want.ndim == 0 else want  # Paddle: a full sum has shape [1]
    for got in (sparse.sum(x, axis, keepdim=keepdim), jax.jit(lambda t: sparse.sum(t, axis, keepdim=keepdim))(x)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.to_dense(), want, rtol=1e-5, atol=1e-6)


def test_sum_follows_paddles_examples_on_a_hybrid_tensor():
    x = sparse.to_sparse_coo(jnp.array([[-2.0, 0.0], [1.0, 2.0]]), sparse_dim=1)
    assert sparse.sum(x).to_dense().tolist() == [1.0]
    out = sparse.sum(x, axis=0)
    assert out.shape == (1, 2) and out.values().tolist() == [[-1.0, 2.0]]
    out = sparse.sum(x, axis=-1)
    assert out.indices().tolist() == [[0, 1]] and out.values().tolist() == [-2.0, 3.0]
    assert sparse.sum(x, axis=1, keepdim=True).to_dense().tolist() == [[-2.0], [3.0]]


def test_sum_of_csr_dtype_and_bad_axis(coo):
    x, dense = coalesced(coo)
    kept = sparse.sum(x.to_sparse_csr(), axis=1, keepdim=True)
    assert kept.is_sparse_csr()
    np.testing.assert_allclose(kept.to_dense(), dense.sum(1, keepdims=True), rtol=1e-6)
    assert sparse.sum(x.to_sparse_csr(), axis=0).is_sparse_coo()
    with jax.enable_x64(True):
        assert sparse.sum(x, dtype=jnp.float64).dtype == jnp.float64
    for bad in (2, (0, 0), (0, -2)):
        with pytest.raises(ValueError, match="sum: axis"):
            sparse.sum(x, bad)


@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_transpose_matches_numpy(coo, perm):
    indices, values, dense = coo((2, 3, 4), 7, seed=6)
    x = sparse.sparse_coo_tensor(indices, values, [2, 3, 4])
    np.testing.assert_allclose(sparse.transpose(x, perm).to_dense(), np.transpose(dense, perm), rtol=1e-6)


def test_transpose_csr_and_errors(coo):
    x, dense = coalesced(coo)
    t = sparse.transpose(x.to_sparse_csr(), [1, 0])
    assert t.is_sparse_csr()
    np.testing.assert_allclose(t.to_dense(), dense.T)
    with pytest.raises(ValueError, match="transpose: perm must order"):
        sparse.transpose(x, [0, 0])
    hybrid = sparse.to_sparse_coo(jnp.ones((2, 3)), sparse_dim=1)
    with pytest.raises(ValueError, match="moves a dense dim"):
        sparse.transpose(hybrid, [1, 0])


@pytest.mark.parametrize("shape", [[20], [5, -1], [2, 5, 2], [-1, 4]])
def test_reshape_matches_numpy(coo, shape):
    indices, values, dense = coo((4, 5), 6, seed=7)
    x = sparse.sparse_coo_tensor(indices, values, [4, 5])
    np.testing.assert_allclose(sparse.reshape(x, shape).to_dense(), dense.reshape(shape), rtol=1e-6)


def test_reshape_errors(coo):
    x, _ = coalesced(coo)
    with pytest.raises(ValueError, match="reshape: cannot reshape"):
        sparse.reshape(x, [3, -1])
    with pytest.raises(ValueError, match="CSR tensor must stay 2-D"):
        sparse.reshape(x.to_sparse_csr(), [20])


@pytest.mark.parametrize("call, error, words", [
    (lambda x: sparse.add(x, sparse.to_sparse_coo(jnp.ones((5, 4)))), ValueError, "add: x and y must have the same"),
    (lambda x: sparse.add(x, jnp.ones((4, 5))), TypeError, "add: expects a sparse tensor"),
    (lambda x: sparse.subtract(jnp.ones((4, 5)), x), TypeError, "subtract: expects a sparse tensor"),
    (lambda x: sparse.multiply(x, jnp.ones((5,)).reshape(5, 1)), ValueError, "multiply: y of shape"),
    (lambda x: sparse.divide(x, jnp.ones((2, 4, 5))), ValueError, "divide: y of shape"),
    (lambda x: sparse.multiply(x, sparse.to_sparse_coo(jnp.ones((4, 5)), 1)), ValueError, "dense dims"),
    (lambda x: sparse.relu(np.ones(3)), TypeError, "relu: expects a sparse tensor"),
])
def test_bad_operands_are_named(coo, call, error, words):
    x, _ = coalesced(coo)
    with pytest.raises(error, match=words):
        call(x)
