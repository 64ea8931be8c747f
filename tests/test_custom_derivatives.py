"""Custom derivative rules survive capture: gradients through a program equal JAX's on the
original function (not the derivative of the primal code), after saving and loading too."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import SymbolicZero
from jax.scipy.special import xlog1py, xlogy

import paddlejax as pj
from paddlejax.capture import CaptureWarning
from paddlejax.ir.verifier import VerificationError


def program_fn(prog):
    return lambda *xs: prog.apply(prog.params, *xs)


def assert_same(a, b):
    """Equal trees, NaN and infinities included (rules give them on purpose)."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@jax.custom_jvp
def safe_norm(x):
    return jnp.sqrt(jnp.sum(x ** 2))


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = safe_norm(x)
    return y, jnp.where(y == 0, 0.0, jnp.vdot(x, t) / jnp.where(y == 0, 1.0, y))


@jax.custom_jvp
def stable_softplus(x):
    return jnp.where(x > 30, x, jnp.log1p(jnp.exp(x)))


stable_softplus.defjvps(lambda t, ans, x: jax.nn.sigmoid(x) * t)


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (clip_gradient(x), None), lambda _, g: (0.1 * g,))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def apply_fn(f, x):
    return f(x)


@apply_fn.defjvp
def _apply_fn_jvp(f, primals, tangents):
    (x,), (t,) = primals, tangents
    return apply_fn(f, x), 2.0 * t  # not the derivative of f: only the rule says 2


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def clip_by(x, bound):
    return x


clip_by.defvjp(lambda x, bound: (x, None), lambda bound, _, g: (jnp.clip(g, -bound, bound),))


scaled_product = jax.custom_jvp(lambda x, y: x * y)
scaled_product.defjvps(lambda t, ans, x, y: 3.0 * t * y, lambda t, ans, x, y: 5.0 * t * x)

# (name, function, inputs): at these inputs differentiating the primal code gives another
# gradient than the rule (0.5 for relu at 0, 1 for the clip, NaN for the norm and softplus).
CASES = [
    ("relu", lambda x: jnp.sum(jax.nn.relu(x)), (jnp.array([-1.0, 0.0, 2.0]),)),
    ("relu6", lambda x: jnp.sum(jax.nn.relu6(x)), (jnp.array([0.0, 3.0, 6.0, 7.0]),)),
    ("clip_gradient", lambda x: jnp.sum(clip_gradient(x) * 2.0), (jnp.array([1.0, -2.0]),)),
    ("safe_norm", safe_norm, (jnp.zeros(3),)),
    ("xlogy", lambda x, y: jnp.sum(xlogy(x, y)), (jnp.array([0.0, 0.0, 2.0]), jnp.array([0.0, 1.0, 3.0]))),
    ("xlog1py", lambda x, y: jnp.sum(xlog1py(x, y)), (jnp.array([0.0, 0.0, 2.0]), jnp.array([-1.0, 0.0, 3.0]))),
    ("stable_softplus", lambda x: jnp.sum(stable_softplus(x)), (jnp.array([-200.0, 0.0, 200.0]),)),
    ("nondiff_argnums_jvp", lambda x: jnp.sum(apply_fn(jnp.sin, x)), (jnp.array([0.0, 1.0]),)),
    ("nondiff_argnums_vjp", lambda x: jnp.sum(clip_by(x, 0.5) * 3.0), (jnp.array([1.0, 2.0]),)),
    ("defjvps", lambda x, y: jnp.sum(scaled_product(x, y)), (jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))),
]


@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_gradients_follow_the_rule_like_jax(name, fn, args):
    prog = pj.trace(fn, *args)
    argnums = tuple(range(len(args)))
    assert_same(prog(*args), fn(*args))
    assert_same(jax.grad(program_fn(prog), argnums)(*args), jax.grad(fn, argnums)(*args))
    assert_same(jax.jit(jax.grad(program_fn(prog), argnums))(*args), jax.grad(fn, argnums)(*args))


def test_the_rule_is_an_op_in_the_printed_program():
    prog = pj.trace(lambda x: clip_gradient(x) * 2.0, jnp.ones(3))
    assert str(prog) == """\
program @<lambda>(%x: f32[3]) -> (f32[3]) {
  %0 = custom_vjp(%x) {name="clip_gradient", num_consts=0} : f32[3] (
    primal(%1: f32[3]) {
      return %1
    }
    fwd(%2: f32[3]) {
      %3 = custom_vjp(%2) {name="clip_gradient", num_consts=0} : f32[3] (
        primal(%4: f32[3]) {
          return %4
        }
        fwd(%5: f32[3]) {
          return %5
        }
        bwd(%6: f32[3]) {
          %7 = constant 0.10000000149011612 : f32[]
          %8 = lax.mul(%7, %6) : f32[3]
          return %8
        }
      )
      return %3
    }
    bwd(%9: f32[3]) {
      %10 = constant 0.10000000149011612 : f32[]
      %11 = lax.mul(%10, %9) : f32[3]
      return %11
    }
  )
  %12 = constant 2.0 : f32[]
  %13 = lax.mul(%0, %12) : f32[3]
  return %13
}"""


def test_jvp_and_second_derivatives_use_the_rules():
    fn = lambda x: jnp.sum(stable_softplus(x) * jax.nn.relu(x))  # noqa: E731
    x = jnp.array([-1.0, 0.0, 0.5, 200.0])
    prog = pj.trace(fn, x)
    t = jnp.array([1.0, 2.0, 3.0, 4.0])
    assert_same(jax.jvp(program_fn(prog), (x,), (t,)), jax.jvp(fn, (x,), (t,)))
    assert_same(jax.hessian(program_fn(prog))(x), jax.hessian(fn)(x))


def test_vmap_and_a_symbolic_batch_size():
    fn = lambda x: jnp.sum(jax.nn.relu(x) + clip_gradient(x), axis=-1)  # noqa: E731
    prog = pj.trace(fn, pj.InputSpec((None, 3)))
    assert str(prog.inputs[0].type) == "f32[b,3]"
    loss = lambda f: lambda x: jnp.sum(f(x))  # noqa: E731
    for n in (1, 4):
        x = jnp.arange(n * 3.0).reshape(n, 3) - 3.0  # includes relu's kink at 0
        assert_same(jax.grad(loss(program_fn(prog)))(x), jax.grad(loss(fn))(x))
        per_row = jax.vmap(jax.grad(lambda row: program_fn(prog)(row[None])[0]))(x)
        assert_same(per_row, jax.vmap(jax.grad(lambda row: fn(row[None])[0]))(x))


def test_save_and_load_keep_the_rules(tmp_path):
    fn = lambda x, y: jnp.sum(jax.nn.relu(x) * clip_gradient(y)) + safe_norm(x - 1.0)  # noqa: E731
    args = (jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 0.0, -1.0]))
    prog = pj.trace(fn, *args)
    pj.save(prog, tmp_path / "model")
    loaded = pj.load(tmp_path / "model")
    assert str(loaded) == str(prog)
    assert_same(loaded(*args), fn(*args))
    assert_same(jax.grad(program_fn(loaded), (0, 1))(*args), jax.grad(fn, (0, 1))(*args))


def test_symbolic_zero_tangents_integer_outputs_and_integer_inputs():
    product = jax.custom_jvp(lambda x, y: x * y)

    @functools.partial(product.defjvp, symbolic_zeros=True)
    def _(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        t = 0.0 if isinstance(tx, SymbolicZero) else 7.0 * tx * y
        return product(x, y), t + (0.0 if isinstance(ty, SymbolicZero) else ty * x)

    with_index = jax.custom_jvp(lambda x: (2.0 * x, jnp.argmax(x)))
    with_index.defjvp(lambda p, t: (with_index(p[0]), (3.0 * t[0], np.zeros((), jax.dtypes.float0))))

    @jax.custom_vjp
    def repeat(x, n):
        return x * n

    repeat.defvjp(lambda x, n: (repeat(x, n), n), lambda n, g: (g * n + 1.0, None))

    def fn(x, y, n):
        doubled, index = with_index(x)
        return jnp.sum(product(x, y) + doubled + repeat(x, n)) + index

    args = (jnp.array([1.0, 3.0]), jnp.array([2.0, 5.0]), jnp.array([2, 3], jnp.int32))
    prog = pj.trace(fn, *args)
    jvp_op = next(op for op in prog.body.ops if op.attrs.get("zero_tangents"))
    assert jvp_op.attrs["zero_tangents"] == (1,)  # the argmax output has no tangent
    assert_same(prog(*args), fn(*args))
    assert_same(jax.grad(program_fn(prog))(*args), jax.grad(fn)(*args))  # y's tangent is a symbolic zero
    assert_same(jax.grad(program_fn(prog), (0, 1))(*args), jax.grad(fn, (0, 1))(*args))


def test_a_rule_giving_an_integer_output_a_zero_tangent_array_saves_and_loads(tmp_path):
    rows = jax.custom_jvp(lambda x: (2.0 * x, jnp.argmax(x, -1)))
    rows.defjvp(lambda p, t: (rows(p[0]), (3.0 * t[0], np.zeros(p[0].shape[:-1], jax.dtypes.float0))))
    fn = lambda x: jnp.sum(rows(x)[0])  # noqa: E731
    x = jnp.arange(6.0).reshape(2, 3)
    prog = pj.trace(fn, x)
    assert not prog.constants  # the float0 zero tangent is no constant of the program
    pj.save(prog, tmp_path / "model")
    loaded = pj.load(tmp_path / "model")
    assert_same(jax.grad(program_fn(loaded))(x), jax.grad(fn)(x))
    np.testing.assert_allclose(jax.grad(program_fn(loaded))(x), np.full((2, 3), 3.0))


def test_a_rule_that_cannot_be_captured_warns_naming_the_function():
    @jax.custom_vjp
    def flip_if_positive(x):
        return x

    def bwd(x, g):  # Python control flow on a value: runs eagerly, but cannot be traced
        return (-g if float(x.sum()) > 0 else g,)

    flip_if_positive.defvjp(lambda x: (x, x), bwd)
    fn = lambda x: jnp.sum(flip_if_positive(x) * 2.0)  # noqa: E731
    with pytest.warns(CaptureWarning, match=r"test_custom_derivatives\.py:\d+: the custom_vjp rule of "
                                            r"'flip_if_positive' cannot be captured"):
        prog = pj.trace(fn, jnp.ones(2))
    assert not any(op.type == "custom_vjp" for op in prog.walk())
    assert_same(prog(jnp.ones(2)), fn(jnp.ones(2)))  # the values stay right


def test_a_rule_closing_over_a_traced_value_warns():
    def fn(p, x):
        snap = jax.custom_jvp(lambda x: jnp.round(x * p["scale"]))
        snap.defjvp(lambda primals, tangents: (snap(primals[0]), tangents[0] * p["scale"]))
        return snap(x)

    with pytest.warns(CaptureWarning, match="custom_jvp rule of '<lambda>'.*closes over a traced value"):
        prog = pj.trace(fn, jnp.ones(2), params={"scale": jnp.float32(3.0)})
    np.testing.assert_allclose(prog(jnp.array([0.4, 1.0])), [1.0, 3.0])


def test_cleanup_passes_keep_the_rules():
    fn = lambda x: jnp.sum(jax.nn.relu(x) + jax.nn.relu(x))  # noqa: E731
    prog = pj.passes.run(pj.trace(fn, jnp.ones(3)), "cse,dce,fold_constants")
    prog.verify()
    x = jnp.array([-1.0, 0.0, 1.0])
    assert_same(jax.grad(program_fn(prog))(x), jax.grad(fn)(x))


def relu_op(prog):
    return next(op for op in prog.body.ops if op.type == "custom_jvp")


@pytest.mark.parametrize("edit,message", [
    (lambda op: op.attrs.update(num_consts=2), "custom_jvp takes 2 blocks and a num_consts of at most 1"),
    (lambda op: op.attrs.update(zero_tangents=(3,)), "zero_tangents must be a tuple of output indices below 1"),
    (lambda op: op.blocks.pop(), "custom_jvp takes 2 blocks"),
])
def test_the_verifier_checks_custom_derivative_ops(edit, message):
    prog = pj.trace(jax.nn.relu, jnp.ones(3))
    edit(relu_op(prog))
    with pytest.raises(VerificationError, match=re.escape(message)):
        prog.verify()
