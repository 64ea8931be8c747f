"""LSTM and GRU against a numpy reference of Paddle's equations that runs each sequence alone
over its valid steps, plus padding behaviour, layouts, dropout, gradients and nnx.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def lstm_step(x_gates, h_gates, state):
    hid = state[0].shape[-1]
    gate = [x_gates[k * hid:(k + 1) * hid] + h_gates[k * hid:(k + 1) * hid] for k in range(4)]  # i, f, c~, o
    c = sigmoid(gate[1]) * state[1] + sigmoid(gate[0]) * np.tanh(gate[2])
    return sigmoid(gate[3]) * np.tanh(c), c


def gru_step(x_gates, h_gates, state):
    hid = state[0].shape[-1]
    xr, xz, xc = (x_gates[k * hid:(k + 1) * hid] for k in range(3))
    hr, hz, hc = (h_gates[k * hid:(k + 1) * hid] for k in range(3))
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    c = np.tanh(xc + r * hc)
    return ((state[0] - c) * z + c,)


def np_model(layer, x, lengths, initial):
    """Paddle's stacked, optionally bidirectional RNN applied to each sequence of ``x``
    truncated to its length; returns zero-padded outputs and the final states."""
    step = lstm_step if isinstance(layer, nn.LSTM) else gru_step
    params = {name: np.asarray(p[...], np.float64) for name, p in layer.named_parameters()}
    layers, dirs, hidden = layer.num_layers, layer.num_directions, layer.hidden_size
    out = np.zeros(x.shape[:2] + (dirs * hidden,))
    finals = np.zeros((len(initial), layers * dirs, x.shape[0], hidden))
    for n, length in enumerate(lengths):
        seq = x[n, :length].astype(np.float64)
        for layer_i in range(layers):
            outputs = []
            for d in range(dirs):
                suffix = f"_l{layer_i}" + ("_reverse" if d else "")
                w_ih, w_hh, b_ih, b_hh = (params[k + suffix] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                state = tuple(s[layer_i * dirs + d, n] for s in initial)
                hs = []
                for x_t in (seq[::-1] if d else seq):
                    state = step(w_ih @ x_t + b_ih, w_hh @ state[0] + b_hh, state)
                    hs.append(state[0])
                outputs.append(np.array(hs[::-1] if d else hs))
                finals[:, layer_i * dirs + d, n] = state
            seq = np.concatenate(outputs, -1)
        out[n, :length] = seq
    return out, finals


def as_list(states):
    return [states] if not isinstance(states, tuple) else list(states)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("num_layers,direction,with_lengths,with_initial", [
    (1, "forward", False, False), (2, "bidirect", True, True)], ids=["1-layer", "2-layer-bidirect-padded"])
def test_matches_numpy_reference(cls, num_layers, direction, with_lengths, with_initial):
    layer = cls(3, 4, num_layers=num_layers, direction=direction)
    x = rand(3, 5, 3)
    lengths = np.array([5, 2, 4]) if with_lengths else np.array([5, 5, 5])
    n_states = 2 if cls is nn.LSTM else 1
    initial = [rand(num_layers * layer.num_directions, 3, 4) for _ in range(n_states)] if with_initial else \
        [np.zeros((num_layers * layer.num_directions, 3, 4), np.float32)] * n_states
    out, states = layer(x, (initial[0] if n_states == 1 else tuple(initial)) if with_initial else None,
                        lengths if with_lengths else None)
    want_out, want_states = np_model(layer, x, lengths, initial)
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
    for got, want in zip(as_list(states), want_states):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if with_lengths:
        assert not np.asarray(out)[1, 2:].any()  # past the length: exactly zero


def shapes(layer):
    return {name: tuple(p[...].shape) for name, p in layer.named_parameters()}


def test_parameters_are_named_and_shaped_as_paddle():
    lstm = shapes(nn.LSTM(3, 4, num_layers=2, direction="bidirectional"))
    assert lstm["weight_ih_l0"] == (16, 3) and lstm["weight_ih_l1_reverse"] == (16, 8)
    assert lstm["weight_hh_l1"] == (16, 4) and lstm["bias_ih_l0_reverse"] == (16,)
    assert len(lstm) == 16
    assert shapes(nn.GRU(3, 4)) == {"weight_ih_l0": (12, 3), "weight_hh_l0": (12, 4), "bias_ih_l0": (12,),
                                    "bias_hh_l0": (12,)}


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_padded_sequence_ends_in_the_state_of_running_it_alone(cls):
    layer = cls(2, 3, direction="bidirect")
    x = rand(2, 6, 2)
    out, states = layer(x, sequence_length=jnp.array([6, 3]))
    alone_out, alone_states = layer(x[1:, :3])
    np.testing.assert_allclose(out[1:, :3], alone_out, rtol=1e-5, atol=1e-6)
    for padded, alone in zip(as_list(states), as_list(alone_states)):
        np.testing.assert_allclose(padded[:, 1:], alone, rtol=1e-5, atol=1e-6)


def test_time_major_layout_and_one_op_per_layer_and_direction():
    layer = nn.GRU(3, 4, num_layers=2, direction="bidirect", time_major=True)
    x = rand(5, 2, 3)  # [time, batch, input]
    out, h = layer(x)
    batch_major = nn.GRU(3, 4, num_layers=2, direction="bidirect")
    nnx.update(batch_major, nnx.state(layer))
    want, want_h = batch_major(x.transpose(1, 0, 2))
    assert out.shape == (5, 2, 8) and h.shape == (4, 2, 4)
    np.testing.assert_allclose(out, np.asarray(want).transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6)
    names = [e.primitive.name for e in jax.make_jaxpr(batch_major)(x.transpose(1, 0, 2)).eqns]
    assert names.count("gru") == 4 and names.count("concat") == 2


def test_dropout_between_layers_only_in_training():
    layer = nn.LSTM(3, 4, num_layers=2, dropout=0.5)
    plain = nn.LSTM(3, 4, num_layers=2)
    nnx.update(plain, nnx.state(layer, nnx.Param))
    x = rand(2, 4, 3)
    assert nn.LSTM(3, 4, dropout=0.5).inter_dropout is None  # nothing to drop between one layer
    assert not np.allclose(layer(x)[0], plain(x)[0])
    layer.eval()
    np.testing.assert_allclose(layer(x)[0], plain(x)[0], rtol=1e-6)


def test_gradients_reach_every_parameter_and_nnx_jit_agrees():
    layer = nn.LSTM(2, 3, num_layers=2, direction="bidirect")
    x, lengths = rand(2, 4, 2), jnp.array([4, 2])
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x, sequence_length=lengths)[0] ** 2)))(layer)
    assert all(np.abs(g).sum() > 0 for g in jax.tree.leaves(grads))
    assert len(jax.tree.leaves(grads)) == 16
    jitted = nnx.jit(lambda m, x: m(x, sequence_length=lengths))(layer, x)
    np.testing.assert_allclose(jitted[0], layer(x, sequence_length=lengths)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call,match", [
    (lambda: nn.LSTM(3, 4, direction="backward"), r"LSTM: argument 'direction' expects one of"),
    (lambda: nn.GRU(3, 4, dropout=2.0), r"GRU: argument 'dropout' expects a probability"),
    (lambda: nn.LSTM(3, 4)(jnp.ones((2, 5, 2))), r"LSTM: input 'inputs' expects shape \[batch, time, 3\]"),
    (lambda: nn.LSTM(3, 4)(jnp.ones((2, 5, 3)), jnp.zeros((1, 2, 4))),
     r"LSTM: argument 'initial_states' expects \(h, c\) of shape \(1, 2, 4\)"),
    (lambda: nn.GRU(3, 4)(jnp.ones((2, 5, 3)), jnp.zeros((2, 2, 4))),
     r"GRU: argument 'initial_states' expects h of shape \(1, 2, 4\)"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
