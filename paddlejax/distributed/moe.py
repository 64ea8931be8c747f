"""Mixture of experts (GShard / Switch routing) with the experts split over the mesh axis ``"ep"``.

:class:`MoELayer` replaces a Transformer's feed-forward block with ``num_experts`` of them. A
gate scores each token against every expert; each token goes to its ``top_k`` experts (1:
Switch, 2: GShard, the second weighted by its gate as GShard does), and each expert takes at
most ``capacity = ceil(capacity_factor * tokens * top_k / num_experts)`` tokens, in token order,
first choices before second choices. A token over an expert's capacity is dropped for that
expert (its output there is zero; the residual connection around the layer carries it on); the
layer counts them. The auxiliary load-balancing loss is Switch's
``num_experts * sum_e(fraction of tokens whose first choice is e * mean gate probability of e)``:
1.0 when the load is even, up to ``num_experts`` when one expert takes everything.

The experts are one stacked feed-forward network (weights ``[num_experts, ...]``), marked to be
split by experts over ``"ep"`` (``Strategy(expert_parallel_degree=N)``): each device holds
``num_experts / N`` experts, and the routed tokens, laid out ``[experts, capacity, d_model]`` and
split by experts, reach their devices through the all-to-all XLA inserts (and come back through
another). On a mesh without ``"ep"`` it is the same computation on every device.

>>> import jax.numpy as jnp
>>> moe = MoELayer(d_model=8, d_hidden=16, num_experts=4, top_k=2)
>>> y, aux = moe(jnp.ones((2, 5, 8)))    # 10 identical tokens: the same two experts for all
>>> y.shape, moe.capacity(10)
((2, 5, 8), 7)
>>> int(moe.dropped[...]), sorted(moe.load[...].tolist())   # 3 over capacity at each
(6, [0, 0, 7, 7])
"""
from __future__ import annotations

import fractions

import jax
import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.distributed.tensor_parallel import mark_sharding
from paddlejax.nn import Layer, initializer
from paddlejax.nn.args import arg_error, choice, positive_int

EP = "ep"
ACTIVATIONS = {"gelu": jax.nn.gelu, "relu": jax.nn.relu, "silu": jax.nn.silu}


class MoEStats(nnx.Variable):
    """What the last forward pass routed (state the forward pass writes, as batch norm's
    statistics): a layer's ``dropped`` token-expert assignments over capacity, and ``load``,
    the assignments each expert received (dropped ones excluded)."""


def routing(probs: jax.Array, top_k: int, capacity: int):
    """GShard's routing of tokens with gate probabilities ``probs [T, E]``: ``(dispatch, combine,
    aux, dropped, tokens)``, where ``dispatch [T, E, C]`` is 1 where token t takes slot c of expert
    e, ``combine`` the same weighted by the token's (renormalised, for top-2) gate, ``aux`` the
    load-balancing loss, ``dropped`` the assignments over capacity and ``tokens`` each expert's load.

    >>> import jax.numpy as jnp
    >>> d, c, aux, dropped, load = routing(jnp.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]), top_k=1, capacity=1)
    >>> d[:, :, 0].tolist(), int(dropped), load.tolist()   # the second token finds expert 0 full
    ([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]], 1, [1, 1])
    """
    num_experts = probs.shape[1]
    remaining, filled = probs, jnp.zeros(num_experts, jnp.int32)
    masks, gates, slots = [], [], []
    for _ in range(top_k):
        choice = jax.nn.one_hot(jnp.argmax(remaining, axis=1), num_experts, dtype=jnp.int32)
        slot = jnp.cumsum(choice, axis=0) - 1 + filled  # each expert's queue, after earlier choices
        filled = filled + jnp.sum(choice, axis=0)
        masks.append(choice)
        gates.append(jnp.sum(probs * choice, axis=1))
        slots.append(jnp.sum(slot * choice, axis=1))
        remaining = remaining * (1 - choice)
    first = masks[0]
    aux = num_experts * jnp.sum(jnp.mean(first.astype(probs.dtype), axis=0) * jnp.mean(probs, axis=0))
    if top_k > 1:
        total = sum(gates)
        gates = [g / jnp.maximum(total, jnp.finfo(probs.dtype).tiny) for g in gates]
    dispatch = jnp.zeros((*probs.shape, capacity), probs.dtype)
    combine = jnp.zeros_like(dispatch)
    dropped = jnp.int32(0)
    tokens = jnp.zeros(num_experts, jnp.int32)
    for mask, gate, slot in zip(masks, gates, slots):
        kept = mask * (slot < capacity)[:, None]
        place = kept[:, :, None] * jax.nn.one_hot(jnp.minimum(slot, capacity - 1), capacity, dtype=jnp.int32)[:, None]
        dispatch = dispatch + place.astype(probs.dtype)
        combine = combine + place.astype(probs.dtype) * gate[:, None, None]
        dropped = dropped + jnp.sum(mask) - jnp.sum(kept)
        tokens = tokens + jnp.sum(kept, axis=0)
    return dispatch, combine, aux, dropped, tokens


class MoELayer(Layer):
    """``num_experts`` feed-forward experts (``d_model -> d_hidden -> d_model``) behind a gate
    routing each token to its ``top_k`` (1 or 2) experts; call ``layer(x)`` on ``x [..., d_model]``
    for ``(y, aux_loss)`` (add ``aux_weight * aux_loss`` to the training loss: Paddle's gate keeps
    it as ``gate.loss``, a program returns it). ``capacity_factor`` sizes each expert's buffer
    (:func:`routing`); ``moe.dropped`` and ``moe.load`` hold the last call's dropped assignments and
    each expert's load.

    >>> import jax.numpy as jnp
    >>> MoELayer(8, 16, num_experts=4, top_k=1).capacity(tokens=10)
    4
    """

    def __init__(self, d_model, d_hidden, num_experts, top_k=2, capacity_factor=1.25, activation="gelu",
                 weight_attr=None, *, rngs: nnx.Rngs | None = None):
        self.d_model = positive_int("MoELayer", "d_model", d_model)
        d_hidden = positive_int("MoELayer", "d_hidden", d_hidden)
        self.num_experts = positive_int("MoELayer", "num_experts", num_experts)
        if top_k not in (1, 2):
            raise arg_error("MoELayer", "top_k", "1 (Switch) or 2 (GShard)", top_k)
        if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or capacity_factor <= 0:
            raise arg_error("MoELayer", "capacity_factor", "a number > 0", capacity_factor)
        self.top_k, self.capacity_factor = top_k, float(capacity_factor)
        self.activation = choice("MoELayer", "activation", activation, tuple(ACTIVATIONS))
        e = self.num_experts
        param = lambda shape, **kw: self.create_parameter(shape, weight_attr, rngs=rngs, **kw)  # noqa: E731
        self.gate = param((self.d_model, e), arg="weight_attr")
        # each expert's weights initialised as a Linear of its shape would be
        self.w1 = param((e, self.d_model, d_hidden), arg="weight_attr",
                        default_initializer=initializer.XavierUniform(fan_in=self.d_model, fan_out=d_hidden))
        self.b1 = param((e, d_hidden), is_bias=True, arg="weight_attr")
        self.w2 = param((e, d_hidden, self.d_model), arg="weight_attr",
                        default_initializer=initializer.XavierUniform(fan_in=d_hidden, fan_out=self.d_model))
        self.b2 = param((e, self.d_model), is_bias=True, arg="weight_attr")
        for w in (self.w1, self.b1, self.w2, self.b2):
            mark_sharding(w, EP, *([None] * (len(w.shape) - 1)))
        self.dropped, self.load = MoEStats(jnp.int32(0)), MoEStats(jnp.zeros(e, jnp.int32))

    def capacity(self, tokens: int) -> int:
        """Slots per expert for a call routing ``tokens`` tokens (at least 1): integer arithmetic,
        so that a symbolic number of tokens (a program's batch size) gives a symbolic capacity."""
        factor = fractions.Fraction(self.capacity_factor).limit_denominator(1000)
        over = self.num_experts * factor.denominator
        return (tokens * self.top_k * factor.numerator + over - 1) // over

    def forward(self, x):
        if x.shape[-1] != self.d_model:
            raise ValueError(f"MoELayer: input expects {self.d_model} features in its last dimension, got "
                             f"{tuple(x.shape)}")
        tokens = x.reshape(-1, self.d_model)
        probs = jax.nn.softmax(tokens.astype(jnp.float32) @ self.gate[...].astype(jnp.float32), axis=-1)
        dispatch, combine, aux, dropped, load = routing(probs, self.top_k, self.capacity(tokens.shape[0]))
        # tokens laid out by expert, split over "ep": XLA's all-to-all carries them to their experts
        routed = ops.sharding_constraint(jnp.einsum("tec,td->ecd", dispatch.astype(x.dtype), tokens),
                                         dim=0, mesh_axis=EP)
        hidden = jnp.einsum("ecd,edh->ech", routed, self.w1[...]) + self.b1[...][:, None]
        out = jnp.einsum("ech,ehd->ecd", ACTIVATIONS[self.activation](hidden), self.w2[...]) + self.b2[...][:, None]
        out = ops.sharding_constraint(out, dim=0, mesh_axis=EP)
        y = jnp.einsum("tec,ecd->td", combine.astype(x.dtype), out)
        self.dropped.set_value(dropped)
        self.load.set_value(load)
        return y.reshape(x.shape), aux
