"""Pass tests written as IR text, in the style of MLIR's FileCheck tests: a program's text in,
one pass (and dce to sweep what it leaves), the printed program out, compared verbatim; and the
rewritten program computes the input's function, within the pass's tolerance, on fresh random
inputs. Parameters are the parser's placeholders (floats in [0.5, 1.5)), so that the folds and
quantizers have real numbers to work on."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def case(pipeline, source, expected, tol=1e-6, *, id):
    """A test: ``pipeline`` turns ``source`` into ``expected``, within ``tol`` (relative)."""
    return pytest.param(pipeline, source, expected, tol, id=id)


CASES = [
    case("dce", """\
program @mlp(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = param @w : f32[3,3]
  %1 = sigmoid(%x) : f32[b,3]
  %2 = matmul(%1, %0) {transpose_x=False, transpose_y=False} : f32[b,3]
  %3 = constant 2.0 : f32[]
  %4 = relu(%x) : f32[b,3]
  return %4
}""", """\
program @mlp(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = relu(%x) : f32[b,3]
  return %0
}""", id="dce_erases_dead_ops_params_and_constants"),
    case("dce", """\
program @branchy(%x: f32[4]) -> (f32[4]) {
  %0 = lax.reduce_sum(%x) {axes=(0,)} : f32[]
  %1 = constant 0.0 : f32[]
  %2 = lax.gt(%0, %1) : bool[]
  %3 = lax.convert_element_type(%2) {new_dtype=int32, weak_type=False} : i32[]
  %4 = cond(%3, %x) : f32[4] (
    branch0(%5: f32[4]) {
      %6 = lax.neg(%5) : f32[4]
      return %6
    }
    branch1(%7: f32[4]) {
      %8 = lax.exp(%7) : f32[4]
      %9 = constant 2.0 : f32[]
      %10 = lax.mul(%7, %9) : f32[4]
      return %10
    }
  )
  return %4
}""", """\
program @branchy(%x: f32[4]) -> (f32[4]) {
  %0 = lax.reduce_sum(%x) {axes=(0,)} : f32[]
  %1 = constant 0.0 : f32[]
  %2 = lax.gt(%0, %1) : bool[]
  %3 = lax.convert_element_type(%2) {new_dtype=int32, weak_type=False} : i32[]
  %4 = cond(%3, %x) : f32[4] (
    branch0(%5: f32[4]) {
      %6 = lax.neg(%5) : f32[4]
      return %6
    }
    branch1(%7: f32[4]) {
      %8 = constant 2.0 : f32[]
      %9 = lax.mul(%7, %8) : f32[4]
      return %9
    }
  )
  return %4
}""", id="dce_inside_cond_branches"),
    case("dce", """\
program @loop(%x: f32[3]) -> (i32[], f32[3]) {
  %0 = constant 0 : i32[]
  %1, %2 = while(%0, %x) {body_nconsts=0, cond_nconsts=0} : i32[], f32[3] (
    cond(%3: i32[], %4: f32[3]) {
      %5 = constant 3 : i32[]
      %6 = lax.lt(%3, %5) : bool[]
      return %6
    }
    body(%7: i32[], %8: f32[3]) {
      %9 = constant 1 : i32[]
      %10 = lax.add(%7, %9) : i32[]
      %11 = lax.sin(%8) : f32[3]
      %12 = constant 0.5 : f32[]
      %13 = lax.mul(%8, %12) : f32[3]
      return %10, %13
    }
  )
  return %1, %2
}""", """\
program @loop(%x: f32[3]) -> (i32[], f32[3]) {
  %0 = constant 0 : i32[]
  %1, %2 = while(%0, %x) {body_nconsts=0, cond_nconsts=0} : i32[], f32[3] (
    cond(%3: i32[], %4: f32[3]) {
      %5 = constant 3 : i32[]
      %6 = lax.lt(%3, %5) : bool[]
      return %6
    }
    body(%7: i32[], %8: f32[3]) {
      %9 = constant 1 : i32[]
      %10 = lax.add(%7, %9) : i32[]
      %11 = constant 0.5 : f32[]
      %12 = lax.mul(%8, %11) : f32[3]
      return %10, %12
    }
  )
  return %1, %2
}""", id="dce_inside_a_while_body"),
    case("cse", """\
program @f(%x: f32[2,3], %y: f32[2,3]) -> (f32[2,3]) {
  %0 = lax.add(%x, %y) : f32[2,3]
  %1 = relu(%0) : f32[2,3]
  %2 = lax.add(%y, %x) : f32[2,3]
  %3 = relu(%2) : f32[2,3]
  %4 = lax.mul(%1, %3) : f32[2,3]
  %5 = lax.tanh(%x) : f32[2,3]
  %6 = lax.tanh(%x) : f32[2,3]
  %7 = lax.sub(%5, %6) : f32[2,3]
  %8 = lax.add(%4, %7) : f32[2,3]
  return %8
}""", """\
program @f(%x: f32[2,3], %y: f32[2,3]) -> (f32[2,3]) {
  %0 = lax.add(%x, %y) : f32[2,3]
  %1 = relu(%0) : f32[2,3]
  %2 = lax.mul(%1, %1) : f32[2,3]
  %3 = lax.tanh(%x) : f32[2,3]
  %4 = lax.sub(%3, %3) : f32[2,3]
  %5 = lax.add(%2, %4) : f32[2,3]
  return %5
}""", id="cse_merges_equal_and_commuted_ops"),
    case("cse", """\
program @f(%x: f32[b,4]) -> (f32[b,4], f32[b,4]) {
  %0 = softmax(%x) {axis=-1} : f32[b,4]
  %1 = softmax(%x) {axis=0} : f32[b,4]
  %2 = softmax(%x) {axis=-1} : f32[b,4]
  %3 = lax.add(%0, %1) : f32[b,4]
  return %3, %2
}""", """\
program @f(%x: f32[b,4]) -> (f32[b,4], f32[b,4]) {
  %0 = softmax(%x) {axis=-1} : f32[b,4]
  %1 = softmax(%x) {axis=0} : f32[b,4]
  %2 = lax.add(%0, %1) : f32[b,4]
  return %2, %0
}""", id="cse_keeps_ops_that_differ_in_attributes"),
    case("canonicalize", """\
program @f(%x: f32[b,4], %y: f32[b,4]) -> (f32[4,b]) {
  %0 = param @w : f32[4,4]
  %1 = lax.dot_general(%x, %0) {dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=float32} : f32[b,4]
  %2 = lax.add(%1, %y) : f32[b,4]
  %3 = lax.max(%2, %y) : f32[b,4]
  %4 = lax.transpose(%3) {permutation=(1, 0)} : f32[4,b]
  return %4
}""", """\
program @f(%x: f32[b,4], %y: f32[b,4]) -> (f32[4,b]) {
  %0 = param @w : f32[4,4]
  %1 = matmul(%x, %0) {transpose_x=False, transpose_y=False} : f32[b,4]
  %2 = elementwise_add(%1, %y) : f32[b,4]
  %3 = elementwise_max(%2, %y) : f32[b,4]
  %4 = transpose(%3) {perm=(1, 0)} : f32[4,b]
  return %4
}""", id="canonicalize_names_generic_ops_by_their_registry_twins"),
    case("fold_constants,dce", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = constant 1.0 : f32[]
  %1 = lax.broadcast_in_dim(%0) {broadcast_dimensions=(), shape=(3,)} : f32[3]
  %2 = constant 0.5 : f32[]
  %3 = lax.mul(%1, %2) : f32[3]
  %4 = lax.exp(%3) : f32[3]
  %5 = lax.broadcast_in_dim(%4) {broadcast_dimensions=(1,), shape=(1, 3)} : f32[1,3]
  %6 = lax.add(%x, %5) : f32[b,3]
  return %6
}""", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = constant @folded3 : f32[1,3]
  %1 = lax.add(%x, %0) : f32[b,3]
  return %1
}""", id="fold_constants_evaluates_constant_subgraphs"),
    case("fold_constants{max_elements=2},dce", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = constant 2.0 : f32[]
  %1 = lax.exp(%0) : f32[]
  %2 = lax.broadcast_in_dim(%1) {broadcast_dimensions=(), shape=(1, 3)} : f32[1,3]
  %3 = lax.mul(%x, %2) : f32[b,3]
  return %3
}""", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = constant 7.389056205749512 : f32[]
  %1 = lax.broadcast_in_dim(%0) {broadcast_dimensions=(), shape=(1, 3)} : f32[1,3]
  %2 = lax.mul(%x, %1) : f32[b,3]
  return %2
}""", id="fold_constants_leaves_results_over_max_elements"),
    case("eliminate_identity,dce", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = constant 1.0 : f32[]
  %1 = lax.mul(%x, %0) : f32[b,3]
  %2 = constant 0.0 : f32[]
  %3 = lax.sub(%1, %2) : f32[b,3]
  %4 = lax.convert_element_type(%3) {new_dtype=float32, weak_type=False} : f32[b,3]
  %5 = lax.transpose(%4) {permutation=(0, 1)} : f32[b,3]
  %6 = relu(%5) : f32[b,3]
  return %6
}""", """\
program @f(%x: f32[b,3]) -> (f32[b,3]) {
  %0 = relu(%x) : f32[b,3]
  return %0
}""", id="eliminate_identity_removes_no_op_arithmetic_and_casts"),
    case("fold_conv_bn,dce", """\
program @ConvBN(%x: f32[b,3,6,6]) -> (f32[b,4,6,6]) {
  %0 = param @conv.bias : f32[4]
  %1 = param @conv.weight : f32[4,3,3,3]
  %2 = param @bn.bias : f32[4]
  %3 = param @bn.mean : f32[4]
  %4 = param @bn.variance : f32[4]
  %5 = param @bn.weight : f32[4]
  %6 = conv2d(%x, %1, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,6,6]
  %7, %8, %9 = batch_norm(%6, %3, %4, %5, %2) {epsilon=1e-05, momentum=0.9, training=False, data_format="NCHW"} : f32[b,4,6,6], f32[4], f32[4]
  %10 = relu(%7) : f32[b,4,6,6]
  return %10
}""", """\
program @ConvBN(%x: f32[b,3,6,6]) -> (f32[b,4,6,6]) {
  %0 = param @conv.weight.folded : f32[4,3,3,3]
  %1 = param @conv.bias.folded : f32[4]
  %2 = conv2d(%x, %0, %1) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,6,6]
  %3 = relu(%2) : f32[b,4,6,6]
  return %3
}""", 1e-05, id="fold_conv_bn_folds_the_statistics_into_the_conv"),
    case("fold_linear_bn,dce", """\
program @LinearBN(%x: f32[b,5]) -> (f32[b,4]) {
  %0 = param @fc.weight : f32[5,4]
  %1 = param @bn.bias : f32[4]
  %2 = param @bn.mean : f32[4]
  %3 = param @bn.variance : f32[4]
  %4 = param @bn.weight : f32[4]
  %5 = linear(%x, %0) : f32[b,4]
  %6, %7, %8 = batch_norm(%5, %2, %3, %4, %1) {epsilon=1e-05, momentum=0.9, training=False, data_format="NCL"} : f32[b,4], f32[4], f32[4]
  return %6
}""", """\
program @LinearBN(%x: f32[b,5]) -> (f32[b,4]) {
  %0 = param @fc.weight.folded : f32[5,4]
  %1 = param @fc.weight.folded_bias : f32[4]
  %2 = linear(%x, %0, %1) : f32[b,4]
  return %2
}""", 1e-05, id="fold_linear_bn_folds_the_statistics_into_the_linear"),
    case("fuse_bias_act,dce", """\
program @f(%x: f32[b,3,5,5]) -> (f32[b,4,3,3]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[4,3,3,3]
  %2 = conv2d(%x, %1) {stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,3,3]
  %3 = reshape(%0) {shape=(1, -1, 1, 1)} : f32[1,4,1,1]
  %4 = elementwise_add(%2, %3) : f32[b,4,3,3]
  %5 = relu(%4) : f32[b,4,3,3]
  return %5
}""", """\
program @f(%x: f32[b,3,5,5]) -> (f32[b,4,3,3]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[4,3,3,3]
  %2 = conv2d(%x, %1, %0) {stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, data_format="NCHW", act="relu"} : f32[b,4,3,3]
  return %2
}""", id="fuse_bias_act_into_a_conv"),
    case("fuse_bias_act,dce", """\
program @f(%x: f32[b,3]) -> (f32[b,4]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[3,4]
  %2 = linear(%x, %1) : f32[b,4]
  %3 = lax.broadcast_in_dim(%0) {broadcast_dimensions=(1,), shape=(1, 4)} : f32[1,4]
  %4 = lax.add(%2, %3) : f32[b,4]
  %5 = gelu(%4) {approximate=False} : f32[b,4]
  return %5
}""", """\
program @f(%x: f32[b,3]) -> (f32[b,4]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[3,4]
  %2 = linear(%x, %1, %0) {act="gelu"} : f32[b,4]
  return %2
}""", id="fuse_bias_act_into_a_linear"),
    case("fuse_elementwise_act,dce", """\
program @f(%x: f32[b,3], %y: f32[b,3]) -> (f32[b,3]) {
  %0 = elementwise_mul(%x, %y) : f32[b,3]
  %1 = sigmoid(%0) : f32[b,3]
  %2 = elementwise_add(%1, %x) : f32[b,3]
  %3 = tanh(%2) : f32[b,3]
  return %3
}""", """\
program @f(%x: f32[b,3], %y: f32[b,3]) -> (f32[b,3]) {
  %0 = elementwise_mul(%x, %y) {act="sigmoid"} : f32[b,3]
  %1 = elementwise_add(%0, %x) {act="tanh"} : f32[b,3]
  return %1
}""", id="fuse_elementwise_act_takes_the_activation"),
    case("eliminate_transposes,dce", """\
program @f(%x: f32[b,2,3,4]) -> (f32[b,2,3,4]) {
  %0 = lax.transpose(%x) {permutation=(0, 2, 3, 1)} : f32[b,3,4,2]
  %1 = relu(%0) : f32[b,3,4,2]
  %2 = lax.transpose(%1) {permutation=(0, 3, 1, 2)} : f32[b,2,3,4]
  return %2
}""", """\
program @f(%x: f32[b,2,3,4]) -> (f32[b,2,3,4]) {
  %0 = relu(%x) : f32[b,2,3,4]
  return %0
}""", id="eliminate_transposes_cancels_inverse_pairs"),
    case("eliminate_transposes,dce", """\
program @f(%x: f32[2,3,4]) -> (f32[3,4,2]) {
  %0 = lax.transpose(%x) {permutation=(1, 0, 2)} : f32[3,2,4]
  %1 = transpose(%0) {perm=(0, 2, 1)} : f32[3,4,2]
  return %1
}""", """\
program @f(%x: f32[2,3,4]) -> (f32[3,4,2]) {
  %0 = transpose(%x) {perm=(1, 2, 0)} : f32[3,4,2]
  return %0
}""", id="eliminate_transposes_composes_chains"),
    case("fuse_attention,dce", """\
program @attention(%q: f32[2,5,3,4], %k: f32[2,5,3,4], %v: f32[2,5,3,4], %mask: f32[2,1,5,5]) -> (f32[2,5,3,4]) {
  %0 = transpose(%q) {perm=(0, 2, 1, 3)} : f32[2,3,5,4]
  %1 = transpose(%k) {perm=(0, 2, 1, 3)} : f32[2,3,5,4]
  %2 = transpose(%v) {perm=(0, 2, 1, 3)} : f32[2,3,5,4]
  %3 = constant 0.5 : f32[]
  %4 = lax.mul(%0, %3) : f32[2,3,5,4]
  %5 = matmul(%4, %1) {transpose_x=False, transpose_y=True} : f32[2,3,5,5]
  %6 = elementwise_add(%5, %mask) : f32[2,3,5,5]
  %7 = softmax(%6) {axis=-1} : f32[2,3,5,5]
  %8 = matmul(%7, %2) {transpose_x=False, transpose_y=False} : f32[2,3,5,4]
  %9 = transpose(%8) {perm=(0, 2, 1, 3)} : f32[2,5,3,4]
  return %9
}""", """\
program @attention(%q: f32[2,5,3,4], %k: f32[2,5,3,4], %v: f32[2,5,3,4], %mask: f32[2,1,5,5]) -> (f32[2,5,3,4]) {
  %0 = scaled_dot_product_attention(%q, %k, %v, %mask) {is_causal=False, scale=0.5} : f32[2,5,3,4]
  return %0
}""", id="fuse_attention_paddle_style"),
    case("fuse_attention,dce", """\
program @attention(%q: f32[b,2,5,4], %k: f32[b,2,5,4], %v: f32[b,2,5,4]) -> (f32[b,2,5,4]) {
  %0 = matmul(%q, %k) {transpose_x=False, transpose_y=True} : f32[b,2,5,5]
  %1 = softmax(%0) {axis=-1} : f32[b,2,5,5]
  %2 = matmul(%1, %v) {transpose_x=False, transpose_y=False} : f32[b,2,5,4]
  return %2
}""", """\
program @attention(%q: f32[b,2,5,4], %k: f32[b,2,5,4], %v: f32[b,2,5,4]) -> (f32[b,2,5,4]) {
  %0 = transpose(%q) {perm=(0, 2, 1, 3)} : f32[b,5,2,4]
  %1 = transpose(%k) {perm=(0, 2, 1, 3)} : f32[b,5,2,4]
  %2 = transpose(%v) {perm=(0, 2, 1, 3)} : f32[b,5,2,4]
  %3 = scaled_dot_product_attention(%0, %1, %2) {is_causal=False, scale=1.0} : f32[b,5,2,4]
  %4 = transpose(%3) {perm=(0, 2, 1, 3)} : f32[b,2,5,4]
  return %4
}""", id="fuse_attention_unscaled_heads_first"),
    case("convert_layout{to=NHWC}", """\
program @f(%x: f32[b,3,4,4]) -> (f32[b,4,2,2]) {
  %0 = param @w : f32[4,3,3,3]
  %1 = conv2d(%x, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,4,4]
  %2 = relu(%1) : f32[b,4,4,4]
  %3 = pool2d(%2) {pooling_type="max", kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False, global_pooling=False, exclusive=True, data_format="NCHW"} : f32[b,4,2,2]
  return %3
}""", """\
program @f(%x: f32[b,3,4,4]) -> (f32[b,4,2,2]) {
  %0 = param @w : f32[4,3,3,3]
  %1 = transpose(%x) {perm=(0, 2, 3, 1)} : f32[b,4,4,3]
  %2 = conv2d(%1, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NHWC"} : f32[b,4,4,4]
  %3 = relu(%2) : f32[b,4,4,4]
  %4 = pool2d(%3) {pooling_type="max", kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False, global_pooling=False, exclusive=True, data_format="NHWC"} : f32[b,2,2,4]
  %5 = transpose(%4) {perm=(0, 3, 1, 2)} : f32[b,4,2,2]
  return %5
}""", id="convert_layout_to_nhwc"),
    case("amp", """\
program @mlp(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @b1 : f32[8]
  %1 = param @w1 : f32[4,8]
  %2 = param @w2 : f32[8,3]
  %3 = linear(%x, %1, %0) : f32[b,8]
  %4 = relu(%3) : f32[b,8]
  %5 = matmul(%4, %2) {transpose_x=False, transpose_y=False} : f32[b,3]
  %6 = softmax(%5) {axis=-1} : f32[b,3]
  return %6
}""", """\
program @mlp(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @b1 : f32[8]
  %1 = param @w1 : f32[4,8]
  %2 = param @w2 : f32[8,3]
  %3 = cast(%x) {dtype=bfloat16} : bf16[b,4]
  %4 = cast(%1) {dtype=bfloat16} : bf16[4,8]
  %5 = cast(%0) {dtype=bfloat16} : bf16[8]
  %6 = linear(%3, %4, %5) : bf16[b,8]
  %7 = relu(%6) : bf16[b,8]
  %8 = cast(%2) {dtype=bfloat16} : bf16[8,3]
  %9 = matmul(%7, %8) {transpose_x=False, transpose_y=False} : bf16[b,3]
  %10 = cast(%9) {dtype=float32} : f32[b,3]
  %11 = softmax(%10) {axis=-1} : f32[b,3]
  return %11
}""", 0.02, id="amp_casts_white_list_ops_to_bfloat16"),
    case("donate", """\
program @sgd_step(%w: f32[8,4], %g: f32[8,4]) -> (f32[8,4], f32[]) {
  %0 = param @lr : f32[]
  %1 = lax.mul(%0, %g) : f32[8,4]
  %2 = lax.sub(%w, %1) : f32[8,4]
  %3 = lax.mul(%g, %g) : f32[8,4]
  %4 = lax.reduce_sum(%3) {axes=(0, 1)} : f32[]
  return %2, %4
}""", """\
program @sgd_step(%w: f32[8,4], %g: f32[8,4]) -> (f32[8,4], f32[]) {
  %0 = param @lr : f32[]
  %1 = lax.mul(%0, %g) : f32[8,4]
  %2 = lax.sub(%w, %1) : f32[8,4]
  %3 = lax.mul(%g, %g) : f32[8,4]
  %4 = lax.reduce_sum(%3) {axes=(0, 1)} : f32[]
  return %2, %4 {donate=(0,)}
}""", id="donate_marks_the_input_an_output_may_take"),
    case("inplace{sizes=b=8}", """\
program @f(%x: f32[b,4]) -> (f32[b,4]) {
  %0 = relu(%x) : f32[b,4]
  %1 = constant 2.0 : f32[]
  %2 = lax.mul(%0, %1) : f32[b,4]
  return %2
}""", """\
program @f(%x: f32[b,4]) -> (f32[b,4]) {
  %0 = relu(%x) : f32[b,4]
  %1 = constant 2.0 : f32[]
  %2 = lax.mul(%0, %1) : f32[b,4]
  return %2
}""", id="inplace_is_an_analysis_that_changes_nothing"),
    case("insert_fake_quant", """\
program @f(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @fc.b : f32[3]
  %1 = param @fc.w : f32[4,3]
  %2 = linear(%x, %1, %0) : f32[b,3]
  return %2
}""", """\
program @f(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @fc.b : f32[3]
  %1 = param @fc.w : f32[4,3]
  %2 = param @fc.w.quant_scale : f32[3]
  %3 = param @fc.w.input_scale : f32[]
  %4 = fake_quantize(%1, %2) {bits=8, axis=1} : f32[4,3]
  %5 = fake_quantize(%x, %3) {bits=8} : f32[b,4]
  %6 = linear(%5, %4, %0) : f32[b,3]
  return %6
}""", 0.02, id="insert_fake_quant_before_weights_and_activations"),
    case("convert_int8,dce", """\
program @f(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @fc.b : f32[3]
  %1 = param @fc.w : f32[4,3]
  %2 = param @fc.w.quant_scale : f32[3]
  %3 = param @fc.w.input_scale : f32[]
  %4 = fake_quantize(%1, %2) {bits=8, axis=1} : f32[4,3]
  %5 = fake_quantize(%x, %3) {bits=8} : f32[b,4]
  %6 = linear(%5, %4, %0) : f32[b,3]
  return %6
}""", """\
program @f(%x: f32[b,4]) -> (f32[b,3]) {
  %0 = param @fc.b : f32[3]
  %1 = param @fc.w.quant_scale : f32[3]
  %2 = param @fc.w.input_scale : f32[]
  %3 = param @fc.w.int8 : i8[4,3]
  %4 = quantize(%x, %2) {bits=8} : i8[b,4]
  %5 = quantized_linear(%4, %3, %2, %1, %0) : f32[b,3]
  return %5
}""", 1e-05, id="convert_int8_runs_the_fake_quantized_linear_in_int8"),
    case("convert_int8,dce", """\
program @f(%x: f32[b,6]) -> (f32[b,3]) {
  %0 = param @fc.w : f32[6,3]
  %1 = param @fc.w.quant_scale : f32[3]
  %2 = fake_quantize(%0, %1) {bits=4, axis=1} : f32[6,3]
  %3 = linear(%x, %2) : f32[b,3]
  return %3
}""", """\
program @f(%x: f32[b,6]) -> (f32[b,3]) {
  %0 = param @fc.w.int4 : u8[3,3]
  %1 = param @fc.w.weight_scale : f32[3]
  %2 = weight_only_linear(%x, %0, %1) {bits=4} : f32[b,3]
  return %2
}""", 1e-05, id="convert_int8_packs_weight_only_int4"),
    case("remat{budget=37864,sizes=b=8}", """\
program @cnn(%x: f32[b,3,8,8]) -> (f32[b,10]) {
  %0 = param @w1 : f32[8,3,3,3]
  %1 = param @w2 : f32[8,8,3,3]
  %2 = param @w3 : f32[512,10]
  %3 = conv2d(%x, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,8,8,8]
  %4 = relu(%3) : f32[b,8,8,8]
  %5 = conv2d(%4, %1) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,8,8,8]
  %6 = relu(%5) : f32[b,8,8,8]
  %7 = lax.reshape(%6) {new_sizes=(b, 512)} : f32[b,512]
  %8 = matmul(%7, %2) {transpose_x=False, transpose_y=False} : f32[b,10]
  return %8
}""", """\
program @cnn(%x: f32[b,3,8,8]) -> (f32[b,10]) {
  %0 = param @w1 : f32[8,3,3,3]
  %1 = param @w2 : f32[8,8,3,3]
  %2 = param @w3 : f32[512,10]
  %3 = conv2d(%x, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW", remat_segment=0} : f32[b,8,8,8]
  %4 = relu(%3) {remat_segment=0} : f32[b,8,8,8]
  %5 = conv2d(%4, %1) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW", remat_segment=0} : f32[b,8,8,8]
  %6 = relu(%5) {remat_segment=1} : f32[b,8,8,8]
  %7 = lax.reshape(%6) {new_sizes=(b, 512), remat_segment=1} : f32[b,512]
  %8 = matmul(%7, %2) {transpose_x=False, transpose_y=False, remat_segment=1} : f32[b,10]
  return %8
}""", id="remat_marks_segments_within_the_budget"),
    case("convert_fp8{emulate=true},dce", """\
program @f(%x: f32[b,16]) -> (f32[b,8]) {
  %0 = param @fc.b : f32[8]
  %1 = param @fc.w : f32[16,8]
  %2 = linear(%x, %1, %0) : f32[b,8]
  return %2
}""", """\
program @f(%x: f32[b,16]) -> (f32[b,8]) {
  %0 = param @fc.b : f32[8]
  %1 = param @fc.w.fp8 : f8e4m3fn[16,8]
  %2 = param @fc.w.fp8_scale : f32[8]
  %3 = fp8_linear(%x, %1, %2, %0) : f32[b,8]
  return %3
}""", 0.06, id="convert_fp8_emulated_linear"),
]


def random_inputs(prog, seed, batch=3):
    rng = np.random.default_rng(seed)
    shapes = [tuple(batch if isinstance(d, str) else d for d in v.type.shape) for v in prog.inputs]
    return [rng.normal(size=s).astype(np.dtype(jnp.dtype(v.type.dtype))) for s, v in zip(shapes, prog.inputs)]


def assert_same_function(before, after, tol):
    """Equal outputs on two random batches, within ``tol`` of each output's largest magnitude."""
    for seed in range(2):
        x = random_inputs(before, seed)
        for want, got in zip(jax.tree_util.tree_leaves(before(*x)), jax.tree_util.tree_leaves(after(*x)), strict=True):
            want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
            assert np.abs(got - want).max() <= tol * max(np.abs(want).max(), 1.0)


@pytest.mark.parametrize("pipeline, source, expected, tol", CASES)
def test_pass_rewrites_the_text(pipeline, source, expected, tol):
    before = pj.parse(source)
    assert str(before) == source
    after = pj.passes.run(before, pipeline)
    assert str(after) == expected
    if pipeline == "insert_fake_quant":  # activation scales come from calibration
        pj.slim.calibrate(after, [tuple(random_inputs(before, seed)) for seed in range(2)], algo="abs_max",
                          progress=False)
    assert_same_function(before, after, tol)
