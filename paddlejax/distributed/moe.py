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
``num_experts / N`` experts, routes its own tokens (a group, as GShard's: the capacity is per
device) and sends them, laid out ``[experts, capacity, d_model]``, to their experts' devices and
back with two all-to-alls over ``"ep"`` (the ``moe_ffn`` op does this under the mesh). Without
``"ep"`` every token of the call is routed as one group. Under plain data parallelism each
device routes its own rows; the dropped counts and loads are summed over the devices.

>>> import jax.numpy as jnp
>>> moe = MoELayer(d_model=8, d_hidden=16, num_experts=4, top_k=2)
>>> y, aux = moe(jnp.ones((2, 5, 8)))    # 10 identical tokens: the same two experts for all
>>> y.shape, moe.capacity(10)
((2, 5, 8), 7)
>>> int(moe.dropped[...]), sorted(moe.load[...].tolist())   # 3 over capacity at each
(6, [0, 0, 7, 7])
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.distributed.tensor_parallel import mark_sharding
from paddlejax.nn import Layer, initializer
from paddlejax.nn.args import arg_error, choice, positive_int
from paddlejax.ops.moe import ACTIVATIONS, EP, balance_loss, capacity, moe_group
from paddlejax.ops.moe import routing  # noqa: F401  (part of this module's face)


class MoEStats(nnx.Variable):
    """What the last forward pass routed (state the forward pass writes, as batch norm's
    statistics): a layer's ``dropped`` token-expert assignments over capacity, and ``load``,
    the assignments each expert received (dropped ones excluded)."""


class MoELayer(Layer):
    """``num_experts`` feed-forward experts (``d_model -> d_hidden -> d_model``) behind a gate
    routing each token to its ``top_k`` (1 or 2) experts (the ``moe_ffn`` op); call ``layer(x)``
    on ``x [..., d_model]`` for ``(y, aux_loss)`` (add ``aux_weight * aux_loss`` to the training
    loss: Paddle's gate keeps it as ``gate.loss``, a program returns it). ``capacity_factor``
    sizes each expert's buffer; ``moe.dropped`` and ``moe.load`` hold the last call's dropped
    assignments and each expert's load.

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
        """Slots per expert for a call routing ``tokens`` tokens."""
        return capacity(tokens, self.num_experts, self.top_k, self.capacity_factor)

    def weights(self) -> dict:
        """The experts' stacked weights: ``w1 [E, d_model, d_hidden]``, ``b1``, ``w2``, ``b2``."""
        return {"w1": self.w1[...], "b1": self.b1[...], "w2": self.w2[...], "b2": self.b2[...]}

    def _options(self) -> dict:
        return dict(top_k=self.top_k, capacity_factor=self.capacity_factor, activation=self.activation)

    def forward(self, x):
        if x.shape[-1] != self.d_model:
            raise ValueError(f"MoELayer: input expects {self.d_model} features in its last dimension, got "
                             f"{tuple(x.shape)}")
        w = self.weights()
        y, aux, dropped, load = ops.moe_ffn(x, self.gate[...], w["w1"], w["b1"], w["w2"], w["b2"], **self._options())
        self.dropped.set_value(dropped)
        self.load.set_value(load)
        return y, aux

    def expert_parallel(self, x, weights: dict, axes: tuple[str, ...], hierarchical: bool = False):
        """The layer inside your own ``shard_map``, with explicit all-to-alls: ``x [T, d_model]``
        this device's tokens (routed as a group of their own), ``weights`` this device's slice of
        :meth:`weights` (``num_experts / devices`` experts, in device order over ``axes``). Tokens
        travel to their experts' devices and back by
        :func:`~paddlejax.distributed.collectives.all_to_all`, in two steps (within a node, then
        across) with ``hierarchical``. Returns ``(y, aux_loss)`` for this device's tokens.
        """
        from paddlejax.distributed.collectives import all_to_all

        exchange = functools.partial(all_to_all, axes=axes, hierarchical=hierarchical)
        def swap(routed, split, concat):
            return exchange(routed, split_axis=split, concat_axis=concat)

        y, balance, _, _ = moe_group(x, self.gate[...], weights["w1"], weights["b1"], weights["w2"], weights["b2"],
                                     **self._options(), exchange=swap)
        return y, balance_loss(jax.lax.pmean(balance, axes))
