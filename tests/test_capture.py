"""Capture: functions, pytrees, NNX modules, lax ops, control flow, symbolic sizes, errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax as pj


def assert_tree_close(a, b, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-6)


def test_pytree_inputs_and_outputs_keep_their_structure():
    def f(batch, scale):
        h = pj.ops.relu(batch["image"]) * scale[0]
        return {"sum": h.sum(axis=1), "pair": (h, [batch["label"] + 1])}

    batch = {"image": jnp.arange(6.0).reshape(2, 3) - 2, "label": jnp.array([1, 2])}
    scale = (jnp.float32(2.0),)
    prog = pj.trace(f, batch, scale)
    assert [v.name for v in prog.inputs] == ["batch.image", "batch.label", "scale.0"]
    assert_tree_close(prog(batch, scale), f(batch, scale))


def test_our_ops_are_single_ops_and_lax_primitives_are_generic_ops():
    prog = pj.trace(lambda x: jnp.tanh(pj.ops.gelu(x)), jnp.ones((2, 3)))
    assert [op.type for op in prog.walk()] == ["gelu", "lax.tanh", "return"]
    assert prog.body.ops[0].attrs == {"approximate": False}


def test_nnx_module_parameters_are_named_by_path():
    class Net(nnx.Module):
        def __init__(self):
            self.layers = nnx.List([nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 2, rngs=nnx.Rngs(1))])
            self.norm = nnx.BatchNorm(4, rngs=nnx.Rngs(2))

        def __call__(self, x):
            return self.layers[1](self.norm(self.layers[0](x)))

    net = Net()
    net.eval()
    prog = pj.trace(net, jnp.ones((5, 3)))
    assert sorted(prog.params) == ["layers.0.bias", "layers.0.kernel", "layers.1.bias", "layers.1.kernel",
                                   "norm.bias", "norm.mean", "norm.scale", "norm.var"]
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    np.testing.assert_allclose(prog(x), net(x), atol=1e-6)


def test_plain_arrays_held_by_a_module_are_captured_with_its_variables():
    class Shift(nnx.Module):
        def __init__(self):
            self.scale = nnx.Param(jnp.full(3, 2.0))
            self.offset = jnp.arange(3.0)  # not a Variable: once an AttributeError in capture

        def __call__(self, x):
            return x * self.scale + self.offset

    prog = pj.trace(Shift(), jnp.ones(3))
    assert sorted(prog.params) == ["offset", "scale"]
    np.testing.assert_array_equal(prog(jnp.ones(3)), [2.0, 3.0, 4.0])


def test_explicit_params_for_plain_functions_and_closed_over_constants():
    table = jnp.arange(4.0)

    def f(p, x):
        return x @ p["w"] + table

    prog = pj.trace(f, jnp.ones((2, 3)), params={"w": jnp.ones((3, 4))})
    assert list(prog.params) == ["w"]
    assert list(prog.constants) == ["const0"]
    np.testing.assert_allclose(prog(jnp.ones((2, 3))), f(prog.params, jnp.ones((2, 3))))


def test_control_flow_becomes_ops_with_sub_blocks():
    def f(x):
        c, ys = jax.lax.scan(lambda c, xi: (c + xi, c * xi), jnp.zeros(x.shape[1:]), x)
        z = jax.lax.cond(c.sum() > 0, lambda a: a + 1, lambda a: a - 1, ys)
        _, w = jax.lax.while_loop(lambda t: t[0] < 3, lambda t: (t[0] + 1, t[1] * 2.0), (0, z))
        return w

    x = jnp.arange(12.0).reshape(4, 3) - 5
    prog = pj.trace(f, x)
    kinds = {op.type: len(op.blocks) for op in prog.body.ops if op.blocks}
    assert kinds == {"scan": 1, "cond": 2, "while": 2}
    np.testing.assert_allclose(prog(x), f(x))


def test_nested_jit_is_inlined_and_custom_jvp_keeps_its_rule():
    inner = jax.jit(lambda x: jax.nn.relu(x) * 3.0)
    prog = pj.trace(lambda x: inner(x) + 1.0, jnp.ones(3))
    types = [op.type for op in prog.body.ops]
    assert "lax.jit" not in types and "lax.pjit" not in types and "custom_jvp" in types
    np.testing.assert_allclose(prog(jnp.array([-1.0, 0.5, 2.0])), [1.0, 2.5, 7.0])


def test_symbolic_batch_size():
    prog = pj.trace(lambda x: x.reshape(x.shape[0], -1).sum(axis=1), pj.InputSpec((None, 2, 3)))
    assert str(prog.inputs[0].type) == "f32[b,2,3]"
    assert str(prog.outputs[0].type) == "f32[b]"
    reshape = next(op for op in prog.walk() if op.type == "lax.reshape")
    assert str(reshape.attrs["new_sizes"]) == "(SymDim('b'), 6)"
    for n in (1, 5):
        x = jnp.arange(n * 6.0).reshape(n, 2, 3)
        np.testing.assert_allclose(prog(x), x.reshape(n, -1).sum(axis=1))


def test_open_sizes_on_later_axes_are_not_the_batch_size():
    # (None, None) once made both sizes the batch size b: only square batches could run
    prog = pj.trace(lambda ids, mask: (ids * mask).sum(axis=1), pj.InputSpec((None, None), "int32"),
                    pj.InputSpec((None, None), "int32"))
    assert [v.type.shape for v in prog.inputs] == [("b", "d1"), ("b", "d1")]
    ids = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    np.testing.assert_array_equal(prog(ids, jnp.ones_like(ids)), [3, 12])


def test_named_symbolic_sizes_are_shared_between_inputs():
    prog = pj.trace(lambda a, b: a @ b, pj.InputSpec(("n", "k")), pj.InputSpec(("k", 4)))
    assert str(prog.outputs[0].type) == "f32[n,4]"
    with pytest.raises(ValueError, match="input 'b' expects f32\\[k,4\\]"):
        prog(jnp.ones((2, 3)), jnp.ones((5, 4)))


def test_unsupported_construct_names_the_source_line():
    def f(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(pj.CaptureError, match=r"test_capture\.py:\d+.*pure_callback"):
        pj.trace(f, jnp.ones(3))


def test_source_lines_point_at_user_code():
    prog = pj.trace(lambda x: pj.ops.relu(x), jnp.ones(3))
    assert prog.body.ops[0].loc.split(":")[0].endswith("test_capture.py")


def test_typed_keys_made_inside_the_function_are_held_by_their_raw_data():
    fn = lambda x: x + jax.random.normal(jax.random.key(0), x.shape)  # noqa: E731
    prog = pj.trace(fn, jnp.ones(3))
    assert all(not v.type.dtype.startswith("key") for op in prog.walk() for v in op.results)
    assert_tree_close(prog(jnp.ones(3)), jax.jit(fn)(jnp.ones(3)))
