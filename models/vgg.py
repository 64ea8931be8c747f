"""VGG 11/13/16/19 (Paddle's ``paddle.vision.models.vgg``), with or without batch norm.

``features`` is a Sequential of 3x3 convs (+ BN) + ReLU and 2x2 max pools
(:func:`make_layers`); the classifier after ``AdaptiveAvgPool2D(7)`` is
Linear(512*7*7, 4096)-ReLU-Dropout-Linear(4096, 4096)-ReLU-Dropout-Linear(4096, num_classes).
``classifier_width`` replaces the 4096 and ``dropout`` the 0.5 (a narrow head without dropout
trains fast and smoothly in a test or on small data).

``pretrained=PATH`` loads a local safetensors file written by
:func:`paddlejax.nn.save_weights`; nothing is downloaded.

>>> import numpy as np, paddlejax.nn as nn
>>> nn.seed(0)
>>> model = VGG(make_layers([8, "M", 512, "M"]), num_classes=3, classifier_width=16)
>>> model.eval()
>>> model(np.zeros((1, 3, 32, 32), np.float32)).shape
(1, 3)
"""
from __future__ import annotations

from paddlejax import nn
from paddlejax.models.blocks import check_image, classify, data_format_of, load_pretrained
from paddlejax.nn.args import arg_error, is_int, probability

__all__ = ["VGG", "CONFIGS", "make_layers", "vgg11", "vgg13", "vgg16", "vgg19"]

# conv widths and max pools ("M") of VGG-11 (A), -13 (B), -16 (D) and -19 (E)
CONFIGS = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def make_layers(cfg, batch_norm: bool = False, data_format: str = "NCHW") -> nn.Sequential:
    """VGG's feature extractor from ``cfg``: an int is a 3x3 conv (padding 1) to that many
    channels followed by BatchNorm2D if ``batch_norm`` and ReLU; ``"M"`` is a 2x2 max pool.
    The input has 3 channels; :class:`VGG`'s classifier expects 512 out.

    >>> [type(layer).__name__ for layer in make_layers([8, "M"], batch_norm=True)]
    ['Conv2D', 'BatchNorm2D', 'ReLU', 'MaxPool2D']
    """
    data_format = data_format_of("make_layers", data_format)
    layers, channels = [], 3
    for i, v in enumerate(cfg):
        if v == "M":
            layers.append(nn.MaxPool2D(2, stride=2, data_format=data_format))
            continue
        if not is_int(v) or v < 1:
            raise arg_error("make_layers", f"cfg[{i}]", 'a positive channel count or "M"', v)
        layers.append(nn.Conv2D(channels, v, 3, padding=1, data_format=data_format))
        if batch_norm:
            layers.append(nn.BatchNorm2D(v, data_format=data_format))
        layers.append(nn.ReLU())
        channels = v
    return nn.Sequential(*layers)


class VGG(nn.Layer):
    """A VGG classifier on ``features`` (see :func:`make_layers`), which must give 512
    channels.

    Args:
        num_classes: size of the last classifier layer; <= 0 leaves the classifier out.
        with_pool: the ``AdaptiveAvgPool2D(7)``; without it the features must be 7x7 for
            the classifier.
        classifier_width: width of the two hidden classifier layers (4096 in the paper).
        dropout: probability of their Dropout layers (0.5 in the paper; torchvision's ``dropout``).
        data_format: the layout ``features`` was built with; the classifier flattens in NCHW
            order in both, so the weights are the same.

    >>> import numpy as np
    >>> model = VGG(make_layers([512, "M"], data_format="NHWC"), num_classes=0, data_format="NHWC")
    >>> model(np.zeros((1, 4, 4, 3), np.float32)).shape
    (1, 7, 7, 512)
    """

    def __init__(self, features: nn.Layer, num_classes: int = 1000, with_pool: bool = True,
                 classifier_width: int = 4096, dropout: float = 0.5, data_format: str = "NCHW"):
        if not is_int(classifier_width) or classifier_width < 1:
            raise arg_error("VGG", "classifier_width", "an int >= 1", classifier_width)
        dropout = probability("VGG", "dropout", dropout)
        self._data_format = data_format_of("VGG", data_format)
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2D(7, data_format=data_format) if with_pool else None
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, classifier_width), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(classifier_width, classifier_width), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(classifier_width, num_classes)) if num_classes > 0 else None

    def forward(self, x):
        check_image("VGG", x, self._data_format)
        return classify(self.features(x), self.avgpool, self.classifier, self._data_format)


def _vgg(depth: int, pretrained, batch_norm: bool, data_format: str = "NCHW", **kwargs) -> VGG:
    model = VGG(make_layers(CONFIGS[depth], batch_norm, data_format), data_format=data_format, **kwargs)
    return load_pretrained(model, pretrained)


def vgg11(pretrained=None, batch_norm: bool = False, **kwargs) -> VGG:
    """VGG-11 (configuration A; 132.9 M parameters); ``kwargs`` go to :class:`VGG`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: vgg11(num_classes=10, classifier_width=256)).classifier[6].weight.shape
    (256, 10)
    """
    return _vgg(11, pretrained, batch_norm, **kwargs)


def vgg13(pretrained=None, batch_norm: bool = False, **kwargs) -> VGG:
    """VGG-13 (configuration B; 133.0 M parameters); ``kwargs`` go to :class:`VGG`.

    >>> from flax import nnx
    >>> len(nnx.eval_shape(lambda: vgg13(batch_norm=True)).features)
    35
    """
    return _vgg(13, pretrained, batch_norm, **kwargs)


def vgg16(pretrained=None, batch_norm: bool = False, **kwargs) -> VGG:
    """VGG-16 (configuration D; 138.4 M parameters); ``kwargs`` go to :class:`VGG`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: vgg16()).classifier[0].weight.shape
    (25088, 4096)
    """
    return _vgg(16, pretrained, batch_norm, **kwargs)


def vgg19(pretrained=None, batch_norm: bool = False, **kwargs) -> VGG:
    """VGG-19 (configuration E; 143.7 M parameters); ``kwargs`` go to :class:`VGG`.

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: vgg19()).features[34].weight.shape
    (512, 512, 3, 3)
    """
    return _vgg(19, pretrained, batch_norm, **kwargs)
