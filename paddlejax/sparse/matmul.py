"""Products with sparse tensors (Paddle's ``paddle.sparse.matmul``, ``masked_matmul``, ``mv``,
``addmm``).

``matmul(sparse, dense)`` is JAX's ``bcoo_dot_general`` (``bcsr_dot_general`` for CSR): a
gather of the dense rows the stored entries hit, scaled and summed per output row, ``O(nnz *
N)``; on GPUs JAX hands suitable cases to cuSPARSE. It differentiates with respect to the values
and the dense operand, so a graph layer ``adj @ features`` trains its edge weights. A 3-D
(batched) COO operand multiplies as one block-diagonal 2-D product.

``matmul(sparse, sparse)`` gives a sparse result holding the positions some pair of entries
reaches. It pairs the entries by comparing every column of ``x`` with every row of ``y``
(``O(nnz_x * nnz_y)``, as JAX's ``bcoo_spdot_general`` does), for small operands such as
two-hop adjacencies of small graphs; under ``jax.jit`` the result keeps ``nnz_x * nnz_y``
slots. It is written here with gathers rather than taken from JAX, whose version has no
reverse-mode rule (``jax.grad`` fails) and leaves zeros from its padding at real positions.

>>> from paddlejax.sparse import sparse_coo_tensor
>>> adj = sparse_coo_tensor([[0, 1, 1], [1, 0, 1]], [1.0, 2.0, 3.0], [2, 2])
>>> matmul(adj, jnp.array([[1.0, 0.0], [0.0, 1.0]])).tolist()
[[0.0, 1.0], [2.0, 3.0]]
"""
from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import sparse as jsparse

from paddlejax.sparse.binary import add, multiply
from paddlejax.sparse.tensor import SparseCooTensor, SparseTensor, as_bcoo, as_sparse, coalesce, is_concrete


def _blocks(coo: jsparse.BCOO) -> jsparse.BCOO:
    """A ``[B, M, K]`` BCOO as the ``[B*M, B*K]`` block-diagonal matrix of its batches."""
    (b, m, k), i = coo.shape, coo.indices
    return jsparse.BCOO((coo.data, jnp.stack([i[:, 0] * m + i[:, 1], i[:, 0] * k + i[:, 2]], 1)),
                        shape=(b * m, b * k))


def _unblocks(coo: jsparse.BCOO, shape) -> jsparse.BCOO:
    """The batches of a ``[B*M, B*N]`` block-diagonal BCOO as a ``[B, M, N]`` one."""
    (_, m, n), i = shape, coo.indices
    return jsparse.BCOO((coo.data, jnp.stack([i[:, 0] // m, i[:, 0] % m, i[:, 1] % n], 1)), shape=shape)


def _check_operands(fn: str, x: SparseTensor, y_shape) -> None:
    if x.ndim not in (2, 3) or len(y_shape) != x.ndim:
        raise ValueError(f"pj.sparse.{fn}: x and y must both be 2-D or both 3-D, got shapes {list(x.shape)} "
                         f"and {list(y_shape)}")
    if x.shape[-1] != y_shape[-2] or x.shape[:-2] != tuple(y_shape[:-2]):
        raise ValueError(f"pj.sparse.{fn}: shapes {list(x.shape)} and {list(y_shape)} do not multiply")
    if as_bcoo(x).n_dense:
        raise ValueError(f"pj.sparse.{fn}: x must store every dim sparsely (sparse_dim == ndim), got "
                         f"{as_bcoo(x).n_dense} dense dims; convert it with to_sparse_coo(x.to_dense())")


def matmul(x, y):
    """``x @ y`` for a sparse ``x`` (2-D, or 3-D COO batches): a dense array for a dense ``y``,
    a sparse tensor of ``x``'s format for a sparse ``y``; Paddle's ``paddle.sparse.matmul``.

    >>> from paddlejax.sparse import to_sparse_csr
    >>> x = to_sparse_csr(jnp.array([[0.0, 2.0], [1.0, 0.0]]))
    >>> matmul(x, jnp.array([[1.0], [10.0]])).tolist()
    [[20.0], [1.0]]
    >>> matmul(x, x).to_dense().tolist()
    [[2.0, 0.0], [0.0, 2.0]]
    """
    x = as_sparse("matmul", x)
    if not isinstance(y, (SparseTensor, jsparse.JAXSparse)):
        y = jnp.asarray(y)
        _check_operands("matmul", x, y.shape)
        if x.ndim == 2:
            return x.array @ y
        b, k, n = y.shape
        return (_blocks(x.array) @ y.reshape(b * k, n)).reshape(b, x.shape[1], n)
    y = as_sparse("matmul", y)
    _check_operands("matmul", x, y.shape)
    if as_bcoo(y).n_dense:
        raise ValueError("pj.sparse.matmul: y must store every dim sparsely (sparse_dim == ndim)")
    a, b = as_bcoo(x), as_bcoo(y)
    if x.ndim == 2:
        out = _sparse_product(a, b)
    else:
        out = _unblocks(_sparse_product(_blocks(a), _blocks(b)), (*x.shape[:2], y.shape[2]))
    out = coalesce(SparseCooTensor(out))
    return out if x.is_sparse_coo() else out.to_sparse_csr()


def _sparse_product(a: jsparse.BCOO, b: jsparse.BCOO) -> jsparse.BCOO:
    """``a @ b`` for 2-D BCOO arrays: one entry per pair (entry of ``a`` in column ``k``, entry
    of ``b`` in row ``k``), duplicates left for ``coalesce``; padding slots pair with nothing."""
    (m, k), n = a.shape, b.shape[1]
    pairs = (a.indices[:, 1, None] == b.indices[None, :, 0]) & (a.indices[:, 1, None] < k)
    size = int(pairs.sum()) if is_concrete(pairs) else pairs.size
    left, right = jnp.nonzero(pairs, size=size, fill_value=(a.nse, b.nse))
    data = a.data.at[left].get(mode="fill", fill_value=0) * b.data.at[right].get(mode="fill", fill_value=0)
    rows = a.indices[:, 0].at[left].get(mode="fill", fill_value=m)
    cols = b.indices[:, 1].at[right].get(mode="fill", fill_value=n)
    return jsparse.BCOO((data, jnp.stack([rows, cols], 1)), shape=(m, n))


def masked_matmul(x, y, mask):
    """``x @ y`` for dense ``x`` ``[..., M, K]`` and ``y`` ``[..., K, N]``, computed only where
    the sparse ``mask`` stores an entry; the result has ``mask``'s pattern and format. Paddle's
    ``paddle.sparse.masked_matmul``. Each stored entry costs one length-``K`` dot product, so
    attention over a sparse pattern never forms the dense product.

    >>> from paddlejax.sparse import to_sparse_csr
    >>> mask = to_sparse_csr(jnp.array([[1.0, 0.0], [0.0, 1.0]]))
    >>> masked_matmul(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.eye(2), mask).to_dense().tolist()
    [[1.0, 0.0], [0.0, 4.0]]
    """
    mask = as_sparse("masked_matmul", mask)
    if as_bcoo(mask).n_dense:
        raise ValueError("pj.sparse.masked_matmul: mask must store every dim sparsely (sparse_dim == ndim)")
    x, y = jnp.asarray(x), jnp.asarray(y)
    if x.ndim != mask.ndim or y.ndim != mask.ndim or x.shape[:-1] != mask.shape[:-1] or \
            y.shape[:-2] + y.shape[-1:] != mask.shape[:-2] + mask.shape[-1:] or x.shape[-1] != y.shape[-2]:
        raise ValueError(f"pj.sparse.masked_matmul: x {list(x.shape)} @ y {list(y.shape)} does not give the "
                         f"mask's shape {list(mask.shape)}")
    indices = as_bcoo(mask).indices
    *batch, rows, cols = (indices[:, d] for d in range(indices.shape[1]))
    # Padding slots point past the end: their rows read as zeros, so their products are 0.
    lhs = x.at[(*batch, rows)].get(mode="fill", fill_value=0)
    rhs = jnp.swapaxes(y, -1, -2).at[(*batch, cols)].get(mode="fill", fill_value=0)
    # a CSR tensor's BCOO view lists its entries in their stored order: the values line up
    return mask.with_values(jnp.einsum("nk,nk->n", lhs, rhs))


def mv(x, vec):
    """``x @ vec`` for a sparse 2-D ``x`` ``[M, N]`` and a dense ``vec`` ``[N]``; Paddle's
    ``paddle.sparse.mv``.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> mv(sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], [2, 2]), jnp.array([1.0, 10.0])).tolist()
    [20.0, 3.0]
    """
    x = as_sparse("mv", x)
    vec = jnp.asarray(vec)
    if x.ndim != 2 or vec.shape != x.shape[1:]:
        raise ValueError(f"pj.sparse.mv: needs x [M, N] and vec [N], got shapes {list(x.shape)} and "
                         f"{list(vec.shape)}")
    return x.array @ vec


def addmm(input, x, y, beta: float = 1.0, alpha: float = 1.0):
    """``beta * input + alpha * (x @ y)`` with a sparse ``x``: dense when ``y`` is dense, sparse
    when ``y`` and ``input`` are; Paddle's ``paddle.sparse.addmm``.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> x = sparse_coo_tensor([[0], [1]], [2.0], [2, 2])
    >>> addmm(jnp.ones((2, 1)), x, jnp.array([[1.0], [3.0]]), beta=0.5).tolist()
    [[6.5], [0.5]]
    """
    product = matmul(x, y)
    if isinstance(product, SparseTensor):
        if product.shape != as_sparse("addmm", input).shape:
            raise ValueError(f"pj.sparse.addmm: input {list(input.shape)} and x @ y {list(product.shape)} differ")
        return add(multiply(input, beta), multiply(product, alpha))
    input = input.to_dense() if isinstance(input, SparseTensor) else jnp.asarray(input)
    if input.shape != product.shape:
        raise ValueError(f"pj.sparse.addmm: input {list(input.shape)} and x @ y {list(product.shape)} differ")
    return beta * input + alpha * product
