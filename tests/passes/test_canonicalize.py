"""canonicalize: generic lax ops become their registry twins, exactly, so later passes see one vocabulary."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj

SOURCE = """\
program @block(%x: f32[b,4], %y: f32[b,4], %w: f32[4,3]) -> (f32[b,3], f32[4,b], i32[b,4], f32[b,4]) {
  %0 = lax.add(%x, %y) : f32[b,4]
  %1 = lax.logistic(%0) {accuracy=None} : f32[b,4]
  %2 = lax.dot_general(%1, %w) {dimension_numbers=(((1,), (0,)), ((), ())), precision=None, \
preferred_element_type=float32} : f32[b,3]
  %3 = lax.transpose(%x) {permutation=(1, 0)} : f32[4,b]
  %4 = lax.convert_element_type(%y) {new_dtype=int32, weak_type=False} : i32[b,4]
  %5 = lax.div(%4, %4) : i32[b,4]
  %6 = lax.max(%x, %y) : f32[b,4]
  return %2, %3, %5, %6
}"""

EXPECTED = """\
program @block(%x: f32[b,4], %y: f32[b,4], %w: f32[4,3]) -> (f32[b,3], f32[4,b], i32[b,4], f32[b,4]) {
  %0 = elementwise_add(%x, %y) : f32[b,4]
  %1 = sigmoid(%0) : f32[b,4]
  %2 = matmul(%1, %w) {transpose_x=False, transpose_y=False} : f32[b,3]
  %3 = transpose(%x) {perm=(1, 0)} : f32[4,b]
  %4 = cast(%y) {dtype=int32} : i32[b,4]
  %5 = lax.div(%4, %4) : i32[b,4]
  %6 = elementwise_max(%x, %y) : f32[b,4]
  return %2, %3, %5, %6
}"""


def test_generic_ops_become_their_twins_and_integer_division_stays():
    before = pj.parse(SOURCE.replace("\\\n", ""))
    after = pj.passes.run(before, "canonicalize")
    assert str(after) == EXPECTED
    rng = np.random.default_rng(0)
    x, y = (rng.uniform(1, 2, (5, 4)).astype(np.float32) for _ in range(2))
    w = rng.normal(size=(4, 3)).astype(np.float32)
    for a, b in zip(before(x, y, w), after(x, y, w)):
        np.testing.assert_array_equal(a, b)


def test_canonicalize_reports_what_it_rewrote():
    pm = pj.passes.PassManager("canonicalize")
    pm.run(pj.trace(lambda x: jnp.tanh(x) + x, jnp.ones(3)))
    assert pm.records[0].stats == {"canonicalized": 2}
    pm.run(pj.trace(lambda x: jnp.sin(x), jnp.ones(3)))
    assert not pm.records[0].changed


def test_ops_in_control_flow_blocks_are_canonicalized_too():
    prog = pj.trace(lambda x: jax.lax.fori_loop(0, 2, lambda i, c: c * 2.0, x), jnp.ones(3))
    out = pj.passes.run(prog, "canonicalize")
    inner = [op.type for op in out.walk() if op.parent is not out.body]
    assert "elementwise_mul" in inner and "lax.mul" not in inner
    np.testing.assert_array_equal(out(jnp.arange(3.0)), prog(jnp.arange(3.0)))


def test_attention_written_with_einsum_fuses_after_canonicalize():
    def attention(q, k, v):
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 2.0
        return jnp.einsum("bhqk,bhkd->bhqd", pj.ops.softmax(logits), v)

    q = jax.random.normal(jax.random.key(0), (2, 2, 3, 4))
    prog = pj.trace(attention, q, q, q)
    assert [op.type for op in prog.walk()].count("lax.dot_general") == 2
    fused = pj.passes.run(prog, "canonicalize,fuse_attention,dce")
    assert [op.type for op in fused.walk()] == ["transpose", "transpose", "transpose", "scaled_dot_product_attention",
                                                 "transpose", "return"]
    np.testing.assert_allclose(fused(q, q, q), prog(q, q, q), rtol=1e-5, atol=1e-6)


def test_cse_merges_commutative_twins_and_identity_elimination_reads_units_from_traits():
    prog = pj.trace(lambda x, y: (x + y) * (y + x) + (0.0 + x) * 1.0, jnp.ones(3), jnp.ones(3))
    out = pj.passes.run(prog, "eliminate_identity,cse,dce")
    assert [op.type for op in out.walk()].count("lax.add") == 2  # x + y once, and the final sum
    np.testing.assert_array_equal(out(jnp.arange(3.0), jnp.ones(3)), prog(jnp.arange(3.0), jnp.ones(3)))


@pytest.mark.parametrize("written", [
    lambda x: x * pj.ops.relu6(x + 3.0) / 6.0,
    lambda x: x * pj.ops.relu6(3.0 + x) * (1.0 / 6.0),
    lambda x: x * (pj.ops.relu6(x + 3.0) / 6.0),
])
def test_hard_swish_written_out_becomes_the_op_and_fuses_into_the_conv(written):
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 3, 3, 3))
    prog = pj.trace(lambda p, x: written(pj.ops.conv2d(x, p["w"])), jnp.ones((1, 3, 6, 6)), params={"w": w})
    canonical = pj.passes.run(prog, "canonicalize")
    assert [op.type for op in canonical.walk() if op.type not in ("param", "constant", "return")] == [
        "conv2d", "hard_swish"]
    fused = pj.passes.run(canonical, "fuse_bias_act")
    assert [(op.type, op.attrs.get("act")) for op in fused.walk() if op.type == "conv2d"] == [("conv2d", "hard_swish")]
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 3, 6, 6)) * 3
    np.testing.assert_allclose(fused(x), prog(x), rtol=1e-5, atol=1e-5)


def test_hard_swish_pieces_read_elsewhere_are_left_alone():
    prog = pj.trace(lambda x: (x * pj.ops.relu6(x + 3.0) / 6.0, pj.ops.relu6(x + 3.0) * 1.0), jnp.ones(4))
    types = [op.type for op in pj.passes.run(prog, "cse,canonicalize").walk()]
    assert "hard_swish" not in types


def test_the_inference_pipeline_starts_with_canonicalize():
    assert pj.passes.inference_pipeline().split(",")[0] == "canonicalize"


@pytest.mark.parametrize("fn", [
    lambda x, y: x - y * 3.0, lambda x, y: jnp.minimum(x, y) ** y, lambda x, y: jnp.tanh(x).reshape(-1),
    lambda x, y: jnp.concatenate([x, y], 1), lambda x, y: x @ y.T, lambda x, y: x.T @ y,
    lambda x, y: jnp.einsum("bi,bj->bij", x, y) @ jnp.ones((3, 2)), lambda x, y: (x > y).astype(jnp.float32),
], ids=["sub_mul", "min_pow", "tanh_reshape", "concat", "matmul_transposed", "transposed_x", "batched", "cast"])
def test_twins_compute_exactly_what_the_generic_ops_did(fn):
    x, y = (jax.random.uniform(jax.random.key(i), (4, 3), minval=0.5, maxval=2.0) for i in range(2))
    prog = pj.trace(fn, x, y)
    out = pj.passes.run(prog, "canonicalize")
    np.testing.assert_array_equal(out(x, y), prog(x, y))
    g = jax.grad(lambda p, a: out.apply(p, a, y).sum(), argnums=1)(out.params, x)
    np.testing.assert_allclose(g, jax.grad(lambda a: fn(a, y).sum())(x), rtol=1e-6)


def _sweep_cases():
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[1] / "capture_sweep_cases.py"
    spec = importlib.util.spec_from_file_location("capture_sweep_cases", path)
    module = sys.modules.get(spec.name)
    if module is None:
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return [c for c in module.CASES if not c.refusal][::8]  # every family, a few of each


@pytest.mark.parametrize("case", _sweep_cases(), ids=lambda c: c.name)
def test_canonicalize_and_cleanup_keep_everyday_jax_code_bit_exact(case):
    prog = pj.trace(case.fn if case.module is None else case.module, *case.args)
    out = pj.passes.run(prog, "canonicalize,eliminate_identity,cse,dce")
    for a, b in zip(jax.tree_util.tree_leaves(prog(*case.args)), jax.tree_util.tree_leaves(out(*case.args))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
