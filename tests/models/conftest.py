"""Fixtures for model tests: look at big models without materialising their weights, and run
small ones jitted."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn


@nnx.jit
def _forward(model, x):
    return model(x)


@pytest.fixture(scope="session")
def count_params():
    """``count_params(factory)``: trainable parameters (nnx.Param, so no batch-norm statistics)
    of ``factory()``, built abstractly with ``nnx.eval_shape``."""
    return lambda factory: sum(p.size for p in jax.tree.leaves(nnx.state(nnx.eval_shape(factory), nnx.Param)))


@pytest.fixture(scope="session")
def out_shape():
    """``out_shape(factory, shape)``: the output shape of ``factory()`` on a float32 input of
    ``shape``, computed abstractly."""
    return lambda factory, shape: nnx.eval_shape(lambda x: factory()(x), jnp.zeros(shape)).shape


@pytest.fixture(scope="session")
def traced_ops():
    """``traced_ops(factory, shape)``: ``(op name, attributes)`` of each equation of
    ``factory()``'s eval-mode forward pass on an input of ``shape``, traced on abstract weights."""

    def trace(factory, shape):
        model = nnx.eval_shape(factory)
        model.eval()
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, jax.ShapeDtypeStruct(shape, jnp.float32))
        return [(e.primitive.name, e.params) for e in jaxpr.eqns]

    return trace


@pytest.fixture(scope="session")
def forward():
    """``forward(model, x)``: the dygraph model's outputs, jitted (one compile instead of one
    per op)."""
    return _forward


@pytest.fixture
def same_in_nhwc(forward):
    """``same_in_nhwc(model, nhwc_model, x)``: the NHWC model given the NCHW model's weights
    computes the same outputs on the transposed images."""

    def check(model, nhwc, x):
        nn.set_state_dict(nhwc, nn.state_dict(model))
        nhwc.eval()
        np.testing.assert_allclose(forward(nhwc, x.transpose(0, 2, 3, 1)), forward(model, x), rtol=1e-4, atol=1e-5)

    return check


@pytest.fixture
def static_matches(forward, tmp_path):
    """``static_matches(model, x)``: the model's program (``pj.to_static``, symbolic batch)
    gives the dygraph outputs, and so does the program after ``pj.save`` / ``pj.load``."""

    def check(model, x):
        prog = pj.to_static(model, pj.InputSpec((None, *x.shape[1:])))
        dygraph = np.asarray(forward(model, x))
        np.testing.assert_allclose(prog(x), dygraph, rtol=1e-5, atol=1e-6)
        pj.save(prog, tmp_path / "model")
        np.testing.assert_allclose(pj.load(tmp_path / "model")(x), dygraph, rtol=1e-5, atol=1e-6)

    return check


@pytest.fixture
def reloads_pretrained(forward, tmp_path):
    """``reloads_pretrained(model, build, x)``: saves the model's weights, builds ``build(path)``
    from another seed, checks it computes the same outputs, and returns the path."""

    def check(model, build, x):
        path = tmp_path / "weights.safetensors"
        nn.save_weights(model, path)
        nn.seed(1)  # different initial weights, replaced by the file's
        loaded = build(path)
        loaded.eval()
        np.testing.assert_array_equal(forward(loaded, x), forward(model, x))
        return path

    return check
