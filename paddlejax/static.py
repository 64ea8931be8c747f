"""Static mode: turn a (dygraph) NNX model into a :class:`~paddlejax.ir.Program`.

``to_static(model, *input_spec)`` captures the model in inference mode (dropout off, batch
norm on its running statistics). ``train=True`` captures training mode, where the program
returns ``(outputs, updates)``: ``updates`` maps the name of every state variable the forward
pass changed (batch-norm running statistics, dropout keys) to its new value, so a training
step can carry the state forward. The model itself is not modified.

>>> import jax.numpy as jnp, paddlejax as pj
>>> from flax import nnx
>>> model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.BatchNorm(4, rngs=nnx.Rngs(0)))
>>> prog = pj.to_static(model, pj.InputSpec((None, 3)))
>>> sorted(prog.params)
['layers.0.bias', 'layers.0.kernel', 'layers.1.bias', 'layers.1.mean', 'layers.1.scale', 'layers.1.var']
>>> out, updates = pj.to_static(model, pj.InputSpec((None, 3)), train=True)(jnp.ones((2, 3)))
>>> sorted(updates)
['layers.1.mean', 'layers.1.var']
"""
from __future__ import annotations

import inspect

import jax

from paddlejax.capture import trace, variable_sharding
from paddlejax.ir.core import Program


class ModelState:
    """A model's variables flattened to ``{path name: value}`` and written back on demand.

    >>> from flax import nnx
    >>> state = ModelState(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    >>> sorted(state.values), sorted(state.trainable)
    (['bias', 'kernel'], ['bias', 'kernel'])
    """

    def __init__(self, model):
        from flax import nnx

        self.model = model
        self.graphdef, state = nnx.split(model)
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(
            state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        self.names = [jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in leaves]
        self.variables = [v for _, v in leaves]
        self.values = {n: v.get_value() for n, v in zip(self.names, self.variables) if _is_array(v.get_value())}
        self.trainable = {n for n, v in zip(self.names, self.variables)
                          if isinstance(v, nnx.Param) and n in self.values}
        self.shardings = {n: spec for n, v in zip(self.names, self.variables)
                          if n in self.values and (spec := variable_sharding(v))}

    def merge(self, values: dict):
        """A copy of the model whose variables hold ``values`` (others keep their own)."""
        from flax import nnx

        new = [v.replace(values[n]) if n in values else v for n, v in zip(self.names, self.variables)]
        return nnx.merge(self.graphdef, jax.tree_util.tree_unflatten(self.treedef, new))

    def read(self, model) -> dict:
        """``{name: value}`` of a model with this structure (e.g. one returned by :meth:`merge`)."""
        from flax import nnx

        _, state = nnx.split(model)
        leaves = jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        return {n: v.get_value() for n, v in zip(self.names, leaves) if n in self.values}

    def write(self, values: dict) -> None:
        """Store ``values`` into the original model's variables."""
        for n, v in zip(self.names, self.variables):
            if n in values:
                v.set_value(values[n])


def _is_array(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _with_values_first(call) -> inspect.Signature:
    try:
        params = list(inspect.signature(call).parameters.values())
    except (TypeError, ValueError):
        params = [inspect.Parameter("x", inspect.Parameter.VAR_POSITIONAL)]
    values = inspect.Parameter("values", inspect.Parameter.POSITIONAL_ONLY)
    return inspect.Signature([values, *params])


def set_mode(model, train: bool) -> None:
    """``model.train()`` or ``model.eval()`` (Paddle layers and plain NNX modules alike)."""
    model.train() if train else model.eval()


def to_static(model, *input_spec, train: bool = False, name: str | None = None) -> Program:
    """Capture ``model`` (an ``nnx.Module``) as a Program with its variables named by path.

    ``input_spec`` are :class:`~paddlejax.InputSpec`, arrays or ``ShapeDtypeStruct``s (any
    pytree). In training mode the program returns ``(outputs, updates)``; see the module doc.
    """
    state = ModelState(model)

    def forward(values, *inputs):
        copy = state.merge(values)
        set_mode(copy, train)
        out = copy(*inputs)
        if not train:
            return out
        new = state.read(copy)
        return out, {n: v for n, v in new.items() if v is not values[n]}

    forward.__signature__ = _with_values_first(model.__call__)  # inputs keep the model's argument names
    return trace(forward, *input_spec, params=state.values, name=name or type(model).__name__,
                 shardings=state.shardings)
