"""Sparse tensors in Paddle's two formats over ``jax.experimental.sparse``: a COO tensor wraps a
``BCOO`` array, a CSR tensor a ``BCSR`` array, and both are pytrees, so they pass through
``jax.jit``, ``jax.grad`` and ``jax.vmap`` like any array.

Paddle lays COO indices out as ``[sparse_dim, nnz]`` and values as ``[nnz, *dense_dims]``;
``indices()`` and ``sparse_coo_tensor`` speak that layout (JAX's own is ``[nnz, sparse_dim]``).

How many entries a tensor stores is part of its shape, known before its values. Eager calls
compute it (``coalesce`` and conversions store exactly the distinct entries); under
``jax.jit`` it cannot depend on the data, so there ``coalesce`` keeps the count it was given
and pads with entries whose indices lie one past the end of each dimension (``to_dense``
drops them; ``values()`` shows them as zeros), and a conversion from a dense array needs
``nnz=``.

>>> x = sparse_coo_tensor([[0, 1, 1], [2, 0, 0]], [1.0, 2.0, 3.0], [2, 3])
>>> x
SparseCooTensor(shape=[2, 3], nnz=3, dtype=float32)
>>> x.to_dense().tolist()
[[0.0, 0.0, 1.0], [5.0, 0.0, 0.0]]
>>> x.coalesce().nnz(), x.to_sparse_csr().crows().tolist()
(2, [0, 1, 2])
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse


def is_concrete(*arrays) -> bool:
    """True when no leaf of ``arrays`` is being traced (eager values: their contents are known).

    >>> seen = []
    >>> _ = jax.jit(lambda x: seen.append(is_concrete(x)) or x)(1.0)
    >>> is_concrete(jnp.ones(2)), seen
    (True, [False])
    """
    return not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(arrays))


class SparseTensor:
    """What both formats share: the wrapped JAX array (``array``), shape, dtype, values and
    conversions. ``isinstance(x, SparseTensor)`` holds for both formats.

    >>> isinstance(to_sparse_csr(jnp.eye(2)), SparseTensor)
    True
    """

    def __init__(self, array):
        self.array = array

    def tree_flatten(self):
        return (self.array,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def ndim(self) -> int:
        return len(self.array.shape)

    @property
    def dtype(self):
        return self.array.dtype

    def __repr__(self):
        return f"{type(self).__name__}(shape={list(self.shape)}, nnz={self.nnz()}, dtype={self.dtype})"

    def nnz(self) -> int:
        """How many entries are stored (duplicates and, under ``jax.jit``, padding included).

        >>> to_sparse_coo(jnp.eye(3), 2).nnz()
        3
        """
        return int(self.array.nse)

    def values(self) -> jax.Array:
        """The stored values, ``[nnz, *dense_dims]``.

        >>> to_sparse_csr(jnp.array([[0.0, 2.0], [3.0, 0.0]])).values().tolist()
        [2.0, 3.0]
        """
        return self.array.data

    def to_dense(self) -> jax.Array:
        """The dense array (duplicate entries add up).

        >>> sparse_coo_tensor([[1, 1]], [2.0, 3.0], [3]).to_dense().tolist()
        [0.0, 5.0, 0.0]
        """
        if self.dtype == jnp.bool_:  # XLA adds no booleans: duplicates combine as "or"
            return self.with_values(self.values().astype(jnp.int32)).array.todense() > 0
        return self.array.todense()

    def is_sparse_coo(self) -> bool:
        """True for a COO tensor.

        >>> to_sparse_coo(jnp.eye(2), 2).is_sparse_coo()
        True
        """
        return isinstance(self, SparseCooTensor)

    def is_sparse_csr(self) -> bool:
        """True for a CSR tensor.

        >>> to_sparse_coo(jnp.eye(2), 2).is_sparse_csr()
        False
        """
        return isinstance(self, SparseCsrTensor)

    def to_sparse_coo(self, sparse_dim: int | None = None) -> SparseCooTensor:
        """This tensor in COO format (see :func:`to_sparse_coo`).

        >>> to_sparse_csr(jnp.eye(2)).to_sparse_coo(2).indices().tolist()
        [[0, 1], [0, 1]]
        """
        return to_sparse_coo(self, sparse_dim)

    def to_sparse_csr(self) -> SparseCsrTensor:
        """This tensor in CSR format (see :func:`to_sparse_csr`).

        >>> to_sparse_coo(jnp.eye(2), 2).to_sparse_csr().cols().tolist()
        [0, 1]
        """
        return to_sparse_csr(self)

    def coalesce(self):
        """Duplicates summed, indices sorted (see :func:`coalesce`).

        >>> sparse_coo_tensor([[1, 1]], [2.0, 3.0], [3]).coalesce().values().tolist()
        [5.0]
        """
        return coalesce(self)

    def with_values(self, values):
        """The same pattern holding ``values`` (shaped as :meth:`values`): how a layer rescales
        the edges of an adjacency without rebuilding its indices.

        >>> a = to_sparse_coo(jnp.array([[0.0, 1.0], [1.0, 0.0]]), 2)
        >>> a.with_values(a.values() * 0.5).to_dense().tolist()
        [[0.0, 0.5], [0.5, 0.0]]
        """
        values = jnp.asarray(values)
        if values.shape != self.array.data.shape:
            raise ValueError(f"pj.sparse.with_values: values must have the shape of values() "
                             f"{self.array.data.shape}, got {values.shape}")
        return rebuild(self, values, self.index_arrays())

    def index_arrays(self) -> list[jax.Array]:
        """The integer arrays that hold the pattern: a COO tensor's indices, a CSR tensor's
        columns and row offsets (in JAX's layout).

        >>> [a.shape for a in to_sparse_csr(jnp.eye(3)).index_arrays()]
        [(3,), (4,)]
        """
        return self.array.tree_flatten()[0][1:]  # the values come first in BCOO and BCSR


@jax.tree_util.register_pytree_node_class
class SparseCooTensor(SparseTensor):
    """A COO tensor: ``indices()`` ``[sparse_dim, nnz]`` and ``values()`` ``[nnz, *dense_dims]``;
    ``array`` is the ``jax.experimental.sparse.BCOO`` it wraps.

    >>> x = SparseCooTensor(jsparse.BCOO.fromdense(jnp.array([[0.0, 2.0], [0.0, 0.0]])))
    >>> x.indices().tolist(), x.values().tolist()
    ([[0], [1]], [2.0])
    """

    def indices(self) -> jax.Array:
        """The indices of the stored entries, ``[sparse_dim, nnz]`` as in Paddle.

        >>> sparse_coo_tensor([[0, 2]], [1.0, 2.0], [3]).indices().tolist()
        [[0, 2]]
        """
        return self.array.indices.T

    @property
    def sparse_dim(self) -> int:
        """How many leading dims are sparse (the rows of :meth:`indices`)."""
        return self.array.n_sparse

    @property
    def dense_dim(self) -> int:
        """How many trailing dims each stored value holds densely."""
        return self.array.n_dense


@jax.tree_util.register_pytree_node_class
class SparseCsrTensor(SparseTensor):
    """A 2-D CSR tensor: row offsets ``crows()`` ``[rows + 1]``, column ``cols()`` and
    ``values()`` ``[nnz]``; ``array`` is the ``jax.experimental.sparse.BCSR`` it wraps.

    >>> x = SparseCsrTensor(jsparse.BCSR.fromdense(jnp.array([[0.0, 2.0], [3.0, 0.0]])))
    >>> x.crows().tolist(), x.cols().tolist()
    ([0, 1, 2], [1, 0])
    """

    def crows(self) -> jax.Array:
        """Row offsets: row ``i`` stores entries ``crows[i]:crows[i + 1]``.

        >>> to_sparse_csr(jnp.array([[0.0, 0.0], [3.0, 4.0]])).crows().tolist()
        [0, 0, 2]
        """
        return self.array.indptr

    def cols(self) -> jax.Array:
        """The column of each stored entry.

        >>> to_sparse_csr(jnp.array([[0.0, 0.0], [3.0, 4.0]])).cols().tolist()
        [0, 1]
        """
        return self.array.indices


def rebuild(x: SparseTensor, values, index_arrays) -> SparseTensor:
    """A tensor of ``x``'s format and shape from new ``values`` and ``index_arrays`` (shaped as
    ``x``'s: its sortedness and uniqueness carry over).

    >>> x = to_sparse_coo(jnp.array([0.0, 2.0]))
    >>> rebuild(x, x.values() + 1, x.index_arrays()).to_dense().tolist()
    [0.0, 3.0]
    """
    aux = x.array.tree_flatten()[1]
    return type(x)(type(x.array).tree_unflatten(aux, (values, *index_arrays)))


def as_sparse(fn: str, x) -> SparseTensor:
    """``x`` as a sparse tensor: ours as they are, JAX's ``BCOO`` / ``BCSR`` wrapped; anything
    else is a TypeError naming ``fn``.

    >>> as_sparse("f", jsparse.BCOO.fromdense(jnp.eye(2))).is_sparse_coo()
    True
    """
    if isinstance(x, SparseTensor):
        return x
    if isinstance(x, jsparse.BCOO):
        return SparseCooTensor(x)
    if isinstance(x, jsparse.BCSR):
        return SparseCsrTensor(x)
    raise TypeError(f"pj.sparse.{fn}: expects a sparse tensor (SparseCooTensor or SparseCsrTensor), "
                    f"got {type(x).__name__}")


def is_sparse_coo(x) -> bool:
    """True for a COO tensor (ours or a ``BCOO``), False for anything else.

    >>> is_sparse_coo(to_sparse_coo(jnp.eye(2), 2)), is_sparse_coo(jnp.eye(2))
    (True, False)
    """
    return isinstance(x, (SparseCooTensor, jsparse.BCOO))


def is_sparse_csr(x) -> bool:
    """True for a CSR tensor (ours or a ``BCSR``), False for anything else.

    >>> is_sparse_csr(to_sparse_csr(jnp.eye(2))), is_sparse_csr(jnp.eye(2))
    (True, False)
    """
    return isinstance(x, (SparseCsrTensor, jsparse.BCSR))


def _index_array(fn: str, name: str, x, ndim: int) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"pj.sparse.{fn}: {name} must hold integers, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"pj.sparse.{fn}: {name} must be {ndim}-D, got shape {x.shape}")
    return x


def _check_range(fn: str, name: str, index, low: int, high) -> None:
    index = np.asarray(index)
    high = np.asarray(high).reshape((-1,) + (1,) * (index.ndim - 1))
    if index.size and (index.min() < low or (index >= high).any()):
        raise ValueError(f"pj.sparse.{fn}: {name} out of range [{low}, {np.squeeze(high).tolist()}): "
                         f"{index.tolist()}")


def sparse_coo_tensor(indices, values, shape=None, dtype=None) -> SparseCooTensor:
    """A COO tensor from ``indices`` ``[sparse_dim, nnz]`` (int32 or int64) and ``values``
    ``[nnz, *dense_dims]``; Paddle's ``paddle.sparse.sparse_coo_tensor``. Duplicate indices are
    kept (they add up; :func:`coalesce` merges them). Without ``shape`` it is the smallest that
    holds the indices, which only concrete indices give (under ``jax.jit`` pass it).

    >>> x = sparse_coo_tensor([[0, 1], [1, 0]], [[1.0, 2.0], [3.0, 4.0]])   # a dense last dim
    >>> x.shape, x.sparse_dim, x.to_dense()[1].tolist()
    ((2, 2, 2), 2, [[3.0, 4.0], [0.0, 0.0]])
    """
    indices = _index_array("sparse_coo_tensor", "indices", indices, 2)
    values = jnp.asarray(values, dtype=dtype)
    if values.ndim == 0 or values.shape[0] != indices.shape[1]:
        raise ValueError(f"pj.sparse.sparse_coo_tensor: values must have one row per index column "
                         f"({indices.shape[1]}), got shape {values.shape}")
    sparse_dim = indices.shape[0]
    if shape is None:
        if not is_concrete(indices):
            raise ValueError("pj.sparse.sparse_coo_tensor: shape is required under jax.jit "
                             "(it cannot be read off traced indices)")
        top = np.asarray(indices).max(axis=1) + 1 if indices.shape[1] else np.zeros(sparse_dim, int)
        shape = (*top.tolist(), *values.shape[1:])
    shape = tuple(int(s) for s in shape)
    if len(shape) != sparse_dim + values.ndim - 1 or shape[sparse_dim:] != values.shape[1:]:
        raise ValueError(f"pj.sparse.sparse_coo_tensor: shape {list(shape)} does not fit {sparse_dim} sparse "
                         f"dims and values of shape {values.shape}")
    if is_concrete(indices):
        _check_range("sparse_coo_tensor", "indices", indices, 0, shape[:sparse_dim])
    return SparseCooTensor(jsparse.BCOO((values, indices.T), shape=shape))


def sparse_csr_tensor(crows, cols, values, shape, dtype=None) -> SparseCsrTensor:
    """A 2-D CSR tensor from row offsets ``crows`` ``[rows + 1]``, columns ``cols`` and
    ``values`` ``[nnz]``; Paddle's ``paddle.sparse.sparse_csr_tensor``. Paddle's 3-D
    (batched) CSR is not supported: a 3-D COO tensor does the same.

    >>> sparse_csr_tensor([0, 1, 3], [2, 0, 1], [1.0, 2.0, 3.0], [2, 3]).to_dense().tolist()
    [[0.0, 0.0, 1.0], [2.0, 3.0, 0.0]]
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise ValueError(f"pj.sparse.sparse_csr_tensor: only 2-D CSR tensors are supported (a 3-D COO tensor "
                         f"serves batches), got shape {list(shape)}")
    crows = _index_array("sparse_csr_tensor", "crows", crows, 1)
    cols = _index_array("sparse_csr_tensor", "cols", cols, 1).astype(crows.dtype)
    values = jnp.asarray(values, dtype=dtype)
    if crows.shape[0] != shape[0] + 1:
        raise ValueError(f"pj.sparse.sparse_csr_tensor: crows must have rows + 1 = {shape[0] + 1} entries, "
                         f"got {crows.shape[0]}")
    if values.shape != cols.shape:
        raise ValueError(f"pj.sparse.sparse_csr_tensor: values and cols must have the same shape, got "
                         f"{values.shape} and {cols.shape}")
    if is_concrete(crows, cols):
        c = np.asarray(crows)
        if c[0] != 0 or (np.diff(c) < 0).any() or c[-1] != cols.shape[0]:
            raise ValueError(f"pj.sparse.sparse_csr_tensor: crows must rise from 0 to nnz = {cols.shape[0]}, "
                             f"got {c.tolist()}")
        _check_range("sparse_csr_tensor", "cols", cols, 0, shape[1])
    return SparseCsrTensor(jsparse.BCSR((values, cols, crows), shape=shape))


def coalesce(x):
    """``x`` with duplicate entries summed and indices sorted row-major; Paddle's
    ``paddle.sparse.coalesce``. Eagerly it stores exactly the distinct entries; under
    ``jax.jit`` it keeps ``nnz`` and pads (see the module's note).

    >>> x = sparse_coo_tensor([[1, 0, 1]], [1.0, 2.0, 3.0], [2]).coalesce()
    >>> x.indices().tolist(), x.values().tolist()
    ([[0, 1]], [2.0, 4.0])
    """
    x = as_sparse("coalesce", x)
    coo = as_bcoo(x)
    out = jsparse.bcoo_sum_duplicates(coo, nse=None if is_concrete(coo) else coo.nse)
    return SparseCooTensor(out) if x.is_sparse_coo() else SparseCsrTensor(jsparse.BCSR.from_bcoo(out))


def as_bcoo(x: SparseTensor) -> jsparse.BCOO:
    """``x``'s entries as a ``BCOO`` (a CSR tensor's converted, in order).

    >>> as_bcoo(to_sparse_csr(jnp.eye(2))).indices.tolist()
    [[0, 0], [1, 1]]
    """
    return x.array if x.is_sparse_coo() else x.array.to_bcoo()


def to_sparse_coo(x, sparse_dim: int | None = None, nnz: int | None = None) -> SparseCooTensor:
    """``x`` (dense, or a CSR tensor) as a COO tensor whose first ``sparse_dim`` dims are
    sparse and the rest dense (default: all sparse); Paddle's ``Tensor.to_sparse_coo``. From a
    dense array, the nonzeros are stored; under ``jax.jit`` say how many slots with ``nnz``.

    >>> x = to_sparse_coo(jnp.array([[0.0, 0.0], [1.0, 2.0]]), sparse_dim=1)   # rows sparse
    >>> x.indices().tolist(), x.values().tolist()
    ([[1]], [[1.0, 2.0]])
    """
    if isinstance(x, (SparseTensor, jsparse.JAXSparse)):
        coo = as_bcoo(as_sparse("to_sparse_coo", x))
        if sparse_dim not in (None, coo.n_sparse):
            raise ValueError(f"pj.sparse.to_sparse_coo: x has {coo.n_sparse} sparse dims, got sparse_dim="
                             f"{sparse_dim}; to_sparse_coo(x.to_dense(), {sparse_dim}) changes them")
        return SparseCooTensor(coo)
    x = jnp.asarray(x)
    sparse_dim = x.ndim if sparse_dim is None else sparse_dim
    if not 0 < sparse_dim <= x.ndim:
        raise ValueError(f"pj.sparse.to_sparse_coo: sparse_dim must be in [1, {x.ndim}], got {sparse_dim}")
    if nnz is None and not is_concrete(x):
        raise ValueError("pj.sparse.to_sparse_coo: under jax.jit the number of nonzeros is unknown; pass nnz=")
    return SparseCooTensor(jsparse.BCOO.fromdense(x, nse=nnz, n_dense=x.ndim - sparse_dim))


def to_sparse_csr(x, nnz: int | None = None) -> SparseCsrTensor:
    """``x`` (a dense 2-D array, or a 2-D COO tensor) as a CSR tensor; Paddle's
    ``Tensor.to_sparse_csr``. A COO tensor is coalesced first (CSR stores each entry once);
    from a dense array under ``jax.jit``, say how many slots with ``nnz``.

    >>> x = to_sparse_csr(jnp.array([[0.0, 5.0], [0.0, 0.0]]))
    >>> x.crows().tolist(), x.cols().tolist(), x.values().tolist()
    ([0, 1, 1], [1], [5.0])
    """
    if isinstance(x, (SparseTensor, jsparse.JAXSparse)):
        x = as_sparse("to_sparse_csr", x)
        if x.is_sparse_csr():
            return x
        if x.ndim != 2 or x.array.n_dense:
            raise ValueError(f"pj.sparse.to_sparse_csr: needs a 2-D tensor with both dims sparse, got shape "
                             f"{list(x.shape)} with {x.array.n_dense} dense dims")
        return SparseCsrTensor(jsparse.BCSR.from_bcoo(coalesce(x).array))
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"pj.sparse.to_sparse_csr: needs a 2-D array, got shape {list(x.shape)}")
    if nnz is None and not is_concrete(x):
        raise ValueError("pj.sparse.to_sparse_csr: under jax.jit the number of nonzeros is unknown; pass nnz=")
    return SparseCsrTensor(jsparse.BCSR.fromdense(x, nse=nnz))
