"""The values an importer's interpreter passes between ops while it traces a foreign graph.

A value is one of:

- a traced JAX array (computed from the model's inputs);
- a NumPy array known while converting (constants, and the shape arithmetic built on them,
  whose symbolic sizes are JAX dimension expressions in an ``object`` array);
- a :class:`Weight`, read as a parameter of the program when an op uses it as a tensor.

Ops whose inputs are all known are computed in NumPy, so ``shape → slice → concat → reshape``
gives the reshape a known (possibly symbolic) target shape, as the source graph meant.

>>> as_value(3).dtype, is_known(np.zeros(2)), shape_array((2, 5)).tolist()
(dtype('int64'), True, [2, 5])
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Weight:
    """A stored tensor that becomes a parameter of the program when read as a tensor."""

    name: str
    array: np.ndarray


_RUNTIME_DTYPES = {np.dtype("int64"): np.dtype("int32"), np.dtype("uint64"): np.dtype("uint32"),
                   np.dtype("float64"): np.dtype("float32")}


def runtime_dtype(dtype) -> np.dtype:
    """The dtype a tensor of ``dtype`` has in the program (JAX's 32-bit defaults)."""
    dtype = np.dtype(dtype)
    return _RUNTIME_DTYPES.get(dtype, dtype)


def is_known(v) -> bool:
    """A value known while converting (not traced, not a parameter)."""
    return isinstance(v, np.ndarray)


def as_tensor(v, params):
    """A traced or constant JAX array for a value (a Weight read from ``params``)."""
    if isinstance(v, Weight):
        return params[v.name]
    if isinstance(v, np.ndarray):
        if v.dtype == object:  # symbolic sizes
            return jnp.array([jnp.asarray(d, jnp.int32) for d in v.flat], jnp.int32).reshape(v.shape) \
                if v.size else jnp.zeros(v.shape, jnp.int32)
        return jnp.asarray(v.astype(runtime_dtype(v.dtype)))
    if isinstance(v, (int, float, np.generic)):
        return jnp.asarray(v)
    return v


def as_value(value):
    """An op's result as an interpreter value: NumPy scalars and symbolic sizes (which NumPy
    indexing returns bare) become 0-d known arrays."""
    if isinstance(value, (np.ndarray, Weight, jax.Array)):
        return value
    if isinstance(value, (np.generic, int, float, bool)):
        return np.asarray(value)
    return np.array(value, dtype=object)


def shape_array(shape) -> np.ndarray:
    """A shape as a known int64 vector (object dtype where a size is symbolic)."""
    dims = [int(d) if isinstance(d, (int, np.integer)) else d for d in shape]
    return np.array(dims, dtype=np.int64 if all(isinstance(d, int) for d in dims) else object)


def shape_of(v) -> tuple:
    """The shape of any value."""
    if isinstance(v, Weight):
        return v.array.shape
    return np.shape(v) if isinstance(v, np.ndarray) else tuple(v.shape)


def override_dims(importer: str, name: str, dims: list, given) -> list:
    """An input's ``dims`` with the user's ``input_shapes[name]`` applied: ``None`` keeps a
    size, an int fixes a dynamic one, a string names it (``32*h``); a wrong rank or a
    conflict with a size the model fixes is a ConversionError naming ``importer``.

    >>> override_dims("from_onnx", "x", ["b", 3, "h"], (None, None, 64))
    ['b', 3, 64]
    """
    from paddlejax.convert.errors import ConversionError

    given = tuple(given)
    if len(given) != len(dims):
        raise ConversionError(f"{importer}: input_shapes['{name}'] has {len(given)} dims, the model's input "
                              f"has {len(dims)} ({tuple(dims)})")
    for axis, (g, d) in enumerate(zip(given, dims)):
        if isinstance(d, int) and g is not None and g != d:
            raise ConversionError(f"{importer}: input_shapes['{name}'] sets axis {axis} to {g}, but the "
                                  f"model fixes it to {d}")
    return [d if g is None else g if isinstance(g, str) else int(g) for g, d in zip(given, dims)]


def is_static(shape) -> bool:
    return all(isinstance(d, (int, np.integer)) for d in shape)
