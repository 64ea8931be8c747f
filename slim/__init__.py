"""Compression (imported as ``paddlejax.slim``): quantization (:mod:`~paddlejax.slim.quant`) and
structured pruning (:mod:`~paddlejax.slim.pruning`), with more to come.

>>> import paddlejax as pj
>>> sorted(pj.slim.quant.OBSERVERS)[:3]
['KL', 'abs_max', 'avg']
"""
from paddlejax.slim import quant  # noqa: F401
from paddlejax.slim.quant import calibrate, convert, quant_aware, quant_post  # noqa: F401
from paddlejax.slim import pruning  # noqa: F401
from paddlejax.slim.pruning import AutoPruner, ChannelGraph, get_ratios_by_loss, prune, sensitivity  # noqa: F401
