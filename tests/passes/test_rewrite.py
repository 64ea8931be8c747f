"""Rewrite patterns driven to a fixpoint, and replace_pattern."""
import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj
from paddlejax.ir import Op
from paddlejax.passes import RewritePattern, apply_patterns, replace_pattern


class DoubleNegation(RewritePattern):
    """neg(neg(x)) -> x"""

    def match_and_rewrite(self, op, rewriter):
        inner = op.operands[0].producer if op.type == "lax.neg" else None
        if inner is None or inner.type != "lax.neg":
            return False
        rewriter.replace_op(op, [inner.operands[0]])
        return True


class SubToAddNeg(RewritePattern):
    """a - b -> a + neg(b): creates work for the other pattern."""

    def match_and_rewrite(self, op, rewriter):
        if op.type != "lax.sub":
            return False
        a, b = op.operands
        neg = rewriter.insert_before(op, Op("lax.neg", [b], [b.type]))
        add = rewriter.insert_before(op, Op("lax.add", [a, neg.result], [op.result.type]))
        rewriter.replace_op(op, [add.result])
        return True


def test_patterns_run_to_a_fixpoint_with_counts():
    f = lambda x, y: x - (-y)  # noqa: E731
    prog = pj.trace(f, jnp.ones(3), jnp.ones(3))
    counts = apply_patterns(prog, [SubToAddNeg(), DoubleNegation()])
    assert counts == {"SubToAddNeg": 1, "DoubleNegation": 1}
    out = pj.passes.run(prog, "dce")
    assert [op.type for op in out.walk()] == ["lax.add", "return"]
    x, y = jnp.arange(3.0), jnp.ones(3) * 2
    np.testing.assert_allclose(out(x, y), f(x, y))


def test_replace_pattern_fuses_matches_and_keeps_the_rest():
    def f(x, w):
        a = pj.ops.relu(pj.ops.linear(x, w))
        b = pj.ops.relu(pj.ops.linear(a, w))
        return pj.ops.sigmoid(pj.ops.linear(b, w)) + b  # this linear has no relu: no match

    def pattern(x, w):
        return pj.ops.relu(pj.ops.linear(x, w))

    def replacement(x, w):
        return jnp.maximum(x @ w, 0.0)

    x, w = jax.random.normal(jax.random.PRNGKey(0), (2, 4)), jax.random.normal(jax.random.PRNGKey(1), (4, 4))
    prog = pj.trace(f, x, w)
    before = str(prog)
    n = replace_pattern(prog, pattern, replacement, example_inputs=(x, w))
    assert n == 2
    types = [op.type for op in prog.walk()]
    assert types.count("relu") == 0 and types.count("linear") == 1 and types.count("lax.dot_general") == 2
    prog.verify()
    assert str(prog) != before
    np.testing.assert_allclose(prog(x, w), f(x, w), atol=1e-5)


def test_replace_pattern_skips_matches_whose_inner_values_escape():
    def f(x):
        r = pj.ops.relu(x)
        return pj.ops.relu(r) + r  # the inner relu is read elsewhere: not a clean match

    prog = pj.trace(f, jnp.ones(3))
    assert replace_pattern(prog, lambda a: pj.ops.relu(pj.ops.relu(a)), lambda a: pj.ops.relu(a)) == 0
