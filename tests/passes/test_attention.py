"""fuse_attention: written-out attention becomes one scaled_dot_product_attention op, with the
printed IR before and after, the same numbers on fresh inputs, and programs it must leave alone."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import nn, ops

B, S, H, D = 2, 5, 3, 4  # batch, sequence, heads, head_dim
BSHD = jax.ShapeDtypeStruct((B, S, H, D), jnp.float32)
BHSD = jax.ShapeDtypeStruct((B, H, S, D), jnp.float32)
FLOAT_MASK = jax.ShapeDtypeStruct((B, 1, S, S), jnp.float32)
BOOL_MASK = jax.ShapeDtypeStruct((B, H, S, S), jnp.bool_)


def apply(prog, **options):
    """fuse_attention (then dce) applied to a copy of ``prog``: (program, PassResult)."""
    out = prog.clone()
    result = pj.passes.get_pass("fuse_attention", **options).apply(out, pj.passes.PassContext())
    pj.passes.get_pass("dce").apply(out, pj.passes.PassContext())
    out.verify()
    return out, result


def random_inputs(prog, seed):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(prog.inputs))
    return [jax.random.bernoulli(k, 0.7, v.type.shape) if v.type.dtype == "bool"
            else jax.random.normal(k, v.type.shape) for k, v in zip(keys, prog.inputs)]


def assert_same_function(before, after):
    for seed in range(2):
        args = random_inputs(before, seed)
        np.testing.assert_allclose(after(*args), before(*args), rtol=1e-5, atol=1e-6)


def assert_unchanged(prog):
    out, result = apply(prog)
    assert not result.changed
    assert str(out) == str(prog)


def op_types(prog):
    return [op.type for op in prog.walk()]


def paddle_attention(q, k, v, mask):
    """MultiHeadAttention's written-out form: [batch, seq, heads, dim] in and out."""
    q, k, v = (ops.transpose(t, perm=(0, 2, 1, 3)) for t in (q, k, v))
    logits = ops.matmul(q * (1 / math.sqrt(D)), k, transpose_y=True)
    weights = ops.softmax(ops.elementwise_add(logits, mask), axis=-1)
    return ops.transpose(ops.matmul(weights, v), perm=(0, 2, 1, 3))


def test_paddle_style_attention_becomes_one_op_without_transposes():
    prog = pj.trace(paddle_attention, BSHD, BSHD, BSHD, FLOAT_MASK)
    assert str(prog) == """\
program @paddle_attention(%q: f32[2,5,3,4], %k: f32[2,5,3,4], %v: f32[2,5,3,4], %mask: f32[2,1,5,5]) -> (f32[2,5,3,4]) {
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
}"""
    fused, result = apply(prog)
    assert result.changed and result.stats == {"attention": 1}
    assert str(fused) == """\
program @paddle_attention(%q: f32[2,5,3,4], %k: f32[2,5,3,4], %v: f32[2,5,3,4], %mask: f32[2,1,5,5]) -> (f32[2,5,3,4]) {
  %0 = scaled_dot_product_attention(%q, %k, %v, %mask) {is_causal=False, scale=0.5} : f32[2,5,3,4]
  return %0
}"""
    assert_same_function(prog, fused)


def logits_scaled(q, k, v):
    return ops.matmul(ops.softmax(ops.elementwise_mul(ops.matmul(q, k, transpose_y=True), jnp.float32(0.25))), v)


def logits_divided_and_masked(q, k, v, mask):
    logits = ops.matmul(q, ops.transpose(k, perm=(0, 1, 3, 2))) / math.sqrt(D)
    return ops.matmul(ops.softmax(ops.elementwise_add(mask, logits), axis=3), v)


def bool_masked(q, k, v, mask):
    logits = jnp.where(mask, ops.matmul(q * 0.5, k, transpose_y=True), -1e9)
    return ops.matmul(ops.softmax(logits), v)


def unscaled(q, k, v):
    return ops.matmul(ops.softmax(ops.matmul(q, k, transpose_y=True)), v)


@pytest.mark.parametrize("fn,inputs,scale", [
    (logits_scaled, (BHSD,) * 3, 0.25),
    (logits_divided_and_masked, (BHSD,) * 3 + (FLOAT_MASK,), 0.5),
    (bool_masked, (BHSD,) * 3 + (BOOL_MASK,), 0.5),
    (unscaled, (BHSD,) * 3, 1.0),
])
def test_hand_written_attention_is_fused(fn, inputs, scale):
    prog = pj.trace(fn, *inputs)
    fused, result = apply(prog)
    assert result.changed
    (sdpa,) = [op for op in fused.walk() if op.type == "scaled_dot_product_attention"]
    assert sdpa.attrs["scale"] == pytest.approx(scale)
    assert len(sdpa.operands) == len(inputs)  # the mask is passed on when there is one
    assert "softmax" not in op_types(fused) and "matmul" not in op_types(fused)
    # [batch, heads, seq, dim] values are moved to the op's layout and back
    assert op_types(fused).count("transpose") == 4
    assert_same_function(prog, fused)


def test_attention_weights_returned_by_multi_head_attention_keep_the_written_out_form():
    nn.seed(0)
    mha = nn.MultiHeadAttention(8, 2, need_weights=True)
    mha.eval()
    prog = pj.to_static(mha, pj.InputSpec((None, 3, 8)))
    assert "softmax" in op_types(prog)
    assert_unchanged(prog)


def test_softmax_over_another_axis_is_left_alone():
    assert_unchanged(pj.trace(lambda q, k, v: ops.matmul(ops.softmax(ops.matmul(q, k, transpose_y=True), axis=2), v),
                              BHSD, BHSD, BHSD))


def test_logits_with_a_second_reader_are_left_alone():
    def attention_and_logits(q, k, v):
        logits = ops.matmul(q, k, transpose_y=True)
        return ops.matmul(ops.softmax(logits), v), logits

    assert_unchanged(pj.trace(attention_and_logits, BHSD, BHSD, BHSD))


def test_a_small_masking_constant_is_not_taken_for_a_mask():
    def weakly_masked(q, k, v, mask):  # -1 leaves masked keys a real weight
        return ops.matmul(ops.softmax(jnp.where(mask, ops.matmul(q, k, transpose_y=True), -1.0)), v)

    assert_unchanged(pj.trace(weakly_masked, BHSD, BHSD, BHSD, BOOL_MASK))


def test_implementation_option_is_set_on_the_fused_op():
    prog = pj.trace(paddle_attention, BSHD, BSHD, BSHD, FLOAT_MASK)
    fused = pj.passes.run(prog, "fuse_attention{implementation=xla}")
    (sdpa,) = [op for op in fused.walk() if op.type == "scaled_dot_product_attention"]
    assert sdpa.attrs["implementation"] == "xla"
    assert_same_function(prog, fused)


def test_implementation_option_is_set_on_attention_already_fused():
    nn.seed(0)
    mha = nn.MultiHeadAttention(8, 2)
    mha.eval()
    prog = pj.trace(mha, jax.ShapeDtypeStruct((2, 5, 8), jnp.float32))
    pm = pj.passes.PassManager("fuse_attention{implementation=xla}")
    out = pm.run(prog)
    (sdpa,) = [op for op in out.walk() if op.type == "scaled_dot_product_attention"]
    assert sdpa.attrs["implementation"] == "xla" and pm.records[0].stats == {"kernel": 1}
    assert_same_function(prog, out)
    again = pj.passes.PassManager("fuse_attention{implementation=xla}")
    again.run(out)
    assert not again.records[0].changed  # an op that has a kernel keeps it


def test_cudnn_takes_xlas_kernel_where_its_inputs_do_not_fit(monkeypatch):
    # a float32 program marked for cuDNN before amp casts it: the f32 op still runs (XLA's kernel)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    prog = pj.trace(paddle_attention, BSHD, BSHD, BSHD, FLOAT_MASK)
    fused = pj.passes.run(prog, "fuse_attention{implementation=cudnn}")
    (sdpa,) = [op for op in fused.walk() if op.type == "scaled_dot_product_attention"]
    assert sdpa.attrs["implementation"] == "cudnn"
    assert_same_function(prog, fused)


def test_cudnn_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    prog = pj.trace(paddle_attention, BSHD, BSHD, BSHD, FLOAT_MASK)
    with pytest.raises(pj.passes.PassError, match="'cudnn', which needs an NVIDIA GPU; the JAX backend here is 'cpu'"):
        pj.passes.run(prog, "fuse_attention{implementation=cudnn}")
    q = jnp.ones((1, 2, 1, 8), jnp.float16)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: attribute 'implementation' is 'cudnn'"):
        ops.scaled_dot_product_attention(q, q, q, implementation="cudnn")


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="option 'implementation' expects None, 'xla' or 'cudnn', got 'flash'"):
        pj.passes.get_pass("fuse_attention", implementation="flash")


def test_inference_pipeline_fuses_attention():
    assert "fuse_attention" in pj.passes.inference_pipeline().split(",")
