"""Building blocks shared by the image-classification models: conv-BN-activation, channel
rounding, argument and input checks, the pool-flatten-head tail, and loading a model's weights
from a local file.

>>> import jax.numpy as jnp
>>> make_divisible(32 * 0.35)
16
>>> block = ConvNormActivation(3, 8, stride=2)
>>> [name for name, _ in block.named_parameters()]
['0.weight', '1.bias', '1.weight']
>>> block(jnp.ones((1, 3, 8, 8))).shape
(1, 8, 4, 4)
"""
from __future__ import annotations

import os

from paddlejax import nn, ops
from paddlejax.nn.args import arg_error, choice


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """``value`` rounded to the nearest multiple of ``divisor`` (at least ``min_value``, which
    defaults to ``divisor``), never more than 10 % below ``value`` (Paddle's and
    torchvision's ``_make_divisible``, used for MobileNet channel widths).

    >>> make_divisible(1280 * 1.4), make_divisible(24 * 0.5), make_divisible(4)
    (1792, 16, 8)
    """
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    # rounding down must not lose more than 10 % of the channels
    return rounded + divisor if rounded < 0.9 * value else rounded


def data_format_of(model: str, data_format) -> str:
    """``data_format`` checked to be ``"NCHW"`` or ``"NHWC"``; ``model`` names the caller in errors.

    >>> data_format_of("VGG", "NHWC")
    'NHWC'
    """
    return choice(model, "data_format", data_format, ("NCHW", "NHWC"))


def check_image(model: str, x, data_format: str, channels: int = 3) -> None:
    """Raise a ValueError naming ``model`` unless ``x`` is a batch of ``channels``-channel
    images in ``data_format`` (so a layout mix-up is reported as one, not as a conv mismatch).

    >>> import numpy as np
    >>> check_image("ResNet", np.zeros((2, 32, 32, 3)), "NCHW")
    Traceback (most recent call last):
    ...
    ValueError: ResNet: input 'x' expects shape [N, 3, H, W] (data_format 'NCHW'), got (2, 32, 32, 3)
    """
    axis = 1 if data_format == "NCHW" else 3
    if len(x.shape) != 4 or x.shape[axis] != channels:
        want = f"[N, {channels}, H, W]" if data_format == "NCHW" else f"[N, H, W, {channels}]"
        raise ValueError(f"{model}: input 'x' expects shape {want} (data_format {data_format!r}), "
                         f"got {tuple(x.shape)}")


def classify(x, pool: nn.Layer | None, head: nn.Layer | None, data_format: str):
    """Paddle's classifier tail: ``pool`` (if any), then, if there is a ``head``, flatten and
    apply it. Features are flattened in channel-major (NCHW) order in both layouts, so a
    head's weights mean the same for NCHW and NHWC models.

    >>> import jax.numpy as jnp
    >>> classify(jnp.ones((2, 3, 3, 4)), nn.AdaptiveAvgPool2D(1, "NHWC"), nn.Linear(4, 5), "NHWC").shape
    (2, 5)
    """
    if pool is not None:
        x = pool(x)
    if head is None:
        return x
    if data_format == "NHWC" and x.shape[1] * x.shape[2] > 1:
        x = ops.transpose(x, perm=(0, 3, 1, 2))
    return head(ops.reshape(x, shape=(0, -1)))


class ConvNormActivation(nn.Sequential):
    """Conv2D (no bias) -> BatchNorm2D -> activation, as a Sequential whose parameters are
    ``0.weight`` (conv), ``1.weight`` / ``1.bias`` (norm) -- Paddle's ``ConvNormActivation``.

    ``padding`` defaults to ``(kernel_size - 1) // 2`` (same size at stride 1);
    ``activation_layer`` is a layer class (``nn.ReLU``, ``nn.ReLU6``) or None for none.

    >>> import jax.numpy as jnp
    >>> dw = ConvNormActivation(4, 4, groups=4, activation_layer=nn.ReLU6, data_format="NHWC")
    >>> dw[0].weight[...].shape, dw(jnp.ones((1, 5, 5, 4))).shape
    ((4, 1, 3, 3), (1, 5, 5, 4))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int | None = None, groups: int = 1, activation_layer=nn.ReLU, data_format: str = "NCHW"):
        padding = (kernel_size - 1) // 2 if padding is None else padding
        layers = [nn.Conv2D(in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups,
                            bias_attr=False, data_format=data_format),
                  nn.BatchNorm2D(out_channels, data_format=data_format)]
        super().__init__(*layers, *([] if activation_layer is None else [activation_layer()]))


def load_pretrained(model: nn.Layer, pretrained) -> nn.Layer:
    """``model`` with its weights loaded from ``pretrained``, a local safetensors file written by
    :func:`paddlejax.nn.save_weights` (None: left as initialised). Nothing is downloaded; a
    file that does not fit raises :class:`~paddlejax.nn.WeightsError` naming the tensor.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "linear.safetensors")
    >>> source = nn.Linear(2, 2); nn.save_weights(source, path)
    >>> bool((load_pretrained(nn.Linear(2, 2), path).weight[...] == source.weight[...]).all())
    True
    >>> load_pretrained(nn.Linear(2, 2), True)
    Traceback (most recent call last):
    ...
    ValueError: Linear: argument 'pretrained' expects None or the path of a local safetensors weights file ...
    """
    if pretrained is None:
        return model
    if not isinstance(pretrained, (str, os.PathLike)):
        raise arg_error(type(model).__name__, "pretrained",
                        "None or the path of a local safetensors weights file (nothing is downloaded)", pretrained)
    nn.load_weights(model, pretrained)
    return model
