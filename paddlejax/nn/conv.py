"""Convolution layers: Conv2D and Conv2DTranspose with Paddle's weight layouts and defaults.

``padding`` is Paddle's: ``"same"`` / ``"valid"``, an int, 2 ints (per spatial dim), 4 ints
``[top, bottom, left, right]``, or 4 ``(before, after)`` pairs that include the (zero) batch
and channel dims.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> conv = nn.Conv2D(3, 8, 3, stride=2, padding=1)
>>> conv.weight[...].shape, conv(jnp.ones((1, 3, 8, 8))).shape
((8, 3, 3, 3), (1, 8, 4, 4))
"""
from __future__ import annotations

import math

import jax
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, pair, positive_int
from paddlejax.nn.initializer import Normal
from paddlejax.nn.layer import Layer

_PAD_MODES = ("zeros", "reflect", "replicate", "circular")


def _spatial_padding(layer, padding, data_format):
    """Paddle's padding forms in the op's terms: 4 pairs (batch and channel included) become
    the 2 spatial pairs; everything else passes through for the op to check."""
    if (isinstance(padding, (list, tuple)) and len(padding) == 4
            and all(isinstance(p, (list, tuple)) for p in padding)):
        channel = 1 if data_format == "NCHW" else 3
        if tuple(padding[0]) != (0, 0) or tuple(padding[channel]) != (0, 0):
            raise arg_error(layer, "padding", "(0, 0) pads for the batch and channel dims", padding)
        return tuple(tuple(p) for i, p in enumerate(padding) if i not in (0, channel))
    return tuple(padding) if isinstance(padding, list) else padding


class _ConvBase(Layer):
    """Shared argument handling; subclasses define the weight shape and the op call."""

    def _setup(self, layer, op, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
               data_format, **extra):
        self._in_channels = positive_int(layer, "in_channels", in_channels)
        self._out_channels = positive_int(layer, "out_channels", out_channels)
        self._groups = positive_int(layer, "groups", groups)
        for name, channels in (("in_channels", self._in_channels), ("out_channels", self._out_channels)):
            if channels % self._groups:
                raise arg_error(layer, "groups", f"a divisor of {name} ({channels})", groups)
        self._kernel_size = pair(layer, "kernel_size", kernel_size)
        self._data_format = choice(layer, "data_format", data_format, ("NCHW", "NHWC"))
        # the op validates (and normalises) the rest now, so a bad argument fails here, not on
        # the first call
        try:
            attrs = op.check_attrs(dict(stride=stride, padding=_spatial_padding(layer, padding, data_format),
                                        dilation=dilation, groups=self._groups, data_format=data_format, **extra))
        except ValueError as e:
            raise ValueError(f"{layer}: {e}") from None
        self._stride, self._padding, self._dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
        return attrs


class Conv2D(_ConvBase):
    """2-D convolution (cross-correlation) with ``weight [out_channels, in_channels / groups,
    kh, kw]`` and ``bias [out_channels]`` (``bias_attr=False``: no bias).

    ``padding_mode`` ``"reflect"``, ``"replicate"`` or ``"circular"`` pads the input with
    the pad op first (``padding`` must then be an int, as in Paddle).

    Default initialisers (Paddle's): weight Normal(0, std) with ``std = sqrt(2 / (in_channels
    * kh * kw))`` -- Paddle's ``_get_default_param_initializer`` counts all input channels
    even when ``groups > 1`` -- and bias zeros.

    >>> import jax, jax.numpy as jnp
    >>> conv = Conv2D(4, 4, 3, padding=1, groups=2, padding_mode="reflect", data_format="NHWC")
    >>> conv.weight[...].shape, conv(jnp.ones((1, 5, 5, 4))).shape
    ((4, 2, 3, 3), (1, 5, 5, 4))
    >>> [e.primitive.name for e in jax.make_jaxpr(Conv2D(1, 1, 1))(jnp.ones((1, 1, 2, 2))).eqns]
    ['conv2d']
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 padding_mode="zeros", weight_attr=None, bias_attr=None, data_format="NCHW", *,
                 rngs: nnx.Rngs | None = None):
        self._padding_mode = choice("Conv2D", "padding_mode", padding_mode, _PAD_MODES)
        if padding_mode != "zeros":
            if not is_int(padding):
                raise arg_error("Conv2D", "padding", f"an int with padding_mode={padding_mode!r}", padding)
            # the pad op pads the input instead; its paddings run over all dims, first to last
            hw = (int(padding),) * 4
            self._pad = (0, 0, 0, 0, *hw) if data_format == "NCHW" else (0, 0, *hw, 0, 0)
            padding = 0
        self._setup("Conv2D", ops.conv2d, in_channels, out_channels, kernel_size, stride, padding, dilation,
                    groups, data_format)
        shape = (self._out_channels, self._in_channels // self._groups, *self._kernel_size)
        std = math.sqrt(2.0 / (self._in_channels * math.prod(self._kernel_size)))
        self.weight = self.create_parameter(shape, weight_attr, default_initializer=Normal(0.0, std), rngs=rngs,
                                            arg="weight_attr")
        self.bias = self.create_parameter((self._out_channels,), bias_attr, is_bias=True, rngs=rngs, arg="bias_attr")

    def forward(self, x):
        if self._padding_mode != "zeros":
            mode = "edge" if self._padding_mode == "replicate" else self._padding_mode
            x = ops.pad(x, paddings=self._pad, mode=mode)
        args = (x, self.weight[...]) if self.bias is None else (x, self.weight[...], self.bias[...])
        return ops.conv2d(*args, stride=self._stride, padding=self._padding, dilation=self._dilation,
                          groups=self._groups, data_format=self._data_format)


class Conv2DTranspose(_ConvBase):
    """Transposed 2-D convolution with ``weight [in_channels, out_channels / groups, kh, kw]``
    and ``bias [out_channels]``. Call as ``layer(x, output_size=None)``; ``output_size``
    (``[h, w]``) picks among the output sizes a strided layer can produce.

    Default initialisers (Paddle's): weight XavierUniform with Paddle's fans of that shape
    (fan_in = out_channels / groups * kh * kw, fan_out = in_channels * kh * kw), bias zeros.

    >>> import jax.numpy as jnp
    >>> up = Conv2DTranspose(4, 2, 3, stride=2, padding=1)
    >>> up.weight[...].shape, up(jnp.ones((1, 4, 5, 5))).shape, up(jnp.ones((1, 4, 5, 5)), output_size=[10, 10]).shape
    ((4, 2, 3, 3), (1, 2, 9, 9), (1, 2, 10, 10))
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 dilation=1, weight_attr=None, bias_attr=None, data_format="NCHW", *, rngs: nnx.Rngs | None = None):
        attrs = self._setup("Conv2DTranspose", ops.conv2d_transpose, in_channels, out_channels, kernel_size, stride,
                            padding, dilation, groups, data_format, output_padding=output_padding)
        self._output_padding = attrs["output_padding"]
        shape = (self._in_channels, self._out_channels // self._groups, *self._kernel_size)
        self.weight = self.create_parameter(shape, weight_attr, rngs=rngs, arg="weight_attr")
        self.bias = self.create_parameter((self._out_channels,), bias_attr, is_bias=True, rngs=rngs, arg="bias_attr")

    def _attrs(self, output_padding):
        return dict(stride=self._stride, padding=self._padding, output_padding=output_padding,
                    dilation=self._dilation, groups=self._groups, data_format=self._data_format)

    def forward(self, x, output_size=None):
        args = (x, self.weight[...]) if self.bias is None else (x, self.weight[...], self.bias[...])
        output_padding = self._output_padding
        if output_size is not None:
            want = pair("Conv2DTranspose", "output_size", output_size)
            smallest = jax.eval_shape(lambda *a: ops.conv2d_transpose(*a, **self._attrs((0, 0))), *args).shape
            hw = smallest[2:] if self._data_format == "NCHW" else smallest[1:3]
            output_padding = tuple(w - n for w, n in zip(want, hw))
            if not all(0 <= p < max(s, d) for p, s, d in zip(output_padding, self._stride, self._dilation)):
                raise arg_error("Conv2DTranspose", "output_size",
                                f"sizes from {tuple(hw)} up to {tuple(n + max(s, d) - 1 for n, s, d in zip(hw, self._stride, self._dilation))}",
                                output_size)
        return ops.conv2d_transpose(*args, **self._attrs(output_padding))
