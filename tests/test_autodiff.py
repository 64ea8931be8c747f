"""Autodiff: dygraph grad/jacobian/hessian/jvp/vjp and static gradients on programs."""
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax import adapter
from paddlejax.autodiff import gradients, grad, hessian, jacobian, jvp, value_and_grad, vjp
from paddlejax.capture import emit, insert_jaxpr
from paddlejax.ir import Rewriter
from paddlejax.lowering import run_ops

KEY = jax.random.PRNGKey(0)


def close(a, b, rtol=1e-5, atol=1e-6):
    chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)  # same structure, leaf by leaf


def params_of(prog):
    """Parameter name -> the value its ``param`` op defines."""
    return {op.attrs["name"]: op.result for op in prog.param_ops()}


# ---------------------------------------------------------------------------------------
# Dygraph

def test_grad_and_value_and_grad_match_jax_on_arrays():
    def f(x, y):
        return jnp.sum(jnp.sin(x) * y), x.mean()

    x, y = jnp.arange(3.0), jnp.array([1.0, -2.0, 0.5])
    close(grad(f, argnums=(0, 1), has_aux=True)(x, y), jax.grad(f, argnums=(0, 1), has_aux=True)(x, y))
    close(value_and_grad(lambda x: f(x, y)[0])(x), jax.value_and_grad(lambda x: f(x, y)[0])(x))


def test_grad_of_a_module_is_the_state_of_its_params():
    model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(1)))
    model.eval()
    x = jax.random.normal(KEY, (5, 3))
    g = grad(lambda m, x: jnp.sum(m(x) ** 2))(model, x)
    assert isinstance(g, nnx.State)
    # only Params: BatchNorm's running statistics get no gradient
    assert sorted(".".join(map(str, p)) for p, _ in nnx.to_flat_state(g)) == [
        "layers.0.bias", "layers.0.kernel", "layers.1.bias", "layers.1.scale"]

    lin, bn = model.layers[0], model.layers[1]

    def reference(kernel, bias, scale, shift):
        h = x @ kernel + bias
        h = (h - bn.mean[...]) / jnp.sqrt(bn.var[...] + bn.epsilon) * scale + shift
        return jnp.sum(h ** 2)

    weights = (lin.kernel[...], lin.bias[...], bn.scale[...], bn.bias[...])
    got = nnx.to_pure_dict(g)["layers"]
    close((got[0]["kernel"], got[0]["bias"], got[1]["scale"], got[1]["bias"]),
          jax.grad(reference, argnums=(0, 1, 2, 3))(*weights))
    value, g2 = value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    close(float(value), float(reference(*weights)))
    close(g2, g)


def test_jacobian_structure_follows_outputs_then_inputs():
    x, y = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, -1.0])
    # one array in, one out: d out / d x with shape out.shape + x.shape
    np.testing.assert_allclose(jacobian(jnp.sin, x), np.diag(np.cos(x)), rtol=1e-6)
    # tuple of inputs, tuple of outputs: J[i][j] = d out_i / d xs_j
    f = lambda a, b: (jnp.outer(a, b), a.sum() * b)  # noqa: E731
    j = jacobian(f, (x, y))
    assert [[jj.shape for jj in row] for row in j] == [[(3, 2, 3), (3, 2, 2)], [(2, 3), (2, 2)]]
    close(j, jax.jacrev(f, argnums=(0, 1))(x, y))
    np.testing.assert_allclose(j[1][0], np.outer(y, np.ones(3)))


def test_hessian_of_one_array_and_of_a_tuple():
    x, y = jnp.array([1.0, 2.0]), jnp.array(3.0)
    np.testing.assert_allclose(hessian(lambda x: jnp.sum(x ** 3), x), np.diag(6 * np.asarray(x)))
    f = lambda a, b: jnp.reshape(jnp.sum(a ** 2) * b ** 2, (1,))  # noqa: E731 — Paddle's [1] loss
    h = hessian(f, (x, y))
    close(h, jax.hessian(lambda a, b: f(a, b)[0], argnums=(0, 1))(x, y))
    np.testing.assert_allclose(h[0][1], 4 * y * np.asarray(x))
    with pytest.raises(ValueError, match="single element, got shape \\(2,\\)"):
        hessian(lambda a: a ** 2, x)


def test_jvp_and_vjp_against_explicit_jacobian_products():
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, -1.0, 0.5])
    f = lambda a, b: (jnp.outer(a, b).sum(0), jnp.sin(a))  # noqa: E731
    jx, jy = jax.jacrev(f, argnums=(0, 1))(x, y)[0]
    out, tangent = jvp(f, (x, y))  # v defaults to ones
    close(out, f(x, y))
    np.testing.assert_allclose(tangent[0], jx @ np.ones(2) + jy @ np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(tangent[1], np.cos(x), rtol=1e-6)
    _, tangent = jvp(lambda a: a ** 2, x, v=jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(tangent, [2.0, 0.0])

    v = (jnp.array([1.0, 0.0, 2.0]), jnp.array([1.0, 1.0]))
    out, (gx, gy) = vjp(f, (x, y), v)
    np.testing.assert_allclose(gx, np.asarray(v[0]) @ jx + np.asarray(v[1]) * np.cos(x), rtol=1e-6)
    np.testing.assert_allclose(gy, np.asarray(v[0]) @ jy, rtol=1e-6)
    _, g = vjp(lambda a: a ** 2, x)  # one array in: one gradient out, v defaults to ones
    np.testing.assert_allclose(g, 2 * np.asarray(x))
    with pytest.raises(ValueError, match=r"vjp: v\[1\] has shape \(3,\), expected \(2,\)"):
        vjp(f, (x, y), (v[0], jnp.ones(3)))
    with pytest.raises(ValueError, match="jvp: v has 1 arrays but xs has 2"):
        jvp(f, (x, y), x)


# ---------------------------------------------------------------------------------------
# The gradient penalty (WGAN-GP): d/dθ mean((‖∇ₓ D_θ(x)‖₂ − 1)²), a second-order derivative

class Critic(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(3, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 8, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.l2(pj.ops.relu(self.l1(x)))))


def critic_fn(p, x):
    """The same critic as a function of its parameters (``l1.kernel`` …)."""
    h = pj.ops.relu(x @ p["l1"]["kernel"] + p["l1"]["bias"])
    h = jnp.tanh(h @ p["l2"]["kernel"] + p["l2"]["bias"])
    return h @ p["out"]["kernel"] + p["out"]["bias"]


def penalty_of(critic_grad):
    return jnp.mean((jnp.linalg.norm(critic_grad, axis=1) - 1.0) ** 2)


def penalty_fn(p, x):
    return penalty_of(jax.grad(lambda x: critic_fn(p, x).sum())(x))


@pytest.fixture(scope="module")
def critic():
    model = Critic(nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    x = jax.random.normal(KEY, (6, 3))
    return model, params, x, jax.grad(penalty_fn)(params, x)


def flat_names(tree):
    return {".".join(k): v for k, v in nnx.traversals.flatten_mapping(tree).items()}


def check_static_penalty_grads(grads, reference):
    """``gradients`` gives None for the output bias, which ∇ₓ D (hence the penalty) ignores."""
    reference = flat_names(reference)
    np.testing.assert_array_equal(reference.pop("out.bias"), 0.0)
    assert grads.pop("out.bias") is None
    close(grads, reference)


def test_gradient_penalty_in_dygraph_with_nested_grad(critic):
    model, params, x, reference = critic
    penalty = lambda d: penalty_of(grad(lambda x: d(x).sum())(x))  # noqa: E731
    got = nnx.to_pure_dict(grad(penalty)(model))
    close(got, reference)


def test_gradient_penalty_static_by_calling_gradients_twice(critic):
    _, params, x, reference = critic
    prog = pj.trace(critic_fn, x, params=params)
    d_out = prog.outputs[0]
    (dx,) = gradients(d_out, prog.inputs[0], target_gradients=emit(jnp.ones_like, d_out))
    penalty = emit(penalty_of, dx)
    names = sorted(params_of(prog))
    grads = dict(zip(names, gradients(penalty, [params_of(prog)[n] for n in names])))
    computed = {n: g for n, g in grads.items() if g is not None}
    prog.set_outputs({"penalty": penalty, "dx": dx, "grads": computed})
    prog.verify()
    out = prog(x)
    close(out["penalty"], penalty_fn(params, x))
    close(out["dx"], jax.grad(lambda x: critic_fn(params, x).sum())(x))  # first order
    check_static_penalty_grads({**grads, **out["grads"]}, reference)  # second order


def test_gradient_penalty_static_from_a_traced_first_order_grad(critic):
    _, params, x, reference = critic
    prog = pj.trace(penalty_fn, x, params=params)  # the traced function holds ∇ₓ D
    names = sorted(params_of(prog))
    grads = dict(zip(names, gradients(prog.outputs[0], [params_of(prog)[n] for n in names])))
    prog.set_outputs({n: g for n, g in grads.items() if g is not None})
    prog.verify()
    check_static_penalty_grads({**grads, **prog(x)}, reference)


# ---------------------------------------------------------------------------------------
# Static gradients

def test_gradients_append_ops_that_reuse_the_forward_pass():
    prog = pj.trace(lambda x: jnp.sum(jnp.sin(x) * 2.0), jnp.ones(3))
    (dx,) = gradients(prog.outputs[0], prog.inputs[0])
    prog.set_outputs([prog.outputs[0], dx])
    assert prog.format() == """\
program @<lambda>(%x: f32[3]) -> (f32[], f32[3]) {
  %0 = lax.sin(%x) : f32[3]
  %1 = constant 2.0 : f32[]
  %2 = lax.mul(%0, %1) : f32[3]
  %3 = lax.reduce_sum(%2) {axes=(0,)} : f32[]
  %4 = lax.cos(%x) : f32[3]
  %5 = constant 1.0 : f32[]
  %6 = lax.broadcast_in_dim(%5) {broadcast_dimensions=(), shape=(3,)} : f32[3]
  %7 = lax.mul(%6, %1) : f32[3]
  %8 = lax.mul(%7, %4) : f32[3]
  return %3, %8
}"""
    x = jnp.array([0.0, 1.0, 2.0])
    close(prog(x)[1], 2 * jnp.cos(x))


def test_gradients_of_params_inputs_and_intermediates_match_jax():
    def f(p, x):
        h = pj.ops.linear(x, p["w"], p["b"])
        return jnp.mean(jnp.tanh(h) ** 2), h

    k1, k2, k3 = jax.random.split(KEY, 3)
    p = {"w": jax.random.normal(k1, (3, 2)), "b": jax.random.normal(k2, (2,))}
    x = jax.random.normal(k3, (4, 3))
    prog = pj.trace(f, x, params=p)
    loss, h = prog.outputs
    pv = params_of(prog)
    dw, db, dx, dh = gradients(loss, [pv["w"], pv["b"], prog.inputs[0], h])
    prog.set_outputs([dw, db, dx, dh])
    prog.verify()
    ref = jax.grad(lambda p, x: f(p, x)[0], argnums=(0, 1))(p, x)
    hv = pj.ops.linear(x, p["w"], p["b"])
    dh_ref = jax.grad(lambda h: jnp.mean(jnp.tanh(h) ** 2))(hv)
    close(prog(x), [ref[0]["w"], ref[0]["b"], ref[1], dh_ref])


def test_second_order_by_calling_gradients_on_gradients():
    # a Hessian-vector product: ∇ₓ (∇ₓ f(x) · v)
    f = lambda x: jnp.sum(jnp.sin(x) * x ** 2)  # noqa: E731
    x, v = jnp.array([0.5, -1.0, 2.0]), jnp.array([1.0, 2.0, -1.0])
    prog = pj.trace(lambda x, v: f(x), x, v)
    (g,) = gradients(prog.outputs[0], prog.inputs[0])
    (hv,) = gradients(g, prog.inputs[0], target_gradients=prog.inputs[1])
    prog.set_outputs([g, hv])
    prog.verify()
    close(prog(x, v), [jax.grad(f)(x), jax.hessian(f)(x) @ v])


def test_gradients_through_scan_and_cond_to_second_order():
    def f(x):
        c, ys = jax.lax.scan(lambda c, xi: (c * jnp.sin(xi) + xi, c * xi), jnp.ones(3), x)
        return jnp.sum(jax.lax.cond(c.sum() > 0, lambda a: a * 2.0, jnp.cos, ys)) + jnp.sum(c)

    x = jnp.arange(12.0).reshape(4, 3) / 7 - 0.5
    v = jnp.ones((4, 3)) - x
    prog = pj.trace(lambda x, v: f(x), x, v)
    (g,) = gradients(prog.outputs[0], prog.inputs[0])
    (hv,) = gradients(g, prog.inputs[0], target_gradients=prog.inputs[1])
    prog.set_outputs([g, hv])
    prog.verify()
    close(prog(x, v), [jax.grad(f)(x), jax.jvp(jax.grad(f), (x,), (v,))[1]])


def test_inputs_that_depend_on_each_other_get_total_derivatives():
    prog = pj.trace(lambda x: jnp.sum(jnp.exp(x) * x), jnp.ones(2))
    (e,) = [op.result for op in prog.body.ops if op.type == "lax.exp"]
    dx, de = gradients(prog.outputs[0], [prog.inputs[0], e])
    prog.set_outputs([dx, de])
    x = jnp.array([0.5, -1.0])
    close(prog(x), [jnp.exp(x) * (1 + x), x])  # d/dx through exp(x) too; d/de = x


def test_no_grad_set_holds_values_constant_and_unreached_inputs_get_none():
    prog = pj.trace(lambda x, y: jnp.sum(jnp.exp(x) * x) + 0.0 * jnp.sum(y), jnp.ones(2), jnp.ones(2))
    (e,) = [op.result for op in prog.body.ops if op.type == "lax.exp"]
    (dx,) = gradients(prog.outputs[0], [prog.inputs[0]], no_grad_set=[e])
    prog.set_outputs(dx)
    x = jnp.array([0.5, -1.0])
    close(prog(x, x), jnp.exp(x))

    prog = pj.trace(lambda x, y: (jnp.sum(x ** 2), y), jnp.ones(2), jnp.ones(2))
    n_ops = len(prog.body.ops)
    assert gradients(prog.outputs[0], prog.inputs[1]) == [None]  # the loss ignores y
    assert len(prog.body.ops) == n_ops  # and nothing was added
    dx, dy = gradients(prog.outputs[0], [prog.inputs[0], prog.inputs[1]])
    assert dy is None and dx is not None


def test_symbolic_batch_sizes():
    prog = pj.trace(lambda p, x: jnp.sum(pj.ops.relu(x @ p["w"])), pj.InputSpec((None, 3)),
                    params={"w": jnp.ones((3, 2))})
    w, x = params_of(prog)["w"], prog.inputs[0]
    dw, dx = gradients(prog.outputs[0], [w, x])
    assert str(dx.type) == "f32[b,3]"
    prog.set_outputs([dw, dx])
    prog.verify()
    xs = jnp.arange(12.0).reshape(4, 3) - 5
    close(prog(xs), list(jax.grad(lambda w, x: jnp.sum(jax.nn.relu(x @ w)), (0, 1))(jnp.ones((3, 2)), xs)))


def test_save_and_load_a_program_with_gradient_ops(tmp_path, critic):
    _, params, x, _ = critic
    prog = pj.trace(penalty_fn, x, params=params)
    names = sorted(params_of(prog))
    grads = gradients(prog.outputs[0], [params_of(prog)[n] for n in names])
    prog.set_outputs([prog.outputs[0], *(g for g in grads if g is not None)])
    path = os.path.join(tmp_path, "penalty")
    pj.save(prog, path)
    loaded = pj.load(path)
    assert str(loaded) == str(prog)
    close(loaded(x), prog(x))


def test_gradients_errors_name_the_problem():
    prog = pj.trace(lambda x: (jnp.sum(x ** 2), x * 2.0), jnp.ones(3))
    other = pj.trace(lambda x: jnp.sum(x), jnp.ones(3))
    loss, y = prog.outputs
    with pytest.raises(ValueError, match=r"inputs\[0\] belongs to a different program \('<lambda>'\) than "
                                         r"targets\[0\] \('<lambda>'\)"):
        gradients(loss, other.inputs[0])
    with pytest.raises(ValueError, match=r"targets\[0\] \(a result of lax.mul: f32\[3\]\) is not a single "
                                         r"element; pass target_gradients\[0\], a value of type f32\[3\]"):
        gradients(y, prog.inputs[0])
    with pytest.raises(ValueError, match=r"target_gradients\[0\] is f32\[\] but targets\[0\] is f32\[3\]"):
        gradients(y, prog.inputs[0], target_gradients=[loss])
    with pytest.raises(TypeError, match=r"inputs\[0\] must be a Value of a program, got ArrayImpl"):
        gradients(loss, jnp.ones(3))
    ints = pj.trace(lambda i: jnp.sum(i * 2), jnp.ones(3, jnp.int32))
    with pytest.raises(TypeError, match=r"targets\[0\] \(a result of lax.reduce_sum: i32\[\]\) is not floating"):
        gradients(ints.outputs[0], ints.inputs[0])


# ---------------------------------------------------------------------------------------
# Program-building helpers gradients relies on

def test_set_outputs_emit_and_insert_jaxpr():
    table = jnp.arange(9.0).reshape(3, 3)
    prog = pj.trace(lambda x: x @ table, jnp.ones((2, 3)))  # holds the constant const0
    out = prog.outputs[0]
    bias = jnp.arange(3.0)
    jaxpr, consts = adapter.make_jaxpr(lambda a: a + bias, jax.ShapeDtypeStruct((2, 3), jnp.float32))
    (shifted,) = insert_jaxpr(Rewriter(prog), prog.body.terminator, jaxpr, consts, [out])
    assert sorted(prog.constants) == ["const0", "const1"]  # a fresh name for the new constant
    stats = emit(lambda a, b: {"max": a.max(), "sum": (a + b).sum()}, shifted, out)
    prog.set_outputs((stats, out))
    prog.verify()
    x = jnp.arange(6.0).reshape(2, 3)
    y = x @ table
    close(prog(x), ({"max": (y + bias).max(), "sum": (2 * y + bias).sum()}, y))
    before, n_uses = str(prog), len(out.uses)
    with pytest.raises(pj.CaptureError, match="applies a function"):  # a failed emit changes nothing
        emit(lambda a: a.at[0].apply(jnp.sin), out)
    assert str(prog) == before and len(out.uses) == n_uses
    other = pj.trace(lambda x: x, jnp.ones(3))
    with pytest.raises(ValueError, match="output 0 belongs to a different program"):
        prog.set_outputs([other.outputs[0], out])
    with pytest.raises(TypeError, match="output 0 must be a Value of a program, got ndarray"):
        prog.set_outputs([np.ones(3)])


def test_run_ops_evaluates_a_stretch_of_a_block():
    prog = pj.trace(lambda x: jnp.exp(x) + 1.0, jnp.ones(2))
    exp_op, *rest, _ = prog.body.ops
    env = run_ops(prog, rest, {exp_op.result: jnp.array([1.0, 2.0])})  # start after exp
    close(env[prog.outputs[0]], jnp.array([2.0, 3.0]))
