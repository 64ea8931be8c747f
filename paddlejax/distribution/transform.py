"""Paddle's transforms (``paddle.distribution.transform``): invertible maps with their
log-Jacobian determinants, computed by TensorFlow Probability's bijectors.

Each transform has an event rank on each side (0 for the elementwise ones, 1 for
StickBreaking and Softmax, the reshaped rank for Reshape); ``forward_log_det_jacobian(x)`` has
``x``'s shape without those event dimensions. A transform is a pytree of its parameters.

>>> t = ChainTransform([AffineTransform(1.0, 2.0), ExpTransform()])  # exp(1 + 2x)
>>> round(float(t.forward(0.0)), 4), round(float(t.inverse(t.forward(0.5))), 4)
(2.7183, 0.5)
>>> round(float(t.forward_log_det_jacobian(0.0)), 4)  # log 2 + (1 + 2x)
1.6931
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.distribution.args import constrain, floats, whole
from paddlejax.distribution.backend import tfb
from paddlejax.distribution.pytree import Parametrised


class Transform(Parametrised):
    """The base of transforms: ``forward``, ``inverse``, their log-Jacobian determinants and
    the shapes they map. Calling a transform applies it: to an array (``forward``), to a
    distribution (a :class:`~paddlejax.distribution.TransformedDistribution`) or to a transform
    (a :class:`ChainTransform` applying this one first, as Paddle's does).

    >>> ExpTransform()(0.0).item()
    1.0
    """

    _params = ()

    def __call__(self, input):
        from paddlejax.distribution.composite import TransformedDistribution  # it is built on transforms
        from paddlejax.distribution.distribution import Distribution
        if isinstance(input, Distribution):
            return TransformedDistribution(input, [self])
        if isinstance(input, Transform):
            return ChainTransform([self, input])
        return self.forward(input)

    @property
    def _domain_rank(self) -> int:
        return self._built().forward_min_event_ndims

    @property
    def _codomain_rank(self) -> int:
        return self._built().inverse_min_event_ndims

    def _float(self, method: str, value) -> jax.Array:
        return floats(f"{type(self).__name__}.{method}", value=value)[0]

    def forward(self, x) -> jax.Array:
        """``y = f(x)``."""
        return self._built().forward(self._float("forward", x))

    def inverse(self, y) -> jax.Array:
        """``x = f^-1(y)``."""
        return self._built().inverse(self._float("inverse", y))

    def forward_log_det_jacobian(self, x) -> jax.Array:
        """``log |det df/dx|`` at ``x``, over the domain's event dimensions."""
        x = self._float("forward_log_det_jacobian", x)
        ldj = self._built().forward_log_det_jacobian(x, event_ndims=self._domain_rank)
        return _over_batch(ldj, x, self._domain_rank)

    def inverse_log_det_jacobian(self, y) -> jax.Array:
        """``log |det df^-1/dy|`` at ``y``, over the codomain's event dimensions."""
        y = self._float("inverse_log_det_jacobian", y)
        ldj = self._built().inverse_log_det_jacobian(y, event_ndims=self._codomain_rank)
        return _over_batch(ldj, y, self._codomain_rank)

    def forward_shape(self, shape) -> tuple[int, ...]:
        """The shape of ``forward(x)`` for ``x`` of ``shape``."""
        return tuple(int(n) for n in self._built().forward_event_shape(tuple(shape)))

    def inverse_shape(self, shape) -> tuple[int, ...]:
        """The shape of ``inverse(y)`` for ``y`` of ``shape``."""
        return tuple(int(n) for n in self._built().inverse_event_shape(tuple(shape)))


def _over_batch(ldj, x: jax.Array, rank: int):
    """``ldj`` spread over ``x``'s batch shape: a constant Jacobian comes back unbroadcast."""
    batch = x.shape[:x.ndim - rank]
    return jax.tree.map(lambda a: jnp.broadcast_to(a, np.broadcast_shapes(a.shape, batch)), ldj)


class AbsTransform(Transform):
    """``y = |x|``. Not injective: ``inverse(y)`` is the pair ``(-y, y)`` and
    ``inverse_log_det_jacobian`` the pair of zeros; ``forward_log_det_jacobian`` raises.

    >>> [float(v) for v in AbsTransform().inverse(2.0)]
    [-2.0, 2.0]
    """

    def _make(self):
        return tfb.AbsoluteValue()


class ExpTransform(Transform):
    """``y = exp(x)``.

    >>> float(ExpTransform().inverse_log_det_jacobian(1.0))  # -log(y)
    -0.0
    """

    def _make(self):
        return tfb.Exp()


class SigmoidTransform(Transform):
    """``y = 1 / (1 + exp(-x))``.

    >>> float(SigmoidTransform().forward(0.0))
    0.5
    """

    def _make(self):
        return tfb.Sigmoid()


class TanhTransform(Transform):
    """``y = tanh(x)``.

    >>> round(float(TanhTransform().inverse(0.5)), 4)
    0.5493
    """

    def _make(self):
        return tfb.Tanh()


class StickBreakingTransform(Transform):
    """Maps ``R^K`` onto the interior of the ``K + 1`` probability simplex by stick breaking
    (``x = 0`` goes to the uniform point).

    >>> [round(v, 4) for v in StickBreakingTransform().forward([0.0, 0.0]).tolist()]
    [0.3333, 0.3333, 0.3333]
    """

    def _make(self):
        return tfb.IteratedSigmoidCentered()


class AffineTransform(Transform):
    """``y = loc + scale * x`` (``scale`` nonzero).

    >>> round(float(AffineTransform(1.0, -2.0).forward_log_det_jacobian(5.0)), 4)  # log 2
    0.6931
    """

    _params = ("loc", "scale")

    def __init__(self, loc, scale):
        self.loc, self.scale = floats("AffineTransform", loc=loc, scale=scale)
        constrain("AffineTransform", "scale", self.scale, lambda s: s != 0, "nonzero")

    def _make(self):
        return tfb.Shift(self.loc)(tfb.Scale(self.scale))


class PowerTransform(Transform):
    """``y = x ** power`` on positive ``x``.

    >>> float(PowerTransform(2.0).forward(3.0))
    9.0
    """

    _params = ("power",)

    def __init__(self, power):
        (self.power,) = floats("PowerTransform", power=power)
        constrain("PowerTransform", "power", self.power, lambda p: p != 0, "nonzero")

    def _make(self):
        return tfb.Power(self.power)


class ReshapeTransform(Transform):
    """Reshapes the trailing ``in_event_shape`` dimensions to ``out_event_shape``.

    >>> ReshapeTransform((2, 3), (6,)).forward(jnp.zeros((4, 2, 3))).shape
    (4, 6)
    """

    _static = ("in_event_shape", "out_event_shape")

    def __init__(self, in_event_shape, out_event_shape):
        shapes = []
        for name, shape in (("in_event_shape", in_event_shape), ("out_event_shape", out_event_shape)):
            if not isinstance(shape, (tuple, list)) or any(whole(n) is None or n < 1 for n in shape):
                raise TypeError(f"ReshapeTransform: {name} must be a list or tuple of ints >= 1, got {shape!r}")
            shapes.append(tuple(int(n) for n in shape))
        if math.prod(shapes[0]) != math.prod(shapes[1]):
            raise ValueError(f"ReshapeTransform: in_event_shape {shapes[0]} and out_event_shape {shapes[1]} "
                             "hold different numbers of elements")
        self.in_event_shape, self.out_event_shape = shapes

    def _make(self):
        return tfb.Reshape(event_shape_out=self.out_event_shape, event_shape_in=self.in_event_shape)


class ChainTransform(Transform):
    """Applies ``transforms`` in order: ``transforms[0]`` first.

    >>> t = ChainTransform([ExpTransform(), PowerTransform(2.0)])  # exp(x)**2
    >>> round(float(t.forward(1.0)), 4)
    7.3891
    """

    _params = ("transforms",)

    def __init__(self, transforms):
        self.transforms = _transforms("ChainTransform", transforms)

    def _make(self):
        return tfb.Chain([t._built() for t in reversed(self.transforms)])


class IndependentTransform(Transform):
    """``base`` with its ``reinterpreted_batch_rank`` rightmost batch dimensions counted as
    event dimensions: log-Jacobians are summed over them.

    >>> IndependentTransform(ExpTransform(), 1).forward_log_det_jacobian(jnp.ones((2, 3))).tolist()
    [3.0, 3.0]
    """

    _params = ("base",)
    _static = ("reinterpreted_batch_rank",)

    def __init__(self, base, reinterpreted_batch_rank):
        if not isinstance(base, Transform):
            raise TypeError(f"IndependentTransform: base must be a Transform, got {type(base).__name__}")
        if whole(reinterpreted_batch_rank) is None or reinterpreted_batch_rank < 1:
            raise ValueError("IndependentTransform: reinterpreted_batch_rank must be an int >= 1, "
                             f"got {reinterpreted_batch_rank!r}")
        self.base, self.reinterpreted_batch_rank = base, whole(reinterpreted_batch_rank)

    def _make(self):
        return _Reinterpreted(self.base._built(), self.reinterpreted_batch_rank)


class SoftmaxTransform(Transform):
    """``y = softmax(x)`` over the last axis, with ``inverse(y) = log(y)``. Not injective
    (adding a constant to ``x`` changes nothing), so it has no log-Jacobian and cannot
    transform a distribution.

    >>> SoftmaxTransform().forward([0.0, 0.0]).tolist()
    [0.5, 0.5]
    """

    _domain_rank = _codomain_rank = 1

    def _make(self):
        raise TypeError("SoftmaxTransform is not injective: it has no log-Jacobian and cannot transform a "
                        "distribution (StickBreakingTransform maps onto the simplex bijectively)")

    def forward(self, x) -> jax.Array:
        """``softmax(x)`` over the last axis."""
        return jax.nn.softmax(self._float("forward", x), axis=-1)

    def inverse(self, y) -> jax.Array:
        """``log(y)``: one of the preimages of ``y``."""
        return jnp.log(self._float("inverse", y))

    def forward_log_det_jacobian(self, x) -> jax.Array:
        """Raises NotImplementedError: softmax is not injective."""
        raise NotImplementedError("SoftmaxTransform is not injective: it has no log-Jacobian")

    inverse_log_det_jacobian = forward_log_det_jacobian

    def forward_shape(self, shape) -> tuple[int, ...]:
        """``shape``: softmax keeps it."""
        return tuple(shape)

    inverse_shape = forward_shape


class StackTransform(Transform):
    """Applies ``transforms[i]`` to the ``i``-th slice of ``x`` along ``axis`` (a batch axis) and
    stacks the results there.

    >>> t = StackTransform([ExpTransform(), AffineTransform(0.0, 3.0)], axis=0)
    >>> t.forward(jnp.zeros((2, 2))).tolist()
    [[1.0, 1.0], [0.0, 0.0]]
    """

    _params = ("transforms",)
    _static = ("axis",)

    def __init__(self, transforms, axis=0):
        if whole(axis) is None:
            raise TypeError(f"StackTransform: axis must be an int, got {axis!r}")
        self.transforms, self.axis = _transforms("StackTransform", transforms), whole(axis)

    def _make(self):
        return _Stacked([t._built() for t in self.transforms], self.axis)


def _transforms(owner: str, transforms) -> list[Transform]:
    if not isinstance(transforms, (list, tuple)) or not all(isinstance(t, Transform) for t in transforms):
        raise TypeError(f"{owner}: transforms must be a list of Transform, got {transforms!r}")
    return list(transforms)


class _Reinterpreted(tfb.Bijector):
    """The library bijector of :class:`IndependentTransform`: ``base`` with ``rank`` more event
    dimensions (the library sums log-Jacobians over event dimensions beyond the minimum)."""

    def __init__(self, base, rank: int):
        parameters = dict(locals())
        self._base = base
        super().__init__(forward_min_event_ndims=base.forward_min_event_ndims + rank,
                         inverse_min_event_ndims=base.inverse_min_event_ndims + rank,
                         is_constant_jacobian=base.is_constant_jacobian, parameters=parameters,
                         name="independent")

    def _forward(self, x):
        return self._base.forward(x)

    def _inverse(self, y):
        return self._base.inverse(y)

    def _forward_log_det_jacobian(self, x):
        return self._base.forward_log_det_jacobian(x, event_ndims=self.forward_min_event_ndims)

    def _forward_event_shape(self, shape):
        return self._base.forward_event_shape(shape)

    def _inverse_event_shape(self, shape):
        return self._base.inverse_event_shape(shape)


class _Stacked(tfb.Bijector):
    """The library bijector of :class:`StackTransform`."""

    def __init__(self, parts, axis: int):
        parameters = dict(locals())
        self._parts, self._axis = parts, axis
        super().__init__(forward_min_event_ndims=max(p.forward_min_event_ndims for p in parts),
                         inverse_min_event_ndims=max(p.inverse_min_event_ndims for p in parts),
                         is_constant_jacobian=all(p.is_constant_jacobian for p in parts), parameters=parameters,
                         name="stack")

    def _apply(self, method: str, x, **kwargs):
        if x.shape[self._axis] != len(self._parts):
            raise ValueError(f"StackTransform: axis {self._axis} of the input has {x.shape[self._axis]} entries "
                             f"for {len(self._parts)} transforms")
        return [getattr(p, method)(jnp.take(x, i, axis=self._axis), **kwargs) for i, p in enumerate(self._parts)]

    def _forward(self, x):
        return jnp.stack(self._apply("forward", x), axis=self._axis)

    def _inverse(self, y):
        return jnp.stack(self._apply("inverse", y), axis=self._axis)

    def _forward_log_det_jacobian(self, x):
        rank, axis = self.forward_min_event_ndims, self._axis % x.ndim
        if axis >= x.ndim - rank:
            raise ValueError(f"StackTransform: axis {self._axis} is an event axis of the transforms; stack along a "
                             "batch axis")
        # each slice's log-Jacobian covers the slice's batch shape; stack them where the slices were
        slice_batch = (x.shape[:axis] + x.shape[axis + 1:])[:x.ndim - 1 - rank]
        parts = self._apply("forward_log_det_jacobian", x, event_ndims=rank)
        return jnp.stack([jnp.broadcast_to(p, slice_batch) for p in parts], axis=axis)
