"""MobileNet V1 and V2 (Paddle's ``paddle.vision.models.mobilenetv1`` / ``mobilenetv2``).

- :class:`MobileNetV1`: a 3x3 conv, then 13 depthwise-separable blocks (3x3 depthwise
  conv-BN-ReLU, 1x1 pointwise conv-BN-ReLU) named as in Paddle (``conv2_1`` ... ``conv6``),
  global pooling and ``fc``. ``scale`` multiplies every width (``int(channels * scale)``).
  Paddle's conv-BN pairs (``_conv``, ``_norm_layer``) are :class:`ConvNormActivation` s here,
  so ``conv2_1._depthwise_conv._conv.weight`` is ``conv2_1._depthwise_conv.0.weight``.
- :class:`MobileNetV2`: inverted residual blocks (1x1 expansion, 3x3 depthwise, linear 1x1
  projection; ReLU6), widths rounded to multiples of 8 by :func:`make_divisible`, a last 1x1
  conv to ``make_divisible(1280 * max(1, scale))`` channels, and a classifier of Dropout(0.2)
  and Linear, as in Paddle and torchvision.

``pretrained=PATH`` loads a local safetensors file written by
:func:`paddlejax.nn.save_weights`; nothing is downloaded.

Shapes, without materialising weights (``nnx.eval_shape``):

>>> import jax.numpy as jnp
>>> from flax import nnx
>>> logits = lambda x: mobilenet_v2(scale=0.35, num_classes=5)(x)
>>> nnx.eval_shape(logits, jnp.zeros((1, 3, 32, 32))).shape
(1, 5)
"""
from __future__ import annotations

from paddlejax import nn, ops
from paddlejax.models.blocks import (ConvNormActivation, check_image, classify, data_format_of, load_pretrained,
                                     make_divisible)
from paddlejax.nn.args import arg_error

__all__ = ["MobileNetV1", "MobileNetV2", "DepthwiseSeparable", "InvertedResidual", "mobilenet_v1", "mobilenet_v2"]

# MobileNetV1 after its stem: (name, input channels, output channels, stride) at scale 1
_V1_BLOCKS = (("conv2_1", 32, 64, 1), ("conv2_2", 64, 128, 2), ("conv3_1", 128, 128, 1), ("conv3_2", 128, 256, 2),
              ("conv4_1", 256, 256, 1), ("conv4_2", 256, 512, 2),
              *((f"conv5_{i}", 512, 512, 1) for i in range(1, 6)),
              ("conv5_6", 512, 1024, 2), ("conv6", 1024, 1024, 1))
# MobileNetV2 stages: (expansion t, output channels c, blocks n, first stride s) at scale 1
_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
              (6, 320, 1, 1))


def _scale(model: str, scale, minimum: float = 0.0) -> float:
    """``scale`` as a float: a number above 0 and at least ``minimum``."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale > 0 and scale >= minimum):
        raise arg_error(model, "scale", f"a width multiplier >= {minimum}" if minimum else "a width multiplier > 0",
                        scale)
    return float(scale)


class DepthwiseSeparable(nn.Layer):
    """3x3 depthwise conv-BN-ReLU (with ``stride``) then 1x1 pointwise conv-BN-ReLU
    (``_depthwise_conv``, ``_pointwise_conv``, as in Paddle).

    >>> import jax.numpy as jnp
    >>> DepthwiseSeparable(8, 16, stride=2)(jnp.ones((1, 8, 6, 6))).shape
    (1, 16, 3, 3)
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, data_format: str = "NCHW"):
        self._depthwise_conv = ConvNormActivation(in_channels, in_channels, 3, stride=stride, groups=in_channels,
                                                  data_format=data_format)
        self._pointwise_conv = ConvNormActivation(in_channels, out_channels, 1, data_format=data_format)

    def forward(self, x):
        return self._pointwise_conv(self._depthwise_conv(x))


class MobileNetV1(nn.Layer):
    """MobileNet V1 (Howard et al. 2017) with width multiplier ``scale`` (0.25, 0.5, 0.75 and
    1.0 are the published ones); ``num_classes`` <= 0 leaves out ``fc``, ``with_pool=False``
    the global pooling; ``data_format`` ``"NCHW"`` or ``"NHWC"`` (same weights).

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> model = nnx.eval_shape(lambda: MobileNetV1(scale=0.25, num_classes=3))
    >>> model.conv2_2._pointwise_conv[0].weight.shape
    (32, 16, 1, 1)
    >>> nnx.eval_shape(lambda m, x: m(x), model, jnp.zeros((1, 3, 32, 32))).shape
    (1, 3)
    """

    def __init__(self, scale: float = 1.0, num_classes: int = 1000, with_pool: bool = True,
                 data_format: str = "NCHW"):
        # widths are truncated with int(): the 32-channel stem needs scale >= 1/32
        scale = _scale("MobileNetV1", scale, 1 / 32)
        self._data_format = data_format_of("MobileNetV1", data_format)
        self.conv1 = ConvNormActivation(3, int(32 * scale), 3, stride=2, data_format=data_format)
        for name, cin, cout, stride in _V1_BLOCKS:
            setattr(self, name, DepthwiseSeparable(int(cin * scale), int(cout * scale), stride, data_format))
        self.pool2d_avg = nn.AdaptiveAvgPool2D(1, data_format=data_format) if with_pool else None
        self.fc = nn.Linear(int(1024 * scale), num_classes) if num_classes > 0 else None

    def forward(self, x):
        check_image("MobileNetV1", x, self._data_format)
        x = self.conv1(x)
        for name, *_ in _V1_BLOCKS:
            x = getattr(self, name)(x)
        return classify(x, self.pool2d_avg, self.fc, self._data_format)


class InvertedResidual(nn.Layer):
    """MobileNetV2's block: 1x1 expansion to ``round(inp * expand_ratio)`` channels
    (conv-BN-ReLU6; left out when the ratio is 1), 3x3 depthwise conv-BN-ReLU6 with
    ``stride``, 1x1 linear projection conv-BN to ``oup``; the input is added back when the
    shapes agree. Layers are ``conv.0``, ``conv.1``, ... as in Paddle.

    >>> import jax.numpy as jnp
    >>> block = InvertedResidual(8, 8, stride=1, expand_ratio=6)
    >>> block.conv[0][0].weight[...].shape, block(jnp.ones((1, 8, 5, 5))).shape
    ((48, 8, 1, 1), (1, 8, 5, 5))
    """

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int, data_format: str = "NCHW"):
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        expand = ([ConvNormActivation(inp, hidden, 1, activation_layer=nn.ReLU6, data_format=data_format)]
                  if expand_ratio != 1 else [])
        self.conv = nn.Sequential(
            *expand,
            ConvNormActivation(hidden, hidden, 3, stride=stride, groups=hidden, activation_layer=nn.ReLU6,
                               data_format=data_format),
            nn.Conv2D(hidden, oup, 1, bias_attr=False, data_format=data_format),
            nn.BatchNorm2D(oup, data_format=data_format))

    def forward(self, x):
        out = self.conv(x)
        return ops.elementwise_add(x, out) if self.use_res_connect else out


class MobileNetV2(nn.Layer):
    """MobileNet V2 (Sandler et al. 2018) with width multiplier ``scale`` (any number whose
    rounded widths stay positive; 0.35, 0.5, 0.75, 1.0, 1.3 and 1.4 are the published ones).
    ``num_classes`` <= 0 leaves out the classifier, ``with_pool=False`` the global pooling;
    ``data_format`` ``"NCHW"`` or ``"NHWC"`` (same weights).

    >>> from flax import nnx
    >>> model = nnx.eval_shape(lambda: MobileNetV2(scale=1.4))
    >>> model.features[0][0].weight.shape, model.classifier[1].weight.shape
    ((48, 3, 3, 3), (1792, 1000))
    """

    def __init__(self, scale: float = 1.0, num_classes: int = 1000, with_pool: bool = True,
                 data_format: str = "NCHW"):
        scale = _scale("MobileNetV2", scale)  # make_divisible keeps every width >= 8
        self._data_format = data_format_of("MobileNetV2", data_format)
        channels = make_divisible(32 * scale)
        last = make_divisible(1280 * max(1.0, scale))
        features = [ConvNormActivation(3, channels, 3, stride=2, activation_layer=nn.ReLU6, data_format=data_format)]
        for t, c, n, s in _V2_STAGES:
            out = make_divisible(c * scale)
            for i in range(n):
                features.append(InvertedResidual(channels, out, s if i == 0 else 1, t, data_format))
                channels = out
        features.append(ConvNormActivation(channels, last, 1, activation_layer=nn.ReLU6, data_format=data_format))
        self.features = nn.Sequential(*features)
        self.pool2d_avg = nn.AdaptiveAvgPool2D(1, data_format=data_format) if with_pool else None
        self.classifier = (nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes)) if num_classes > 0
                           else None)

    def forward(self, x):
        check_image("MobileNetV2", x, self._data_format)
        return classify(self.features(x), self.pool2d_avg, self.classifier, self._data_format)


def mobilenet_v1(pretrained=None, scale: float = 1.0, **kwargs) -> MobileNetV1:
    """MobileNet V1 (4.2 M parameters at scale 1.0 and 1000 classes); ``kwargs`` go to
    :class:`MobileNetV1`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: mobilenet_v1(scale=0.5, num_classes=10)).fc.weight.shape
    (512, 10)
    """
    return load_pretrained(MobileNetV1(scale=scale, **kwargs), pretrained)


def mobilenet_v2(pretrained=None, scale: float = 1.0, **kwargs) -> MobileNetV2:
    """MobileNet V2 (3.5 M parameters at scale 1.0 and 1000 classes); ``kwargs`` go to
    :class:`MobileNetV2`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: mobilenet_v2(scale=0.35, num_classes=10)).features[1].conv[0][0].weight.shape
    (16, 1, 3, 3)
    """
    return load_pretrained(MobileNetV2(scale=scale, **kwargs), pretrained)
