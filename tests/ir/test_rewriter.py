"""All mutation goes through the Rewriter, which keeps use lists exact."""
import jax.numpy as jnp
import pytest

import paddlejax as pj
from paddlejax.ir import Op, Rewriter


def program():
    return pj.trace(lambda x: pj.ops.relu(x) + pj.ops.sigmoid(x), jnp.ones(3))


def test_values_know_their_users():
    prog = program()
    x = prog.inputs[0]
    assert [op.type for op in x.users] == ["relu", "sigmoid"]
    relu = prog.body.ops[0]
    assert relu.result.users[0].type == "lax.add"
    assert relu.result.producer is relu and x.producer is None


def test_replace_all_uses_and_erase():
    prog = program()
    relu, sigmoid, add, ret = prog.body.ops
    rw = Rewriter(prog)
    assert rw.replace_all_uses_with(sigmoid.result, relu.result) == 1
    assert add.operands == [relu.result, relu.result]
    assert len(relu.result.uses) == 2
    rw.erase_op(sigmoid)
    assert [op.type for op in prog.walk()] == ["relu", "lax.add", "return"]
    assert [op.type for op in prog.inputs[0].users] == ["relu"]
    prog.verify()
    assert prog(jnp.array([-1.0, 2.0, 3.0])).tolist() == [0.0, 4.0, 6.0]


def test_insert_before_and_set_operand():
    prog = program()
    relu, sigmoid, add, _ = prog.body.ops
    rw = Rewriter(prog)
    tanh = rw.insert_before(add, Op("lax.tanh", [relu.result], [relu.result.type]))
    rw.set_operand(add, 1, tanh.result)
    prog.verify()
    assert [op.type for op in prog.walk()] == ["relu", "sigmoid", "lax.tanh", "lax.add", "return"]
    assert sigmoid.result.uses == []


def test_erasing_a_used_op_is_refused():
    prog = program()
    with pytest.raises(ValueError, match="still used by lax.add"):
        Rewriter(prog).erase_op(prog.body.ops[0])


def test_type_changing_replacement_is_refused():
    prog = pj.trace(lambda x: pj.ops.cast(x, dtype="int32") + 1, jnp.ones(3))
    cast = prog.body.ops[0]
    with pytest.raises(TypeError, match="i32\\[3\\] replaced by f32\\[3\\]"):
        Rewriter(prog).replace_all_uses_with(cast.result, prog.inputs[0])


def test_clone_is_independent():
    prog = program()
    copy = prog.clone()
    rw = Rewriter(copy)
    relu, sigmoid, add, _ = copy.body.ops
    rw.replace_all_uses_with(sigmoid.result, relu.result)
    rw.erase_op(sigmoid)
    assert len(list(prog.walk())) == 4 and len(list(copy.walk())) == 3
