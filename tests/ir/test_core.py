"""The IR's data classes: ops know their meaning and their named inputs; programs run through the
lowering layer and recompile after a rewrite."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.ir import Rewriter


def linear_program():
    return pj.trace(lambda p, x: pj.ops.relu(pj.ops.linear(x, p["w"], p["b"])) + 1.0, jnp.ones((2, 3)),
                    params={"w": jnp.ones((3, 4)), "b": jnp.zeros(4)})


def test_named_inputs_read_the_registry_declaration():
    prog = linear_program()
    linear = next(op for op in prog.walk() if op.type == "linear")
    assert linear.input("x") is prog.inputs[0]
    assert linear.input("weight").producer.attrs["name"] == "w"
    assert linear.input("bias").producer.attrs["name"] == "b"
    without_bias = pj.trace(lambda x: pj.ops.linear(x, jnp.ones((3, 4))), jnp.ones((2, 3)))
    assert next(op for op in without_bias.walk() if op.type == "linear").input("bias") is None


def test_a_variadic_input_is_the_list_of_its_operands():
    prog = pj.trace(lambda x, y: pj.ops.concat(x, y, x, axis=0), jnp.ones(2), jnp.ones(3))
    concat = prog.body.ops[0]
    assert concat.input("x") == [prog.inputs[0], prog.inputs[1], prog.inputs[0]]


def test_unknown_input_names_and_generic_ops_say_what_they_have():
    prog = linear_program()
    linear = next(op for op in prog.walk() if op.type == "linear")
    with pytest.raises(KeyError, match=r"linear has no input 'w'; it has inputs \['x', 'weight', 'bias'\]"):
        linear.input("w")
    add = next(op for op in prog.walk() if op.type == "lax.add")
    with pytest.raises(KeyError, match="not a registry op"):
        add.input("x")


def test_ops_answer_trait_questions_with_their_attributes():
    prog = pj.trace(lambda x, m, v: pj.ops.batch_norm(x, m, v, training=True)[0] + x, jnp.ones((2, 3)),
                    jnp.zeros(3), jnp.ones(3))
    bn, add = prog.body.ops[0], prog.body.ops[1]
    assert bn.has_trait("batch_coupled") and bn.has_trait("layout_sensitive") and not bn.has_trait("pointwise")
    assert add.has_trait("commutative") and add.traits.unit == 0.0
    assert add.canonical == ("elementwise_add", {})


def test_a_rewritten_program_recompiles_on_its_next_call():
    prog = linear_program()
    x = -np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(prog(x), np.full((2, 4), 1.0))  # relu(-3) + 1
    relu = next(op for op in prog.walk() if op.type == "relu")
    Rewriter(prog).replace_op(relu, [relu.operands[0]])
    np.testing.assert_array_equal(prog(x), np.full((2, 4), -2.0))  # -3 + 1


def test_compile_snapshots_the_program_and_its_parameters():
    prog = linear_program()
    f = prog.compile(jax.ShapeDtypeStruct((2, 3), "float32"))
    prog.params["b"] = jnp.full(4, 5.0)
    np.testing.assert_array_equal(f(jnp.ones((2, 3))), np.full((2, 4), 4.0))
    np.testing.assert_array_equal(prog(jnp.ones((2, 3))), np.full((2, 4), 9.0))
    with pytest.raises(TypeError, match="expects inputs structured as"):
        f(jnp.ones((2, 3)), jnp.ones(1))
