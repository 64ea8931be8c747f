"""Elementwise arithmetic between sparse tensors (Paddle's ``paddle.sparse.add``,
``subtract``, ``multiply``, ``divide``).

Two sparse operands of one shape combine over the union of their patterns: the result stores
every position either stores (coalesced: sorted, each once), so a product comes out as an
explicit zero where only one side stores. A position neither stores stays unstored, i.e. 0, also
in ``divide``, where dense division would give ``0 / 0 = nan``. Under ``jax.jit`` the result
keeps ``x.nnz() + y.nnz()`` slots (see :mod:`paddlejax.sparse.tensor`).

``multiply`` and ``divide`` also take a scalar or a dense array that broadcasts to ``x``'s shape
(a column or row vector scales the rows or the columns): the result then has exactly ``x``'s
pattern, at ``O(nnz)`` cost and without a dense copy. ``add`` and ``subtract`` take sparse
operands only (a dense one fills every zero: use ``x.to_dense() + y``).

>>> from paddlejax.sparse import to_sparse_coo
>>> a = to_sparse_coo(jnp.array([[1.0, 0.0], [0.0, 2.0]]))
>>> b = to_sparse_coo(jnp.array([[3.0, 4.0], [0.0, 0.0]]))
>>> add(a, b).to_dense().tolist(), multiply(a, b).nnz()
([[4.0, 4.0], [0.0, 2.0]], 3)
>>> multiply(a, jnp.array([[10.0], [100.0]])).values().tolist()   # scale the rows
[10.0, 200.0]
"""
from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import sparse as jsparse

from paddlejax.sparse.tensor import SparseTensor, as_bcoo, as_sparse, is_concrete


def _union(fn: str, x: SparseTensor, y):
    """The coalesced union of both patterns (a BCOO with the two sides' values in a trailing dim
    of 2), each side's values on it, and a mask of its padding slots."""
    y = as_sparse(fn, y)
    if x.shape != y.shape:
        raise ValueError(f"pj.sparse.{fn}: x and y must have the same shape, got {list(x.shape)} and "
                         f"{list(y.shape)}")
    a, b = as_bcoo(x), as_bcoo(y)
    if a.n_dense != b.n_dense:
        raise ValueError(f"pj.sparse.{fn}: x and y must have as many dense dims, got {a.n_dense} and {b.n_dense}")
    dtype = jnp.result_type(a.dtype, b.dtype)
    # Each side's values in a column of their own along a new trailing dim: summing duplicates
    # over the concatenation lines both sides up on each position, whichever of them stores it.
    data = jnp.concatenate([jnp.stack([a.data.astype(dtype), jnp.zeros_like(a.data, dtype)], -1),
                            jnp.stack([jnp.zeros_like(b.data, dtype), b.data.astype(dtype)], -1)])
    indices = jnp.concatenate([a.indices, b.indices.astype(a.indices.dtype)])
    both = jsparse.BCOO((data, indices), shape=(*x.shape, 2))
    both = jsparse.bcoo_sum_duplicates(both, nse=None if is_concrete(both) else both.nse)
    padding = jnp.any(both.indices >= jnp.array(x.shape[:a.n_sparse]), axis=-1)
    return both, both.data[..., 0], both.data[..., 1], padding.reshape(padding.shape + (1,) * a.n_dense)


def _on_union(fn: str, x, y, combine) -> SparseTensor:
    x = as_sparse(fn, x)
    union, a, b, padding = _union(fn, x, y)
    out = jsparse.BCOO((combine(a, b, padding), union.indices), shape=x.shape, indices_sorted=True,
                       unique_indices=True)
    return type(x)(out if x.is_sparse_coo() else jsparse.BCSR.from_bcoo(out))


def _dense_at(fn: str, x: SparseTensor, y):
    """``y`` (a scalar, or dense and broadcasting to ``x``'s shape) at ``x``'s stored positions,
    shaped to combine with ``x.values()``; 1 at padding slots."""
    y = jnp.asarray(y)
    if y.ndim == 0:
        return y
    if y.ndim > x.ndim or any(n not in (1, m) for n, m in zip(y.shape[::-1], x.shape[::-1])):
        raise ValueError(f"pj.sparse.{fn}: y of shape {list(y.shape)} does not broadcast to x's shape "
                         f"{list(x.shape)}")
    y = y.reshape((1,) * (x.ndim - y.ndim) + y.shape)
    coo = as_bcoo(x)
    at = tuple(coo.indices[:, d] if y.shape[d] != 1 else 0 for d in range(coo.n_sparse))
    return y.at[at].get(mode="fill", fill_value=1)


def add(x, y):
    """``x + y`` for sparse tensors of one shape, on the union of their patterns; Paddle's
    ``paddle.sparse.add``.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> x = sparse_coo_tensor([[0, 2]], [1.0, 2.0], [3])
    >>> add(x, sparse_coo_tensor([[2]], [5.0], [3])).to_dense().tolist()
    [1.0, 0.0, 7.0]
    """
    return _on_union("add", x, y, lambda a, b, padding: a + b)


def subtract(x, y):
    """``x - y`` for sparse tensors of one shape, on the union of their patterns; Paddle's
    ``paddle.sparse.subtract``.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> x = sparse_coo_tensor([[0, 2]], [1.0, 2.0], [3])
    >>> subtract(x, sparse_coo_tensor([[1]], [5.0], [3])).to_dense().tolist()
    [1.0, -5.0, 2.0]
    """
    return _on_union("subtract", x, y, lambda a, b, padding: a - b)


def multiply(x, y):
    """``x * y`` elementwise; Paddle's ``paddle.sparse.multiply``. ``y`` sparse: on the union of
    both patterns; ``y`` a scalar or dense (broadcasting to ``x``): on ``x``'s pattern.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> x = sparse_coo_tensor([[0, 2]], [1.0, 2.0], [3])
    >>> multiply(x, sparse_coo_tensor([[2]], [5.0], [3])).to_dense().tolist()
    [0.0, 0.0, 10.0]
    >>> multiply(x, jnp.array([7.0, 8.0, 9.0])).values().tolist()
    [7.0, 18.0]
    """
    if isinstance(y, (SparseTensor, jsparse.JAXSparse)):
        return _on_union("multiply", x, y, lambda a, b, padding: a * b)
    x = as_sparse("multiply", x)
    return x.with_values(x.values() * _dense_at("multiply", x, y))


def divide(x, y):
    """``x / y`` elementwise; Paddle's ``paddle.sparse.divide``. ``y`` sparse: on the union of
    both patterns (where only ``x`` stores, it divides by 0); ``y`` a scalar or dense
    (broadcasting to ``x``): on ``x``'s pattern.

    >>> from paddlejax.sparse import sparse_coo_tensor
    >>> x = sparse_coo_tensor([[0, 2]], [1.0, 2.0], [3])
    >>> divide(x, sparse_coo_tensor([[0, 2]], [4.0, 8.0], [3])).to_dense().tolist()
    [0.25, 0.0, 0.25]
    >>> divide(x, 2.0).values().tolist()
    [0.5, 1.0]
    """
    if isinstance(y, (SparseTensor, jsparse.JAXSparse)):
        return _on_union("divide", x, y, lambda a, b, padding: a / jnp.where(padding, 1, b))
    x = as_sparse("divide", x)
    return x.with_values(x.values() / _dense_at("divide", x, y))
