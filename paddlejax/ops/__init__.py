"""The op library: Paddle's op vocabulary as JAX primitives.

Every op is an :class:`OpDef` and can be called like a function; under tracing it records one
equation (``jax.make_jaxpr`` shows ``conv2d[...]``), eagerly it runs its reference kernel.

>>> import jax.numpy as jnp, paddlejax as pj
>>> pj.ops.relu(jnp.array([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""
from paddlejax.ops.registry import Attr, Input, OpDef, all_ops, define, get, lookup  # noqa: F401
from paddlejax.ops.activation import (gelu, hard_sigmoid, hard_swish, leaky_relu, log_softmax, prelu, relu, relu6,  # noqa: F401
                                      sigmoid, silu, softmax, tanh)
from paddlejax.ops.attention import scaled_dot_product_attention  # noqa: F401
from paddlejax.ops.conv import conv1d, conv2d, conv2d_transpose, conv3d, depthwise_conv2d  # noqa: F401
from paddlejax.ops.conv_pool import conv2d_pool  # noqa: F401
from paddlejax.ops.deform_conv import deformable_conv2d  # noqa: F401
from paddlejax.ops.detection import multiclass_nms, roi_align, yolo_box  # noqa: F401
from paddlejax.ops.fp8 import fp8_linear, quantize_fp8  # noqa: F401
from paddlejax.ops.hashing import hash_bucket  # noqa: F401
from paddlejax.ops.loss import cross_entropy, nll_loss, sigmoid_focal_loss  # noqa: F401
from paddlejax.ops.moe import moe_ffn  # noqa: F401
from paddlejax.ops.math import (einsum, elementwise_add, elementwise_div, elementwise_max,  # noqa: F401
                                elementwise_min, elementwise_mul, elementwise_pow, elementwise_sub, embedding, linear,
                                matmul)
from paddlejax.ops.sampling import grid_sample  # noqa: F401
from paddlejax.ops.unfold import unfold  # noqa: F401
from paddlejax.ops.norm import batch_norm, group_norm, layer_norm, spectral_norm, sync_batch_norm  # noqa: F401
from paddlejax.ops.pool import adaptive_pool2d, pool2d  # noqa: F401
from paddlejax.ops.pipeline import pipeline_stage  # noqa: F401
from paddlejax.ops.quant import (abs_max, dequantize, fake_quantize, fake_quantize_asym,  # noqa: F401
                                 moving_average_abs_max, quantize, quantize_asym, quantized_conv2d, quantized_linear,
                                 quantized_matmul, weight_only_conv2d, weight_only_linear)
from paddlejax.ops.random import dropout, split_key  # noqa: F401
from paddlejax.ops.resize import interpolate  # noqa: F401
from paddlejax.ops.rnn import gru, lstm  # noqa: F401
from paddlejax.ops.reduce import reduce_max, reduce_mean, reduce_sum  # noqa: F401
from paddlejax.ops.segment import segment_max, segment_mean, segment_min, segment_sum  # noqa: F401
from paddlejax.ops.message_passing import send_u_recv, send_ue_recv, send_uv  # noqa: F401
from paddlejax.ops.shape import cast, concat, pad, reshape, slice, split, transpose  # noqa: F401, A004
from paddlejax.ops.sharding import sharding_constraint  # noqa: F401
from paddlejax.ops.sharded_lookup import sparse_embedding  # noqa: F401
from paddlejax.ops.video import temporal_shift  # noqa: F401
