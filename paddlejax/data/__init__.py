"""Input pipelines: a Grain-based :class:`DataLoader` and ready datasets from installed packages.

>>> from paddlejax.data import DataLoader, Digits
>>> images, labels = next(iter(DataLoader(Digits("test"), batch_size=8)))
>>> images.shape, labels.dtype
((8, 1, 8, 8), dtype('int32'))
"""
from paddlejax.data.clips import MovingDigits
from paddlejax.data.datasets import BBCNews, Digits, SyntheticCriteo
from paddlejax.data.digit_domains import DigitEdges, DigitImages
from paddlejax.data.graphs import KarateClub, SyntheticCitation
from paddlejax.data.loader import DataLoader
from paddlejax.data.shapes import Shapes

__all__ = ["DataLoader", "Digits", "BBCNews", "SyntheticCriteo", "KarateClub", "SyntheticCitation", "MovingDigits",
           "DigitImages", "DigitEdges", "Shapes"]
