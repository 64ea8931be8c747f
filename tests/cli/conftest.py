"""Fixtures for the command-line tests."""
import jax.numpy as jnp
import pytest

import paddlejax as pj


@pytest.fixture
def saved(tmp_path):
    """A small saved program (linear -> *1.0 -> relu over a symbolic batch): ``(program, path)``."""
    def f(p, x):
        return pj.ops.relu(pj.ops.linear(x, p["w"], p["b"]) * 1.0)

    prog = pj.trace(f, pj.InputSpec((None, 4)), params={"w": jnp.ones((4, 8)), "b": jnp.zeros(8)})
    pj.save(prog, tmp_path / "m")
    return prog, tmp_path / "m"
