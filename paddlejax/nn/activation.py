"""Activation layers, each one call of the matching op.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> nn.ReLU()(jnp.array([-1.0, 2.0])).tolist(), nn.Softmax()(jnp.zeros(2)).tolist()
([0.0, 2.0], [0.5, 0.5])
"""
from __future__ import annotations

from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, is_number, positive_int
from paddlejax.nn.initializer import Constant
from paddlejax.nn.layer import Layer


def _axis(layer, axis):
    if not is_int(axis):
        raise arg_error(layer, "axis", "an int", axis)
    return int(axis)


class ReLU(Layer):
    """``max(x, 0)``.

    >>> import jax.numpy as jnp
    >>> ReLU()(jnp.array([-1.0, 1.0])).tolist()
    [0.0, 1.0]
    """

    def forward(self, x):
        return ops.relu(x)


class ReLU6(Layer):
    """``min(max(x, 0), 6)``.

    >>> import jax.numpy as jnp
    >>> ReLU6()(jnp.array([-1.0, 7.0])).tolist()
    [0.0, 6.0]
    """

    def forward(self, x):
        return ops.relu6(x)


class GELU(Layer):
    """Gaussian error linear unit: the exact erf form, or the tanh form if ``approximate``.

    >>> import jax.numpy as jnp
    >>> round(float(GELU()(jnp.float32(1.0))), 4), round(float(GELU(approximate=True)(jnp.float32(1.0))), 4)
    (0.8413, 0.8412)
    """

    def __init__(self, approximate=False):
        if not isinstance(approximate, bool):
            raise arg_error("GELU", "approximate", "a bool", approximate)
        self._approximate = approximate

    def forward(self, x):
        return ops.gelu(x, approximate=self._approximate)


class Sigmoid(Layer):
    """``1 / (1 + exp(-x))``.

    >>> import jax.numpy as jnp
    >>> Sigmoid()(jnp.zeros(1)).tolist()
    [0.5]
    """

    def forward(self, x):
        return ops.sigmoid(x)


class Tanh(Layer):
    """Hyperbolic tangent.

    >>> import jax.numpy as jnp
    >>> Tanh()(jnp.zeros(1)).tolist()
    [0.0]
    """

    def forward(self, x):
        return ops.tanh(x)


class Softmax(Layer):
    """``exp(x) / sum(exp(x))`` along ``axis``.

    >>> import jax.numpy as jnp
    >>> Softmax(axis=0)(jnp.zeros((2, 1))).tolist()
    [[0.5], [0.5]]
    """

    def __init__(self, axis=-1):
        self._axis = _axis("Softmax", axis)

    def forward(self, x):
        return ops.softmax(x, axis=self._axis)


class LogSoftmax(Layer):
    """``log(softmax(x))`` along ``axis``, computed stably.

    >>> import jax.numpy as jnp
    >>> round(float(LogSoftmax()(jnp.zeros(2))[0]), 4)
    -0.6931
    """

    def __init__(self, axis=-1):
        self._axis = _axis("LogSoftmax", axis)

    def forward(self, x):
        return ops.log_softmax(x, axis=self._axis)


class LeakyReLU(Layer):
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    >>> import jax.numpy as jnp
    >>> LeakyReLU(0.5)(jnp.array([-2.0, 2.0])).tolist()
    [-1.0, 2.0]
    """

    def __init__(self, negative_slope=0.01):
        if not is_number(negative_slope):
            raise arg_error("LeakyReLU", "negative_slope", "a number", negative_slope)
        self._negative_slope = float(negative_slope)

    def forward(self, x):
        return ops.leaky_relu(x, negative_slope=self._negative_slope)


class Hardswish(Layer):
    """``x * relu6(x + 3) / 6``.

    >>> import jax.numpy as jnp
    >>> Hardswish()(jnp.array([-4.0, 0.0, 4.0])).tolist()
    [-0.0, 0.0, 4.0]
    """

    def forward(self, x):
        return ops.hard_swish(x)


class Silu(Layer):
    """``x * sigmoid(x)``.

    >>> import jax.numpy as jnp
    >>> Silu()(jnp.zeros(1)).tolist()
    [0.0]
    """

    def forward(self, x):
        return ops.silu(x)


class PReLU(Layer):
    """``x`` where positive, ``weight * x`` elsewhere, with a learnt ``weight [num_parameters]``:
    one slope shared by all channels (``num_parameters=1``) or one per channel on
    ``data_format``'s channel axis. ``init`` is the starting slope (Paddle's 0.25).

    >>> import jax.numpy as jnp
    >>> PReLU()(jnp.array([-2.0, 2.0])).tolist()
    [-0.5, 2.0]
    >>> PReLU(3, init=0.1, data_format="NHWC")(-jnp.ones((1, 2, 2, 3))).shape
    (1, 2, 2, 3)
    """

    def __init__(self, num_parameters=1, init=0.25, weight_attr=None, data_format="NCHW", *,
                 rngs: nnx.Rngs | None = None):
        num = positive_int("PReLU", "num_parameters", num_parameters)
        if not is_number(init):
            raise arg_error("PReLU", "init", "a number", init)
        self._data_format = choice("PReLU", "data_format", data_format, ops.prelu.attrs["data_format"].choices)
        self.weight = self.create_parameter((num,), weight_attr, default_initializer=Constant(float(init)), rngs=rngs,
                                            arg="weight_attr")

    def forward(self, x):
        return ops.prelu(x, self.weight[...], data_format=self._data_format)
