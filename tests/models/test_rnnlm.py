"""PaddingRNN language model: shapes and parameter counts, state carried across windows,
padding, the loss and perplexity against their formulas, learning a synthetic corpus,
static capture, saved weights, the data helpers and errors."""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.models import rnnlm
from paddlejax.models.rnnlm import (RNNLM, build_vocab, encode, lm_batches, lm_loss, padding_rnn, perplexity,
                                    train_step)

CELLS = ["lstm", "gru"]
rng = np.random.default_rng(0)


def tiny(cell, **kwargs):
    pj.nn.seed(0)
    return RNNLM(**{"vocab_size": 23, "hidden_size": 6, "num_steps": 8, "cell": cell, **kwargs})


def ids(*shape, vocab=23):
    return jnp.asarray(rng.integers(0, vocab, shape), jnp.int32)


def max_diff(a, b):
    return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def param_count(model):
    return sum(math.prod(p.shape) for _, p in model.named_parameters())


@pytest.mark.parametrize("cell", CELLS)
def test_logits_and_state_shapes(cell):
    logits, states = tiny(cell, num_layers=3)(ids(4, 8))
    assert logits.shape == (4, 8, 23)
    if cell == "lstm":
        h, c = states
        assert h.shape == c.shape == (3, 4, 6)
    else:
        assert states.shape == (3, 4, 6)


def test_small_preset_has_paddingrnns_parameter_count():
    lstm = nnx.eval_shape(lambda: padding_rnn("small"))
    embedding, output = 10000 * 200, 200 * 10000 + 10000
    assert param_count(lstm) == embedding + 2 * (4 * 200 * (200 + 200) + 2 * 4 * 200) + output == 4_653_200
    gru = nnx.eval_shape(lambda: padding_rnn("small", cell="gru"))
    assert param_count(gru) == embedding + 2 * (3 * 200 * (200 + 200) + 2 * 3 * 200) + output


@pytest.mark.parametrize("size, hidden, steps, scale, dropout", [
    ("small", 200, 20, 0.1, 0.0), ("medium", 650, 35, 0.05, 0.5), ("large", 1500, 35, 0.04, 0.65)])
def test_presets_follow_paddingrnn(size, hidden, steps, scale, dropout):
    model = nnx.eval_shape(lambda: padding_rnn(size))
    assert (model.vocab_size, model.num_layers, model.hidden_size, model.num_steps, model.init_scale) == \
        (10000, 2, hidden, steps, scale)
    assert model.dropout.p == model.rnn.dropout == dropout


def test_every_parameter_is_uniform_within_init_scale():
    model = tiny("lstm", hidden_size=32, init_scale=0.05)
    for name, p in model.named_parameters():
        values = np.asarray(p[...])
        assert 0.045 < np.abs(values).max() < 0.05, name
        assert abs(values.mean()) < 0.01, name


@pytest.mark.parametrize("cell", CELLS)
def test_carried_state_continues_the_sequence(cell):
    model, x = tiny(cell), ids(3, 10)
    whole, final = model(x)
    first, state = model(x[:, :4])
    second, carried = model(x[:, 4:], state)
    assert max_diff(jnp.concatenate([first, second], axis=1), whole) < 1e-5
    assert max_diff(carried, final) < 1e-5


@pytest.mark.parametrize("cell", CELLS)
def test_padded_batch_equals_the_unpadded_sequences(cell):
    model, lengths = tiny(cell), [7, 3, 5]
    x, y = ids(3, 7), ids(3, 7)
    logits, states = model(x, sequence_length=jnp.array(lengths))
    loss = lm_loss(logits, y, jnp.array(lengths))
    metric = pj.train.Perplexity(ignore_index=rnnlm.IGNORE_INDEX)
    sums = metric.update(logits, rnnlm.mask_padding(y, jnp.array(lengths)))
    alone_loss = 0.0
    for row, n in enumerate(lengths):
        alone, alone_states = model(x[row:row + 1, :n])
        assert max_diff(logits[row:row + 1, :n], alone) < 1e-5
        assert max_diff([s[:, row:row + 1] for s in jax.tree.leaves(states)], alone_states) < 1e-5
        alone_loss += float(lm_loss(alone, y[row:row + 1, :n]))
    # PaddingRNN's loss averages over the batch: the padded batch's loss times 3 rows is the sum
    assert float(loss) * 3 == pytest.approx(alone_loss, rel=1e-5)
    assert int(sums["tokens"]) == sum(lengths)
    expected_ppl = math.exp(alone_loss / sum(lengths))
    assert metric.result(sums)["ppl"] == pytest.approx(expected_ppl, rel=1e-5)
    assert perplexity(model, [(x, y, jnp.array(lengths))]) == pytest.approx(expected_ppl, rel=1e-5)


def test_loss_is_token_cross_entropy_summed_over_time_averaged_over_batch():
    logits, labels = rng.normal(size=(4, 5, 9)).astype(np.float32), rng.integers(0, 9, (4, 5))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    assert float(lm_loss(jnp.asarray(logits), jnp.asarray(labels))) == pytest.approx(nll.sum(1).mean(), rel=1e-5)


def cyclic_corpus(n, vocab, seed, noise=0.1):
    """A fixed cycle through every word, with a share ``noise`` of tokens replaced by random ones."""
    gen = np.random.default_rng(seed)
    tokens = np.random.default_rng(0).permutation(vocab)[np.arange(n) % vocab]
    hit = gen.random(n) < noise
    tokens[hit] = gen.integers(0, vocab, hit.sum())
    return tokens


@pytest.mark.parametrize("cell", CELLS)
def test_training_learns_a_noisy_cycle(cell):
    vocab, batch, steps = 50, 16, 10
    pj.nn.seed(0)
    model = RNNLM(vocab_size=vocab, hidden_size=32, num_layers=1, num_steps=steps, cell=cell)
    optimizer = nnx.Optimizer(model, optax.adam(0.01), wrt=nnx.Param)
    train, test = cyclic_corpus(batch * steps * 30 + batch, vocab, 1), cyclic_corpus(4000, vocab, 2)
    assert perplexity(model, lm_batches(test, batch, steps)) == pytest.approx(vocab, rel=0.02)  # uniform at start
    for _ in range(10):  # 10 epochs of 30 windows, the state carried through each epoch
        states = model.initial_states(batch)
        for x, y in lm_batches(train, batch, steps):
            _, states = train_step(model, optimizer, x, y, states)
    # a perfect model of the cycle still pays for the 10 % noise: p(next) = 0.9 + 0.1 / 50
    hit = 0.9 + 0.1 / vocab
    floor = math.exp(-hit * math.log(hit) - (vocab - 1) * (0.1 / vocab) * math.log(0.1 / vocab))
    ppl = perplexity(model, lm_batches(test, batch, steps))
    assert floor < ppl < 3.0
    assert model.training  # perplexity() switched to eval mode and back


@pytest.mark.parametrize("cell", CELLS)
def test_static_program_equals_eager_and_survives_save_load(cell, tmp_path):
    model = tiny(cell, num_steps=20)
    model.eval()
    prog = pj.to_static(model, pj.InputSpec((None, 20), "int32"))
    x = ids(3, 20)
    eager = model(x)
    assert max_diff(prog(x), eager) == 0.0
    pj.save(prog, tmp_path / "rnnlm")
    assert max_diff(pj.load(tmp_path / "rnnlm")(x), eager) == 0.0


def test_static_program_takes_states_and_lengths():
    model = tiny("lstm")
    model.eval()
    state = pj.InputSpec((2, "b", 6))  # the batch size on axis 1: named, since None there is a size of its own
    prog = pj.to_static(model, pj.InputSpec((None, 8), "int32"), (state, state), pj.InputSpec((None,), "int32"))
    x, h, c, lengths = ids(2, 8), jnp.ones((2, 2, 6)) * 0.3, jnp.ones((2, 2, 6)) * -0.2, jnp.array([8, 2])
    assert [v.name for v in prog.inputs] == ["input_ids", "initial_states.0", "initial_states.1", "sequence_length"]
    assert max_diff(prog(x, (h, c), lengths), model(x, (h, c), lengths)) < 1e-6


def test_pretrained_weights_load_into_a_preset(tmp_path):
    pj.nn.seed(0)
    model = padding_rnn("small", cell="gru", vocab_size=40)
    pj.nn.save_weights(model, tmp_path / "gru.safetensors")
    pj.nn.seed(1)
    loaded = padding_rnn("small", cell="gru", vocab_size=40, pretrained=tmp_path / "gru.safetensors")
    x = ids(2, 20, vocab=40)
    assert max_diff(loaded(x), model(x)) == 0.0


def test_dropout_is_random_in_training_and_off_in_eval():
    model, x = tiny("lstm", dropout=0.5), ids(2, 8)
    assert max_diff(model(x)[0], model(x)[0]) > 0
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    key = np.asarray(model.dropout.key[...])
    loss, _ = train_step(model, optimizer, x, x, model.initial_states(2))
    assert np.isfinite(float(loss))
    assert (np.asarray(model.dropout.key[...]) != key).any()  # the jitted step draws fresh masks each time
    model.eval()
    assert max_diff(model(x)[0], model(x)[0]) == 0.0


def test_vocabulary_keeps_the_most_frequent_words_after_unk_and_eos():
    tokens = "b c a b <eos> c b <unk> d".split()
    vocab = build_vocab(tokens, size=4)
    assert vocab == {"<unk>": 0, "<eos>": 1, "b": 2, "c": 3}
    assert encode(["c", "a", "<eos>", "zebra"], vocab).tolist() == [3, 0, 1, 0]
    assert rnnlm.tokenize("One, two.\nThree's\n") == ["one", ",", "two", ".", "<eos>", "three's", "<eos>"]


def test_windows_cut_the_stream_into_rows_and_continue_them():
    stream = np.arange(3 * 11 + 2)  # 3 rows of 11 tokens; the 2 left over are dropped
    windows = list(lm_batches(stream, batch_size=3, num_steps=4))
    assert len(windows) == 2  # (11 - 1) // 4
    x = np.concatenate([w[0] for w in windows], axis=1)
    y = np.concatenate([w[1] for w in windows], axis=1)
    assert x.tolist() == [list(range(r * 11, r * 11 + 8)) for r in range(3)]
    assert (y == x + 1).all() and x.dtype == np.int32


@pytest.mark.parametrize("call, message", [
    (lambda: RNNLM(cell="rnn"), "RNNLM: argument 'cell' expects one of ['lstm', 'gru'], got 'rnn'"),
    (lambda: RNNLM(init_scale=0), "RNNLM: argument 'init_scale' expects a float > 0, got 0"),
    (lambda: padding_rnn("tiny"), "padding_rnn: argument 'size' expects one of ['small', 'medium', 'large']"),
    (lambda: tiny("gru")(ids(8)),
     "RNNLM: input 'input_ids' expects int token ids of shape [batch, steps], got int32[8]"),
    (lambda: tiny("gru")(jnp.zeros((2, 8))), "expects int token ids of shape [batch, steps], got float32[2, 8]"),
    (lambda: tiny("lstm")(ids(2, 8), jnp.zeros((2, 2, 6))), "LSTM: argument 'initial_states' expects"),
    (lambda: lm_loss(jnp.zeros((2, 5, 3)), jnp.zeros((2, 4), int)), "lm_loss: argument 'logits' expects"),
    (lambda: rnnlm.mask_padding(jnp.zeros((2, 4), int), jnp.array([1, 2, 3])),
     "mask_padding: argument 'sequence_length' expects shape [2]"),
    (lambda: lm_batches(np.arange(10), batch_size=4, num_steps=2), "lm_batches: argument 'ids' has 10 tokens"),
    (lambda: perplexity(tiny("gru"), []), "perplexity: argument 'batches' is empty"),
    (lambda: encode(["a"], {"a": 0}), "encode: argument 'vocab' expects a mapping with '<unk>'"),
])
def test_bad_input_is_refused_with_a_clear_error(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
