"""Normalisation layers: BatchNorm1D, BatchNorm2D, LayerNorm, GroupNorm.

Batch norm keeps its running statistics ``mean`` and ``variance`` as ``nnx.BatchStat``: in
training mode it normalises with the batch statistics and updates the running ones
(``running = momentum * running + (1 - momentum) * batch``, biased batch variance as in
Paddle); in eval mode it uses the running ones.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> bn = nn.BatchNorm2D(3)
>>> _ = bn(jnp.ones((2, 3, 4, 4)))
>>> [round(m, 4) for m in bn.mean[...].tolist()]
[0.1, 0.1, 0.1]
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, positive_int
from paddlejax.nn.initializer import Constant, FrozenParam
from paddlejax.nn.layer import Layer


def _float(layer, name, value, minimum=0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise arg_error(layer, name, f"a number >= {minimum}", value)
    return float(value)


def _affine(layer, shape, weight_attr, bias_attr, rngs):
    """Weight (ones) and bias (zeros); an attr of False gives a frozen constant, as Paddle's
    batch and group norm do."""
    out = []
    for arg, attr, value in (("weight_attr", weight_attr, 1.0), ("bias_attr", bias_attr, 0.0)):
        if attr is False:
            out.append(FrozenParam(jnp.full(shape, value, jnp.float32)))
        else:
            out.append(layer.create_parameter(shape, attr, default_initializer=Constant(value), rngs=rngs, arg=arg))
    return out


class _BatchNorm(Layer):
    """Batch norm over every axis but the channel one."""

    _formats: tuple[str, ...] = ()
    _ranks: tuple[int, ...] = ()

    def __init__(self, num_features, momentum=0.9, epsilon=1e-05, weight_attr=None, bias_attr=None,
                 data_format=None, use_global_stats=None, *, rngs: nnx.Rngs | None = None):
        name = type(self).__name__
        self._num_features = positive_int(name, "num_features", num_features)
        self._momentum = _float(name, "momentum", momentum)
        self._epsilon = _float(name, "epsilon", epsilon)
        self._data_format = choice(name, "data_format", data_format or self._formats[0], self._formats)
        if use_global_stats not in (None, True, False):
            raise arg_error(name, "use_global_stats", "None, True or False", use_global_stats)
        self._use_global_stats = use_global_stats
        self.weight, self.bias = _affine(self, (self._num_features,), weight_attr, bias_attr, rngs)
        self.mean = nnx.BatchStat(jnp.zeros(self._num_features, jnp.float32))
        self.variance = nnx.BatchStat(jnp.ones(self._num_features, jnp.float32))

    def forward(self, x):
        if x.ndim not in self._ranks:
            raise ValueError(f"{type(self).__name__}: input 'x' expects rank "
                             f"{' or '.join(map(str, self._ranks))}, got shape {tuple(x.shape)}")
        # use_global_stats=None follows the mode; True/False force running/batch statistics
        batch_stats = self.training if self._use_global_stats is None else not self._use_global_stats
        out, mean, variance = ops.batch_norm(x, self.mean[...], self.variance[...], self.weight[...],
                                             self.bias[...], epsilon=self._epsilon, momentum=self._momentum,
                                             training=batch_stats, data_format=self._data_format)
        if batch_stats and self.training:
            self.mean.set_value(mean)
            self.variance.set_value(variance)
        return out


class BatchNorm1D(_BatchNorm):
    """Batch norm of ``[N, C]`` or ``[N, C, L]`` inputs (``data_format`` ``"NCL"``, ``"NC"``
    or ``"NLC"``), with ``weight``, ``bias`` ``[C]`` and statistics ``mean``, ``variance``.

    Defaults: weight ones, bias zeros (``False``: frozen at those values), running mean 0,
    variance 1. ``use_global_stats`` True/False forces running/batch statistics in both modes.

    >>> import jax.numpy as jnp
    >>> bn = BatchNorm1D(2)
    >>> bn(jnp.array([[1.0, 2.0], [3.0, 6.0]])).round(3).tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    """

    _formats = ("NCL", "NC", "NLC")
    _ranks = (2, 3)


class BatchNorm2D(_BatchNorm):
    """Batch norm of ``[N, C, H, W]`` (``"NCHW"``) or ``[N, H, W, C]`` (``"NHWC"``) inputs,
    with ``weight``, ``bias`` ``[C]`` and statistics ``mean``, ``variance`` (see :class:`BatchNorm1D`).

    >>> import jax.numpy as jnp
    >>> bn = BatchNorm2D(3, data_format="NHWC")
    >>> bn.eval()
    >>> bn(jnp.ones((1, 2, 2, 3)))[0, 0, 0].round(3).tolist()  # running stats 0 / 1
    [1.0, 1.0, 1.0]
    """

    _formats = ("NCHW", "NHWC")
    _ranks = (4,)


class LayerNorm(Layer):
    """Normalise over the trailing ``normalized_shape`` axes, with Paddle's flat ``weight`` and
    ``bias`` of ``prod(normalized_shape)`` elements (``False``: none).

    Defaults: weight ones, bias zeros.

    >>> import jax.numpy as jnp
    >>> ln = LayerNorm([2, 2])
    >>> y = ln(jnp.arange(8.0).reshape(2, 2, 2))
    >>> ln.weight[...].shape, [round(v, 3) for v in y[0].ravel().tolist()]
    ((4,), [-1.342, -0.447, 0.447, 1.342])
    """

    def __init__(self, normalized_shape, epsilon=1e-05, weight_attr=None, bias_attr=None, *,
                 rngs: nnx.Rngs | None = None):
        shape = (normalized_shape,) if is_int(normalized_shape) else normalized_shape
        if not isinstance(shape, (list, tuple)) or not shape or not all(is_int(n) and n >= 1 for n in shape):
            raise arg_error("LayerNorm", "normalized_shape", "an int or a list of ints >= 1", normalized_shape)
        self._normalized_shape = tuple(int(n) for n in shape)
        self._epsilon = _float("LayerNorm", "epsilon", epsilon)
        size = (math.prod(self._normalized_shape),)
        self.weight = self.create_parameter(size, weight_attr, default_initializer=Constant(1.0), rngs=rngs,
                                            arg="weight_attr")
        self.bias = self.create_parameter(size, bias_attr, is_bias=True, rngs=rngs, arg="bias_attr")

    def forward(self, x):
        n = len(self._normalized_shape)
        if tuple(x.shape[x.ndim - n:]) != self._normalized_shape:
            raise ValueError(f"LayerNorm: input 'x' expects trailing dims {self._normalized_shape}, "
                             f"got shape {tuple(x.shape)}")
        weight = None if self.weight is None else self.weight[...]
        if self.bias is None:
            affine = () if weight is None else (weight,)
        else:  # the op's optional inputs are positional: a bias needs a weight before it
            affine = (jnp.ones_like(self.bias[...]) if weight is None else weight, self.bias[...])
        return ops.layer_norm(x, *affine, epsilon=self._epsilon, begin_norm_axis=x.ndim - n)


class GroupNorm(Layer):
    """Normalise each of ``num_groups`` channel groups over its channels and all positions,
    with ``weight``, ``bias`` ``[num_channels]``.

    Defaults: weight ones, bias zeros (``False``: frozen at those values).

    >>> import jax.numpy as jnp
    >>> gn = GroupNorm(2, 4)
    >>> gn(jnp.arange(16.0).reshape(1, 4, 2, 2)).shape
    (1, 4, 2, 2)
    """

    def __init__(self, num_groups, num_channels, epsilon=1e-05, weight_attr=None, bias_attr=None,
                 data_format="NCHW", *, rngs: nnx.Rngs | None = None):
        self._num_groups = positive_int("GroupNorm", "num_groups", num_groups)
        self._num_channels = positive_int("GroupNorm", "num_channels", num_channels)
        if self._num_channels % self._num_groups:
            raise arg_error("GroupNorm", "num_groups", f"a divisor of num_channels ({num_channels})", num_groups)
        self._epsilon = _float("GroupNorm", "epsilon", epsilon)
        self._data_format = choice("GroupNorm", "data_format", data_format,
                                   ("NCHW", "NHWC", "NCL", "NLC", "NCDHW", "NDHWC"))
        self.weight, self.bias = _affine(self, (self._num_channels,), weight_attr, bias_attr, rngs)

    def forward(self, x):
        return ops.group_norm(x, self.weight[...], self.bias[...], groups=self._num_groups,
                              epsilon=self._epsilon, data_format=self._data_format)
