"""ResNet, ResNeXt and SE-ResNeXt (Paddle's ``paddle.vision.models.resnet`` with the
PaddleClas variants), with Paddle's parameter names (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer1.0.downsample.0``, ``fc``).

Variants (``variant=``):

- ``"vb"``: 7x7 stem; the bottleneck strides on its 3x3 conv; the shortcut is a strided 1x1
  conv + BN (``downsample.0`` / ``downsample.1``). Paddle's and torchvision's default.
- ``"vc"``: the 7x7 stem becomes three 3x3 convs of 32, 32 and 64 channels, the first with
  stride 2: ``conv1.0`` and ``conv1.1`` are conv-BN-ReLU, ``conv1.2`` is the last conv, and
  ``bn1`` follows it as in vb.
- ``"vd"``: the vc stem, and a strided shortcut first averages 2x2 windows
  (``AvgPool2D(2, 2, ceil_mode=True)``) and then applies a stride-1 1x1 conv + BN, so it sees
  every input position (PaddleClas ``ResNet_vd``, "Bag of Tricks"). Its shortcut is
  ``downsample.0`` (the pool; Identity where nothing is strided), ``downsample.1`` (conv) and
  ``downsample.2`` (BN).

``pretrained=PATH`` loads a local safetensors file written by
:func:`paddlejax.nn.save_weights`; nothing is downloaded.

>>> import numpy as np, paddlejax.nn as nn
>>> nn.seed(0)
>>> model = resnet18(num_classes=10, variant="vd")
>>> model.eval()
>>> model(np.zeros((1, 3, 32, 32), np.float32)).shape
(1, 10)
>>> type(model.layer2[0].downsample[0]).__name__
'AvgPool2D'
"""
from __future__ import annotations

from paddlejax import nn, ops
from paddlejax.models.blocks import ConvNormActivation, check_image, classify, data_format_of, load_pretrained
from paddlejax.nn.args import arg_error, choice, positive_int

__all__ = ["ResNet", "BasicBlock", "BottleneckBlock", "SqueezeExcitation", "VARIANTS", "resnet18", "resnet34",
           "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "se_resnext50_32x4d"]

VARIANTS = ("vb", "vc", "vd")
# residual blocks per stage
_DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class SqueezeExcitation(nn.Layer):
    """Channel attention (Hu et al.): global average pool -> ``squeeze`` (Linear to
    ``channels // reduction``) -> ReLU -> ``excitation`` (Linear back) -> sigmoid, which
    scales each channel of the input. Names as PaddleClas's ``SELayer``.

    >>> import jax.numpy as jnp
    >>> se = SqueezeExcitation(32, reduction=16)
    >>> se.squeeze.weight[...].shape, se(jnp.ones((2, 32, 4, 4))).shape
    ((32, 2), (2, 32, 4, 4))
    """

    def __init__(self, channels: int, reduction: int = 16, data_format: str = "NCHW"):
        channels = positive_int("SqueezeExcitation", "channels", channels)
        reduction = positive_int("SqueezeExcitation", "reduction", reduction)
        if channels < reduction:
            raise arg_error("SqueezeExcitation", "reduction", f"at most channels ({channels})", reduction)
        data_format = data_format_of("SqueezeExcitation", data_format)
        self.pool2d_gap = nn.AdaptiveAvgPool2D(1, data_format=data_format)
        self.squeeze = nn.Linear(channels, channels // reduction)
        self.excitation = nn.Linear(channels // reduction, channels)
        self._scale_shape = (0, -1, 1, 1) if data_format == "NCHW" else (0, 1, 1, -1)

    def forward(self, x):
        s = ops.reshape(self.pool2d_gap(x), shape=(0, -1))
        s = ops.sigmoid(self.excitation(ops.relu(self.squeeze(s))))
        return ops.elementwise_mul(x, ops.reshape(s, shape=self._scale_shape))


class _ResidualBlock(nn.Layer):
    """``relu(se(branch(x)) + shortcut(x))``; subclasses build ``_branch`` and set ``expansion``."""

    expansion = 1

    def _add_se_and_shortcut(self, out_channels, downsample, se_reduction, data_format):
        self.downsample = downsample
        self.se = None if se_reduction is None else SqueezeExcitation(out_channels, se_reduction, data_format)

    def forward(self, x):
        out = self._branch(x)
        if self.se is not None:
            out = self.se(out)
        identity = x if self.downsample is None else self.downsample(x)
        return ops.relu(ops.elementwise_add(out, identity))


class BasicBlock(_ResidualBlock):
    """Two 3x3 conv-BN layers (ResNet-18/34); ``stride`` is on the first. ``downsample``
    maps the input onto the output's shape when they differ; ``se_reduction`` adds
    squeeze-and-excitation after ``bn2``.

    >>> import jax.numpy as jnp
    >>> BasicBlock(8, 8)(jnp.ones((1, 8, 6, 6))).shape
    (1, 8, 6, 6)
    """

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Layer | None = None,
                 groups: int = 1, base_width: int = 64, se_reduction: int | None = None, data_format: str = "NCHW"):
        if groups != 1 or base_width != 64:
            raise arg_error("BasicBlock", "groups" if groups != 1 else "base_width",
                            "groups=1 and base_width=64 (use BottleneckBlock for ResNeXt widths)",
                            groups if groups != 1 else base_width)
        self.conv1 = nn.Conv2D(inplanes, planes, 3, stride=stride, padding=1, bias_attr=False, data_format=data_format)
        self.bn1 = nn.BatchNorm2D(planes, data_format=data_format)
        self.conv2 = nn.Conv2D(planes, planes, 3, padding=1, bias_attr=False, data_format=data_format)
        self.bn2 = nn.BatchNorm2D(planes, data_format=data_format)
        self._add_se_and_shortcut(planes, downsample, se_reduction, data_format)

    def _branch(self, x):
        return self.bn2(self.conv2(ops.relu(self.bn1(self.conv1(x)))))


class BottleneckBlock(_ResidualBlock):
    """1x1 conv-BN (to ``width = planes * base_width / 64 * groups`` channels), 3x3 grouped
    conv-BN with ``stride``, 1x1 conv-BN to ``4 * planes`` (ResNet-50 and deeper, ResNeXt);
    ``se_reduction`` adds squeeze-and-excitation after ``bn3``.

    >>> import jax.numpy as jnp
    >>> block = BottleneckBlock(64, 16, groups=4, base_width=32)
    >>> block.conv2.weight[...].shape, block(jnp.ones((1, 64, 6, 6))).shape
    ((32, 8, 3, 3), (1, 64, 6, 6))
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Layer | None = None,
                 groups: int = 1, base_width: int = 64, se_reduction: int | None = None, data_format: str = "NCHW"):
        width = int(planes * (base_width / 64.0)) * groups
        out = planes * self.expansion
        self.conv1 = nn.Conv2D(inplanes, width, 1, bias_attr=False, data_format=data_format)
        self.bn1 = nn.BatchNorm2D(width, data_format=data_format)
        self.conv2 = nn.Conv2D(width, width, 3, stride=stride, padding=1, groups=groups, bias_attr=False,
                               data_format=data_format)
        self.bn2 = nn.BatchNorm2D(width, data_format=data_format)
        self.conv3 = nn.Conv2D(width, out, 1, bias_attr=False, data_format=data_format)
        self.bn3 = nn.BatchNorm2D(out, data_format=data_format)
        self._add_se_and_shortcut(out, downsample, se_reduction, data_format)

    def _branch(self, x):
        out = ops.relu(self.bn1(self.conv1(x)))
        out = ops.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


def _stem(variant: str, data_format: str) -> nn.Layer:
    """The first conv: one 7x7 (vb), or the deep 3x3 stack (vc, vd) whose last BN is ``bn1``."""
    if variant == "vb":
        return nn.Conv2D(3, 64, 7, stride=2, padding=3, bias_attr=False, data_format=data_format)
    return nn.Sequential(ConvNormActivation(3, 32, stride=2, data_format=data_format),
                         ConvNormActivation(32, 32, data_format=data_format),
                         nn.Conv2D(32, 64, 3, padding=1, bias_attr=False, data_format=data_format))


def _shortcut(inplanes: int, out: int, stride: int, variant: str, data_format: str) -> nn.Layer | None:
    """The projection for a block whose output shape differs from its input's (None if not)."""
    if stride == 1 and inplanes == out:
        return None
    avg_down = variant == "vd"
    conv = nn.Conv2D(inplanes, out, 1, stride=1 if avg_down else stride, bias_attr=False, data_format=data_format)
    bn = nn.BatchNorm2D(out, data_format=data_format)
    if not avg_down:
        return nn.Sequential(conv, bn)
    # the Identity keeps the conv at downsample.1 in every stage
    pool = (nn.AvgPool2D(2, 2, ceil_mode=True, data_format=data_format) if stride != 1 else nn.Identity())
    return nn.Sequential(pool, conv, bn)


class ResNet(nn.Layer):
    """A ResNet of ``block`` (:class:`BasicBlock` or :class:`BottleneckBlock`) in the stage
    layout of ``depth`` (18, 34, 50, 101 or 152), as Paddle's ``ResNet(block, depth, width,
    num_classes, with_pool, groups)``.

    Args:
        width: channels per group in the bottleneck's 3x3 conv at the first stage (Paddle's
            ``width``, torchvision's ``width_per_group``): 64 for ResNet, 4 for ResNeXt 32x4d.
        num_classes: size of the ``fc`` head; <= 0 leaves the head out (the output is then
            the pooled features, or the feature map if ``with_pool`` is False too).
        with_pool: global average pooling before the head.
        groups: groups of the bottleneck's 3x3 conv (32 for ResNeXt 32x4d).
        variant: ``"vb"``, ``"vc"`` or ``"vd"`` (see the module doc).
        se_reduction: None, or the squeeze-and-excitation reduction (16 in SE-ResNeXt) after
            the last BN of every block.
        data_format: ``"NCHW"`` (Paddle's default) or ``"NHWC"``; the weights are the same
            in both.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> features = lambda x: ResNet(BasicBlock, 18, num_classes=0, data_format="NHWC")(x)
    >>> nnx.eval_shape(features, jnp.zeros((2, 32, 32, 3))).shape  # pooled features, no head
    (2, 1, 1, 512)
    """

    def __init__(self, block, depth: int = 50, width: int = 64, num_classes: int = 1000, with_pool: bool = True,
                 groups: int = 1, variant: str = "vb", se_reduction: int | None = None,
                 data_format: str = "NCHW"):
        if not (isinstance(block, type) and issubclass(block, _ResidualBlock)):
            raise arg_error("ResNet", "block", "BasicBlock or BottleneckBlock", block)
        stages = _DEPTHS[choice("ResNet", "depth", depth, tuple(_DEPTHS))]
        variant = choice("ResNet", "variant", variant, VARIANTS)
        self._data_format = data_format_of("ResNet", data_format)
        self.conv1 = _stem(variant, data_format)
        self.bn1 = nn.BatchNorm2D(64, data_format=data_format)
        self.maxpool = nn.MaxPool2D(3, stride=2, padding=1, data_format=data_format)
        block_args = dict(groups=positive_int("ResNet", "groups", groups),
                          base_width=positive_int("ResNet", "width", width),
                          se_reduction=None if se_reduction is None else
                          positive_int("ResNet", "se_reduction", se_reduction),
                          data_format=data_format)
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), stages)):
            stride = 1 if i == 0 else 2
            out = planes * block.expansion
            layers = [block(inplanes, planes, stride, _shortcut(inplanes, out, stride, variant, data_format),
                            **block_args)]
            layers += [block(out, planes, **block_args) for _ in range(1, blocks)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
            inplanes = out
        self.avgpool = nn.AdaptiveAvgPool2D(1, data_format=data_format) if with_pool else None
        self.fc = nn.Linear(inplanes, num_classes) if num_classes > 0 else None

    def forward(self, x):
        check_image("ResNet", x, self._data_format)
        x = self.maxpool(ops.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return classify(x, self.avgpool, self.fc, self._data_format)


def _resnet(block, depth, pretrained, **kwargs) -> ResNet:
    return load_pretrained(ResNet(block, depth, **kwargs), pretrained)


def resnet18(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNet-18 (11.7 M parameters at 1000 classes); ``kwargs`` go to :class:`ResNet`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: resnet18(num_classes=10)).fc.weight.shape
    (512, 10)
    """
    return _resnet(BasicBlock, 18, pretrained, variant=variant, **kwargs)


def resnet34(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNet-34 (21.8 M parameters); ``kwargs`` go to :class:`ResNet`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: resnet34()).layer3[5].conv2.weight.shape
    (256, 256, 3, 3)
    """
    return _resnet(BasicBlock, 34, pretrained, variant=variant, **kwargs)


def resnet50(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNet-50 (25.6 M parameters); ``kwargs`` go to :class:`ResNet`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: resnet50(variant="vd")).layer2[0].downsample[1].weight.shape
    (512, 256, 1, 1)
    """
    return _resnet(BottleneckBlock, 50, pretrained, variant=variant, **kwargs)


def resnet101(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNet-101 (44.5 M parameters); ``kwargs`` go to :class:`ResNet`.

    >>> from flax import nnx
    >>> len(nnx.eval_shape(lambda: resnet101()).layer3)
    23
    """
    return _resnet(BottleneckBlock, 101, pretrained, variant=variant, **kwargs)


def resnet152(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNet-152 (60.2 M parameters); ``kwargs`` go to :class:`ResNet`.

    >>> from flax import nnx
    >>> len(nnx.eval_shape(lambda: resnet152()).layer2)
    8
    """
    return _resnet(BottleneckBlock, 152, pretrained, variant=variant, **kwargs)


def resnext50_32x4d(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """ResNeXt-50 32x4d: ResNet-50 whose 3x3 convs have 32 groups of 4 channels at the first
    stage (doubling per stage); 25.0 M parameters.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: resnext50_32x4d()).layer1[0].conv2.weight.shape
    (128, 4, 3, 3)
    """
    return _resnet(BottleneckBlock, 50, pretrained, variant=variant, groups=32, width=4, **kwargs)


def se_resnext50_32x4d(pretrained=None, variant: str = "vb", **kwargs) -> ResNet:
    """SE-ResNeXt-50 32x4d: ResNeXt-50 32x4d with squeeze-and-excitation (reduction 16) in
    every block; 27.6 M parameters.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: se_resnext50_32x4d()).layer1[0].se.squeeze.weight.shape
    (256, 16)
    """
    return _resnet(BottleneckBlock, 50, pretrained, variant=variant, groups=32, width=4, se_reduction=16, **kwargs)
