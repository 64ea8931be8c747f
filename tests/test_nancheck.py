"""The NaN/Inf checker names the first op (as printed) and its source line."""
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def f(x):
    y = jnp.exp(x)          # overflows to inf for large x
    return y - y            # inf - inf = nan, but the first bad value is the exp


def test_first_non_finite_op_is_named_with_its_line():
    prog = pj.trace(f, jnp.ones(3))
    with pytest.raises(pj.NonFiniteError) as e:
        pj.check_nan_inf(prog, prog.params, np.array([0.0, 100.0, 1.0], np.float32))
    assert e.value.line == "%0 = lax.exp(%x) : f32[3]"
    assert "produced Inf" in str(e.value)
    assert e.value.loc.endswith(f"test_nancheck.py:{f.__code__.co_firstlineno + 1}")


def test_finite_run_passes_and_bad_inputs_are_blamed_on_the_input():
    prog = pj.trace(f, jnp.ones(3))
    pj.check_nan_inf(prog, prog.params, np.zeros(3, np.float32))
    with pytest.raises(pj.NonFiniteError, match="input 'x' contains NaN"):
        pj.check_nan_inf(prog, prog.params, np.array([np.nan, 0, 0], np.float32))


def test_a_non_finite_parameter_is_reported_as_such():
    prog = pj.trace(lambda p, x: x * p["w"], jnp.ones(2), params={"w": jnp.array([1.0, jnp.inf])})
    with pytest.raises(pj.NonFiniteError, match=r"parameter `%0 = param @w : f32\[2\]` produced Inf"):
        pj.check_nan_inf(prog, prog.params, np.ones(2, np.float32))
