"""A sweep of small functions from public JAX APIs (``capture_sweep_cases.py``): each is traced,
run against ``jax.jit`` of the function, saved, loaded (same printed IR), run again and
differentiated with respect to its float inputs. A case that cannot be captured must be listed
with the error it gives; every other case must pass, so no difference goes unnoticed."""
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.ops.traits import declared_traits

_spec = importlib.util.spec_from_file_location("capture_sweep_cases",
                                               Path(__file__).with_name("capture_sweep_cases.py"))
cases = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(cases)
CASES = cases.CASES
MIN_CASES = 300
MIN_PASS_RATE = 0.97


def test_sweep_size_and_pass_rate():
    refused = [c.name for c in CASES if c.refusal]
    rate = 1 - len(refused) / len(CASES)
    print(f"capture sweep: {len(CASES)} cases, {len(CASES) - len(refused)} captured ({rate:.1%}); "
          f"refused as expected: {', '.join(refused)}")
    assert len(CASES) >= MIN_CASES and len({c.name for c in CASES}) == len(CASES)
    assert rate >= MIN_PASS_RATE


def _inexact(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _weighted_sum(tree):
    """A scalar that depends on every float output element differently (a plain sum hides
    errors in outputs that sum to a constant, such as softmax)."""
    total = 0.0
    for leaf in jax.tree_util.tree_leaves(tree):
        if _inexact(leaf):
            w = jnp.sin(jnp.arange(1.0, leaf.size + 1.0)).reshape(leaf.shape)
            total = total + jnp.sum(jnp.real(leaf) * w) + jnp.sum(jnp.imag(leaf) * w[::-1] if leaf.ndim else 0.0)
    return total


def _assert_same(got, want, tol, what):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want), what
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if np.issubdtype(w.dtype, np.inexact):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_capture(case, tmp_path):
    target = case.fn if case.module is None else case.module
    if case.refusal:
        with pytest.raises(pj.CaptureError, match=case.refusal):
            pj.trace(target, *case.args)
        return
    prog = pj.trace(target, *case.args)
    assert [op.type for op in prog.walk() if declared_traits(op.type) is None] == []  # passes know every op
    pj.save(prog, tmp_path / "m")
    loaded = pj.load(tmp_path / "m")
    assert str(loaded) == str(prog)

    leaves, tree = jax.tree_util.tree_flatten(case.args)
    floats = [i for i, x in enumerate(leaves) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]

    def on_floats(fn):
        def loss(xs, all_leaves):
            full = list(all_leaves)
            for i, x in zip(floats, xs):
                full[i] = x
            return _weighted_sum(fn(*jax.tree_util.tree_unflatten(tree, full)))
        return jax.grad(loss)

    functions = [lambda *a: prog.apply(prog.params, *a), lambda *a: loaded.apply(loaded.params, *a)]
    if case.module is None:
        functions.insert(0, case.fn)
    try:  # differentiable where JAX differentiates the function itself
        jax.eval_shape(on_floats(functions[-1]), [leaves[i] for i in floats], leaves)
        grads = bool(floats)
    except Exception:
        grads = False

    def run(*all_leaves):
        args = jax.tree_util.tree_unflatten(tree, all_leaves)
        xs = [all_leaves[i] for i in floats]
        return [f(*args) for f in functions], [on_floats(f)(xs, all_leaves) for f in functions[-2:]] if grads else []

    outs, g = jax.jit(run)(*leaves)
    if case.module is not None:  # a module updates its state, so JAX runs it through nnx's transforms
        want, want_grads = _module_reference(case, leaves, tree, floats, grads)
        outs, g = [want, *outs], [want_grads, g[0]] if grads else []
    want, got, got_loaded = outs
    _assert_same(got, want, case.tol, "program vs jax.jit(fn)")
    _assert_same(got_loaded, want, case.tol, "loaded program vs jax.jit(fn)")
    if grads:
        _assert_same(g[1], g[0], case.tol, "gradient of the program vs jax.grad(fn)")


def _module_reference(case, leaves, tree, floats, grads):
    """Outputs and input gradients of a fresh copy of the module each, under nnx.jit."""
    def forward(m, all_leaves):
        return m(*jax.tree_util.tree_unflatten(tree, all_leaves))

    def loss(m, xs, all_leaves):
        full = list(all_leaves)
        for i, x in zip(floats, xs):
            full[i] = x
        return _weighted_sum(forward(m, full))

    want = nnx.jit(forward)(nnx.clone(case.module), leaves)
    if not grads:
        return want, None
    return want, nnx.jit(nnx.grad(loss, argnums=1))(nnx.clone(case.module), [leaves[i] for i in floats], leaves)
