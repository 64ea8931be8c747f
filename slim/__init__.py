"""Compression (imported as ``paddlejax.slim``): quantization (:mod:`~paddlejax.slim.quant`) and
structured pruning (:mod:`~paddlejax.slim.prune`), with more to come.

>>> import paddlejax as pj
>>> sorted(pj.slim.quant.OBSERVERS)[:3]
['KL', 'abs_max', 'avg']
"""
from paddlejax.slim import quant  # noqa: F401
from paddlejax.slim.quant import calibrate, convert, quant_aware, quant_post  # noqa: F401
from paddlejax.slim.prune import ChannelGraph, prune  # noqa: F401
