"""Elementwise functions of sparse tensors that map 0 to 0 (Paddle's ``paddle.sparse.sin``,
``relu``, ``sqrt``, ...): they apply to the stored values only, and the pattern stays. Functions
with ``f(0) != 0`` (``cos``, ``exp``, ``log``) would fill every unstored entry, so there are none
here: use ``jnp.cos(x.to_dense())``. Each applies to every stored value, so on a tensor with
duplicate entries ``f(a) + f(b)`` lands where the dense result has ``f(a + b)``: ``coalesce``
such a tensor first (as Paddle's kernels, which assume coalesced input).

>>> from paddlejax.sparse import to_sparse_coo
>>> x = to_sparse_coo(jnp.array([[0.0, -1.0], [4.0, 0.0]]))
>>> relu(x).to_dense().tolist(), sqrt(abs(x)).values().tolist()
([[0.0, 0.0], [4.0, 0.0]], [1.0, 2.0])
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.sparse.tensor import as_sparse, rebuild


def _elementwise(name: str, fn, what: str, example: str):
    def op(x):
        x = as_sparse(name, x)
        return x.with_values(fn(x.values()))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"""{what} of each stored value; Paddle's ``paddle.sparse.{name}``.

    >>> from paddlejax.sparse import to_sparse_coo
    >>> x = to_sparse_coo(jnp.array([0.5, 0.0, -0.25]))
    >>> [round(float(v), 3) for v in {name}(x).to_dense()]
    {example}
    """
    return op


abs = _elementwise("abs", jnp.abs, "The absolute value", "[0.5, 0.0, 0.25]")
neg = _elementwise("neg", jnp.negative, "The negation", "[-0.5, 0.0, 0.25]")
square = _elementwise("square", jnp.square, "The square", "[0.25, 0.0, 0.062]")
sqrt = _elementwise("sqrt", jnp.sqrt, "The square root (nan below 0)", "[0.707, 0.0, nan]")
sin = _elementwise("sin", jnp.sin, "The sine", "[0.479, 0.0, -0.247]")
tan = _elementwise("tan", jnp.tan, "The tangent", "[0.546, 0.0, -0.255]")
asin = _elementwise("asin", jnp.arcsin, "The arcsine", "[0.524, 0.0, -0.253]")
atan = _elementwise("atan", jnp.arctan, "The arctangent", "[0.464, 0.0, -0.245]")
sinh = _elementwise("sinh", jnp.sinh, "The hyperbolic sine", "[0.521, 0.0, -0.253]")
tanh = _elementwise("tanh", jnp.tanh, "The hyperbolic tangent", "[0.462, 0.0, -0.245]")
asinh = _elementwise("asinh", jnp.arcsinh, "The inverse hyperbolic sine", "[0.481, 0.0, -0.247]")
atanh = _elementwise("atanh", jnp.arctanh, "The inverse hyperbolic tangent", "[0.549, 0.0, -0.255]")
expm1 = _elementwise("expm1", jnp.expm1, "``exp(v) - 1``", "[0.649, 0.0, -0.221]")
log1p = _elementwise("log1p", jnp.log1p, "``log(1 + v)``", "[0.405, 0.0, -0.288]")
deg2rad = _elementwise("deg2rad", jnp.deg2rad, "Degrees to radians", "[0.009, 0.0, -0.004]")
rad2deg = _elementwise("rad2deg", jnp.rad2deg, "Radians to degrees", "[28.648, 0.0, -14.324]")
relu = _elementwise("relu", jax.nn.relu, "``max(v, 0)``", "[0.5, 0.0, 0.0]")
relu6 = _elementwise("relu6", jax.nn.relu6, "``min(max(v, 0), 6)``", "[0.5, 0.0, 0.0]")
isnan = _elementwise("isnan", jnp.isnan, "Whether it is nan", "[0.0, 0.0, 0.0]")


def leaky_relu(x, negative_slope: float = 0.01):
    """``v`` where positive, ``negative_slope * v`` elsewhere, on each stored value; Paddle's
    ``paddle.sparse.nn.functional.leaky_relu``.

    >>> from paddlejax.sparse import to_sparse_coo
    >>> leaky_relu(to_sparse_coo(jnp.array([2.0, 0.0, -1.0])), 0.1).values().tolist()
    [2.0, -0.10000000149011612]
    """
    x = as_sparse("leaky_relu", x)
    return x.with_values(jax.nn.leaky_relu(x.values(), negative_slope))


def pow(x, factor: float):
    """Each stored value to the power ``factor``, which must be positive (``0 ** factor``
    must stay 0); Paddle's ``paddle.sparse.pow``.

    >>> from paddlejax.sparse import to_sparse_coo
    >>> pow(to_sparse_coo(jnp.array([3.0, 0.0])), 2).values().tolist()
    [9.0]
    """
    x = as_sparse("pow", x)
    if not factor > 0:
        raise ValueError(f"pj.sparse.pow: factor must be > 0 (0 ** factor must stay 0), got {factor}")
    return x.with_values(jnp.power(x.values(), factor))


def cast(x, index_dtype=None, value_dtype=None):
    """``x`` with its indices (and CSR row offsets) as ``index_dtype`` and its values as
    ``value_dtype``; either left out keeps its type. Paddle's ``paddle.sparse.cast``.

    >>> from paddlejax.sparse import to_sparse_coo
    >>> y = cast(to_sparse_coo(jnp.array([1.5, 0.0])), value_dtype=jnp.bfloat16)
    >>> y.dtype, y.indices().dtype
    (dtype(bfloat16), dtype('int32'))
    """
    x = as_sparse("cast", x)
    if index_dtype is not None and not jnp.issubdtype(index_dtype, jnp.integer):
        raise TypeError(f"pj.sparse.cast: index_dtype must be an integer type, got {index_dtype}")
    values = x.values() if value_dtype is None else x.values().astype(value_dtype)
    index_arrays = [i if index_dtype is None else i.astype(index_dtype) for i in x.index_arrays()]
    return rebuild(x, values, index_arrays)
