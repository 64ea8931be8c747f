"""The digits CNN trained in float32, shared by the quantization tests on real data."""
import types

import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import paddlejax as pj
from paddlejax.models.digits import DigitsCNN


@pytest.fixture(scope="session")
def digits():
    """sklearn's digits (pixels / 16, stratified 80/20 split: 1,437 train / 360 test images) and
    the CNN trained on them for 15 epochs: ``model`` (do not modify it), its eval ``program``,
    and ``calib``, the first 256 training images in batches of 32."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(x, y.astype(np.int32), test_size=0.2, random_state=0,
                                                        stratify=y)
    pj.nn.seed(0)
    model = DigitsCNN()
    trainer = pj.Trainer(model, optax.adam(1e-3), loss=pj.ops.cross_entropy, progress=False)
    rng = np.random.default_rng(0)
    for _ in range(15):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order), 32):
            trainer.train_batch([x_train[order[i:i + 32]]], y_train[order[i:i + 32]])
    trainer.sync_model()
    model.eval()
    program = pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))
    calib = [x_train[i:i + 32] for i in range(0, 256, 32)]
    return types.SimpleNamespace(model=model, program=program, calib=calib, x_train=x_train, y_train=y_train,
                                 x_test=x_test, y_test=y_test)


@pytest.fixture(scope="session")
def untrained_digits():
    """The digits CNN's eval program with its seeded initial weights: for tests that read a real
    conv-BN network's structure without needing accuracy (do not modify it)."""
    pj.nn.seed(0)
    model = DigitsCNN()
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))
