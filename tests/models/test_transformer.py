"""The Transformer translation model: its forward pass and masks, the label-smoothed criterion,
greedy and beam-search decoding against slow full re-decoding, learning to reverse sequences,
static programs, weights files, the base configuration's size and argument errors."""
from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.models.transformer import (CrossEntropyCriterion, Transformer, length_penalty, position_encoding,
                                          transformer_base)

BOS, EOS, PAD = 0, 1, 0   # PaddleNLP's convention: the pad id is the bos id
VOCAB, LONGEST = 12, 6    # tokens 2..11, sequences of 2..6 tokens
WIDTH = LONGEST + 2       # batches and decoded ids: the longest sequence, its eos and a pad


def tiny(**kwargs):
    args = dict(src_vocab_size=VOCAB, trg_vocab_size=VOCAB, max_length=16, num_encoder_layers=2,
                num_decoder_layers=2, n_head=4, d_model=32, d_inner_hid=64, dropout=0.0)
    return Transformer(**{**args, **kwargs})


def reverse_batch(rng, n):
    """Sources ``tokens + eos``, decoder inputs ``bos + reversed`` and labels ``reversed +
    eos``, all padded to ``[n, WIDTH]``."""
    src, trg, label = (np.full((n, WIDTH), PAD, np.int32) for _ in range(3))
    for i, length in enumerate(rng.integers(2, LONGEST + 1, n)):
        tokens = rng.integers(2, VOCAB, length)
        src[i, :length + 1] = [*tokens, EOS]
        trg[i, :length + 1] = [BOS, *tokens[::-1]]
        label[i, :length + 1] = [*tokens[::-1], EOS]
    return src, trg, label


forward = nnx.jit(lambda model, src, trg: model(src, trg))
greedy = nnx.jit(lambda model, src, max_len: model.greedy_search(src, max_len), static_argnums=2)
beam = nnx.jit(lambda model, src, size, max_len, alpha: model.beam_search(src, size, max_len, alpha),
               static_argnums=(2, 3, 4))


@pytest.fixture(scope="module")
def random_model():
    pj.nn.seed(1)
    model = tiny()
    model.eval()
    return model


@pytest.fixture(scope="module")
def sources():
    src, _, _ = reverse_batch(np.random.default_rng(2), 6)
    return src


@pytest.fixture(scope="module")
def reverser():
    """A tiny model trained to reverse its input: 300 Adam steps on batches of 64."""
    pj.nn.seed(0)
    model = tiny(weight_sharing=True)
    criterion = CrossEntropyCriterion(label_smooth_eps=0.1, pad_idx=PAD)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 5e-3, 30, 300, 2.5e-4)
    optimizer = nnx.Optimizer(model, optax.adam(schedule), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, src, trg, label):
        loss, grads = nnx.value_and_grad(lambda m: criterion(m(src, trg), label)[1])(model)
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(0)
    losses = [float(train_step(model, optimizer, *reverse_batch(rng, 64))) for _ in range(300)]
    model.eval()
    return model, losses


def slow_greedy(model, src, max_len):
    """Greedy decoding that re-runs the whole decoder on the prefix for every new token."""
    trg = np.full((len(src), max_len), PAD, np.int32)
    trg[:, 0] = BOS
    out = np.full((len(src), max_len), PAD, np.int32)
    ended = np.zeros(len(src), bool)
    for i in range(max_len):
        # later positions hold pads; the causal mask keeps them from position i
        words = np.where(ended, PAD, np.asarray(forward(model, src, trg))[:, i].argmax(-1))
        out[:, i] = words
        ended |= words == EOS
        if i + 1 < max_len:
            trg[:, i + 1] = words
    return out


def sequence_log_probs(model, src, ids):
    """log P(ids[r] up to its first eos, or all of it) and that length, by teacher forcing."""
    trg = np.concatenate([np.full((len(ids), 1), BOS, np.int32), ids[:, :-1]], axis=1)
    logits = np.asarray(forward(model, src, trg), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, ids[:, :, None], axis=2)[:, :, 0]
    is_eos = ids == EOS
    lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, ids.shape[1])
    return np.array([p[:n].sum() for p, n in zip(picked, lengths)]), lengths


def test_reverser_learns_and_both_decoders_reverse_held_out_sequences(reverser):
    model, losses = reverser
    assert np.mean(losses[-20:]) < 0.35 * np.mean(losses[:5]), losses[::30]
    src, _, label = reverse_batch(np.random.default_rng(1), 200)
    greedy_accuracy = np.mean((np.asarray(greedy(model, src, WIDTH)) == label).all(axis=1))
    ids, scores = beam(model, src, 4, WIDTH, 0.6)
    beam_accuracy = np.mean((np.asarray(ids[:, 0]) == label).all(axis=1))
    assert greedy_accuracy >= 0.9 and beam_accuracy >= 0.9, \
        f"exact reversals: greedy {greedy_accuracy:.1%}, beam {beam_accuracy:.1%}"
    assert (np.diff(np.asarray(scores), axis=1) <= 0).all()


def test_greedy_search_equals_full_redecoding_and_pads_after_eos(random_model, reverser, sources):
    np.testing.assert_array_equal(greedy(random_model, sources, WIDTH), slow_greedy(random_model, sources, WIDTH))
    trained = reverser[0]
    ids = np.asarray(greedy(trained, sources, WIDTH))
    np.testing.assert_array_equal(ids, slow_greedy(trained, sources, WIDTH))
    lengths = (sources != PAD).sum(1)  # tokens and eos: the reversal is as long as its source
    assert all((row[n - 1] == EOS and (row[n:] == PAD).all()) for row, n in zip(ids, lengths))


@pytest.mark.parametrize("which", ["random", "trained"])
def test_beam_of_one_without_length_penalty_is_greedy_search(which, random_model, reverser, sources):
    model = random_model if which == "random" else reverser[0]
    ids, scores = beam(model, sources, 1, WIDTH, 0.0)
    np.testing.assert_array_equal(ids[:, 0], greedy(model, sources, WIDTH))
    log_probs, _ = sequence_log_probs(model, sources, np.asarray(ids[:, 0]))
    np.testing.assert_allclose(scores[:, 0], log_probs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_beam_scores_are_sorted_length_penalised_log_probs_of_the_returned_hypotheses(alpha, random_model, sources):
    size, max_len = 3, WIDTH
    ids, scores = (np.asarray(a) for a in beam(random_model, sources, size, max_len, alpha))
    assert ids.shape == (len(sources), size, max_len) and scores.shape == (len(sources), size)
    assert (np.diff(scores, axis=1) <= 0).all()
    assert all(len({tuple(h) for h in hypotheses}) == size for hypotheses in ids)
    log_probs, lengths = sequence_log_probs(random_model, np.repeat(sources, size, axis=0), ids.reshape(-1, max_len))
    np.testing.assert_allclose(scores.reshape(-1), log_probs / length_penalty(lengths, alpha), rtol=1e-4, atol=1e-4)
    # after each eos only pads follow
    for row, n in zip(ids.reshape(-1, max_len), lengths):
        assert (row[n:] == PAD).all()


def test_source_padding_and_future_target_tokens_do_not_change_the_logits(random_model, sources):
    trg = np.random.default_rng(3).integers(2, VOCAB, (len(sources), WIDTH)).astype(np.int32)
    logits = np.asarray(forward(random_model, sources, trg))
    padded = np.pad(sources, ((0, 0), (0, 3)), constant_values=PAD)
    np.testing.assert_allclose(forward(random_model, padded, trg), logits, rtol=1e-5, atol=1e-5)
    changed = trg.copy()
    changed[:, 3:] = 2
    np.testing.assert_allclose(forward(random_model, sources, changed)[:, :3], logits[:, :3], rtol=1e-5, atol=1e-5)


def test_position_encoding_is_paddlenlps_table():
    dim, positions = 9, np.arange(20)
    scale = np.log(1e4) / (dim // 2 - 1)
    angles = positions[:, None] * np.exp(np.arange(dim // 2) * -scale)[None]
    table = np.pad(np.concatenate([np.sin(angles), np.cos(angles)], axis=1), ((0, 0), (0, 1)))
    np.testing.assert_allclose(position_encoding(positions, dim), table, atol=1e-5)


def test_criterion_is_label_smoothed_cross_entropy_over_non_pad_tokens():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    label = np.array([[3, 1, 0], [2, 4, 1]])
    eps = 0.1
    target = (1 - eps) * np.eye(5)[label] + eps / 5
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    cost = -(target * log_softmax).sum(-1) * (label != 0)
    sum_cost, avg_cost, token_num = CrossEntropyCriterion(eps, pad_idx=0)(logits, label[..., None])
    assert float(token_num) == 5
    np.testing.assert_allclose([sum_cost, avg_cost], [cost.sum(), cost.sum() / 5], rtol=1e-5)


def test_to_static_program_equals_eager_and_survives_save_and_load(random_model, sources, tmp_path):
    prog = pj.to_static(random_model, pj.InputSpec((None, WIDTH), "int32"), pj.InputSpec((None, 4), "int32"))
    trg = np.array([[BOS, 5, 6, 7]] * len(sources), np.int32)
    want = np.asarray(forward(random_model, sources, trg))
    np.testing.assert_allclose(prog(sources, trg), want, rtol=1e-5, atol=1e-5)
    pj.save(prog, tmp_path / "transformer")
    np.testing.assert_allclose(pj.load(tmp_path / "transformer")(sources[:2], trg[:2]), want[:2], rtol=1e-5,
                               atol=1e-5)


def test_weights_file_round_trip_through_pretrained(random_model, sources, tmp_path):
    path = tmp_path / "transformer.safetensors"
    pj.nn.save_weights(random_model, path)
    sizes = dict(num_encoder_layers=2, num_decoder_layers=2, n_head=4, d_model=32, d_inner_hid=64)
    loaded = transformer_base(VOCAB, VOCAB, 16, pretrained=path, **sizes)
    loaded.eval()
    trg = np.array([[BOS, 4]] * len(sources), np.int32)
    np.testing.assert_array_equal(forward(loaded, sources, trg), forward(random_model, sources, trg))


def test_shared_weights_are_the_untied_model_with_both_embeddings_and_the_projection_equal(sources):
    pj.nn.seed(0)
    shared, untied = tiny(weight_sharing=True), tiny()
    weights = pj.nn.state_dict(shared)
    assert not any(name.startswith(("trg_word_embedding", "linear")) for name in weights)
    embedding = weights["src_word_embedding.weight"]
    pj.nn.set_state_dict(untied, {**weights, "trg_word_embedding.weight": embedding, "linear.weight": embedding.T})
    shared.eval()
    untied.eval()
    trg = np.array([[BOS, 3, 4]] * len(sources), np.int32)
    np.testing.assert_allclose(forward(shared, sources, trg), forward(untied, sources, trg), rtol=1e-5, atol=1e-5)


def test_transformer_base_parameter_count_with_a_shared_32k_vocabulary():
    model = nnx.eval_shape(lambda: transformer_base(32000, 32000, weight_sharing=True))
    count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    d, ffn, vocab = 512, 2048, 32000
    attention, feed_forward, norm = 4 * (d * d + d), 2 * d * ffn + ffn + d, 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    assert count == vocab * d + 6 * encoder_layer + 6 * decoder_layer + 2 * norm == 60_524_544


def test_configs_name_their_sizes():
    big = nnx.eval_shape(lambda: Transformer.from_config("big", 100, 200))
    assert (big.d_model, big.decoder.layers[0].self_attn.num_heads, big.linear.weight.shape) == (1024, 16, (1024, 200))
    assert big.encoder.layers[5].linear1.weight.shape == (1024, 4096)


@pytest.mark.parametrize("make,match", [
    (functools.partial(tiny, trg_vocab_size=13, weight_sharing=True),
     r"Transformer: argument 'weight_sharing' expects False when the vocabularies differ \(src_vocab_size 12, "
     r"trg_vocab_size 13\)"),
    (functools.partial(tiny, n_head=5), r"Transformer: argument 'n_head' expects a divisor of d_model \(32\), got 5"),
    (functools.partial(tiny, eos_id=12), r"Transformer: argument 'eos_id' expects a token id in \[0, 12\), got 12"),
    (lambda: Transformer.from_config("small", 10, 10),
     r"Transformer.from_config: argument 'config' expects one of \['base', 'big'\], got 'small'"),
])
def test_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("call,match", [
    (lambda m, s: m.greedy_search(s, max_len=0),
     r"Transformer.greedy_search: argument 'max_len' expects an int in \[1, max_length=16\], got 0"),
    (lambda m, s: m.beam_search(s, max_len=17),
     r"Transformer.beam_search: argument 'max_len' expects an int in \[1, max_length=16\], got 17"),
    (lambda m, s: m.beam_search(s, beam_size=7, max_len=4),
     r"argument 'beam_size' expects an int in \[1, trg_vocab_size // 2 = 6\], got 7"),
    (lambda m, s: m.beam_search(s, max_len=4, alpha=-1.0), r"argument 'alpha' expects a number >= 0, got -1.0"),
    (lambda m, s: m(s[0], s), r"Transformer: argument 'src_word' expects int ids of shape \[batch, length\], "
                              r"got 'int32\[8\]'"),
    (lambda m, s: m(s, np.zeros((1, 17), np.int32)),
     r"Transformer: argument 'trg_word' expects a length in \[1, max_length=16\], got 17"),
])
def test_bad_call_arguments(call, match, random_model, sources):
    with pytest.raises(ValueError, match=match):
        call(random_model, sources)


def test_decoding_refuses_training_mode(sources):
    model = tiny()
    with pytest.raises(RuntimeError, match=r"greedy_search: the model is in training mode; call model.eval\(\)"):
        model.greedy_search(sources, 4)
