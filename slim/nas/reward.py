"""The reward of a searched network: a short training, scored on a validation split.

``data`` is a training set -- ``(images, labels)`` arrays or a dataset with ``arrays()`` such as
``pj.data.Digits("train")``; a dataset whose ``split`` is ``"test"`` is refused, since a search
that selects on the test split reports a biased test score. A seeded ``validation`` fraction of
it is held out and scored; the rest trains the network through :class:`paddlejax.Trainer`.

>>> import paddlejax as pj
>>> from paddlejax.slim.nas import search_space
>>> space = search_space(("ResNetSpace", {"input_size": 8, "output_size": 1, "block_num": 1,
...                                       "input_channels": 1, "class_dim": 10}))
>>> train_and_score(space.token2arch([0, 0])[0], pj.data.Digits("test"), epochs=1)
Traceback (most recent call last):
...
ValueError: train_and_score: refusing the test split; search on a validation split of the training data
"""
from __future__ import annotations

import numpy as np
import optax

from paddlejax.train.trainer import Trainer


def train_and_score(model, data, epochs: int = 1, *, batch_size: int = 64, learning_rate: float = 1e-2,
                    validation: float = 0.2, seed: int = 0, metric: str = "acc", progress: bool = False) -> float:
    """Train ``model`` for ``epochs`` (Adam at ``learning_rate``) on all but a seeded
    ``validation`` fraction of ``data``, then return its ``metric`` on that fraction
    (``"acc"``: accuracy; ``"loss"``: the negated loss, so that higher is better).

    >>> import numpy as np, paddlejax as pj
    >>> pj.nn.seed(0)
    >>> x = np.random.default_rng(0).normal(size=(160, 4)).astype("float32")
    >>> train_and_score(pj.nn.Linear(4, 2), (x, (x[:, 0] > 0).astype("int32")), epochs=20, batch_size=32,
    ...                 learning_rate=0.05)
    1.0
    """
    if getattr(data, "split", None) == "test":
        raise ValueError("train_and_score: refusing the test split; search on a validation split of the training data")
    images, labels = data.arrays() if hasattr(data, "arrays") else data
    if not 0 < validation < 1:
        raise ValueError(f"train_and_score: validation is a fraction in (0, 1), got {validation!r}")
    if metric not in ("acc", "loss"):
        raise ValueError(f"train_and_score: metric expects 'acc' or 'loss', got {metric!r}")
    order = np.random.default_rng(seed).permutation(len(labels))
    held = max(1, int(round(validation * len(labels))))
    # whole batches only: a last, smaller batch would compile the training step a second time
    train = order[held:][:max(batch_size, (len(labels) - held) // batch_size * batch_size)]
    trainer = Trainer(model, optax.adam(learning_rate), metrics=["accuracy"], progress=progress)
    trainer.fit((images[train], labels[train]), epochs=epochs, batch_size=batch_size, seed=seed)
    scores = trainer.evaluate((images[order[:held]], labels[order[:held]]), batch_size=held)
    return float(scores["acc"] if metric == "acc" else -scores["loss"])
