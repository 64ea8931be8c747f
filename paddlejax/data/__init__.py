"""Input pipelines: a Grain-based :class:`DataLoader` and ready datasets from installed packages.

>>> from paddlejax.data import DataLoader, Digits
>>> images, labels = next(iter(DataLoader(Digits("test"), batch_size=8)))
>>> images.shape, labels.dtype
((8, 1, 8, 8), dtype('int32'))
"""
from paddlejax.data.datasets import BBCNews, Digits, SyntheticCriteo
from paddlejax.data.loader import DataLoader

__all__ = ["DataLoader", "Digits", "BBCNews", "SyntheticCriteo"]
