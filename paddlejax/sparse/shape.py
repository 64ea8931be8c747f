"""Rearranging sparse tensors without densifying them (Paddle's ``paddle.sparse.transpose``
and ``reshape``): both move indices only. A CSR tensor comes back as CSR (its entries re-sorted
by row), which needs a 2-D result.

>>> import jax.numpy as jnp
>>> from paddlejax.sparse import sparse_coo_tensor
>>> x = sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], [2, 3])
>>> transpose(x, [1, 0]).to_dense().tolist()
[[0.0, 2.0], [0.0, 0.0], [1.0, 0.0]]
>>> reshape(x, [3, -1]).to_dense().tolist()
[[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]
"""
from __future__ import annotations

import math

from jax.experimental import sparse as jsparse

from paddlejax.sparse.tensor import SparseCooTensor, as_bcoo, as_sparse, to_sparse_csr


def _like(fn: str, x, coo: jsparse.BCOO):
    """``coo`` in ``x``'s format."""
    if x.is_sparse_coo():
        return SparseCooTensor(coo)
    if coo.ndim != 2:
        raise ValueError(f"pj.sparse.{fn}: a CSR tensor must stay 2-D, got shape {list(coo.shape)}; "
                         f"convert it with to_sparse_coo first")
    return to_sparse_csr(SparseCooTensor(coo))


def transpose(x, perm):
    """``x`` with its dims permuted by ``perm``; dense trailing dims of a hybrid COO tensor must
    stay where they are. Paddle's ``paddle.sparse.transpose``.

    >>> import jax.numpy as jnp
    >>> transpose(to_sparse_csr(jnp.array([[0.0, 1.0], [0.0, 0.0]])), [1, 0]).crows().tolist()
    [0, 0, 1]
    """
    x = as_sparse("transpose", x)
    perm = [int(p) % x.ndim if -x.ndim <= int(p) < x.ndim else -1 for p in perm]
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"pj.sparse.transpose: perm must order the {x.ndim} dims of x, got {perm}")
    coo = as_bcoo(x)
    if perm[coo.n_sparse:] != list(range(coo.n_sparse, x.ndim)):
        raise ValueError(f"pj.sparse.transpose: perm {perm} moves a dense dim (x has {coo.n_sparse} sparse dims)")
    return _like("transpose", x, jsparse.bcoo_transpose(coo, permutation=perm))


def reshape(x, shape):
    """``x`` in a new ``shape`` holding as many elements (one entry may be -1); a hybrid COO
    tensor's dense trailing dims must stay. Paddle's ``paddle.sparse.reshape``.

    >>> import jax.numpy as jnp
    >>> from paddlejax.sparse import to_sparse_coo
    >>> reshape(to_sparse_coo(jnp.array([[0.0, 1.0], [2.0, 0.0]])), [4]).indices().tolist()
    [[1, 2]]
    """
    x = as_sparse("reshape", x)
    shape = [int(s) for s in shape]
    known = math.prod(s for s in shape if s != -1)
    if shape.count(-1) == 1 and known and math.prod(x.shape) % known == 0:
        shape[shape.index(-1)] = math.prod(x.shape) // known
    if math.prod(shape) != math.prod(x.shape) or min(shape, default=0) < 0:
        raise ValueError(f"pj.sparse.reshape: cannot reshape {list(x.shape)} to {shape}")
    coo = as_bcoo(x)
    dense = x.shape[coo.n_sparse:]
    if coo.n_dense and tuple(shape[len(shape) - coo.n_dense:]) != dense:
        raise ValueError(f"pj.sparse.reshape: the dense dims {list(dense)} of x must stay last, got {shape}")
    return _like("reshape", x, jsparse.bcoo_reshape(coo, new_sizes=shape))
