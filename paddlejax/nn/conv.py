"""Convolution layers: Conv1D, Conv2D, Conv3D and Conv2DTranspose with Paddle's weight layouts
and defaults.

``padding`` is Paddle's: ``"same"`` / ``"valid"``, an int, one int per spatial dim, a
``(before, after)`` int pair per spatial dim (``[top, bottom, left, right]`` in 2-D), or a
``(before, after)`` pair for every dim including the (zero) batch and channel dims.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> conv = nn.Conv2D(3, 8, 3, stride=2, padding=1)
>>> conv.weight[...].shape, conv(jnp.ones((1, 3, 8, 8))).shape
((8, 3, 3, 3), (1, 8, 4, 4))

Data in the other layout than ``data_format`` is named as such:

>>> conv(jnp.ones((1, 8, 8, 3)))
Traceback (most recent call last):
...
ValueError: conv2d: input 'x' (1, 8, 8, 3) has 8 channels on axis 1 (data_format='NCHW'), but 'weight' (8, 3, 3, 3) takes 3; the input looks like NHWC data: pass data_format='NHWC'
"""
from __future__ import annotations

import math

import jax
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, ntuple, pair, positive_int
from paddlejax.nn.initializer import Normal
from paddlejax.nn.layer import Layer
from paddlejax.ops.common import channel_axis
from paddlejax.ops.conv import CONV_LAYOUTS

_PAD_MODES = ("zeros", "reflect", "replicate", "circular")


def spatial_padding(layer, padding, data_format):
    """Paddle's padding forms in the op's terms: a pair for every dim (batch and channel
    included) becomes the spatial pairs; everything else passes through for the op to check."""
    if (isinstance(padding, (list, tuple)) and len(padding) == len(data_format)
            and all(isinstance(p, (list, tuple)) for p in padding)):
        channel = channel_axis(data_format, len(data_format))
        if tuple(padding[0]) != (0, 0) or tuple(padding[channel]) != (0, 0):
            raise arg_error(layer, "padding", "(0, 0) pads for the batch and channel dims", padding)
        return tuple(tuple(p) for i, p in enumerate(padding) if i not in (0, channel))
    return tuple(padding) if isinstance(padding, list) else padding


class _ConvBase(Layer):
    """Shared argument handling; subclasses define the weight shape and the op call."""

    _ndim = 2

    def _setup(self, layer, op, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
               data_format, **extra):
        self._in_channels = positive_int(layer, "in_channels", in_channels)
        self._out_channels = positive_int(layer, "out_channels", out_channels)
        self._groups = positive_int(layer, "groups", groups)
        for name, channels in (("in_channels", self._in_channels), ("out_channels", self._out_channels)):
            if channels % self._groups:
                raise arg_error(layer, "groups", f"a divisor of {name} ({channels})", groups)
        self._kernel_size = ntuple(layer, "kernel_size", kernel_size, self._ndim)
        self._data_format = choice(layer, "data_format", data_format, CONV_LAYOUTS[self._ndim])
        # the op validates (and normalises) the rest now, so a bad argument fails here, not on
        # the first call
        try:
            attrs = op.check_attrs(dict(stride=stride, padding=spatial_padding(layer, padding, data_format),
                                        dilation=dilation, groups=self._groups, data_format=data_format, **extra))
        except ValueError as e:
            raise ValueError(f"{layer}: {e}") from None
        self._stride, self._padding, self._dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
        return attrs


class _Conv(_ConvBase):
    """Conv1D / Conv2D / Conv3D: the op, number of spatial dims and channels-first default
    layout come from the subclass."""

    _op = ops.conv2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 padding_mode="zeros", weight_attr=None, bias_attr=None, data_format=None, *,
                 rngs: nnx.Rngs | None = None):
        layer = type(self).__name__
        data_format = CONV_LAYOUTS[self._ndim][0] if data_format is None else data_format
        self._padding_mode = choice(layer, "padding_mode", padding_mode, _PAD_MODES)
        if padding_mode != "zeros":
            if not is_int(padding):
                raise arg_error(layer, "padding", f"an int with padding_mode={padding_mode!r}", padding)
            # the pad op pads the input instead; its paddings run over all dims, first to last
            spatial = (int(padding),) * (2 * self._ndim)
            self._pad = (0, 0, 0, 0, *spatial) if data_format[1] == "C" else (0, 0, *spatial, 0, 0)
            padding = 0
        self._setup(layer, self._op, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                    data_format)
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
        return self._op(*args, stride=self._stride, padding=self._padding, dilation=self._dilation,
                        groups=self._groups, data_format=self._data_format)


class Conv2D(_Conv):
    """2-D convolution (cross-correlation) with ``weight [out_channels, in_channels / groups,
    kh, kw]`` and ``bias [out_channels]`` (``bias_attr=False``: no bias); ``data_format``
    ``"NCHW"`` (the default) or ``"NHWC"``.

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

    _op = ops.conv2d


class Conv1D(_Conv):
    """1-D convolution with ``weight [out_channels, in_channels / groups, k]``; ``data_format``
    ``"NCL"`` (the default) or ``"NLC"``; otherwise as :class:`Conv2D`.

    >>> import jax.numpy as jnp
    >>> conv = Conv1D(3, 4, 3, padding=1, padding_mode="circular", data_format="NLC")
    >>> conv.weight[...].shape, conv(jnp.ones((2, 7, 3))).shape
    ((4, 3, 3), (2, 7, 4))
    """

    _op, _ndim = ops.conv1d, 1


class Conv3D(_Conv):
    """3-D convolution with ``weight [out_channels, in_channels / groups, kd, kh, kw]``;
    ``data_format`` ``"NCDHW"`` (the default) or ``"NDHWC"``; otherwise as :class:`Conv2D`.

    >>> import jax.numpy as jnp
    >>> conv = Conv3D(2, 4, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
    >>> conv.weight[...].shape, conv(jnp.ones((1, 2, 3, 8, 8))).shape
    ((4, 2, 1, 3, 3), (1, 4, 3, 4, 4))
    """

    _op, _ndim = ops.conv3d, 3


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

    def forward(self, x, output_size=None):
        args = (x, self.weight[...]) if self.bias is None else (x, self.weight[...], self.bias[...])
        attrs = dict(stride=self._stride, padding=self._padding, output_padding=self._output_padding,
                     dilation=self._dilation, groups=self._groups, data_format=self._data_format)
        return conv2d_transpose_to("Conv2DTranspose", args, attrs, output_size)


class DeformConv2D(Layer):
    """Deformable 2-D convolution (Paddle's ``paddle.vision.ops.DeformConv2D``, Dai et al. 2017,
    and v2 with a modulation ``mask``, Zhu et al. 2019): called as ``layer(x, offset, mask=None)``
    where ``offset`` ``[N, 2 * deformable_groups * kh * kw, Ho, Wo]`` moves each kernel tap
    (``(dy, dx)`` pairs) and ``mask`` ``[N, deformable_groups * kh * kw, Ho, Wo]`` scales what it
    reads. NCHW only; initialisers as :class:`Conv2D`.

    >>> import jax.numpy as jnp
    >>> dcn = DeformConv2D(4, 8, 3, padding=1)
    >>> x = jnp.ones((1, 4, 5, 5))
    >>> dcn(x, jnp.zeros((1, 18, 5, 5)), jnp.ones((1, 9, 5, 5))).shape
    (1, 8, 5, 5)
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, deformable_groups=1,
                 groups=1, weight_attr=None, bias_attr=None, *, rngs: nnx.Rngs | None = None):
        layer = "DeformConv2D"
        in_channels, out_channels = positive_int(layer, "in_channels", in_channels), positive_int(layer, "out_channels", out_channels)
        groups = positive_int(layer, "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise arg_error(layer, "groups", f"a divisor of in_channels ({in_channels}) and out_channels ({out_channels})",
                            groups)
        kernel = ntuple(layer, "kernel_size", kernel_size, 2)
        try:
            self._attrs = ops.deformable_conv2d.check_attrs(dict(stride=stride, padding=padding, dilation=dilation,
                                                                 deformable_groups=deformable_groups, groups=groups))
        except ValueError as e:
            raise ValueError(f"{layer}: {e}") from None
        std = math.sqrt(2.0 / (in_channels * math.prod(kernel)))
        self.weight = self.create_parameter((out_channels, in_channels // groups, *kernel), weight_attr,
                                            default_initializer=Normal(0.0, std), rngs=rngs, arg="weight_attr")
        self.bias = self.create_parameter((out_channels,), bias_attr, is_bias=True, rngs=rngs, arg="bias_attr")

    def forward(self, x, offset, mask=None):
        bias = None if self.bias is None else self.bias[...]
        return ops.deformable_conv2d(x, offset, self.weight[...], mask, bias, **self._attrs)


def conv2d_transpose_to(owner, args, attrs, output_size=None):
    """``ops.conv2d_transpose(*args, **attrs)``, its ``output_padding`` picked to give
    ``output_size`` (``[h, w]``) if that is given."""
    if output_size is not None:
        want = pair(owner, "output_size", output_size)
        smallest = jax.eval_shape(lambda *a: ops.conv2d_transpose(*a, **{**attrs, "output_padding": (0, 0)}),
                                  *args).shape
        hw = smallest[2:] if attrs["data_format"] == "NCHW" else smallest[1:3]
        strides, dilations = attrs["stride"], attrs["dilation"]
        attrs = {**attrs, "output_padding": tuple(w - n for w, n in zip(want, hw))}
        if not all(0 <= p < max(s, d) for p, s, d in zip(attrs["output_padding"], strides, dilations)):
            raise arg_error(owner, "output_size",
                            f"sizes from {tuple(hw)} up to {tuple(n + max(s, d) - 1 for n, s, d in zip(hw, strides, dilations))}",
                            output_size)
    return ops.conv2d_transpose(*args, **attrs)
