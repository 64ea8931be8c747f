"""Compression (imported as ``paddlejax.slim``): quantization (:mod:`~paddlejax.slim.quant`),
structured pruning (:mod:`~paddlejax.slim.pruning`), sparsity (:mod:`~paddlejax.slim.sparsity`),
distillation (:mod:`~paddlejax.slim.distill`), architecture search (:mod:`~paddlejax.slim.nas`)
and auto-compression (:mod:`~paddlejax.slim.auto_compress`, with PaddleSlim 1.x configs in
:mod:`~paddlejax.slim.compress_config`), all over programs.

>>> import paddlejax as pj
>>> sorted(pj.slim.quant.OBSERVERS)[:3]
['KL', 'abs_max', 'avg']
"""
from paddlejax.slim import quant  # noqa: F401
from paddlejax.slim.quant import calibrate, convert, quant_aware, quant_post  # noqa: F401
from paddlejax.slim import pruning  # noqa: F401
from paddlejax.slim.pruning import AutoPruner, ChannelGraph, get_ratios_by_loss, prune, sensitivity  # noqa: F401
from paddlejax.slim import sparsity  # noqa: F401
from paddlejax.slim import distill  # noqa: F401
from paddlejax.slim.distill import (DistillLayer, distill_loss, fsp_loss, l2_loss, loss, merge,  # noqa: F401
                                    soft_label_loss)
from paddlejax.slim.auto_compress import CompressionResult, auto_compress, compress_with_config  # noqa: F401
from paddlejax.slim import nas  # noqa: F401
from paddlejax.slim.nas import SANAS  # noqa: F401
