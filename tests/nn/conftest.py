"""Shared checks for layer tests."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import paddlejax as pj


@pytest.fixture
def round_trip(tmp_path):
    """``check(model, *inputs)``: the model traces to a program that prints, saves and loads
    (printing the same), and both programs compute what the model does; returns the text."""

    def check(model, *inputs, tol=1e-6):
        program = pj.trace(model, *inputs)
        text = str(program)
        pj.save(program, tmp_path / "model")
        loaded = pj.load(tmp_path / "model")
        assert str(loaded) == text
        want = model(*inputs)
        for got in (program(*inputs), loaded(*inputs)):
            assert jax.tree.structure(got) == jax.tree.structure(want)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol)
        return text

    return check
