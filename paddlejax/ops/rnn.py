"""Recurrent ops: one LSTM or GRU layer in one direction, with Paddle's equations.

Inputs are batch-major ``x [batch, time, input]``, initial states ``[batch, hidden]`` and
Paddle's weights ``weight_ih [gates * hidden, input]``, ``weight_hh [gates * hidden, hidden]``,
``bias_ih`` and ``bias_hh [gates * hidden]``. With ``sequence_length [batch]``, steps at or past
a sequence's length output zeros and leave its state alone, so the final state is the one at
its last valid step; ``is_reverse`` runs each sequence's valid steps from last to first.

LSTM gates ``x W_ih^T + b_ih + h W_hh^T + b_hh`` split as (i, f, c~, o); GRU computes
``r = σ(x_r + h_r)``, ``z = σ(x_z + h_z)``, ``c = tanh(x_c + r * h_c)``, ``h = (h_prev - c) * z + c``
from ``x W_ih^T + b_ih`` and ``h W_hh^T + b_hh``, each split as (r, z, c).

>>> import jax.numpy as jnp
>>> from paddlejax.ops.rnn import lstm
>>> x, h0 = jnp.ones((2, 5, 3)), jnp.zeros((2, 4))
>>> out, h, c = lstm(x, h0, h0, jnp.ones((16, 3)), jnp.ones((16, 4)), jnp.zeros(16), jnp.zeros(16),
...                  jnp.array([5, 2]))
>>> out.shape, h.shape, out[1, 2:].tolist() == [[0.0] * 4] * 3
((2, 5, 4), (2, 4), True)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import input_error


def _check(op, gates, x, states, weight_ih, weight_hh, bias_ih, bias_hh, lengths):
    batch, _, size = x.shape
    hidden = weight_hh.shape[-1]
    expected = {"weight_ih": (weight_ih, (gates * hidden, size)), "weight_hh": (weight_hh, (gates * hidden, hidden)),
                "bias_ih": (bias_ih, (gates * hidden,)), "bias_hh": (bias_hh, (gates * hidden,)),
                **{name: (s, (batch, hidden)) for name, s in states.items()}}
    if lengths is not None:
        expected["sequence_length"] = (lengths, (batch,))
    for name, (arr, shape) in expected.items():
        if arr.shape != shape:
            raise input_error(op, name, f"shape {shape} (x is {tuple(x.shape)}, hidden size {hidden})", arr.shape)


def _run(cell, x, weight_ih, bias_ih, state, lengths, is_reverse):
    """``cell(x_gates, state) -> (output, state)`` over time; returns batch-major outputs and
    the final state."""
    # the input projection has no recurrence: one matmul for all steps, outside the loop
    gx = jnp.swapaxes(x @ weight_ih.T + bias_ih, 0, 1)  # [time, batch, gates * hidden]

    if lengths is None:
        def step(s, g):
            out, s = cell(g, s)
            return s, out

        state, out = lax.scan(step, state, gx, reverse=is_reverse)
        return jnp.swapaxes(out, 0, 1), state

    steps = jnp.arange(gx.shape[0])[:, None]
    valid = steps < lengths[None, :]  # [time, batch]
    if is_reverse:
        # step s of sequence b reads time length_b - 1 - s while valid; an involution, so the
        # same gather puts the outputs back in time order
        order = jnp.where(valid, lengths[None, :] - 1 - steps, steps)[:, :, None]
        gx = jnp.take_along_axis(gx, order, axis=0)

    def masked_step(s, inputs):
        g, keep = inputs
        out, new = cell(g, s)
        keep = keep[:, None]
        new = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, s)
        return new, jnp.where(keep, out, jnp.zeros((), out.dtype))

    state, out = lax.scan(masked_step, state, (gx, valid))
    if is_reverse:
        out = jnp.take_along_axis(out, order, axis=0)
    return jnp.swapaxes(out, 0, 1), state


# Jitted so that eager calls reuse one compiled loop per shape; an eager lax.scan would be
# traced and compiled again on every call. Under tracing it is just a nested call.
@functools.partial(jax.jit, static_argnames="is_reverse")
def _lstm(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, sequence_length=None, *, is_reverse):
    """One LSTM layer, one direction (gates i, f, c~, o); returns (out, last_h, last_c)."""
    _check("lstm", 4, x, {"h0": h0, "c0": c0}, weight_ih, weight_hh, bias_ih, bias_hh, sequence_length)

    def cell(gx, state):
        h, c = state
        i, f, g, o = jnp.split(gx + h @ weight_hh.T + bias_hh, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, (h, c)

    out, (h, c) = _run(cell, x, weight_ih, bias_ih, (h0, c0), sequence_length, is_reverse)
    return out, h, c


@functools.partial(jax.jit, static_argnames="is_reverse")
def _gru(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, sequence_length=None, *, is_reverse):
    """One GRU layer, one direction (gates r, z, c); returns (out, last_h)."""
    _check("gru", 3, x, {"h0": h0}, weight_ih, weight_hh, bias_ih, bias_hh, sequence_length)

    def cell(gx, h):
        xr, xz, xc = jnp.split(gx, 3, axis=-1)
        hr, hz, hc = jnp.split(h @ weight_hh.T + bias_hh, 3, axis=-1)
        r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
        c = jnp.tanh(xc + r * hc)
        h = (h - c) * z + c
        return h, h

    return _run(cell, x, weight_ih, bias_ih, h0, sequence_length, is_reverse)


def _rnn_flops(gates):
    def flops(in_shapes, out_shapes, attrs):
        """Two matmuls per step (input and hidden projections)."""
        batch, time, size = in_shapes[0]
        hidden = out_shapes[0][-1]
        return 2 * batch * time * (size + hidden) * gates * hidden

    return flops


_float = dict(dtype="float")
_weights = [Input("weight_ih", rank=2, **_float), Input("weight_hh", rank=2, **_float),
            Input("bias_ih", rank=1, **_float), Input("bias_hh", rank=1, **_float),
            Input("sequence_length", rank=1, dtype="int", optional=True)]
lstm = define("lstm", _lstm,
              inputs=[Input("x", rank=3, **_float), Input("h0", rank=2, **_float), Input("c0", rank=2, **_float),
                      *_weights],
              attrs={"is_reverse": Attr("bool", False)}, outputs=("out", "last_h", "last_c"), flops=_rnn_flops(4),
              traits=Traits())
gru = define("gru", _gru, inputs=[Input("x", rank=3, **_float), Input("h0", rank=2, **_float), *_weights],
             attrs={"is_reverse": Attr("bool", False)}, outputs=("out", "last_h"), flops=_rnn_flops(3),
             traits=Traits())
