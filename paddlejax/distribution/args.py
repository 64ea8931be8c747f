"""Argument handling shared by the distributions and transforms: parameters as float arrays of
one dtype, support checks that run eagerly, sample shapes and PRNG keys.

Parameters may be Python numbers, lists, numpy or JAX arrays. Python numbers and integer arrays
become JAX's default float (float64 when ``jax_enable_x64`` is on); float arrays keep their
dtype, and a distribution's parameters share the widest one among its float arrays.

Checks (``scale > 0``, ``0 <= probs <= 1``...) run when the parameters are concrete: building a
distribution eagerly, or inside ``jax.jit`` from Python numbers or closed-over arrays (they are
converted and checked at trace time). A distribution built from traced parameters (arguments
of the jitted function) is not checked, since their values are unknown while tracing; bad
values then give NaN, as JAX's own functions do.

>>> loc, scale = floats("Normal", loc=0.0, scale=[1.0, 2.0])
>>> scale.dtype == loc.dtype, scale.shape
(True, (2,))
>>> positive("Normal", scale=jnp.asarray(-1.0))
Traceback (most recent call last):
    ...
ValueError: Normal: scale must be > 0, got -1.0
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def floats(owner: str, *, broadcast: bool = True, **params) -> list[jax.Array]:
    """``params`` as float arrays of one dtype, checked to broadcast together (unless
    ``broadcast`` is false: parameters of different ranks, such as a mean and a covariance).

    >>> [p.dtype == jnp.float32 for p in floats("Beta", alpha=jnp.float32(2), beta=3)]
    [True, True]
    """
    arrays = []
    for name, value in params.items():
        try:
            with jax.ensure_compile_time_eval():  # concrete values stay concrete inside a trace, for the checks
                array = jnp.asarray(value)
        except TypeError:
            raise TypeError(f"{owner}: {name} must be a number or an array of numbers, "
                            f"got {type(value).__name__}") from None
        if not (jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer)
                or array.dtype == bool):
            raise TypeError(f"{owner}: {name} must hold real numbers, got dtype {array.dtype}")
        arrays.append(array)
    explicit = [a.dtype for a in arrays if jnp.issubdtype(a.dtype, jnp.floating) and not a.weak_type]
    dtype = jnp.result_type(*explicit) if explicit else jnp.result_type(float)
    shapes = {name: a.shape for name, a in zip(params, arrays)}
    try:
        if broadcast:
            np.broadcast_shapes(*shapes.values())
    except ValueError:
        described = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"{owner}: parameter shapes do not broadcast: {described}") from None
    with jax.ensure_compile_time_eval():
        return [a.astype(dtype) for a in arrays]


def _concrete(value) -> np.ndarray | None:
    """``value`` as numpy, or None while it is traced."""
    if isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value)


def constrain(owner: str, name: str, value, holds: Callable[[jax.Array], jax.Array], requirement: str) -> None:
    """Raise a ValueError naming ``owner`` and ``name`` unless ``holds(value)`` is true
    everywhere; skipped while it is traced.

    >>> constrain("Uniform", "high", jnp.asarray(0.0), lambda high: high > 1.0, "> low")
    Traceback (most recent call last):
        ...
    ValueError: Uniform: high must be > low, got 0.0
    """
    with jax.ensure_compile_time_eval():
        ok = _concrete(holds(value))
    if ok is None or bool(ok.all()):
        return
    shown = _concrete(value)
    shape = np.broadcast_shapes(ok.shape, shown.shape)
    first_bad = np.broadcast_to(shown, shape)[~np.broadcast_to(ok, shape)].flat[0].item()
    raise ValueError(f"{owner}: {name} must be {requirement}, got {first_bad}")


def positive(owner: str, **params) -> None:
    """Each of ``params`` is > 0 (eagerly).

    >>> positive("Gamma", concentration=jnp.asarray([1.0, 2.0]), rate=jnp.asarray(0.5))
    """
    for name, value in params.items():
        constrain(owner, name, value, lambda v: v > 0, "> 0")


def probability(owner: str, name: str, value, *, open_low: bool = False) -> None:
    """``value`` lies in ``[0, 1]`` (``(0, 1]`` with ``open_low``), eagerly.

    >>> probability("Bernoulli", "probs", jnp.asarray(1.5))
    Traceback (most recent call last):
        ...
    ValueError: Bernoulli: probs must be in [0, 1], got 1.5
    """
    above = (lambda v: v > 0) if open_low else (lambda v: v >= 0)
    constrain(owner, name, value, lambda v: above(v) & (v <= 1), f"in {'(' if open_low else '['}0, 1]")


def whole(value) -> int | None:
    """``value`` as an int if it is a Python or numpy integer (not a bool), else None.

    >>> whole(3), whole(np.int64(2)), whole(2.0), whole(True)
    (3, 2, None, None)
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def sample_shape(owner: str, shape) -> tuple[int, ...]:
    """Paddle's ``shape`` argument of ``sample``: a sequence of ints >= 0 (an int is one).

    >>> sample_shape("Normal.sample", [2, 3]), sample_shape("Normal.sample", 4)
    ((2, 3), (4,))
    """
    items = (shape,) if whole(shape) is not None else shape
    if not isinstance(items, (tuple, list)) or any(whole(n) is None or n < 0 for n in items):
        raise TypeError(f"{owner}: shape must be a list or tuple of ints >= 0, got {shape!r}")
    return tuple(int(n) for n in items)


def prng_key(owner: str, key) -> jax.Array:
    """The ``key`` argument of ``sample``/``rsample``: a JAX PRNG key (typed, or raw
    ``uint32[2]``) or an int seed. There is no default: randomness is never drawn from hidden
    global state, so the same key always gives the same sample, under ``jax.jit`` too.

    >>> prng_key("Normal.sample", 0).dtype
    key<fry>
    >>> prng_key("Normal.sample", None)
    Traceback (most recent call last):
        ...
    TypeError: Normal.sample: pass key=, a jax.random.key(...) or an int seed
    """
    if whole(key) is not None:
        return jax.random.key(whole(key))
    dtype = getattr(key, "dtype", None)
    if dtype is not None and (jnp.issubdtype(dtype, jax.dtypes.prng_key)
                              or (dtype == jnp.uint32 and key.shape[-1:] == (2,))):
        return key
    raise TypeError(f"{owner}: pass key=, a jax.random.key(...) or an int seed"
                    + ("" if key is None else f", got {type(key).__name__}"))
