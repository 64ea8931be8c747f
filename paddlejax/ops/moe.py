"""Mixture-of-experts feed-forward: ``moe_ffn`` routes tokens to experts (GShard / Switch) and runs
each expert's feed-forward network on the tokens it takes.

Routing (:func:`routing`): a gate scores each token against every expert; each token goes to its
``top_k`` experts (1: Switch; 2: GShard, the two gates renormalised), and each expert takes at
most ``capacity = ceil(capacity_factor * tokens * top_k / num_experts)`` tokens, in token order,
first choices before second choices; a token over capacity is dropped for that expert (counted).
The load-balancing loss is Switch's ``num_experts * sum_e(fraction of first choices for e *
mean gate probability of e)``: 1 when even, ``num_experts`` when one expert takes all.

Where the surrounding ``jax.set_mesh`` has an ``"ep"`` axis, the kernel runs expert parallel:
under ``shard_map`` over the mesh's batch axes each device routes its own tokens (a group, as
GShard's), holds ``num_experts / ep`` experts, and sends the routed tokens to their experts'
devices and back with two all-to-alls over ``"ep"``. Otherwise every token is routed as one group.

>>> import jax, jax.numpy as jnp
>>> rng = jax.random.key(0)
>>> x, gate = jnp.ones((6, 4)), jax.random.normal(rng, (4, 2))
>>> w1, b1 = jnp.ones((2, 4, 8)), jnp.zeros((2, 8))
>>> w2, b2 = jnp.ones((2, 8, 4)), jnp.zeros((2, 4))
>>> y, aux, dropped, load = moe_ffn(x, gate, w1, b1, w2, b2, top_k=1, capacity_factor=1.0)
>>> y.shape, int(dropped), sorted(load.tolist())   # 6 identical tokens, 3 slots an expert
((6, 4), 3, [0, 3])
"""
from __future__ import annotations

import fractions
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.sharding import batch_axes, mesh_axes
from paddlejax.ops.traits import Traits

EP = "ep"
ACTIVATIONS = {"gelu": jax.nn.gelu, "relu": jax.nn.relu, "silu": jax.nn.silu}


def capacity(tokens, num_experts: int, top_k: int, capacity_factor: float):
    """Slots per expert for ``tokens`` tokens (at least 1), in integer arithmetic, so that a
    symbolic number of tokens (a program's batch size) gives a symbolic capacity.

    >>> capacity(10, num_experts=4, top_k=2, capacity_factor=1.25)
    7
    """
    factor = fractions.Fraction(capacity_factor).limit_denominator(1000)
    over = num_experts * factor.denominator
    return (tokens * top_k * factor.numerator + over - 1) // over


def balance_loss(balance) -> jax.Array:
    """Switch's load-balancing loss from ``balance = (fraction of first choices, mean gate
    probability)`` per expert (:func:`routing`'s; means over a group, or over all groups).

    >>> import jax.numpy as jnp
    >>> float(balance_loss((jnp.full(4, 0.25), jnp.full(4, 0.25))))   # even
    1.0
    """
    fraction, mean_prob = balance
    return fraction.shape[0] * jnp.sum(fraction * mean_prob)


def routing(probs: jax.Array, top_k: int, capacity: int):
    """GShard's routing of tokens with gate probabilities ``probs [T, E]``: ``(dispatch, combine,
    balance, dropped, load)``, where ``dispatch [T, E, C]`` is 1 where token t takes slot c of
    expert e, ``combine`` the same weighted by the token's (renormalised, for top-2) gate,
    ``balance`` what :func:`balance_loss` reads, ``dropped`` the assignments over capacity and
    ``load`` each expert's.

    >>> import jax.numpy as jnp
    >>> d, c, balance, dropped, load = routing(jnp.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]), top_k=1, capacity=1)
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
    balance = (jnp.mean(masks[0].astype(probs.dtype), axis=0), jnp.mean(probs, axis=0))
    if top_k > 1:
        total = sum(gates)
        gates = [g / jnp.maximum(total, jnp.finfo(probs.dtype).tiny) for g in gates]
    dispatch = jnp.zeros((*probs.shape, capacity), probs.dtype)
    combine = jnp.zeros_like(dispatch)
    dropped, load = jnp.int32(0), jnp.zeros(num_experts, jnp.int32)
    for mask, gate, slot in zip(masks, gates, slots):
        kept = mask * (slot < capacity)[:, None]
        place = kept[:, :, None] * jax.nn.one_hot(jnp.minimum(slot, capacity - 1), capacity, dtype=jnp.int32)[:, None]
        dispatch = dispatch + place.astype(probs.dtype)
        combine = combine + place.astype(probs.dtype) * gate[:, None, None]
        dropped = dropped + jnp.sum(mask) - jnp.sum(kept)
        load = load + jnp.sum(kept, axis=0)
    return dispatch, combine, balance, dropped, load


def experts(routed, w1, b1, w2, b2, activation: str):
    """Each expert's feed-forward network on its ``routed [E, C, d]`` tokens."""
    hidden = jnp.einsum("ecd,edh->ech", routed, w1) + b1[:, None]
    return jnp.einsum("ech,ehd->ecd", ACTIVATIONS[activation](hidden), w2) + b2[:, None]


def moe_group(x, gate, w1, b1, w2, b2, *, top_k, capacity_factor, activation, exchange=None):
    """One group of tokens ``x [T, d]`` through the experts: ``(y, balance, dropped, load)``. With
    ``exchange(routed, split_axis, concat_axis)`` (an all-to-all inside ``shard_map``) ``w1``...
    are this device's experts, and the routed tokens travel to their devices and back."""
    probs = jax.nn.softmax(x.astype(jnp.float32) @ gate.astype(jnp.float32), axis=-1)
    slots = capacity(x.shape[0], gate.shape[1], top_k, capacity_factor)
    dispatch, combine, balance, dropped, load = routing(probs, top_k, slots)
    routed = jnp.einsum("tec,td->ecd", dispatch.astype(x.dtype), x)  # [E, C, d]
    if exchange is None:
        out = experts(routed, w1, b1, w2, b2, activation)
    else:  # [E / n, n * C, d]: every device's tokens for this device's experts, and back
        out = exchange(experts(exchange(routed, 0, 1), w1, b1, w2, b2, activation), 1, 0)
    return jnp.einsum("tec,ecd->td", combine.astype(x.dtype), out), balance, dropped, load


def _moe_ffn(x, gate, w1, b1, w2, b2, *, top_k, capacity_factor, activation):
    """Tokens ``x [..., d]`` through the experts (see the module doc): ``(y, aux, dropped, load)``."""
    tokens = x.reshape(-1, x.shape[-1])
    options = dict(top_k=top_k, capacity_factor=capacity_factor, activation=activation)
    axes = mesh_axes()
    if EP not in axes:
        y, balance, dropped, load = moe_group(tokens, gate, w1, b1, w2, b2, **options)
        return y.reshape(x.shape), balance_loss(balance), dropped, load
    batch = batch_axes()

    def per_device(x, gate, w1, b1, w2, b2):
        exchange = functools.partial(lax.all_to_all, axis_name=EP, tiled=True)
        y, balance, dropped, load = moe_group(x.reshape(-1, x.shape[-1]), gate, w1, b1, w2, b2, **options,
                                              exchange=lambda a, s, c: exchange(a, split_axis=s, concat_axis=c))
        # the whole batch's fractions and mean probabilities (equal groups): the loss one device gives
        whole = balance_loss(lax.pmean(balance, batch))
        return y.reshape(x.shape), whole, lax.psum(dropped, batch), lax.psum(load, batch)

    expert_spec = P(EP)
    return jax.shard_map(per_device, in_specs=(P(batch), P(), *[expert_spec] * 4), out_specs=(P(batch), P(), P(), P()),
                         axis_names=set(batch))(x, gate, w1, b1, w2, b2)


def _moe_flops(in_shapes, out_shapes, attrs):
    """The experts' two matmuls for every token's ``top_k`` choices (the gate and routing aside)."""
    return 4 * math.prod(in_shapes[0][:-1]) * attrs["top_k"] * in_shapes[0][-1] * in_shapes[2][-1]


moe_ffn = define(
    "moe_ffn", _moe_ffn,
    inputs=[Input("x", dtype="float"), Input("gate", rank=2, dtype="float"), Input("w1", rank=3, dtype="float"),
            Input("b1", rank=2, dtype="float"), Input("w2", rank=3, dtype="float"), Input("b2", rank=2, dtype="float")],
    outputs=("y", "aux_loss", "dropped", "load"), multiple_results=True,
    attrs={"top_k": Attr("int", 2, choices=(1, 2)), "capacity_factor": Attr("float", 1.25, minimum=1e-3),
           "activation": Attr("str", "gelu", choices=tuple(ACTIVATIONS))},
    flops=_moe_flops, traits=Traits(batch_coupled=True))
