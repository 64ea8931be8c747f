"""The CNNs the inference benchmarks share, at 32x32x3 inputs in NCHW or NHWC.

- SmallCNN: 3 x [conv3x3 without bias -> batch_norm -> relu -> maxpool 2x2] with 32/64/128
  channels, flatten, linear 2048 -> 10;
- ResNet-18 for 32x32 inputs (3x3 stem, no max-pool; the network of train_step.py, as in the
  CIFAR figures Paddle Inference and PyTorch are compared on);
- the zoo's MobileNetV2.

    from cnn_models import MODELS, SmallCNN, randomise_statistics
"""
from __future__ import annotations

import numpy as np

import paddlejax as pj
from paddlejax import nn
from paddlejax.models import mobilenet_v2
from train_step import ResNet18 as CifarResNet18


class SmallCNN(nn.Layer):
    """3 x [conv3x3 (no bias) -> BN -> ReLU -> maxpool 2x2] (32/64/128), flatten, linear 2048 -> 10."""

    def __init__(self, data_format: str = "NCHW", image: int = 32):
        layers, cin = [], 3
        for cout in (32, 64, 128):
            layers += [nn.Conv2D(cin, cout, 3, padding=1, bias_attr=False, data_format=data_format),
                       nn.BatchNorm2D(cout, data_format=data_format), nn.ReLU(),
                       nn.MaxPool2D(2, data_format=data_format)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.nhwc = data_format == "NHWC"
        self.fc = nn.Linear(128 * (image // 8) ** 2, 10)

    def forward(self, x):
        x = self.features(x)
        if self.nhwc:  # flatten in NCHW order, so both layouts share the head's weights
            x = pj.ops.transpose(x, perm=(0, 3, 1, 2))
        return self.fc(pj.ops.reshape(x, shape=(0, -1)))


MODELS = {"SmallCNN": SmallCNN,
          "ResNet-18": lambda data_format, image: CifarResNet18(fmt=data_format),
          "MobileNetV2": lambda data_format, image: mobilenet_v2(num_classes=10, data_format=data_format)}


def randomise_statistics(model) -> None:
    """Give every batch norm non-trivial running statistics, so folding them is real work."""
    rng = np.random.default_rng(1)
    statistics = {name: rng.normal(0, 0.1, v.shape) if name.endswith(".mean") else rng.uniform(0.5, 1.5, v.shape)
                  for name, v in nn.state_dict(model).items() if name.endswith((".mean", ".variance"))}
    nn.set_state_dict(model, statistics, strict=False)
