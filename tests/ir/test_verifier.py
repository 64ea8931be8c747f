"""The verifier re-infers types through the registry and names the offending op."""
import jax.numpy as jnp
import pytest

import paddlejax as pj
from paddlejax.ir import Op, Rewriter, TensorType, VerificationError


def prog():
    return pj.trace(lambda x: pj.ops.relu(x) * 2.0, jnp.ones((2, 3)))


def test_a_traced_program_verifies():
    prog().verify()


def test_wrong_result_type_names_the_op():
    p = prog()
    relu = p.body.ops[0]
    relu.results[0].type = TensorType((3, 2), "float32")
    with pytest.raises(VerificationError, match=r"op #0 'relu'.*results are \(f32\[3,2\]\) but the inputs give \(f32\[2,3\]\)"):
        p.verify()


def test_unknown_op_is_an_error():
    p = prog()
    rw = Rewriter(p)
    rw.insert_before(p.body.ops[0], Op("frobnicate", [p.inputs[0]], [p.inputs[0].type]))
    with pytest.raises(VerificationError, match="op #0 'frobnicate'.*unknown op type 'frobnicate'"):
        p.verify()


def test_use_before_definition_is_an_error():
    p = prog()
    relu, const, mul, ret = p.body.ops
    p.body.ops = [mul, relu, const, ret]
    with pytest.raises(VerificationError, match="op #0 'lax.mul'.*used before it is defined"):
        p.verify()


def test_broken_use_list_is_an_error():
    p = prog()
    p.inputs[0].uses.clear()
    with pytest.raises(VerificationError, match="missing from its use list"):
        p.verify()


def test_bad_attribute_is_an_error():
    p = pj.trace(lambda x: pj.ops.softmax(x, axis=1), jnp.ones((2, 3)))
    p.body.ops[0].attrs["axis"] = "one"
    with pytest.raises(VerificationError, match="softmax: attribute 'axis' expects an int"):
        p.verify()


def test_parameter_shape_must_match():
    p = pj.trace(lambda q, x: x @ q["w"], jnp.ones((1, 2)), params={"w": jnp.ones((2, 2))})
    p.params["w"] = jnp.ones((3, 2))
    with pytest.raises(VerificationError, match="parameter 'w' is f32\\[3,2\\] but the program says f32\\[2,2\\]"):
        p.verify()
