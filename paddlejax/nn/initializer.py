"""Paddle's parameter initialisers and :class:`ParamAttr`.

An initialiser is called as ``init(key, shape, dtype)`` (the JAX convention, so it also
works as a Flax initialiser). Fans follow Paddle: a 1-D shape has ``fan_in = fan_out =
shape[0]``; a 2-D (Linear) weight ``[in, out]`` has ``fan_in = in, fan_out = out``; a
convolution weight ``[a, b, kh, kw]`` has ``fan_in = b * kh * kw`` and ``fan_out = a * kh * kw``.

>>> import jax
>>> w = XavierUniform()(jax.random.key(0), (300, 500))
>>> bool(abs(w).max() <= (6 / 800) ** 0.5)
True
>>> compute_fans((64, 16, 3, 3))
(144, 576)
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from paddlejax.nn import random


def compute_fans(shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a parameter shape, as Paddle computes them."""
    shape = tuple(shape)
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


@functools.cache
def _flat_sampler(kind: str, size: int):
    @jax.jit
    def sample(key, lo, hi):
        if kind == "normal":
            return jax.random.normal(key, (size,))
        if kind == "uniform":
            return jax.random.uniform(key, (size,), minval=lo, maxval=hi)
        return jax.random.truncated_normal(key, lo, hi, (size,))

    return sample


def sample(kind: str, key, shape, lo=0.0, hi=1.0):
    """float32 samples of ``shape``: standard ``"normal"``, ``"uniform"`` on ``[lo, hi)`` or
    ``"truncated_normal"`` (standard, cut to ``[lo, hi]``). A numpy array for a concrete key, a
    jax array under tracing.

    XLA compiles a random sampler per shape (about a second each for 4-D threefry shapes on a
    CPU), and a network has dozens of weight shapes; so samples are drawn as one flat vector
    of a power-of-two length and cut to size, which needs a few compilations for any model.

    >>> sample("uniform", jax.random.key(0), (2, 3), -1.0, 1.0).shape
    (2, 3)
    """
    shape = tuple(shape)
    n = math.prod(shape)
    size = max(1024, 1 << max(n - 1, 0).bit_length())
    flat = _flat_sampler(kind, size)(key, jnp.float32(lo), jnp.float32(hi))
    if isinstance(flat, jax.core.Tracer):
        return flat[:n].reshape(shape)
    return np.asarray(flat)[:n].reshape(shape)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """Paddle's recommended gain for a nonlinearity (``param`` is leaky_relu's slope).

    >>> round(calculate_gain("relu"), 4), calculate_gain("tanh")
    (1.4142, 1.6666666666666667)
    """
    gains = {"sigmoid": 1.0, "linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0,
             "conv1d_transpose": 1.0, "conv2d_transpose": 1.0, "conv3d_transpose": 1.0,
             "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 3.0 / 4}
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in gains:
        raise ValueError(f"calculate_gain: argument 'nonlinearity' expects one of "
                         f"{sorted([*gains, 'leaky_relu'])}, got {nonlinearity!r}")
    return gains[nonlinearity]


class Initializer:
    """Base class: ``init(key, shape, dtype=float32) -> array``. ``random`` says whether
    the initialiser needs a key (constant ones take none from the global stream)."""

    random = True

    def __call__(self, key, shape, dtype=jnp.float32):
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")


@dataclasses.dataclass(frozen=True)
class Constant(Initializer):
    """Every element ``value``.

    >>> Constant(0.5)(None, (2,)).tolist()
    [0.5, 0.5]
    """

    value: float = 0.0
    random = False

    def __call__(self, key, shape, dtype=jnp.float32):
        return jnp.full(shape, self.value, dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Assign(Initializer):
    """A given array (its shape must match the parameter's).

    >>> Assign([[1.0, 2.0]])(None, (1, 2)).tolist()
    [[1.0, 2.0]]
    """

    value: object
    random = False

    def __call__(self, key, shape, dtype=jnp.float32):
        value = jnp.asarray(self.value, dtype)
        if value.shape != tuple(shape):
            raise ValueError(f"Assign: value has shape {value.shape}, the parameter needs {tuple(shape)}")
        return value


@dataclasses.dataclass(frozen=True)
class Normal(Initializer):
    """Samples of N(mean, std^2).

    >>> Normal(1.0, 0.0)(jax.random.key(0), (2,)).tolist()
    [1.0, 1.0]
    """

    mean: float = 0.0
    std: float = 1.0

    def __call__(self, key, shape, dtype=jnp.float32):
        return jnp.asarray(self.mean + self.std * sample("normal", key, shape), dtype)


@dataclasses.dataclass(frozen=True)
class TruncatedNormal(Initializer):
    """N(mean, std^2) restricted to ``[a, b]`` (absolute bounds, as in Paddle).

    >>> w = TruncatedNormal(std=10.0)(jax.random.key(0), (1000,))
    >>> bool(w.min() >= -2 and w.max() <= 2)
    True
    """

    mean: float = 0.0
    std: float = 1.0
    a: float = -2.0
    b: float = 2.0

    def __call__(self, key, shape, dtype=jnp.float32):
        lo, hi = (self.a - self.mean) / self.std, (self.b - self.mean) / self.std
        return jnp.asarray(self.mean + self.std * sample("truncated_normal", key, shape, lo, hi), dtype)


@dataclasses.dataclass(frozen=True)
class Uniform(Initializer):
    """Samples of U(low, high).

    >>> w = Uniform(-0.1, 0.1)(jax.random.key(0), (1000,))
    >>> bool(w.min() >= -0.1 and w.max() < 0.1)
    True
    """

    low: float = -1.0
    high: float = 1.0

    def __call__(self, key, shape, dtype=jnp.float32):
        return jnp.asarray(sample("uniform", key, shape, self.low, self.high), dtype)


def _fans(shape, fan_in, fan_out):
    default_in, default_out = compute_fans(shape)
    return (default_in if fan_in is None else fan_in), (default_out if fan_out is None else fan_out)


@dataclasses.dataclass(frozen=True)
class XavierNormal(Initializer):
    """N(0, std^2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``; fans from the shape
    unless given.

    >>> w = XavierNormal()(jax.random.key(0), (200, 300))
    >>> round(float(w.std()) / (2 / 500) ** 0.5, 1)
    1.0
    """

    fan_in: float | None = None
    fan_out: float | None = None
    gain: float = 1.0

    def __call__(self, key, shape, dtype=jnp.float32):
        fan_in, fan_out = _fans(shape, self.fan_in, self.fan_out)
        return jnp.asarray(self.gain * math.sqrt(2.0 / (fan_in + fan_out)) * sample("normal", key, shape), dtype)


@dataclasses.dataclass(frozen=True)
class XavierUniform(Initializer):
    """U(-limit, limit) with ``limit = gain * sqrt(6 / (fan_in + fan_out))``.

    >>> w = XavierUniform(fan_in=2, fan_out=4)(jax.random.key(0), (100,))
    >>> bool(abs(w).max() <= 1.0)
    True
    """

    fan_in: float | None = None
    fan_out: float | None = None
    gain: float = 1.0

    def __call__(self, key, shape, dtype=jnp.float32):
        fan_in, fan_out = _fans(shape, self.fan_in, self.fan_out)
        limit = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return jnp.asarray(sample("uniform", key, shape, -limit, limit), dtype)


@dataclasses.dataclass(frozen=True)
class KaimingNormal(Initializer):
    """N(0, std^2) with ``std = gain / sqrt(fan_in)``, ``gain = calculate_gain(nonlinearity,
    negative_slope)``.

    >>> w = KaimingNormal()(jax.random.key(0), (64, 32, 3, 3))
    >>> round(float(w.std()) / (2 / (32 * 9)) ** 0.5, 1)
    1.0
    """

    fan_in: float | None = None
    negative_slope: float = 0.0
    nonlinearity: str = "relu"

    def __call__(self, key, shape, dtype=jnp.float32):
        fan_in, _ = _fans(shape, self.fan_in, None)
        std = calculate_gain(self.nonlinearity, self.negative_slope) / math.sqrt(fan_in)
        return jnp.asarray(std * sample("normal", key, shape), dtype)


@dataclasses.dataclass(frozen=True)
class KaimingUniform(Initializer):
    """U(-limit, limit) with ``limit = gain * sqrt(3 / fan_in)``.

    >>> w = KaimingUniform(fan_in=6)(jax.random.key(0), (100,))
    >>> bool(abs(w).max() <= 1.0)
    True
    """

    fan_in: float | None = None
    negative_slope: float = 0.0
    nonlinearity: str = "relu"

    def __call__(self, key, shape, dtype=jnp.float32):
        fan_in, _ = _fans(shape, self.fan_in, None)
        limit = calculate_gain(self.nonlinearity, self.negative_slope) * math.sqrt(3.0 / fan_in)
        return jnp.asarray(sample("uniform", key, shape, -limit, limit), dtype)


@dataclasses.dataclass(frozen=True)
class ParamAttr:
    """How a layer creates one parameter (Paddle's ``paddle.ParamAttr``).

    ``initializer`` replaces the layer's default; ``trainable=False`` makes a
    :class:`FrozenParam` (not an ``nnx.Param``, so gradients and optimisers over
    ``nnx.Param`` leave it alone); ``name`` is kept as the variable's ``name`` metadata.

    >>> import paddlejax.nn as nn
    >>> lin = nn.Linear(2, 3, weight_attr=ParamAttr(initializer=Constant(1.0), trainable=False))
    >>> type(lin.weight).__name__, float(lin.weight[...].sum())
    ('FrozenParam', 6.0)
    """

    name: str | None = None
    initializer: Initializer | None = None
    trainable: bool = True


class FrozenParam(nnx.Variable):
    """A parameter created with ``ParamAttr(trainable=False)`` (Paddle's ``stop_gradient``)."""


def _to_attr(layer: str, arg: str, attr) -> ParamAttr:
    if attr is None or attr is True:
        return ParamAttr()
    if isinstance(attr, ParamAttr):
        return attr
    if isinstance(attr, Initializer):
        return ParamAttr(initializer=attr)
    if isinstance(attr, str):
        return ParamAttr(name=attr)
    raise TypeError(f"{layer}: argument '{arg}' expects None, False, an Initializer, a ParamAttr or a "
                    f"name, got {attr!r}")


def create_parameter(shape, attr=None, dtype="float32", is_bias=False, default_initializer=None, *,
                     rngs: nnx.Rngs | None = None, layer: str = "Layer", arg: str = "attr"):
    """A new parameter variable of ``shape``, or None when ``attr is False``.

    ``attr`` is Paddle's: None, an :class:`Initializer`, a :class:`ParamAttr` or a name.
    Without an initialiser in ``attr``, ``default_initializer`` is used, else zeros for a
    bias and :class:`XavierUniform` for a weight (Paddle's defaults). ``layer`` and ``arg``
    name the caller in errors.

    >>> p = create_parameter((2, 3), default_initializer=Constant(2.0))
    >>> type(p).__name__, p[...].shape
    ('Param', (2, 3))
    >>> create_parameter((3,), attr=False) is None
    True
    """
    if attr is False:
        return None
    attr = _to_attr(layer, arg, attr)
    init = attr.initializer or default_initializer or (Constant(0.0) if is_bias else XavierUniform())
    shape = tuple(int(s) for s in shape)
    value = init(random.next_key(rngs) if init.random else None, shape, jnp.dtype(dtype))
    metadata = {} if attr.name is None else {"name": attr.name}
    return (nnx.Param if attr.trainable else FrozenParam)(value, **metadata)


__all__ = ["Initializer", "Constant", "Assign", "Normal", "TruncatedNormal", "Uniform", "XavierNormal",
           "XavierUniform", "KaimingNormal", "KaimingUniform", "ParamAttr", "FrozenParam", "calculate_gain",
           "compute_fans", "create_parameter"]
