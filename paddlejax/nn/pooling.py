"""Pooling layers: MaxPool2D, AvgPool2D, AdaptiveAvgPool2D, AdaptiveMaxPool2D,
AdaptiveAvgPool1D, AdaptiveMaxPool1D.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> x = jnp.ones((1, 3, 7, 7))
>>> nn.MaxPool2D(2)(x).shape, nn.AvgPool2D(3, 2, 1)(x).shape, nn.AdaptiveAvgPool2D(1)(x).shape
((1, 3, 3, 3), (1, 3, 4, 4), (1, 3, 1, 1))
"""
from __future__ import annotations

from paddlejax import ops
from paddlejax.nn import functional as F
from paddlejax.nn.args import arg_error, choice, pair, positive_int
from paddlejax.nn.layer import Layer


def _no_mask(layer, return_mask):
    if return_mask:
        raise arg_error(layer, "return_mask", "False (max-pooling indices are not supported)", return_mask)


def _op_attrs(layer, op, **attrs):
    """The op's normalised attributes, so a bad argument fails at construction."""
    try:
        return op.check_attrs(attrs)
    except ValueError as e:
        raise ValueError(f"{layer}: {e}") from None


class _Pool2D(Layer):
    _type = "max"

    def __init__(self, layer, kernel_size, stride, padding, ceil_mode, exclusive, data_format):
        kernel_size = pair(layer, "kernel_size", kernel_size)
        self._attrs = tuple(_op_attrs(layer, ops.pool2d, pooling_type=self._type, kernel_size=kernel_size,
                                      stride=stride,
                                      padding=tuple(padding) if isinstance(padding, list) else padding,
                                      ceil_mode=ceil_mode, exclusive=exclusive,
                                      data_format=choice(layer, "data_format", data_format, ("NCHW", "NHWC"))).items())

    def forward(self, x):
        return ops.pool2d(x, **dict(self._attrs))


class MaxPool2D(_Pool2D):
    """Max pooling over ``kernel_size`` windows (``stride`` defaults to ``kernel_size``;
    ``padding`` and ``ceil_mode`` as in Paddle).

    >>> import jax.numpy as jnp
    >>> MaxPool2D(2, ceil_mode=True)(jnp.arange(25.0).reshape(1, 1, 5, 5))[0, 0].tolist()
    [[6.0, 8.0, 9.0], [16.0, 18.0, 19.0], [21.0, 23.0, 24.0]]
    """

    def __init__(self, kernel_size, stride=None, padding=0, return_mask=False, ceil_mode=False,
                 data_format="NCHW"):
        _no_mask("MaxPool2D", return_mask)
        super().__init__("MaxPool2D", kernel_size, stride, padding, ceil_mode, True, data_format)


class AvgPool2D(_Pool2D):
    """Average pooling; ``exclusive=True`` (Paddle's default) leaves padding out of each
    window's count, ``divisor_override`` divides every window sum by a fixed number.

    >>> import jax.numpy as jnp
    >>> AvgPool2D(2, padding=1, exclusive=False)(jnp.ones((1, 1, 2, 2)))[0, 0].tolist()
    [[0.25, 0.25], [0.25, 0.25]]
    """

    _type = "avg"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, exclusive=True, divisor_override=None,
                 data_format="NCHW"):
        if divisor_override is not None and (isinstance(divisor_override, bool) or
                                             not isinstance(divisor_override, (int, float)) or divisor_override <= 0):
            raise arg_error("AvgPool2D", "divisor_override", "None or a positive number", divisor_override)
        # a fixed divisor is the inclusive average rescaled by kh * kw / divisor
        super().__init__("AvgPool2D", kernel_size, stride, padding, ceil_mode,
                         exclusive and divisor_override is None, data_format)
        kh, kw = pair("AvgPool2D", "kernel_size", kernel_size)
        self._rescale = None if divisor_override is None else kh * kw / divisor_override

    def forward(self, x):
        y = ops.pool2d(x, **dict(self._attrs))
        return y if self._rescale is None else y * self._rescale


class _AdaptivePool2D(Layer):
    _type = "avg"

    def __init__(self, layer, output_size, data_format):
        self._attrs = tuple(_op_attrs(layer, ops.adaptive_pool2d, output_size=output_size, pooling_type=self._type,
                                      data_format=choice(layer, "data_format", data_format, ("NCHW", "NHWC"))).items())

    def forward(self, x):
        return ops.adaptive_pool2d(x, **dict(self._attrs))


class AdaptiveAvgPool2D(_AdaptivePool2D):
    """Average pooling into an ``output_size`` grid (an int, or ``[h, w]`` where None keeps
    that input size) with Paddle's bins ``[floor(i * H / out), ceil((i + 1) * H / out))``.

    >>> import jax.numpy as jnp
    >>> AdaptiveAvgPool2D([2, None])(jnp.arange(6.0).reshape(1, 1, 3, 2))[0, 0].tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    """

    def __init__(self, output_size, data_format="NCHW"):
        super().__init__("AdaptiveAvgPool2D", output_size, data_format)


class AdaptiveMaxPool2D(_AdaptivePool2D):
    """Max pooling into an ``output_size`` grid (Paddle's adaptive bins, see :class:`AdaptiveAvgPool2D`).

    >>> import jax.numpy as jnp
    >>> AdaptiveMaxPool2D(1)(jnp.arange(6.0).reshape(1, 1, 3, 2))[0, 0].tolist()
    [[5.0]]
    """

    _type = "max"

    def __init__(self, output_size, return_mask=False, data_format="NCHW"):
        _no_mask("AdaptiveMaxPool2D", return_mask)
        super().__init__("AdaptiveMaxPool2D", output_size, data_format)


class AdaptiveAvgPool1D(Layer):
    """Average pooling of ``[N, C, L]`` input into ``output_size`` adaptive bins along L
    (Paddle's bins ``[floor(i * L / out), ceil((i + 1) * L / out))``).

    >>> import jax.numpy as jnp
    >>> AdaptiveAvgPool1D(2)(jnp.arange(5.0).reshape(1, 1, 5)).tolist()
    [[[1.0, 3.0]]]
    """

    def __init__(self, output_size):
        self._output_size = positive_int("AdaptiveAvgPool1D", "output_size", output_size)

    def forward(self, x):
        return F.adaptive_avg_pool1d(x, self._output_size)


class AdaptiveMaxPool1D(Layer):
    """Max pooling of ``[N, C, L]`` input into ``output_size`` adaptive bins along L.

    >>> import jax.numpy as jnp
    >>> AdaptiveMaxPool1D(2)(jnp.arange(5.0).reshape(1, 1, 5)).tolist()
    [[[2.0, 4.0]]]
    """

    def __init__(self, output_size, return_mask=False):
        _no_mask("AdaptiveMaxPool1D", return_mask)
        self._output_size = positive_int("AdaptiveMaxPool1D", "output_size", output_size)

    def forward(self, x):
        return F.adaptive_max_pool1d(x, self._output_size)
