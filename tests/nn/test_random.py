"""The global parameter stream and RngKey, the raw key state layers hold."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn
from paddlejax.nn.random import next_key


def data(key):
    return np.asarray(jax.random.key_data(key))


def test_seed_restarts_the_stream_and_successive_keys_differ():
    nn.seed(11)
    first = [data(next_key()) for _ in range(3)]
    nn.seed(11)
    again = [data(next_key()) for _ in range(3)]
    assert all((a == b).all() for a, b in zip(first, again))
    assert len({a.tobytes() for a in first}) == 3
    with pytest.raises(ValueError, match="seed: argument 'n' expects an int, got 1.5"):
        nn.seed(1.5)


def test_keys_drawn_while_tracing_are_concrete():
    nn.seed(0)
    leaked = []
    jax.make_jaxpr(lambda x: leaked.append(next_key()) or x)(1.0)
    assert not isinstance(leaked[0], jax.core.Tracer)
    nn.seed(0)
    assert (data(leaked[0]) == data(next_key())).all()


def test_rngs_streams_take_precedence():
    assert (data(next_key(nnx.Rngs(params=3))) == data(nnx.Rngs(params=3).params())).all()
    key = nn.RngKey.fresh(nnx.Rngs(dropout=5))
    assert key[...].dtype == jnp.uint32 and (key[...] == data(nnx.Rngs(dropout=5).dropout())).all()
    assert isinstance(key, nnx.Variable) and not isinstance(key, nnx.Param)
