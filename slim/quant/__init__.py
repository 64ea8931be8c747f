"""Quantization: observers and calibration algorithms (PaddleSlim's), int8 programs.

>>> import numpy as np, paddlejax as pj
>>> observer = pj.slim.quant.make_observer("abs_max")
>>> observer.observe(np.array([0.5, -2.0]))
>>> float(observer.scale())
2.0
"""
from paddlejax.slim.quant.observers import (OBSERVERS, AbsMaxObserver, AvgObserver,  # noqa: F401
                                            ChannelWiseAbsMaxObserver, HistObserver, KLObserver,
                                            MinMaxObserver, MovingAverageAbsMaxObserver, MSEObserver, Observer,
                                            make_observer, quant_error)
from paddlejax.slim.quant.aware import convert, quant_aware  # noqa: F401
from paddlejax.slim.quant.post import activation_scales, calibrate, quant_post  # noqa: F401
from paddlejax.slim.quant.report import LayerError, layer_errors, plot_layer_errors  # noqa: F401
from paddlejax.slim.quant.sensitivity import LayerSensitivity, quant_sensitivity  # noqa: F401
