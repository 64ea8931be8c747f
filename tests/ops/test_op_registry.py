"""Registry-level behaviour of the op library: what is registered, and that bad attributes and
inputs raise ValueErrors naming the op and the attribute or input."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import paddlejax.ops as ops

OP_NAMES = {
    "conv2d", "depthwise_conv2d", "conv2d_transpose", "batch_norm", "layer_norm", "group_norm", "spectral_norm",
    "linear", "matmul", "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div", "elementwise_max",
    "elementwise_min", "elementwise_pow", "embedding", "relu", "relu6", "gelu", "sigmoid", "tanh", "silu",
    "leaky_relu", "hard_swish", "hard_sigmoid", "softmax", "log_softmax", "pool2d", "cross_entropy", "dropout", "reshape",
    "transpose", "concat", "split", "slice", "pad", "cast", "reduce_sum", "reduce_mean", "reduce_max",
    "scaled_dot_product_attention", "lstm", "gru", "split_key", "adaptive_pool2d",
    "fake_quantize", "fake_quantize_asym", "quantize", "dequantize", "quantized_linear", "quantized_matmul",
    "quantized_conv2d", "weight_only_linear", "conv1d", "conv3d", "interpolate", "prelu", "nll_loss",
    "segment_sum", "segment_mean", "segment_max", "segment_min", "send_u_recv", "send_ue_recv", "send_uv",
    "temporal_shift",
    "deformable_conv2d", "roi_align", "multiclass_nms", "yolo_box", "sigmoid_focal_loss", "unfold", "einsum",
    "grid_sample", "conv2d_pool",
}


def test_all_ops_registered_exported_and_documented():
    registered = ops.all_ops()
    assert OP_NAMES <= set(registered)
    for name in OP_NAMES:
        op = registered[name]
        assert getattr(ops, name) is op
        assert op.doc, f"{name} has no kernel docstring"
        assert ops.get(name) is op and op.primitive.name == name


def test_variants_and_outputs():
    assert {"lax_nhwc", "im2col", "shifted_matmul"} <= set(ops.conv2d.variants)
    assert {"lax_nhwc", "im2col", "shifted_matmul"} <= set(ops.depthwise_conv2d.variants)
    assert "xla" in ops.scaled_dot_product_attention.variants
    assert ops.batch_norm.outputs == ("out", "mean_out", "variance_out")
    assert ops.split.multiple_results and ops.split.outputs == ("outs",)


def test_bare_ints_for_int_list_attrs():
    x = np.zeros((2, 6), np.float32)
    assert [p.shape for p in ops.split(x, num_or_sections=2, axis=1)] == [(2, 3), (2, 3)]
    assert ops.reduce_sum(x, axis=1).shape == (2,)
    assert ops.reduce_sum(x, axis=()).shape == ()  # Paddle: an empty axis list reduces everything


x4, w4 = np.zeros((2, 6, 5, 5), np.float32), np.zeros((4, 6, 3, 3), np.float32)
x2 = np.zeros((2, 6), np.float32)
key = np.asarray(jax.random.PRNGKey(0))

BAD_CALLS = [
    (lambda: ops.conv2d(x4, np.zeros((4, 1, 3, 3), np.float32), groups=4),
     r"conv2d: attribute 'groups' expects a divisor of the input channels \(6\), got 4"),
    (lambda: ops.conv2d(x4, w4, stride="2"), r"conv2d: attribute 'stride' expects 2 ints"),
    (lambda: ops.conv2d(x4, w4, stride=0), r"conv2d: attribute 'stride' expects values >= 1"),
    (lambda: ops.conv2d(x4, w4, padding="FULL"), r"conv2d: attribute 'padding'"),
    (lambda: ops.conv2d(x4, w4, data_format="NCWH"), r"conv2d: attribute 'data_format' expects one of"),
    (lambda: ops.conv2d(x4, w4, dilations=2), r"conv2d: unknown attribute\(s\) \['dilations'\]"),
    (lambda: ops.conv2d(x4[0], w4), r"conv2d: input 'x' expects rank 4"),
    (lambda: ops.conv2d(x4), r"conv2d: input 'weight' is required"),
    (lambda: ops.conv2d(x4, np.zeros((4, 3, 3, 3), np.float32)),
     r"conv2d: input 'x' \(2, 6, 5, 5\) has 6 channels on axis 1 \(data_format='NCHW'\), but 'weight' "
     r"\(4, 3, 3, 3\) takes 3$"),
    (lambda: ops.conv2d(x4.transpose(0, 2, 3, 1), w4),
     r"has 5 channels on axis 1 \(data_format='NCHW'\), but 'weight' \(4, 6, 3, 3\) takes 6; "
     r"the input looks like NHWC data: pass data_format='NHWC'"),
    (lambda: ops.conv1d(x4[:, :, 0], w4[:, :, 0], padding=(1, 2, 3)), r"conv1d: attribute 'padding' expects"),
    (lambda: ops.conv2d(x4.astype(jax.numpy.bfloat16), w4),
     r"conv2d: input 'weight' expects the dtype of 'x' \(bfloat16\); cast one of them, got 'float32'"),
    (lambda: ops.conv2d(x4, w4, np.zeros(5, np.float32)), r"conv2d: input 'bias' expects shape \(4,\)"),
    (lambda: ops.conv2d(x4, np.zeros((4, 6, 9, 9), np.float32)), r"conv2d: attribute 'padding'"),
    (lambda: ops.conv2d_transpose(x4, np.zeros((6, 2, 3, 3), np.float32), output_padding=1),
     r"conv2d_transpose: attribute 'output_padding'"),
    (lambda: ops.depthwise_conv2d(x4, np.zeros((6, 2, 3, 3), np.float32)), r"depthwise_conv2d: input 'weight'"),
    (lambda: ops.batch_norm(x4, np.zeros(5, np.float32), np.ones(6, np.float32)),
     r"batch_norm: input 'running_mean' expects shape \(6,\)"),
    (lambda: ops.batch_norm(x4, np.zeros(6, np.float32)), r"batch_norm: input 'running_var' is required"),
    (lambda: ops.group_norm(x4, groups=4), r"group_norm: attribute 'groups' expects a divisor of the channels \(6\)"),
    (lambda: ops.group_norm(x4), r"group_norm: attribute 'groups' is required"),
    (lambda: ops.layer_norm(x4, begin_norm_axis=4), r"layer_norm: attribute 'begin_norm_axis'"),
    (lambda: ops.linear(x2, np.zeros((5, 3), np.float32)), r"linear: input 'weight' expects shape \[6,"),
    (lambda: ops.matmul(x2, x2), r"matmul: input 'y' expects contracted size 6"),
    (lambda: ops.matmul(x2, x2, transpose_y="yes"), r"matmul: attribute 'transpose_y' expects a bool"),
    (lambda: ops.elementwise_add(x2, np.zeros(4)), r"elementwise_add: inputs 'x' .* do not broadcast"),
    (lambda: ops.embedding(x2, x2), r"embedding: input 'ids' expects a int array"),
    (lambda: ops.embedding(np.zeros(3, np.int32), x2, padding_idx=2), r"embedding: attribute 'padding_idx'"),
    (lambda: ops.softmax(x2, axis=2), r"softmax: attribute 'axis' expects an axis in \[-2, 2\)"),
    (lambda: ops.relu(np.zeros(3, np.int32)), r"relu: input 'x' expects a float array"),
    (lambda: ops.pool2d(x4, pooling_type="min", kernel_size=2), r"pool2d: attribute 'pooling_type'"),
    (lambda: ops.pool2d(x4), r"pool2d: attribute 'kernel_size'"),
    (lambda: ops.pool2d(x4, kernel_size=7), r"pool2d: attribute 'kernel_size'"),
    (lambda: ops.cross_entropy(x2, np.zeros(3, np.int32)), r"cross_entropy: input 'label'"),
    (lambda: ops.cross_entropy(x2, np.zeros(2, np.int32), reduction="avg"), r"cross_entropy: attribute 'reduction'"),
    (lambda: ops.cross_entropy(x2, np.zeros(2, np.int32), label_smoothing=1.5),
     r"cross_entropy: attribute 'label_smoothing'"),
    (lambda: ops.dropout(x2, key, p=1.5), r"dropout: attribute 'p'"),
    (lambda: ops.dropout(x2, key, mode="scale"), r"dropout: attribute 'mode'"),
    (lambda: ops.dropout(x2), r"dropout: input 'key' is required"),
    (lambda: ops.dropout(x2, np.zeros(3, np.uint32)), r"dropout: input 'key' expects a raw uint32\[2\]"),
    (lambda: ops.reshape(x2, shape=(5, -1)), r"reshape: attribute 'shape'"),
    (lambda: ops.reshape(x2, shape=(-1, -1)), r"reshape: attribute 'shape'"),
    (lambda: ops.transpose(x2, perm=(0, 0)), r"transpose: attribute 'perm' expects a permutation of range\(2\)"),
    (lambda: ops.concat(x2, np.zeros((3, 5))), r"concat: input 'x1' expects shape"),
    (lambda: ops.concat(), r"concat: needs at least one 'x' input"),
    (lambda: ops.split(x2, num_or_sections=4, axis=1), r"split: attribute 'num_or_sections'"),
    (lambda: ops.split(x2, num_or_sections=(2, 2), axis=1), r"split: attribute 'num_or_sections'"),
    (lambda: ops.slice(x2, axes=(1,), starts=(0, 1), ends=(2,)), r"slice: attribute 'starts'"),
    (lambda: ops.slice(x2, axes=(2,), starts=0, ends=1), r"slice: attribute 'axes'"),
    (lambda: ops.pad(x2, paddings=(1, 1)), r"pad: attribute 'paddings' expects 2 ints per dimension"),
    (lambda: ops.pad(x2, paddings=(0, 0, 6, 0), mode="reflect"), r"pad: attribute 'paddings'"),
    (lambda: ops.cast(x2, dtype="float128"), r"cast: attribute 'dtype'"),
    (lambda: ops.reduce_mean(x2, axis=(1, -1)), r"reduce_mean: attribute 'axis' expects distinct axes"),
    (lambda: ops.scaled_dot_product_attention(np.zeros((1, 2, 2, 4)), np.zeros((1, 3, 2, 4)),
                                              np.zeros((1, 3, 2, 4)), np.zeros((4, 3), bool)),
     r"scaled_dot_product_attention: input 'mask'"),
    (lambda: ops.scaled_dot_product_attention(np.zeros((1, 2, 2, 4)), np.zeros((1, 3, 2, 3)),
                                              np.zeros((1, 3, 2, 3))),
     r"scaled_dot_product_attention: input 'key'"),
    (lambda: ops.lstm(np.zeros((2, 5, 3), np.float32), np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32),
                      np.zeros((12, 3), np.float32), np.zeros((16, 4), np.float32), np.zeros(16, np.float32),
                      np.zeros(16, np.float32)),
     r"lstm: input 'weight_ih' expects shape \(16, 3\) \(x is \(2, 5, 3\), hidden size 4\), got \(12, 3\)"),
    (lambda: ops.split_key(np.zeros(3, np.uint32)), r"split_key: input 'key' expects raw uint32\[..., 2\]"),
    (lambda: ops.adaptive_pool2d(x4, output_size=0), r"adaptive_pool2d: attribute 'output_size' expects an int >= 1"),
    (lambda: ops.conv3d(np.zeros((1, 5, 5, 5, 4), np.float32), np.zeros((2, 4, 3, 3, 3), np.float32)),
     r"conv3d: input 'x' .* has 5 channels on axis 1 \(data_format='NCDHW'\), .* pass data_format='NDHWC'"),
    (lambda: ops.interpolate(x4), r"interpolate: attribute 'size' expects exactly one of size and scale_factor"),
    (lambda: ops.interpolate(x4, scale_factor=(2.0, 2.0, 2.0)), r"interpolate: attribute 'scale_factor' expects 1 or 2"),
    (lambda: ops.interpolate(x4, size=3, mode="trilinear"), r"interpolate: attribute 'mode' expects 'nearest' or "
                                                            r"'bilinear' for a rank-4 input"),
    (lambda: ops.interpolate(x4, size=3, align_corners=True), r"interpolate: attribute 'align_corners'"),
    (lambda: ops.interpolate(x4[0], size=3), r"interpolate: attribute 'data_format' expects a layout of rank 3"),
    (lambda: ops.interpolate(x4, scale_factor=0.0), r"interpolate: attribute 'scale_factor' expects a positive"),
    (lambda: ops.prelu(x4, np.zeros(5, np.float32)), r"prelu: input 'weight' expects shape \(1,\) or one slope per "
                                                     r"channel \(x \(2, 6, 5, 5\) has 6 channels on axis 1"),
    (lambda: ops.cross_entropy(x2, np.zeros(2, np.int32), np.ones(5, np.float32)),
     r"cross_entropy: input 'weight' expects shape \(6,\) \(one weight per class\)"),
    (lambda: ops.nll_loss(x2, np.zeros((2, 1), np.int32)), r"nll_loss: input 'label' expects input's shape \(2, 6\) "
                                                           r"without axis 1, got \(2, 1\)"),
]


@pytest.mark.parametrize("bad,match", BAD_CALLS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD_CALLS)])
def test_bad_calls_raise_naming_op(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_kernel_checks_also_raise_under_jit():
    with pytest.raises(ValueError, match=r"conv2d: attribute 'groups'"):
        jax.jit(lambda x, w: ops.conv2d(x, w, groups=4))(x4, np.zeros((4, 1, 3, 3), np.float32))
