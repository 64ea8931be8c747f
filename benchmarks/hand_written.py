"""The hand-written JAX training step that benchmarks set the Trainer against.

    from hand_written import jax_train_step
    step = jax.jit(jax_train_step(graphdef, optax.sgd(0.01), jnp.bfloat16), donate_argnums=(0, 1, 2))
    params, opt_state, rest, loss = step(params, tx.init(params), rest, inputs, labels)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from paddlejax import ops


def cast(state, dtype):
    """A copy of ``state`` with its floating arrays in ``dtype`` (None: unchanged) -- mixed
    precision written by hand, with f32 master weights. The copy's variables belong to the
    current trace, so a model merged from them may update its batch statistics there."""
    def leaf(v):
        return v.astype(dtype) if dtype is not None and jnp.issubdtype(v.dtype, jnp.floating) else v

    return jax.tree.map(leaf, state)


def jax_train_step(graphdef, tx, dtype):
    """A hand-written train step: ``jax.value_and_grad`` of the merged model, then optax."""
    def step(params, opt_state, rest, inputs, labels):
        def loss_fn(params):
            model = nnx.merge(graphdef, cast(params, dtype), cast(rest, None))
            loss = ops.cross_entropy(model(*cast(inputs, dtype)), labels)
            return loss, nnx.split(model, nnx.Param, ...)[2]

        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rest, loss

    return step
