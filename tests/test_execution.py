"""Compiling programs ahead of time: a program compiled again for the same shapes (and the same
frozen weights) takes the executable already built, as the Predictor does with the plan the
autotuner timed; nothing that computes something else is ever reused."""
import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj
from paddlejax import execution

SPEC = jax.ShapeDtypeStruct((3, 2), "float32")
X = np.ones((3, 2), np.float32)


def scaled(k):
    return pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": jnp.eye(2) * k})


def test_the_same_program_compiled_again_takes_the_executable_already_built():
    prog = scaled(1.0)
    first = prog.compile(SPEC, freeze_params=True)
    assert prog.clone().compile(SPEC, freeze_params=True).func is first.func
    assert prog.compile(jax.ShapeDtypeStruct((4, 2), "float32"), freeze_params=True).func is not first.func
    assert prog.compile(SPEC).func is not first.func  # weights as arguments: another executable


def test_frozen_weights_of_other_values_compile_anew():
    one, two = scaled(1.0).compile(SPEC, freeze_params=True), scaled(2.0).compile(SPEC, freeze_params=True)
    assert one.func is not two.func
    np.testing.assert_allclose(two(X), 2 * X)
    np.testing.assert_allclose(one(X), X)


def test_weights_as_arguments_share_the_executable_not_the_values():
    one, three = scaled(1.0).compile(SPEC), scaled(3.0).compile(SPEC)
    assert one.func is three.func
    np.testing.assert_allclose(three(X), 3 * X)
    np.testing.assert_allclose(one(X), X)


def test_another_program_with_the_same_weights_compiles_anew():
    first = scaled(1.0).compile(SPEC, freeze_params=True)
    relu = pj.trace(lambda p, x: pj.ops.relu(x @ p["w"]), pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
    assert relu.compile(SPEC, freeze_params=True).func is not first.func
    np.testing.assert_allclose(relu.compile(SPEC, freeze_params=True)(-X), 0 * X)


def test_only_the_last_few_compilations_are_kept():
    progs = [scaled(float(k)) for k in range(execution.RECENT_COMPILATIONS + 1)]
    first = progs[0].compile(SPEC, freeze_params=True)
    for prog in progs[1:]:
        prog.compile(SPEC, freeze_params=True)
    assert progs[0].compile(SPEC, freeze_params=True).func is not first.func
