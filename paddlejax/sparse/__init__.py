"""Sparse tensors in Paddle's names (``paddle.sparse``) on ``jax.experimental.sparse``: COO and
CSR tensors, conversions, zero-preserving elementwise functions, arithmetic, sums, transposes
and products. Everything traces under ``jax.jit`` and differentiates with respect to the stored
values (``sparse @ dense`` included), so a graph layer can hold its adjacency as a sparse tensor
and learn edge weights.

- :mod:`~paddlejax.sparse.tensor`: :class:`SparseCooTensor`, :class:`SparseCsrTensor`,
  ``sparse_coo_tensor``, ``sparse_csr_tensor``, ``to_sparse_coo``, ``to_sparse_csr``,
  ``coalesce`` (and why counts of stored entries are fixed under ``jax.jit``);
- :mod:`~paddlejax.sparse.unary`: ``relu``, ``abs``, ``sqrt``, ``sin``, ``tanh``, ``neg``, ...;
- :mod:`~paddlejax.sparse.binary`: ``add``, ``subtract``, ``multiply``, ``divide``;
- :mod:`~paddlejax.sparse.matmul`: ``matmul``, ``masked_matmul``, ``mv``, ``addmm``;
- :mod:`~paddlejax.sparse.shape` and :mod:`~paddlejax.sparse.reduce`: ``transpose``,
  ``reshape``, ``sum``.

>>> import jax, jax.numpy as jnp, paddlejax as pj
>>> edges = jnp.array([[0, 1, 2], [1, 2, 0]])          # [2, nnz], Paddle's layout
>>> features = jnp.eye(3)
>>> def loss(weights):
...     adj = pj.sparse.sparse_coo_tensor(edges, weights, [3, 3])
...     return pj.sparse.matmul(adj, features).sum()
>>> jax.grad(loss)(jnp.ones(3)).tolist()
[1.0, 1.0, 1.0]
"""
from paddlejax.sparse.binary import add, divide, multiply, subtract  # noqa: F401
from paddlejax.sparse.matmul import addmm, masked_matmul, matmul, mv  # noqa: F401
from paddlejax.sparse.reduce import sum  # noqa: F401
from paddlejax.sparse.shape import reshape, transpose  # noqa: F401
from paddlejax.sparse.tensor import (SparseCooTensor, SparseCsrTensor, SparseTensor, coalesce,  # noqa: F401
                                     is_sparse_coo, is_sparse_csr, sparse_coo_tensor, sparse_csr_tensor,
                                     to_sparse_coo, to_sparse_csr)
from paddlejax.sparse.unary import (abs, asin, asinh, atan, atanh, cast, deg2rad, expm1, isnan,  # noqa: F401
                                    leaky_relu, log1p, neg, pow, rad2deg, relu, relu6, sin, sinh, sqrt,
                                    square, tan, tanh)
