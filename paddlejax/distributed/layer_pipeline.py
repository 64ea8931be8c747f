"""Pipelines of identical layers, partitioned by XLA: the pipeline axis of a 3-D
(pipeline x data x tensor) mesh.

A program's runs of identical layers (:func:`paddlejax.passes.layer_stack.find_layers`: a
Transformer's encoder and decoder layers) have their parameters stacked, ``[layers, ...]``, split
over the mesh axis ``"pp"`` by layers: each of ``S`` stages holds ``layers / S`` consecutive
layers. A run goes through the stages as a GPipe schedule over ``micro_batches`` micro-batches,
written as one loop that every device runs alike (no branch per stage): at each of
``micro_batches + S - 1`` ticks the activations move one stage on (``jnp.roll`` along the stage
axis, a collective permute), the next micro-batch enters stage 0, and every stage runs its layers
on what it holds (``jax.vmap`` over the stage axis with ``spmd_axis_name="pp"``, so each device
computes its own stage). The ops between runs (embeddings, heads) run on the whole batch.
Nothing in it is hand-partitioned: the tensor-parallel marks inside the layers (``"mp"``) and
the batch split (``"dp"``) are XLA's to honour, in the same program, and JAX differentiates the
loop for the backward pass.

State a layer updates in the forward pass (its dropout key) takes the last micro-batch's value,
floating-point state the micro-batches' mean, as in the stage pipeline.

>>> import jax, jax.numpy as jnp, paddlejax as pj
>>> from jax.sharding import Mesh
>>> from paddlejax.passes.layer_stack import find_layers
>>> def net(p, x):
...     for i in range(4):
...         x = jnp.tanh(pj.ops.linear(x, p[f"blocks.{i}.w"]))
...     return x
>>> params = {f"blocks.{i}.w": jnp.eye(3) * 0.5 for i in range(4)}
>>> program = pj.trace(net, pj.InputSpec((None, 3)), params=params)
>>> pipeline = LayerPipeline(find_layers(program), stages=2, micro_batches=2)
>>> mesh = Mesh(jax.devices()[:2], ("pp",))
>>> with jax.set_mesh(mesh):
...     out = jax.jit(pipeline.apply)(pipeline.stack(program.params), jnp.ones((4, 3)))
>>> bool(jnp.allclose(out, program(jnp.ones((4, 3)))))
True
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from paddlejax.ops.sharding import mesh_axes
from paddlejax.passes.layer_stack import LayerSplit, LayerStack, Segment

PP = "pp"


def stacked_name(stack: LayerStack, rest: str) -> str:
    """The name a stack's parameters go by once stacked: ``<stack>.*.<rest>``."""
    return f"{stack.name}.*.{rest}"


class LayerPipeline:
    """``split`` (a program cut by :func:`~paddlejax.passes.layer_stack.find_layers`) run with each
    layer stack pipelined over ``stages`` stages and ``micro_batches`` micro-batches; the batch
    split over ``batch_axes`` of the mesh; ``recompute`` recomputes each layer's activations in
    the backward pass. :meth:`apply` is the program's ``apply``, with the stacks' parameters
    stacked (:meth:`stack`)."""

    def __init__(self, split: LayerSplit, stages: int, micro_batches: int, batch_axes: tuple[str, ...] = (),
                 recompute: bool = False):
        for stack in split.stacks:
            if stack.count % stages:
                raise ValueError(f"pipeline: {stack.count} layers of '{stack.name}' do not split evenly into "
                                 f"{stages} stages")
        self.split, self.stages, self.micro_batches = split, stages, micro_batches
        self.batch_axes, self.recompute = tuple(batch_axes), recompute
        self.program = split.program

    # -- the parameters, stacked ---------------------------------------------------------------
    def stack(self, values: dict) -> dict:
        """``values`` with each stack's per-layer entries replaced by one ``[layers, ...]`` array
        under :func:`stacked_name` (entries a stack does not read stay by name)."""
        out = dict(values)
        for stack in self.split.stacks:
            for k, rest in enumerate(stack.rests):
                names = [layer[k] for layer in stack.params]
                if names[0] in out:
                    out[stacked_name(stack, rest)] = jnp.stack([out.pop(n) for n in names])
        return out

    def unstack(self, values: dict) -> dict:
        """:meth:`stack`'s inverse: every stacked entry back by layer names."""
        out = dict(values)
        for stack in self.split.stacks:
            for k, rest in enumerate(stack.rests):
                name = stacked_name(stack, rest)
                if name in out:
                    whole = out.pop(name)
                    out.update({layer[k]: whole[i] for i, layer in enumerate(stack.params)})
        return out

    def stacked_names(self) -> dict[str, str]:
        """Stacked name -> the name of layer 0's parameter it holds the stack of."""
        return {stacked_name(s, rest): s.params[0][k] for s in self.split.stacks for k, rest in enumerate(s.rests)}

    # -- running -----------------------------------------------------------------------------
    def apply(self, values: dict, *inputs):
        """What ``program.apply(values, *inputs)`` computes, the stacks pipelined; ``values`` may
        hold any stack's parameters stacked or by layer."""
        values = self.stack(values)
        env = dict(zip(self.program.inputs, jax.tree_util.tree_leaves(inputs)))
        for part in self.split.parts:
            if isinstance(part, Segment):
                outs = part.program.apply(_reads(part.program, values), *[env[v] for v in part.inputs])
                env.update(zip(part.outputs, outs))
            else:
                self._run_stack(part, values, env)
        leaves = [env[v] for v in self.program.outputs]
        return jax.tree_util.tree_unflatten(self.program.out_tree, leaves)

    def _run_stack(self, stack: LayerStack, values: dict, env: dict) -> None:
        stacked = {rest: values[stacked_name(stack, rest)] for rest in stack.rests}
        own = set(stack.params[0])
        shared = {op.attrs["name"]: values[op.attrs["name"]] for op in stack.layer.param_ops()
                  if op.attrs["name"] not in own}
        carry = [env[v] for v in stack.carry_in]
        broadcast = [env[v] for v in stack.broadcast]
        last, sides = self._pipeline(stack, stacked, shared, carry, broadcast)
        env.update(zip(stack.carry_out[-1], last))
        for i, layer_sides in enumerate(stack.side):
            env.update((v, s[i]) for v, s in zip(layer_sides, sides))

    def _layer_fn(self, stack: LayerStack, shared: dict):
        """``f(params by rest, carry, broadcast) -> (carry, sides)`` for one layer."""
        names = dict(zip(stack.rests, stack.params[0]))
        carries = len(stack.carry_in)

        def layer(params, carry, broadcast):
            outs = stack.layer.apply({**shared, **{names[r]: v for r, v in params.items()}}, *carry, *broadcast)
            return list(outs[:carries]), list(outs[carries:])

        return jax.checkpoint(layer) if self.recompute else layer

    def _pipeline(self, stack: LayerStack, stacked: dict, shared: dict, carry: list, broadcast: list):
        S, M, N = self.stages, self.micro_batches, stack.count
        batch = carry[0].shape[0]
        if batch % M:
            raise ValueError(f"pipeline: a batch of {batch} does not split into {M} micro-batches")
        mb = batch // M
        size = stack.carry_in[0].type.shape[0]  # the batch's size in the program: a symbol, or a number
        batched = [bool(v.type.shape) and v.type.shape[0] == size for v in stack.broadcast]
        micro = lambda x: x.reshape(M, mb, *x.shape[1:])  # noqa: E731
        feeds = [micro(c) for c in carry] + [micro(b) for b, t in zip(broadcast, batched) if t]
        fixed = [b for b, t in zip(broadcast, batched) if not t]
        by_stage = {r: a.reshape(S, N // S, *a.shape[1:]) for r, a in stacked.items()}
        layer = self._layer_fn(stack, shared)
        nc = len(carry)

        def stage(params, flowing, fixed):
            """One stage's layers on what it holds: the carry goes through them, the batched
            broadcast values along."""
            moving, along = flowing[:nc], flowing[nc:]
            it = iter(along)
            bc = [next(it) if t else f for t, f in zip(batched, _fill(fixed, batched))]

            def body(c, p):
                c, side = layer(p, c, bc)
                return c, side

            moving, sides = lax.scan(body, moving, params)
            return moving + along, sides

        one = jax.eval_shape(lambda: stage({r: a[0] for r, a in by_stage.items()},
                                           [f[0] for f in feeds], fixed)[1])
        on_mesh = PP in mesh_axes()

        def spec(x):  # each stage's slot on its own devices, its rows split as the batch is
            return lax.with_sharding_constraint(x, P(PP, self.batch_axes or None)) if on_mesh else x

        state = [spec(jnp.zeros((S, *f.shape[1:]), f.dtype)) for f in feeds]
        outs = [jnp.zeros_like(c) for c in feeds[:nc]]
        acc = [jnp.zeros((S, *s.shape), s.dtype) for s in one]

        def tick(carried, t):
            state, outs, acc = carried
            entering = [lax.dynamic_index_in_dim(f, jnp.minimum(t, M - 1), keepdims=False) for f in feeds]
            state = [spec(jnp.roll(s, 1, axis=0).at[0].set(e)) for s, e in zip(state, entering)]
            state, sides = jax.vmap(stage, in_axes=(0, 0, None), spmd_axis_name=PP)(by_stage, state, fixed)
            done = t - (S - 1)  # the micro-batch leaving the last stage
            outs = [jnp.where(done >= 0, lax.dynamic_update_index_in_dim(o, s[S - 1], jnp.maximum(done, 0), 0), o)
                    for o, s in zip(outs, state[:nc])]
            m = t - jnp.arange(S)  # the micro-batch each stage ran
            real = ((m >= 0) & (m < M)).reshape(S, *([1] * (acc[0].ndim - 1))) if acc else None
            acc = [jnp.where(real, a + s / M, a) if jnp.issubdtype(a.dtype, jnp.inexact) else jnp.where(real, s, a)
                   for a, s in zip(acc, sides)]
            return (state, outs, acc), None

        (_, outs, acc), _ = lax.scan(tick, (state, outs, acc), jnp.arange(M + S - 1))
        last = [o.reshape(batch, *o.shape[2:]) for o in outs]
        return last, [a.reshape(N, *a.shape[2:]) for a in acc]


def _fill(fixed: list, batched: list) -> list:
    """The unbatched broadcast values in the places of all broadcast values (None where batched)."""
    it = iter(fixed)
    return [None if t else next(it) for t in batched]


def _reads(program, values: dict) -> dict:
    """The entries of ``values`` that ``program``'s param ops name."""
    return {op.attrs["name"]: values[op.attrs["name"]] for op in program.param_ops()}
