"""TSM, the Temporal Shift Module network for video classification (Lin et al., "TSM: Temporal
Shift Module for Efficient Video Understanding", ICCV 2019; PaddleVideo's ``TSM``).

A 2-D CNN runs on every frame of a clip ``[N, T, C, H, W]`` (as ``N * T`` images); at the start
of every residual block's branch, ``temporal_shift`` moves part of the channels one frame back
and one frame forward, so each block's first convolution mixes neighbouring frames for no extra
FLOPs or parameters (the "residual shift": the shortcut keeps the unshifted frame). The
per-frame class scores are averaged over the clip (the consensus). ``shift_ratio`` is the
share shifted each way: 1/8 as in the paper (PaddleVideo's ``1 / num_seg`` at 8 segments);
``shift_ratio=0`` leaves the shifts out, which is TSN (Temporal Segment Networks), a frame
model that cannot tell a clip from the same clip played backwards.

The shift wraps each block's ``conv1`` (:class:`TemporalShift`, as the paper's code does), so
the backbone's weights are named ``backbone.layer1.0.conv1.net.weight`` and so on; backbone
weights load into the backbone before it is wrapped (``TSM(resnet50(pretrained=PATH), 8)``).

>>> import numpy as np, paddlejax.nn as nn
>>> nn.seed(0)
>>> model = TSM(small_resnet(4, widths=(8, 16), blocks=(1, 1)), num_segments=3)
>>> model.eval()
>>> model(np.zeros((2, 3, 1, 16, 16), np.float32)).shape  # 2 clips of 3 frames
(2, 4)
>>> type(model.backbone[1].conv1).__name__
'TemporalShift'
"""
from __future__ import annotations

from flax import nnx

from paddlejax import nn, ops
from paddlejax.models.blocks import ConvNormActivation, data_format_of, load_pretrained
from paddlejax.models.resnet import BasicBlock, BottleneckBlock, _shortcut, resnet18, resnet50
from paddlejax.nn.args import arg_error, is_number, positive_int

__all__ = ["TSM", "TemporalShift", "small_resnet", "tsm_resnet18", "tsm_resnet50"]


class TemporalShift(nn.Layer):
    """``net`` applied to its input after a temporal shift (:func:`paddlejax.ops.temporal_shift`
    over clips of ``num_segments`` frames): what :class:`TSM` puts in place of a residual
    block's first conv.

    >>> import jax.numpy as jnp
    >>> shift = TemporalShift(nn.Identity(), num_segments=2, shift_ratio=0.25)
    >>> shift(jnp.ones((2, 4, 1, 1)))[:, :, 0, 0].tolist()  # one clip of 2 frames, 4 channels
    [[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]]
    """

    def __init__(self, net: nn.Layer, num_segments: int, shift_ratio: float = 0.125, data_format: str = "NCHW"):
        self.net = net
        self.num_segments = positive_int("TemporalShift", "num_segments", num_segments)
        self.shift_ratio = shift_ratio
        self.data_format = data_format_of("TemporalShift", data_format)

    def forward(self, x):
        return self.net(ops.temporal_shift(x, seg_num=self.num_segments, shift_ratio=self.shift_ratio,
                                           data_format=self.data_format))


class TSM(nn.Layer):
    """A frame classifier ``backbone`` (``[B, C, H, W]`` images to ``[B, K]`` scores) made a
    clip classifier: ``[N, T, C, H, W]`` clips with ``T = num_segments`` to ``[N, K]`` scores,
    with a temporal shift before the first conv of every residual block (:class:`BasicBlock`,
    :class:`BottleneckBlock`) of the backbone, which is changed in place.

    Args:
        backbone: the frame model: a zoo ResNet, :func:`small_resnet`, or any layer built from
            the zoo's residual blocks.
        num_segments: frames per clip (T).
        shift_ratio: the share of channels shifted each way, in [0, 0.5); 0 inserts no shift
            (TSN).
        data_format: the backbone's layout, ``"NCHW"`` or ``"NHWC"`` (frames are then
            ``[N, T, H, W, C]``).

    >>> from flax import nnx
    >>> tsn = nnx.eval_shape(lambda: TSM(small_resnet(4, widths=(8,), blocks=(1,)), 8, shift_ratio=0))
    >>> type(tsn.backbone[1].conv1).__name__  # no shift
    'Conv2D'
    """

    def __init__(self, backbone: nn.Layer, num_segments: int, shift_ratio: float = 0.125,
                 data_format: str = "NCHW"):
        self.num_segments = positive_int("TSM", "num_segments", num_segments)
        if not is_number(shift_ratio) or not 0 <= shift_ratio < 0.5:
            raise arg_error("TSM", "shift_ratio", "a ratio in [0, 0.5) (0: no shift)", shift_ratio)
        self.shift_ratio = float(shift_ratio)
        self.data_format = data_format_of("TSM", data_format)
        blocks = [node for _, node in nnx.iter_graph(backbone) if isinstance(node, (BasicBlock, BottleneckBlock))]
        if self.shift_ratio:
            if not blocks:
                raise arg_error("TSM", "backbone", "a network of residual blocks (BasicBlock or BottleneckBlock) to "
                                "shift in, or shift_ratio=0", type(backbone).__name__)
            for block in blocks:
                block.conv1 = TemporalShift(block.conv1, self.num_segments, self.shift_ratio, self.data_format)
        self.backbone = backbone

    def forward(self, x):
        if len(x.shape) != 5 or x.shape[1] != self.num_segments:
            frame = "C, H, W" if self.data_format == "NCHW" else "H, W, C"
            raise ValueError(f"TSM: input 'x' expects clips of shape [N, {self.num_segments}, {frame}] "
                             f"(num_segments={self.num_segments}), got {tuple(x.shape)}")
        scores = self.backbone(ops.reshape(x, shape=(-1, *x.shape[2:])))
        scores = ops.reshape(scores, shape=(-1, self.num_segments, *scores.shape[1:]))
        return ops.reduce_mean(scores, axis=1)


def small_resnet(num_classes: int, in_channels: int = 1, widths=(16, 32, 64, 128), blocks=(2, 2, 2, 2),
                 data_format: str = "NCHW") -> nn.Sequential:
    """A ResNet of :class:`BasicBlock` stages for small images (CIFAR style: a 3x3 stride-1
    conv-BN-ReLU stem and no max-pool): ``blocks[i]`` blocks of ``widths[i]`` channels per stage,
    stride 2 from the second stage on, then global average pooling and a linear head. The
    default is ResNet-18's layout at a quarter of its width: a frame model for :class:`TSM` on
    small clips at CPU cost.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> nnx.eval_shape(lambda x: small_resnet(10)(x), jnp.zeros((2, 1, 16, 16))).shape
    (2, 10)
    """
    widths, blocks = tuple(widths), tuple(blocks)
    if not widths or len(blocks) != len(widths):
        raise arg_error("small_resnet", "blocks", f"one count per stage ({len(widths)} widths)", blocks)
    data_format = data_format_of("small_resnet", data_format)
    inplanes = positive_int("small_resnet", "widths", widths[0])
    layers = [ConvNormActivation(positive_int("small_resnet", "in_channels", in_channels), inplanes,
                                 data_format=data_format)]
    for i, (planes, count) in enumerate(zip(widths, blocks)):
        planes, count, stride = (positive_int("small_resnet", "widths", planes),
                                 positive_int("small_resnet", "blocks", count), 1 if i == 0 else 2)
        layers.append(BasicBlock(inplanes, planes, stride, _shortcut(inplanes, planes, stride, "vb", data_format),
                                 data_format=data_format))
        layers += [BasicBlock(planes, planes, data_format=data_format) for _ in range(1, count)]
        inplanes = planes
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2D(1, data_format=data_format), nn.Flatten(),
                         nn.Linear(inplanes, positive_int("small_resnet", "num_classes", num_classes)))


def _tsm(resnet, num_classes, num_segments, shift_ratio, pretrained, kwargs) -> TSM:
    model = TSM(resnet(num_classes=num_classes, **kwargs), num_segments, shift_ratio,
                data_format=kwargs.get("data_format", "NCHW"))
    return load_pretrained(model, pretrained)


def tsm_resnet18(num_classes: int, num_segments: int, shift_ratio: float = 0.125, pretrained=None,
                 **kwargs) -> TSM:
    """TSM on the zoo's ResNet-18 (``kwargs`` go to :func:`~paddlejax.models.resnet18`:
    ``variant``, ``data_format``); ``pretrained`` is a local safetensors file of a TSM's weights.

    >>> from flax import nnx
    >>> model = nnx.eval_shape(lambda: tsm_resnet18(num_classes=4, num_segments=8))
    >>> type(model.backbone.layer3[1].conv1).__name__, model.backbone.layer3[1].conv1.net.weight.shape
    ('TemporalShift', (256, 256, 3, 3))
    """
    return _tsm(resnet18, num_classes, num_segments, shift_ratio, pretrained, kwargs)


def tsm_resnet50(num_classes: int, num_segments: int, shift_ratio: float = 0.125, pretrained=None,
                 **kwargs) -> TSM:
    """TSM on the zoo's ResNet-50 (PaddleVideo's TSM backbone; ``kwargs`` go to
    :func:`~paddlejax.models.resnet50`); ``pretrained`` is a local safetensors file of a TSM's
    weights.

    >>> from flax import nnx
    >>> model = nnx.eval_shape(lambda: tsm_resnet50(num_classes=400, num_segments=8))
    >>> model.backbone.layer1[0].conv1.net.weight.shape, model.backbone.fc.weight.shape
    ((64, 64, 1, 1), (2048, 400))
    """
    return _tsm(resnet50, num_classes, num_segments, shift_ratio, pretrained, kwargs)
