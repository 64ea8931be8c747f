"""Sums over the dims of a sparse tensor (Paddle's ``paddle.sparse.sum``), sparse in, sparse
out: the result stores one entry per distinct position left after the reduced dims collapse.

Shapes follow Paddle: ``keepdim=True`` keeps each reduced dim as size 1; without it they go,
except that one size-1 dim stays when every sparse dim is reduced (a full sum has shape
``[1]``, as in Paddle, not ``[]``). A CSR tensor's sum is CSR when the result is 2-D
(``keepdim=True``) and COO otherwise.

>>> import jax.numpy as jnp
>>> from paddlejax.sparse import to_sparse_coo
>>> x = to_sparse_coo(jnp.array([[-2.0, 0.0], [1.0, 2.0]]))
>>> sum(x).to_dense().tolist(), sum(x, axis=-1).to_dense().tolist()
([1.0], [-2.0, 3.0])
>>> sum(x, axis=1, keepdim=True).to_dense().tolist()
[[-2.0], [3.0]]
"""
from __future__ import annotations

from jax.experimental import sparse as jsparse

from paddlejax.sparse.tensor import SparseCooTensor, as_bcoo, as_sparse, coalesce


def sum(x, axis=None, dtype=None, keepdim: bool = False):
    """The sum of ``x`` over ``axis`` (an int, a sequence of them, or None: all), as a sparse
    tensor; the values are cast to ``dtype`` first when it is given. Paddle's
    ``paddle.sparse.sum``.

    >>> import jax.numpy as jnp
    >>> from paddlejax.sparse import to_sparse_coo
    >>> x = to_sparse_coo(jnp.array([[-2.0, 0.0], [1.0, 2.0]]), sparse_dim=1)  # a dense last dim
    >>> y = sum(x, axis=0)
    >>> y.shape, y.values().tolist()
    ((1, 2), [[-1.0, 2.0]])
    """
    x = as_sparse("sum", x)
    axes = range(x.ndim) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    if not all(-x.ndim <= a < x.ndim for a in axes) or len({a % x.ndim for a in axes}) != len(axes):
        raise ValueError(f"pj.sparse.sum: axis must hold distinct dims in [{-x.ndim}, {x.ndim}), got {axis}")
    axes = sorted(a % x.ndim for a in axes)
    coo = as_bcoo(x)
    n_sparse = coo.n_sparse
    sparse_axes = [a for a in axes if a < n_sparse]
    values_axes = tuple(a - n_sparse + 1 for a in axes if a >= n_sparse)  # values are [nnz, *dense]
    values = coo.data if dtype is None else coo.data.astype(dtype)
    values = values.sum(axis=values_axes, keepdims=True)
    indices = coo.indices.at[:, sparse_axes].set(0)  # the reduced dims collapse onto index 0
    kept = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    out = coalesce(SparseCooTensor(jsparse.BCOO((values, indices), shape=kept))).array
    if not keepdim:
        stay = [d for d in range(n_sparse) if d not in sparse_axes] or [0]
        values = out.data.squeeze(values_axes) if values_axes else out.data
        out = jsparse.BCOO((values, out.indices[:, stay]),
                           shape=tuple(kept[d] for d in stay) + tuple(
                               s for d, s in enumerate(x.shape) if d >= n_sparse and d not in axes),
                           indices_sorted=True, unique_indices=True)
    if x.is_sparse_csr() and out.ndim == 2:
        return SparseCooTensor(out).to_sparse_csr()
    return SparseCooTensor(out)
