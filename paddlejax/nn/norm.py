"""Normalisation layers: BatchNorm1D, BatchNorm2D, SyncBatchNorm, LayerNorm, GroupNorm,
InstanceNorm1D/2D/3D and SpectralNorm.

Batch norm keeps its running statistics ``mean`` and ``variance`` as ``nnx.BatchStat``: in
training mode it normalises with the batch statistics and updates the running ones
(``running = momentum * running + (1 - momentum) * batch``, biased batch variance as in
Paddle); in eval mode it uses the running ones. Spectral norm keeps its power-iteration vectors
the same way: training advances them, eval reads them. Under data parallelism ``BatchNorm1D`` and
``BatchNorm2D`` take the statistics of each device's rows; :class:`SyncBatchNorm` those of the
whole batch.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> bn = nn.BatchNorm2D(3)
>>> _ = bn(jnp.ones((2, 3, 4, 4)))
>>> [round(m, 4) for m in bn.mean[...].tolist()]
[0.1, 0.1, 0.1]
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, positive_int
from paddlejax.nn.initializer import Constant, FrozenParam
from paddlejax.nn.layer import Layer
from paddlejax.nn.random import next_key


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
    _batch_op = ops.batch_norm  # the op that normalises with batch statistics

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
        op = self._batch_op if batch_stats else ops.batch_norm
        out, mean, variance = op(x, self.mean[...], self.variance[...], self.weight[...],
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


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose training statistics are those of the whole batch when data parallelism
    splits it over devices (Paddle's ``SyncBatchNorm``): mean and variance are summed over the
    devices, so training computes what one device computes on the whole batch, gradients
    included. On one device, in eval mode, and inside a pipeline (where each micro-batch is
    normalised on its own) it is plain batch norm.

    Inputs of rank 2 to 5, channels first (``"NCHW"``, the default, also stands for ``"NC"``,
    ``"NCL"``, ``"NCDHW"``) or last (``"NHWC"``, ``"NLC"``, ``"NDHWC"``); parameters and
    statistics as :class:`BatchNorm1D`.

    >>> import jax.numpy as jnp
    >>> bn = SyncBatchNorm(2)
    >>> bn(jnp.array([[1.0, 2.0], [3.0, 6.0]])).round(3).tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    """

    _formats = ("NCHW", "NC", "NCL", "NCDHW", "NHWC", "NLC", "NDHWC")
    _ranks = (2, 3, 4, 5)
    _batch_op = ops.sync_batch_norm

    @classmethod
    def convert_sync_batchnorm(cls, layer):
        """``layer`` with every ``BatchNorm1D`` / ``BatchNorm2D`` in it replaced by a
        ``SyncBatchNorm`` holding the same parameters, statistics and settings (changed in place;
        returned, since ``layer`` itself may be a batch norm).

        >>> import paddlejax.nn as nn
        >>> model = nn.Sequential(nn.Conv2D(3, 4, 3), nn.BatchNorm2D(4), nn.ReLU())
        >>> model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        >>> type(model[1]).__name__, [n for n, _ in model.named_parameters()][2:]
        ('SyncBatchNorm', ['1.bias', '1.weight'])
        """
        memo: dict[int, nnx.Module] = {}
        return cls._converted(layer, memo, set())

    @classmethod
    def _converted(cls, node, memo, seen):
        if isinstance(node, _BatchNorm) and not isinstance(node, cls):
            if id(node) not in memo:  # a layer used in several places stays one layer
                memo[id(node)] = cls._from(node)
            return memo[id(node)]
        if isinstance(node, nnx.Module) and id(node) not in seen:
            seen.add(id(node))
            for name, child in list(vars(node).items()):
                if isinstance(child, nnx.Module):
                    setattr(node, name, cls._converted(child, memo, seen))
        return node

    @classmethod
    def _from(cls, bn: _BatchNorm):
        new = cls(bn._num_features, bn._momentum, bn._epsilon, data_format=bn._data_format,
                  use_global_stats=bn._use_global_stats)
        new.weight, new.bias, new.mean, new.variance = bn.weight, bn.bias, bn.mean, bn.variance
        new.training = bn.training
        return new


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


class _InstanceNorm(Layer):
    """Instance norm: each sample's channels normalised on their own, over all positions."""

    _formats: tuple[str, ...] = ()
    _rank = 4

    def __init__(self, num_features, epsilon=1e-05, momentum=0.9, weight_attr=None, bias_attr=None,
                 data_format=None, *, rngs: nnx.Rngs | None = None):
        name = type(self).__name__
        self._num_features = positive_int(name, "num_features", num_features)
        self._epsilon = _float(name, "epsilon", epsilon)
        self._momentum = _float(name, "momentum", momentum)  # accepted as Paddle does; no statistics are kept
        self._data_format = choice(name, "data_format", data_format or self._formats[0], self._formats)
        affine = weight_attr is not False and bias_attr is not False  # Paddle: either False drops both
        shape = (self._num_features,)
        self.scale = self.create_parameter(shape, weight_attr if affine else False, default_initializer=Constant(1.0),
                                           rngs=rngs, arg="weight_attr")
        self.bias = self.create_parameter(shape, bias_attr if affine else False, is_bias=True, rngs=rngs,
                                          arg="bias_attr")

    def forward(self, x):
        name = type(self).__name__
        if x.ndim != self._rank:
            raise ValueError(f"{name}: input 'x' expects rank {self._rank}, got shape {tuple(x.shape)}")
        axis = 1 if self._data_format[1] == "C" else x.ndim - 1
        if x.shape[axis] != self._num_features:
            raise ValueError(f"{name}: input 'x' expects {self._num_features} channels on axis {axis} (data_format="
                             f"{self._data_format!r}), got shape {tuple(x.shape)}")
        affine = () if self.scale is None else (self.scale[...], self.bias[...])
        # instance norm is group norm with a group per channel
        return ops.group_norm(x, *affine, groups=self._num_features, epsilon=self._epsilon,
                              data_format=self._data_format)


class InstanceNorm2D(_InstanceNorm):
    """Instance norm of ``[N, C, H, W]`` (``"NCHW"``) or ``[N, H, W, C]`` (``"NHWC"``) inputs:
    every sample's every channel normalised over its positions, in training and eval alike (as
    in Paddle, no running statistics), then ``scale`` and ``bias`` ``[C]`` applied (ones and
    zeros; ``weight_attr=False`` or ``bias_attr=False`` gives neither, as style transfer and
    CycleGAN use it). ``momentum`` is accepted for Paddle's signature and unused.

    >>> import jax.numpy as jnp
    >>> norm = InstanceNorm2D(2, weight_attr=False, bias_attr=False)
    >>> y = norm(jnp.arange(16.0).reshape(1, 2, 2, 4))
    >>> norm.scale is None, [round(v, 3) for v in y[0, 1, 0].tolist()]
    (True, [-1.528, -1.091, -0.655, -0.218])
    """

    _formats = ("NCHW", "NHWC")
    _rank = 4


class InstanceNorm1D(_InstanceNorm):
    """Instance norm of ``[N, C, L]`` (``"NCL"``) or ``[N, L, C]`` (``"NLC"``) inputs; see
    :class:`InstanceNorm2D`.

    >>> import jax.numpy as jnp
    >>> InstanceNorm1D(1)(jnp.array([[[1.0, 3.0]]])).round(3).tolist()
    [[[-1.0, 1.0]]]
    """

    _formats = ("NCL", "NLC")
    _rank = 3


class InstanceNorm3D(_InstanceNorm):
    """Instance norm of ``[N, C, D, H, W]`` (``"NCDHW"``) or ``[N, D, H, W, C]`` (``"NDHWC"``)
    inputs; see :class:`InstanceNorm2D`.

    >>> import jax.numpy as jnp
    >>> InstanceNorm3D(3)(jnp.ones((2, 3, 2, 2, 2))).shape
    (2, 3, 2, 2, 2)
    """

    _formats = ("NCDHW", "NDHWC")
    _rank = 5


class SpectralNorm(Layer):
    """A weight divided by its largest singular value (Paddle's ``SpectralNorm``, Miyato et al.
    2018): called on a weight of ``weight_shape``, it returns ``weight / sigma`` through the
    ``spectral_norm`` op, ``sigma`` estimated by power iteration on the weight seen as a matrix
    of ``weight_shape[dim]`` rows.

    The vectors ``weight_u [h]`` and ``weight_v [w]`` (random unit vectors at first) are state,
    as batch norm's statistics are: each call in training mode runs ``power_iters`` iterations
    from them and keeps the result, so the estimate sharpens over training steps; eval mode
    iterates none and reads them (Paddle's layer iterates from its initial vectors on every
    call and keeps nothing). Gradients treat the vectors as constants. ``weight_u`` and
    ``weight_v`` are saved with the weights (``state_dict``) and carried by the Trainer.

    >>> import jax.numpy as jnp, numpy as np
    >>> sn = SpectralNorm((3, 2), power_iters=20)
    >>> w = jnp.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> [[round(x, 3) for x in row] for row in sn(w).tolist()]
    [[1.0, 0.0], [0.0, 0.333], [0.0, 0.0]]
    >>> sn.eval(); before = sn.weight_u[...]; _ = sn(w)
    >>> bool((sn.weight_u[...] == before).all())
    True
    """

    def __init__(self, weight_shape, dim=0, power_iters=1, eps=1e-12, dtype="float32", *,
                 rngs: nnx.Rngs | None = None):
        if (not isinstance(weight_shape, (list, tuple)) or len(weight_shape) < 2
                or not all(is_int(n) and n >= 1 for n in weight_shape)):
            raise arg_error("SpectralNorm", "weight_shape", "a list of at least 2 ints >= 1", weight_shape)
        self._weight_shape = tuple(int(n) for n in weight_shape)
        rank = len(self._weight_shape)
        if not is_int(dim) or not -rank <= dim < rank:
            raise arg_error("SpectralNorm", "dim", f"an axis of weight_shape in [{-rank}, {rank})", dim)
        self._dim = int(dim) % rank
        self._power_iters = positive_int("SpectralNorm", "power_iters", power_iters, minimum=0)
        self._eps = _float("SpectralNorm", "eps", eps)
        h = self._weight_shape[self._dim]
        w = math.prod(self._weight_shape) // h
        self.weight_u = nnx.BatchStat(_unit_vector(next_key(rngs), h, dtype))
        self.weight_v = nnx.BatchStat(_unit_vector(next_key(rngs), w, dtype))

    def forward(self, weight):
        if tuple(weight.shape) != self._weight_shape:
            raise ValueError(f"SpectralNorm: input 'weight' expects shape {self._weight_shape}, got "
                             f"{tuple(weight.shape)}")
        out, u, v = ops.spectral_norm(weight, self.weight_u[...], self.weight_v[...], dim=self._dim,
                                      power_iters=self._power_iters if self.training else 0, eps=self._eps)
        if self.training:
            self.weight_u.set_value(u)
            self.weight_v.set_value(v)
        return out


def _unit_vector(key, size, dtype):
    x = jax.random.normal(key, (size,), jnp.dtype(dtype))
    return x / jnp.linalg.norm(x)
