"""Cleanup passes: the printed IR before and after, and the same numbers on fresh inputs."""
import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj


def check_same_function(before, after, *shapes, atol=1e-6):
    for seed in range(3):
        keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
        xs = [jax.random.normal(k, s) for k, s in zip(keys, shapes)]
        np.testing.assert_allclose(after(*xs), before(*xs), atol=atol, rtol=1e-6)


def test_dce_removes_unused_ops_params_and_constants():
    def f(p, x):
        pj.ops.sigmoid(x @ p["w"])  # computed, never used
        return x * 2.0

    prog = pj.trace(f, jnp.ones((2, 3)), params={"w": jnp.ones((3, 3))})
    assert str(prog) == """\
program @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = param @w : f32[3,3]
  %1 = lax.dot_general(%x, %0) {dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=float32} : f32[2,3]
  %2 = sigmoid(%1) : f32[2,3]
  %3 = constant 2.0 : f32[]
  %4 = lax.mul(%x, %3) : f32[2,3]
  return %4
}"""
    out = pj.passes.run(prog, "dce")
    assert str(out) == """\
program @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = constant 2.0 : f32[]
  %1 = lax.mul(%x, %0) : f32[2,3]
  return %1
}"""
    assert out.used_params() == {}
    check_same_function(prog, out, (2, 3))


def test_cse_merges_repeated_work_but_not_different_attributes():
    def f(x):
        return pj.ops.softmax(x, axis=0) + pj.ops.softmax(x, axis=0) + pj.ops.softmax(x, axis=1)

    prog = pj.trace(f, jnp.ones((2, 3)))
    out = pj.passes.run(prog, "cse,dce")
    assert str(out) == """\
program @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = softmax(%x) {axis=0} : f32[2,3]
  %1 = lax.add(%0, %0) : f32[2,3]
  %2 = softmax(%x) {axis=1} : f32[2,3]
  %3 = lax.add(%1, %2) : f32[2,3]
  return %3
}"""
    check_same_function(prog, out, (2, 3))


def test_random_ops_are_neither_merged_nor_folded_nor_dropped():
    def f(x):
        unused = jax.lax.rng_uniform(jnp.float32(0), jnp.float32(1), (3,))  # noqa: F841  (advances the generator)
        a = jax.lax.rng_uniform(jnp.float32(0), jnp.float32(1), (3,))
        b = jax.lax.rng_uniform(jnp.float32(0), jnp.float32(1), (3,))
        return x + a * b

    prog = pj.trace(f, jnp.ones(3))
    out = pj.passes.run(prog, "cse,fold_constants,dce")
    assert str(out) == """\
program @f(%x: f32[3]) -> (f32[3]) {
  %0 = constant 0.0 : f32[]
  %1 = constant 1.0 : f32[]
  %2 = lax.rng_uniform(%0, %1) {shape=(3,)} : f32[3]
  %3 = lax.rng_uniform(%0, %1) {shape=(3,)} : f32[3]
  %4 = lax.rng_uniform(%0, %1) {shape=(3,)} : f32[3]
  %5 = lax.mul(%3, %4) : f32[3]
  %6 = lax.add(%x, %5) : f32[3]
  return %6
}"""


def test_cse_inside_sub_blocks():
    def f(x):
        return jax.lax.cond(x[0] > 0, lambda a: jnp.sin(a) * jnp.sin(a), lambda a: a, x)

    prog = pj.trace(f, jnp.ones(3))
    out = pj.passes.run(prog, "cse,dce")
    branch = next(op for op in out.walk() if op.type == "cond").blocks[1]
    assert [op.type for op in branch.ops] == ["lax.sin", "lax.mul", "return"]
    check_same_function(prog, out, (3,))


def test_fold_constants_evaluates_constant_subgraphs():
    table = np.arange(4.0, dtype=np.float32)

    def f(x):
        return x + jnp.exp(jnp.asarray(table)) * jnp.float32(2.0)

    prog = pj.trace(f, jnp.ones(4))
    out = pj.passes.run(prog, "fold_constants,dce")
    assert str(out) == """\
program @f(%x: f32[4]) -> (f32[4]) {
  %0 = constant @folded2 : f32[4]
  %1 = lax.add(%x, %0) : f32[4]
  return %1
}"""
    np.testing.assert_allclose(out.constants["folded2"], np.exp(table) * 2, rtol=1e-6)
    check_same_function(prog, out, (4,))


def test_fold_constants_respects_the_size_limit():
    prog = pj.trace(lambda x: x + jnp.exp(jnp.arange(100.0)), jnp.ones(100))
    out = pj.passes.run(prog, "fold_constants{max_elements=10}")
    assert "lax.exp" in str(out)


def test_eliminate_identity():
    key = jax.random.PRNGKey(0)

    def f(x):
        y = pj.ops.reshape(x, shape=(2, 3))
        y = pj.ops.transpose(y, perm=(0, 1))
        y = pj.ops.cast(y, dtype="float32") * 1.0 + 0.0
        y = pj.ops.dropout(y, key, p=0.5, training=False)
        return y + jnp.zeros((4, 2, 3))  # broadcasting: must stay

    prog = pj.trace(f, jnp.ones((2, 3)))
    pm = pj.passes.PassManager("eliminate_identity,dce")
    out = pm.run(prog)
    assert pm.records[0].stats == {"identities": 6}
    assert str(out) == """\
program @f(%x: f32[2,3]) -> (f32[4,2,3]) {
  %0 = constant 0.0 : f32[]
  %1 = lax.broadcast_in_dim(%0) {broadcast_dimensions=(), shape=(4, 2, 3)} : f32[4,2,3]
  %2 = lax.broadcast_in_dim(%x) {broadcast_dimensions=(1, 2), shape=(1, 2, 3)} : f32[1,2,3]
  %3 = lax.add(%2, %1) : f32[4,2,3]
  return %3
}"""
    check_same_function(prog, out, (2, 3))


def test_passes_leave_symbolic_programs_runnable():
    prog = pj.trace(lambda x: (x * 1.0).reshape(x.shape[0], -1) + 0.0, pj.InputSpec((None, 2, 2)))
    out = pj.passes.run(prog, "eliminate_identity,fold_constants,cse,dce")
    check_same_function(prog, out, (5, 2, 2))
