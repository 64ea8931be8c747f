"""Recurrent layers: LSTM and GRU as in Paddle, one ``lstm`` / ``gru`` op per layer and direction.

Inputs are ``[batch, time, input_size]`` (``[time, batch, input_size]`` if ``time_major``);
outputs ``[batch, time, num_directions * hidden_size]``; states ``[num_layers *
num_directions, batch, hidden_size]``, layer-major (forward before backward). With
``sequence_length``, steps at or past a sequence's length output zeros and leave its state
alone, and the backward direction starts at each sequence's own last valid step.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> lstm = nn.LSTM(3, 4, num_layers=2, direction="bidirect")
>>> out, (h, c) = lstm(jnp.ones((2, 5, 3)), sequence_length=jnp.array([5, 3]))
>>> out.shape, h.shape, float(abs(out[1, 3:]).max())
((2, 5, 8), (4, 2, 4), 0.0)
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, positive_int, probability
from paddlejax.nn.common import Dropout
from paddlejax.nn.initializer import Uniform
from paddlejax.nn.layer import Layer

_DIRECTIONS = {"forward": 1, "bidirect": 2, "bidirectional": 2}


class _RNNBase(Layer):
    """Stacked, optionally bidirectional recurrent layers over one op per layer and direction."""

    _op = None
    _gates = 0
    _num_states = 1

    def __init__(self, input_size, hidden_size, num_layers=1, direction="forward", time_major=False, dropout=0.0,
                 weight_ih_attr=None, weight_hh_attr=None, bias_ih_attr=None, bias_hh_attr=None, *,
                 rngs: nnx.Rngs | None = None):
        name = type(self).__name__
        self.input_size = positive_int(name, "input_size", input_size)
        self.hidden_size = positive_int(name, "hidden_size", hidden_size)
        self.num_layers = positive_int(name, "num_layers", num_layers)
        self.num_directions = _DIRECTIONS[choice(name, "direction", direction, tuple(_DIRECTIONS))]
        if not isinstance(time_major, bool):
            raise arg_error(name, "time_major", "a bool", time_major)
        self.time_major = time_major
        self.dropout = probability(name, "dropout", dropout)
        # Paddle drops out between stacked layers, not after the last
        self.inter_dropout = Dropout(self.dropout, rngs=rngs) if self.dropout > 0 and self.num_layers > 1 else None
        std = 1.0 / math.sqrt(self.hidden_size)
        rows = self._gates * self.hidden_size
        specs = (("weight_ih", weight_ih_attr, False), ("weight_hh", weight_hh_attr, False),
                 ("bias_ih", bias_ih_attr, True), ("bias_hh", bias_hh_attr, True))
        for layer in range(self.num_layers):
            in_size = self.input_size if layer == 0 else self.num_directions * self.hidden_size
            shapes = {"weight_ih": (rows, in_size), "weight_hh": (rows, self.hidden_size), "bias_ih": (rows,),
                      "bias_hh": (rows,)}
            for direction in range(self.num_directions):
                for kind, attr, is_bias in specs:
                    param = self.create_parameter(shapes[kind], attr, is_bias=is_bias,
                                                  default_initializer=Uniform(-std, std), rngs=rngs,
                                                  arg=f"{kind}_attr")
                    setattr(self, self._param_name(kind, layer, direction), param)

    @staticmethod
    def _param_name(kind, layer, direction):
        return f"{kind}_l{layer}{'_reverse' if direction else ''}"

    def _weights(self, layer, direction):
        weights = []
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            param = getattr(self, self._param_name(kind, layer, direction))
            # a bias turned off with attr=False contributes zeros
            weights.append(jnp.zeros(self._gates * self.hidden_size, jnp.float32) if param is None else param[...])
        return weights

    def _initial_states(self, initial_states, batch, dtype):
        """The initial state tuple of each layer and direction, in Paddle's layer-major order."""
        count = self.num_layers * self.num_directions
        if initial_states is None:
            zeros = jnp.zeros((batch, self.hidden_size), dtype)
            return [(zeros,) * self._num_states] * count
        shape = (count, batch, self.hidden_size)
        states = [initial_states] if self._num_states == 1 else list(initial_states)
        if len(states) != self._num_states or any(tuple(getattr(s, "shape", ())) != shape for s in states):
            expected = "h" if self._num_states == 1 else "(h, c)"
            raise arg_error(type(self).__name__, "initial_states", f"{expected} of shape {shape}",
                            [getattr(s, "shape", s) for s in states])
        return [tuple(s[k] for s in states) for k in range(count)]

    def forward(self, inputs, initial_states=None, sequence_length=None):
        x = ops.transpose(inputs, perm=(1, 0, 2)) if self.time_major else inputs
        if x.ndim != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}: input 'inputs' expects shape [batch, time, {self.input_size}]"
                             f"{' (time-major)' if self.time_major else ''}, got {tuple(inputs.shape)}")
        states = self._initial_states(initial_states, x.shape[0], x.dtype)
        lengths = None if sequence_length is None else jnp.asarray(sequence_length, jnp.int32)
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.num_directions):
                out, *final = self._op(x, *states[layer * self.num_directions + direction],
                                       *self._weights(layer, direction), lengths, is_reverse=bool(direction))
                outputs.append(out)
                finals.append(final)
            x = outputs[0] if len(outputs) == 1 else ops.concat(*outputs, axis=-1)
            if self.inter_dropout is not None and layer < self.num_layers - 1:
                x = self.inter_dropout(x)
        out = ops.transpose(x, perm=(1, 0, 2)) if self.time_major else x
        stacked = [jnp.stack(s) for s in zip(*finals)]
        return out, (stacked[0] if self._num_states == 1 else tuple(stacked))


class LSTM(_RNNBase):
    """Long short-term memory, Paddle's ``paddle.nn.LSTM``; returns ``(outputs, (h, c))``.

    Gates ``x W_ih^T + b_ih + h W_hh^T + b_hh`` split as (i, f, c~, o); parameters per layer
    ``l`` are ``weight_ih_l{l}`` ``[4 * hidden, input]``, ``weight_hh_l{l}`` ``[4 * hidden,
    hidden]``, ``bias_ih_l{l}``, ``bias_hh_l{l}`` ``[4 * hidden]``, and ``..._reverse`` for
    the backward direction. ``dropout`` applies between stacked layers in training.

    Default initialisers (Paddle's): every weight and bias Uniform(-1/sqrt(hidden),
    1/sqrt(hidden)).

    >>> import jax, jax.numpy as jnp
    >>> lstm = LSTM(3, 4)
    >>> lstm.weight_ih_l0[...].shape
    (16, 3)
    >>> [e.primitive.name for e in jax.make_jaxpr(lstm)(jnp.ones((2, 5, 3))).eqns if e.primitive.name == "lstm"]
    ['lstm']
    """

    _op = ops.lstm
    _gates = 4
    _num_states = 2


class GRU(_RNNBase):
    """Gated recurrent unit, Paddle's ``paddle.nn.GRU``; returns ``(outputs, h)``.

    From ``x W_ih^T + b_ih`` and ``h W_hh^T + b_hh``, each split as (r, z, c):
    ``r = σ(x_r + h_r)``, ``z = σ(x_z + h_z)``, ``c = tanh(x_c + r * h_c)``,
    ``h = (h_prev - c) * z + c``. Parameters as :class:`LSTM` with ``3 * hidden`` rows.

    Default initialisers (Paddle's): every weight and bias Uniform(-1/sqrt(hidden),
    1/sqrt(hidden)).

    >>> import jax.numpy as jnp
    >>> out, h = GRU(3, 4, direction="bidirectional")(jnp.ones((2, 5, 3)))
    >>> out.shape, h.shape
    ((2, 5, 8), (2, 2, 4))
    """

    _op = ops.gru
    _gates = 3
