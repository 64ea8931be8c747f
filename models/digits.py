"""A small CNN for 8x8 digit images (sklearn's digits), in Paddle's NCHW layout.

conv3x3(1→32, no bias)-BN-ReLU, conv3x3(32→64)-BN-ReLU-maxpool2, conv3x3(64→128)-BN-ReLU-maxpool2,
flatten, linear(512→10).

>>> import numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> DigitsCNN()(np.zeros((2, 1, 8, 8), np.float32)).shape
(2, 10)
"""
from __future__ import annotations

from paddlejax import nn


def _block(cin, cout, bias=True, pool=False):
    layers = [nn.Conv2D(cin, cout, 3, padding=1, bias_attr=None if bias else False), nn.BatchNorm2D(cout), nn.ReLU()]
    return layers + ([nn.MaxPool2D(2)] if pool else [])


class DigitsCNN(nn.Layer):
    """The digits CNN; ``num_classes`` sets the head."""

    def __init__(self, num_classes: int = 10):
        self.features = nn.Sequential(*_block(1, 32, bias=False), *_block(32, 64, pool=True),
                                      *_block(64, 128, pool=True))
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(128 * 2 * 2, num_classes)

    def __call__(self, x):
        return self.fc(self.flatten(self.features(x)))
