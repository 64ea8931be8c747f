"""Products with sparse tensors against numpy's dense products; gradients with respect to the
stored values against the dense gradient read at the stored positions; jit, vmap, dtypes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paddlejax import sparse


def operands(coo, shape=(4, 5), nnz=8, n=3, seed=0, dtype=np.float32):
    indices, values, dense = coo(shape, nnz, seed=seed, dtype=dtype)
    y = np.random.default_rng(seed + 100).normal(size=(*shape[:-2], shape[-1], n)).astype(dtype)
    return indices, values, dense, y


# JAX's CPU kernel for CSR products has no bfloat16 and says so before it falls back to its generic one
@pytest.mark.filterwarnings("ignore:bcsr_dot_general cpu lowering not available")
@pytest.mark.parametrize("fmt", ["coo", "csr"])
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_sparse_times_dense(coo, fmt, dtype, tol):
    indices, values, dense, y = operands(coo, dtype=dtype)
    x = sparse.sparse_coo_tensor(indices, values, [4, 5])
    x = x if fmt == "coo" else x.to_sparse_csr()
    got = sparse.matmul(x, jnp.asarray(y))
    assert got.dtype == dtype
    want = np.asarray(dense, np.float32) @ np.asarray(y, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(jax.jit(sparse.matmul)(x, y), np.float32), want, rtol=tol, atol=tol)


def test_float64(coo):
    with jax.enable_x64(True):
        indices, values, dense, y = operands(coo, dtype=np.float64)
        got = sparse.matmul(sparse.sparse_coo_tensor(indices.astype(np.int64), values, [4, 5]), y)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, dense @ y, rtol=1e-12)


def test_batched_coo_times_dense(coo):
    indices, values, dense, y = operands(coo, shape=(2, 3, 4), nnz=7)
    x = sparse.sparse_coo_tensor(indices, values, [2, 3, 4])
    np.testing.assert_allclose(sparse.matmul(x, y), dense @ y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sparse_times_sparse_is_sparse(coo, fmt):
    ia, va, a = coo((4, 5), 7, seed=1)
    ib, vb, b = coo((5, 3), 6, seed=2)
    x, y = sparse.sparse_coo_tensor(ia, va, [4, 5]), sparse.sparse_coo_tensor(ib, vb, [5, 3])
    if fmt == "csr":
        x, y = x.to_sparse_csr(), y.to_sparse_csr()
    out = sparse.matmul(x, y)
    assert out.is_sparse_csr() == (fmt == "csr") and out.nnz() == np.count_nonzero(
        (a != 0).astype(int) @ (b != 0).astype(int))
    np.testing.assert_allclose(out.to_dense(), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(sparse.matmul)(x, y).to_dense(), a @ b, rtol=1e-5, atol=1e-6)


def test_batched_sparse_times_sparse(coo):
    ia, va, a = coo((2, 3, 4), 6, seed=3)
    ib, vb, b = coo((2, 4, 2), 5, seed=4)
    out = sparse.matmul(sparse.sparse_coo_tensor(ia, va, [2, 3, 4]), sparse.sparse_coo_tensor(ib, vb, [2, 4, 2]))
    assert out.shape == (2, 3, 2)
    np.testing.assert_allclose(out.to_dense(), a @ b, rtol=1e-5, atol=1e-6)


def test_sparse_times_sparse_differentiates_both_ways(coo):
    ia, va, a = coo((3, 4), 5, seed=5)
    ib, vb, b = coo((4, 3), 5, seed=6)
    x, y = sparse.sparse_coo_tensor(ia, va, [3, 4]), sparse.sparse_coo_tensor(ib, vb, [4, 3])
    w = np.arange(9.0, dtype=np.float32).reshape(3, 3)

    def loss(va, vb):
        return jnp.sum(sparse.matmul(x.with_values(va), y.with_values(vb)).to_dense() * w)

    ga, gb = jax.grad(lambda a, b: jnp.sum((a @ b) * w), argnums=(0, 1))(a, b)
    for got_a, got_b in (jax.grad(loss, argnums=(0, 1))(va, vb), jax.jit(jax.grad(loss, argnums=(0, 1)))(va, vb)):
        np.testing.assert_allclose(got_a, np.asarray(ga)[tuple(ia)], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_b, np.asarray(gb)[tuple(ib)], rtol=1e-5, atol=1e-6)
    _, tangent = jax.jvp(lambda v: sparse.matmul(x.with_values(v), y).to_dense(), (va,), (np.ones_like(va),))
    counts = np.zeros_like(a)
    np.add.at(counts, tuple(ia), 1.0)
    np.testing.assert_allclose(tangent, counts @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_grad_wrt_values_is_the_dense_grad_at_the_stored_positions(coo, fmt):
    indices, values, dense, y = operands(coo)  # duplicates included: each copy gets the full gradient
    w = np.random.default_rng(7).normal(size=(4, 3)).astype(np.float32)
    x0 = sparse.sparse_coo_tensor(indices, values, [4, 5])
    x0 = x0 if fmt == "coo" else x0.to_sparse_csr()
    pos = tuple(np.asarray(sparse.to_sparse_coo(x0).indices()))

    def loss(v, y):
        return jnp.sum(jnp.tanh(sparse.matmul(x0.with_values(v), y)) * w)

    def dense_loss(a, y):
        return jnp.sum(jnp.tanh(a @ y) * w)

    g_values, g_y = jax.jit(jax.grad(loss, argnums=(0, 1)))(x0.values(), jnp.asarray(y))
    g_dense, g_y_dense = jax.grad(dense_loss, argnums=(0, 1))(jnp.asarray(dense), jnp.asarray(y))
    np.testing.assert_allclose(g_values, np.asarray(g_dense)[pos], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_y, g_y_dense, rtol=1e-5, atol=1e-6)


def test_grad_through_the_constructor_and_vmap_over_values(coo):
    indices, values, dense, y = operands(coo)
    g = jax.grad(lambda v: sparse.matmul(sparse.sparse_coo_tensor(indices, v, [4, 5]), y).sum())(values)
    np.testing.assert_allclose(g, y.sum(1)[indices[1]], rtol=1e-5)
    batch = np.stack([values, 2 * values])
    got = jax.vmap(lambda v: sparse.matmul(sparse.sparse_coo_tensor(indices, v, [4, 5]), y))(batch)
    np.testing.assert_allclose(got, np.stack([dense @ y, 2 * dense @ y]), rtol=1e-5, atol=1e-6)


def test_sparse_times_dense_stays_one_sparse_product(coo):
    """The traced product gathers through JAX's sparse dot: it never builds the dense matrix."""
    indices, values, _, y = operands(coo)
    for make in (lambda v: sparse.sparse_coo_tensor(indices, v, [4, 5]),
                 lambda v: sparse.sparse_coo_tensor(indices, v, [4, 5]).to_sparse_csr()):
        text = str(jax.make_jaxpr(lambda v, y: sparse.matmul(make(v), y))(values, y))
        assert "dot_general[" in text and "todense" not in text and "f32[4,5]" not in text


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_masked_matmul(coo, fmt):
    indices, values, dense = coo((4, 3), 6, seed=8)
    mask = sparse.sparse_coo_tensor(indices, values, [4, 3]).coalesce()
    mask = mask if fmt == "coo" else mask.to_sparse_csr()
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    stored = dense != 0
    out = sparse.masked_matmul(a, b, mask)
    assert out.is_sparse_csr() == (fmt == "csr") and out.nnz() == mask.nnz()
    np.testing.assert_allclose(out.to_dense(), (a @ b) * stored, rtol=1e-5, atol=1e-6)
    ga, gb = jax.grad(lambda a, b: sparse.masked_matmul(a, b, mask).values().sum(), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(ga, stored @ b.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, a.T @ stored, rtol=1e-5, atol=1e-6)


def test_batched_masked_matmul_under_jit(coo):
    indices, values, dense = coo((2, 3, 4), 6, seed=10, duplicates=False)
    mask = sparse.sparse_coo_tensor(indices, values, [2, 3, 4])
    rng = np.random.default_rng(11)
    a, b = rng.normal(size=(2, 3, 5)).astype(np.float32), rng.normal(size=(2, 5, 4)).astype(np.float32)
    out = jax.jit(sparse.masked_matmul)(a, b, mask)
    np.testing.assert_allclose(out.to_dense(), (a @ b) * (dense != 0), rtol=1e-5, atol=1e-6)


def test_mv_and_addmm(coo):
    indices, values, dense, y = operands(coo)
    x = sparse.sparse_coo_tensor(indices, values, [4, 5])
    vec = y[:, 0]
    np.testing.assert_allclose(sparse.mv(x, vec), dense @ vec, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sparse.mv(x.to_sparse_csr(), vec), dense @ vec, rtol=1e-5, atol=1e-6)
    base = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(sparse.addmm(base, x, y, beta=0.5, alpha=2.0), 0.5 + 2.0 * dense @ y, rtol=1e-5)
    sq = sparse.sparse_coo_tensor(indices[:, :3] % 4, values[:3], [4, 4])
    d_sq = np.asarray(sq.to_dense())
    out = sparse.addmm(sq, sq, sq, beta=2.0, alpha=-1.0)
    assert out.is_sparse_coo()
    np.testing.assert_allclose(out.to_dense(), 2.0 * d_sq - d_sq @ d_sq, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, error, words", [
    (lambda x: sparse.matmul(x, jnp.ones((4, 2))), ValueError, "matmul: shapes"),
    (lambda x: sparse.matmul(x, jnp.ones((5,))), ValueError, "matmul: x and y must both be 2-D"),
    (lambda x: sparse.matmul(jnp.ones((2, 4)), x), TypeError, "matmul: expects a sparse tensor"),
    (lambda x: sparse.matmul(sparse.to_sparse_coo(jnp.ones((4, 5)), 1), jnp.ones((5, 2))), ValueError,
     "matmul: x must store every dim sparsely"),
    (lambda x: sparse.masked_matmul(jnp.ones((4, 2)), jnp.ones((3, 5)), x), ValueError, "masked_matmul"),
    (lambda x: sparse.mv(x, jnp.ones(4)), ValueError, "mv: needs"),
    (lambda x: sparse.addmm(jnp.ones((3, 3)), x, jnp.ones((5, 3))), ValueError, "addmm: input"),
])
def test_bad_shapes_are_named(coo, call, error, words):
    indices, values, _ = coo((4, 5), 5)
    with pytest.raises(error, match=words):
        call(sparse.sparse_coo_tensor(indices, values, [4, 5]))
