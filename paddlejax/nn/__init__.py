"""Paddle-style layers (``paddle.nn``) on Flax NNX, calling the op library.

Constructor and call signatures, parameter names, shapes, layouts and default initialisers
follow Paddle 2.x; layers are ``nnx.Module`` s with ``nnx.Param`` parameters and
``nnx.BatchStat`` running statistics, so ``nnx.jit``, ``nnx.grad`` and ``nnx.Optimizer``
work on them, and a trace shows the ops (``conv2d[...]``, ``lstm[...]``). Layers that update
state while training (batch statistics, dropout keys) are traced in eval mode with
``jax.make_jaxpr``, or in any mode with ``paddlejax.trace`` or ``nnx.jit``: nnx refuses
state updates from inside a plain jax trace.

>>> import jax, jax.numpy as jnp, paddlejax.nn as nn
>>> nn.seed(0)
>>> model = nn.Sequential(nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4), nn.ReLU(),
...                       nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(4, 2))
>>> model(jnp.ones((2, 3, 8, 8))).shape
(2, 2)
>>> model.eval()
>>> [e.primitive.name for e in jax.make_jaxpr(model)(jnp.ones((2, 3, 8, 8))).eqns]
['conv2d', 'batch_norm', 'relu', 'adaptive_pool2d', 'reshape', 'linear']
"""
from paddlejax.nn import functional, initializer, utils
from paddlejax.nn.activation import (GELU, Hardswish, LeakyReLU, LogSoftmax, PReLU, ReLU, ReLU6, Sigmoid, Silu,
                                     Softmax, Tanh)
from paddlejax.nn.common import (Dropout, Embedding, Flatten, Identity, Linear, Pad1D, Pad2D, Pad3D, Upsample,
                                 UpsamplingBilinear2D, UpsamplingNearest2D)
from paddlejax.nn.conv import Conv1D, Conv2D, Conv2DTranspose, Conv3D, DeformConv2D
from paddlejax.nn.graph_conv import GATConv, GCNConv, GraphSAGEConv
from paddlejax.nn.initializer import ParamAttr
from paddlejax.nn.layer import Layer, LayerList, ParameterList, Sequential
from paddlejax.nn.loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss,
                               SmoothL1Loss)
from paddlejax.nn.norm import (BatchNorm1D, BatchNorm2D, GroupNorm, InstanceNorm1D, InstanceNorm2D, InstanceNorm3D,
                               LayerNorm, SpectralNorm, SyncBatchNorm)
from paddlejax.nn.pooling import (AdaptiveAvgPool1D, AdaptiveAvgPool2D, AdaptiveMaxPool1D, AdaptiveMaxPool2D,
                                  AvgPool2D, MaxPool2D)
from paddlejax.nn.random import RngKey, seed
from paddlejax.nn.rnn import GRU, LSTM
from paddlejax.nn.transformer import (MultiHeadAttention, TransformerDecoder, TransformerDecoderLayer,
                                      TransformerEncoder, TransformerEncoderLayer)
from paddlejax.nn.weights import WeightsError, load_weights, save_weights, set_state_dict, state_dict

__all__ = [
    "functional", "initializer", "ParamAttr", "seed", "RngKey", "Layer", "Sequential", "LayerList", "ParameterList",
    "Linear", "Embedding", "Dropout", "Flatten", "Identity", "Conv1D", "Conv2D", "Conv3D", "Conv2DTranspose", "DeformConv2D",
    "Pad1D", "Pad2D", "Pad3D", "Upsample", "UpsamplingNearest2D", "UpsamplingBilinear2D",
    "BatchNorm1D", "BatchNorm2D", "SyncBatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm1D", "InstanceNorm2D",
    "InstanceNorm3D", "SpectralNorm", "utils",
    "MaxPool2D", "AvgPool2D", "AdaptiveAvgPool2D", "AdaptiveMaxPool2D", "AdaptiveAvgPool1D", "AdaptiveMaxPool1D",
    "ReLU", "ReLU6", "GELU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "LeakyReLU", "Hardswish", "Silu", "PReLU",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "KLDivLoss", "BCELoss", "BCEWithLogitsLoss",
    "GCNConv", "GATConv", "GraphSAGEConv",
    "LSTM", "GRU", "MultiHeadAttention", "TransformerEncoderLayer", "TransformerEncoder",
    "TransformerDecoderLayer", "TransformerDecoder",
    "state_dict", "set_state_dict", "save_weights", "load_weights", "WeightsError",
]
