"""The Transformer of "Attention is all you need" for translation (PaddleNLP's
``TransformerModel`` and ``InferTransformerModel``), its label-smoothed loss and its decoding.

:class:`Transformer` embeds source and target words (scaled by sqrt(d_model)) and adds
sinusoidal position encodings (computed, not trained), runs a
:class:`~paddlejax.nn.TransformerEncoder` and :class:`~paddlejax.nn.TransformerDecoder`
(pre-norm with final LayerNorms by default, as PaddleNLP) and projects to the target
vocabulary -- with the transposed target embedding when ``weight_sharing``. Source padding is
masked out; the target is masked causally. :class:`CrossEntropyCriterion` is the training loss.
``TransformerModel`` is PaddleNLP's name for :class:`Transformer`.

Decoding runs under ``lax.while_loop`` with key/value caches, so each step decodes one
position, and stops as soon as the result is settled: :meth:`Transformer.greedy_search` and
:meth:`Transformer.beam_search` (GNMT length penalty). Both are jittable.

>>> import numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> model = Transformer(src_vocab_size=10, trg_vocab_size=10, max_length=16, num_encoder_layers=1,
...                     num_decoder_layers=1, n_head=2, d_model=8, d_inner_hid=16)
>>> src = np.array([[4, 5, 6, 1]], np.int32)              # tokens then eos (1); 0 pads
>>> model(src, np.array([[0, 6, 5]], np.int32)).shape     # bos (0), then the target so far
(1, 3, 10)
>>> model.eval()
>>> model.greedy_search(src, max_len=5).shape
(1, 5)
>>> ids, scores = model.beam_search(src, beam_size=2, max_len=5)
>>> ids.shape, scores.shape
((1, 2, 5), (1, 2))
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from paddlejax import nn, ops
from paddlejax.nn.args import arg_error, is_int, positive_int, probability

CONFIGS = {
    "base": {"num_encoder_layers": 6, "num_decoder_layers": 6, "n_head": 8, "d_model": 512, "d_inner_hid": 2048},
    "big": {"num_encoder_layers": 6, "num_decoder_layers": 6, "n_head": 16, "d_model": 1024, "d_inner_hid": 4096},
}


def position_encoding(positions, dim: int):
    """PaddleNLP's sinusoidal encodings of integer ``positions``: ``[sin(p w), cos(p w)]`` with
    ``w_i = 10000^(-i / (dim // 2 - 1))``, zero-padded to ``dim`` when it is odd. Shape
    ``positions.shape + (dim,)``.

    >>> import numpy as np
    >>> np.asarray(position_encoding(jnp.arange(2), 4), np.float64).round(4).tolist()
    [[0.0, 0.0, 1.0, 1.0], [0.8415, 0.0001, 0.5403, 1.0]]
    """
    half = dim // 2
    rate = math.log(1e4) / max(half - 1, 1)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * jnp.exp(jnp.arange(half, dtype=jnp.float32) * -rate)
    signal = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, dim % 2)])


def length_penalty(length, alpha: float):
    """GNMT's length penalty ``((5 + length) / 6) ** alpha``; beam search ranks hypotheses by
    ``log-probability / length_penalty(length)``.

    >>> float(length_penalty(7, 1.0))
    2.0
    """
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class Transformer(nn.Layer):
    """The encoder-decoder Transformer (PaddleNLP's ``TransformerModel``).

    ``forward(src_word, trg_word)`` takes int ids ``[batch, src_len]`` and ``[batch, trg_len]``
    -- the target starting with ``bos_id`` -- and returns logits ``[batch, trg_len,
    trg_vocab_size]``. ``pad_id`` (default: ``bos_id``, as in PaddleNLP) marks source padding,
    which attention ignores; its embedding rows are zero. Sequences may be at most
    ``max_length`` long. ``weight_sharing`` uses one embedding for source and target and its
    transpose as the output projection (the vocabularies must then be equal); otherwise the
    projection is ``linear`` (no bias).

    Sub-layers: ``src_word_embedding``, ``trg_word_embedding`` (the same layer when shared),
    ``dropout``, ``encoder``, ``decoder``, ``linear``. Use :meth:`from_config` or
    :func:`transformer_base` / :func:`transformer_big` for the paper's sizes.

    >>> import numpy as np, paddlejax as pj
    >>> model = Transformer(12, 12, max_length=8, num_encoder_layers=1, num_decoder_layers=1, n_head=2,
    ...                     d_model=8, d_inner_hid=16, weight_sharing=True)
    >>> model.linear is None, model.trg_word_embedding is model.src_word_embedding
    (True, True)
    >>> prog = pj.to_static(model, pj.InputSpec((None, 5), "int32"), pj.InputSpec((None, 4), "int32"))
    >>> prog(np.ones((3, 5), np.int32), np.ones((3, 4), np.int32)).shape
    (3, 4, 12)
    """

    def __init__(self, src_vocab_size, trg_vocab_size, max_length, num_encoder_layers=6, num_decoder_layers=6,
                 n_head=8, d_model=512, d_inner_hid=2048, dropout=0.1, weight_sharing=False, attn_dropout=None,
                 act_dropout=None, bos_id=0, eos_id=1, pad_id=None, activation="relu", normalize_before=True):
        self.src_vocab_size = positive_int("Transformer", "src_vocab_size", src_vocab_size)
        self.trg_vocab_size = positive_int("Transformer", "trg_vocab_size", trg_vocab_size)
        self.max_length = positive_int("Transformer", "max_length", max_length)
        self.d_model = positive_int("Transformer", "d_model", d_model)
        if d_model % positive_int("Transformer", "n_head", n_head):
            raise arg_error("Transformer", "n_head", f"a divisor of d_model ({d_model})", n_head)
        if not isinstance(weight_sharing, bool):
            raise arg_error("Transformer", "weight_sharing", "a bool", weight_sharing)
        if weight_sharing and src_vocab_size != trg_vocab_size:
            raise arg_error("Transformer", "weight_sharing", "False when the vocabularies differ (src_vocab_size "
                            f"{src_vocab_size}, trg_vocab_size {trg_vocab_size})", weight_sharing)
        pad_id = bos_id if pad_id is None else pad_id
        smallest = min(src_vocab_size, trg_vocab_size)
        for arg, token in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if not is_int(token) or not 0 <= token < smallest:
                raise arg_error("Transformer", arg, f"a token id in [0, {smallest})", token)
        self.bos_id, self.eos_id, self.pad_id = int(bos_id), int(eos_id), int(pad_id)
        self.weight_sharing = weight_sharing

        self.src_word_embedding = self._word_embedding(src_vocab_size)
        self.trg_word_embedding = self.src_word_embedding if weight_sharing else self._word_embedding(trg_vocab_size)
        self.dropout = nn.Dropout(probability("Transformer", "dropout", dropout))
        layer_args = (d_model, n_head, d_inner_hid, dropout, activation, attn_dropout, act_dropout, normalize_before)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(*layer_args), num_encoder_layers,
                                             norm=nn.LayerNorm(d_model) if normalize_before else None)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(*layer_args), num_decoder_layers,
                                             norm=nn.LayerNorm(d_model) if normalize_before else None)
        self.linear = None if weight_sharing else nn.Linear(d_model, trg_vocab_size, bias_attr=False)

    @classmethod
    def from_config(cls, config: str, src_vocab_size, trg_vocab_size, max_length=256, *, pretrained=None,
                    **kwargs) -> Transformer:
        """The ``"base"`` or ``"big"`` model of the paper (see ``CONFIGS``); ``kwargs`` override
        or add constructor arguments. ``pretrained`` is a safetensors file of this model's
        weights (as :func:`paddlejax.nn.save_weights` writes it).

        >>> from flax import nnx
        >>> abstract = nnx.eval_shape(lambda: Transformer.from_config("big", 100, 100))
        >>> abstract.d_model, abstract.encoder.layers[0].linear1.weight.shape
        (1024, (1024, 4096))
        """
        if config not in CONFIGS:
            raise arg_error("Transformer.from_config", "config", f"one of {sorted(CONFIGS)}", config)
        model = cls(src_vocab_size, trg_vocab_size, max_length, **{**CONFIGS[config], **kwargs})
        if pretrained is not None:
            nn.load_weights(model, pretrained)
        return model

    def _word_embedding(self, vocab_size):
        # PaddleNLP's initialisation, N(0, d_model^-1/2): after the sqrt(d_model) scaling the
        # embeddings have unit variance, like the position encodings they are added to
        return nn.Embedding(vocab_size, self.d_model, padding_idx=self.pad_id,
                            weight_attr=nn.initializer.Normal(0.0, self.d_model ** -0.5))

    def _ids(self, arg, ids):
        ids = jnp.asarray(ids)
        if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise arg_error("Transformer", arg, "int ids of shape [batch, length]", f"{ids.dtype}{list(ids.shape)}")
        if is_int(ids.shape[1]) and not 0 < ids.shape[1] <= self.max_length:
            raise arg_error("Transformer", arg, f"a length in [1, max_length={self.max_length}]", ids.shape[1])
        return ids

    def _embed(self, embedding, words, positions):
        return self.dropout(embedding(words) * self.d_model ** 0.5 + position_encoding(positions, self.d_model))

    def _logits(self, hidden):
        if self.linear is None:
            return ops.linear(hidden, ops.transpose(self.trg_word_embedding.weight[...], perm=(1, 0)))
        return self.linear(hidden)

    def encode(self, src_word):
        """``(memory [batch, src_len, d_model], memory_mask [batch, 1, 1, src_len])``: the
        encoder output and the mask (True on non-pad source tokens) that attention over it uses.

        >>> import numpy as np
        >>> model = Transformer(10, 10, 16, 1, 1, 2, 8, 16)
        >>> memory, mask = model.encode(np.array([[4, 5, 1, 0]], np.int32))
        >>> memory.shape, mask.tolist()
        ((1, 4, 8), [[[[True, True, True, False]]]])
        """
        src_word = self._ids("src_word", src_word)
        mask = (src_word != self.pad_id)[:, None, None, :]
        x = self._embed(self.src_word_embedding, src_word, jnp.arange(src_word.shape[1]))
        return self.encoder(x, mask), mask

    def forward(self, src_word, trg_word):
        trg_word = self._ids("trg_word", trg_word)
        memory, memory_mask = self.encode(src_word)
        length = trg_word.shape[1]
        x = self._embed(self.trg_word_embedding, trg_word, jnp.arange(length))
        causal = jnp.tril(jnp.ones((length, length), bool))
        return self._logits(self.decoder(x, memory, causal, memory_mask))

    def _next_log_probs(self, words, step, memory, memory_mask, cache):
        """Log-probabilities ``[n, trg_vocab]`` of the token after ``words`` (``[n]``, at
        position ``step``) and the updated decoder cache."""
        x = self._embed(self.trg_word_embedding, words[:, None], step[None])
        out, cache = self.decoder(x, memory, None, memory_mask, cache)
        return ops.log_softmax(self._logits(out[:, 0]), axis=-1), cache

    def _decoding_length(self, method, src_word, max_len) -> int:
        """The decoding length: ``max_len`` checked, or by default the source length + 20 (as in
        PaddleNLP), at most ``max_length``. Decoding refuses training mode."""
        if self.training:
            raise RuntimeError(f"Transformer.{method}: the model is in training mode; call model.eval() first "
                               "(decoding runs without dropout)")
        if max_len is None:
            max_len = min(self._ids("src_word", src_word).shape[1] + 20, self.max_length)
        if not is_int(max_len) or not 0 < max_len <= self.max_length:
            raise arg_error(f"Transformer.{method}", "max_len", f"an int in [1, max_length={self.max_length}]",
                            max_len)
        return int(max_len)

    def greedy_search(self, src_word, max_len=None):
        """Greedy decoding: ids ``[batch, max_len]``, each row the most likely token at every
        step until ``eos_id`` (included), then ``pad_id``. Stops when every row has ended.
        Needs eval mode.

        >>> import numpy as np
        >>> model = Transformer(10, 10, 16, 1, 1, 2, 8, 16)
        >>> model.eval()
        >>> model.greedy_search(np.array([[4, 5, 6, 1]], np.int32), max_len=4).shape
        (1, 4)
        """
        max_len = self._decoding_length("greedy_search", src_word, max_len)
        memory, memory_mask = self.encode(src_word)
        batch = memory.shape[0]

        def step(state):
            i, words, ids, ended, cache = state
            log_probs, cache = self._next_log_probs(words, i, memory, memory_mask, cache)
            words = jnp.where(ended, self.pad_id, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
            ids = lax.dynamic_update_slice_in_dim(ids, words[:, None], i, axis=1)
            return i + 1, words, ids, ended | (words == self.eos_id), cache

        state = (jnp.int32(0), jnp.full((batch,), self.bos_id, jnp.int32),
                 jnp.full((batch, max_len), self.pad_id, jnp.int32), jnp.zeros((batch,), bool),
                 self.decoder.gen_cache(memory, max_length=max_len))
        return lax.while_loop(lambda s: (s[0] < max_len) & ~jnp.all(s[3]), step, state)[2]

    def beam_search(self, src_word, beam_size=4, max_len=None, alpha=0.6):
        """Beam search with GNMT's length penalty: returns ids ``[batch, beam_size, max_len]``
        (each hypothesis up to its ``eos_id``, then ``pad_id``) and their scores ``[batch,
        beam_size]``, best first. A hypothesis scores ``log P(tokens) / length_penalty(length,
        alpha)``, its length counting the eos.

        The search is PaddleNLP's ``beam_search_v2`` (tensor2tensor's): each step extends the
        ``beam_size`` live hypotheses by every token and keeps the best ``2 * beam_size``
        candidates; the ``beam_size`` best of those not ending in eos stay alive, and the
        ``beam_size`` best finished hypotheses are kept. It stops when the worst kept one beats
        anything a live hypothesis can still reach, or at ``max_len``. Two rules differ from
        PaddleNLP's: a candidate ending in eos finishes only if it ranks among the first
        ``beam_size`` (as in fairseq and Hugging Face), so that with ``alpha=0`` a beam of one
        is greedy search; and at ``max_len`` the unfinished hypotheses (scored at that length)
        compete with the finished ones for the returned places, rather than being used only
        when nothing finished. Needs eval mode.

        >>> import numpy as np
        >>> model = Transformer(10, 10, 16, 1, 1, 2, 8, 16)
        >>> model.eval()
        >>> ids, scores = model.beam_search(np.array([[4, 5, 6, 1]], np.int32), beam_size=3, max_len=4)
        >>> ids.shape, bool((scores[:, :-1] >= scores[:, 1:]).all())
        ((1, 3, 4), True)
        """
        max_len = self._decoding_length("beam_search", src_word, max_len)
        if not is_int(beam_size) or not 0 < beam_size <= self.trg_vocab_size // 2:
            raise arg_error("Transformer.beam_search", "beam_size",
                            f"an int in [1, trg_vocab_size // 2 = {self.trg_vocab_size // 2}]", beam_size)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise arg_error("Transformer.beam_search", "alpha", "a number >= 0", alpha)
        memory, memory_mask = self.encode(src_word)
        return _BeamSearch(self, memory, memory_mask, int(beam_size), max_len, float(alpha)).run()


class _Beams(NamedTuple):
    """Beam-search state; ``*_seq`` are ``[batch, beam, max_len]`` and the scores ``[batch,
    beam]``, sorted best first (``-inf`` marks an empty finished slot)."""

    step: Any
    words: Any               # [batch * beam] last token of each live hypothesis
    alive_seq: Any
    alive_log_prob: Any      # log P(hypothesis), no length penalty
    finished_seq: Any
    finished_score: Any      # log P / length_penalty
    cache: Any


class _BeamSearch:
    """One beam search of :meth:`Transformer.beam_search` over encoded sources; rows of the
    decoder cache are ``batch * beam``, hypothesis ``k`` of source ``b`` at row ``b * beam + k``."""

    def __init__(self, model, memory, memory_mask, beam, max_len, alpha):
        self.model, self.beam, self.max_len, self.alpha = model, beam, max_len, alpha
        self.batch = memory.shape[0]
        self.memory = jnp.repeat(memory, beam, axis=0)
        self.memory_mask = jnp.repeat(memory_mask, beam, axis=0)

    def run(self):
        b, k, model = self.batch, self.beam, self.model
        seqs = jnp.full((b, k, self.max_len), model.pad_id, jnp.int32)
        no_scores = jnp.full((b, k), -jnp.inf, jnp.float32)
        state = _Beams(jnp.int32(0), jnp.full((b * k,), model.bos_id, jnp.int32), seqs,
                       no_scores.at[:, 0].set(0.0),  # one live hypothesis (the empty one) to start from
                       seqs, no_scores, model.decoder.gen_cache(self.memory, max_length=self.max_len))
        state = lax.while_loop(self._going_on, self._step, state)
        # at max_len the unfinished hypotheses compete too; after an early stop they cannot win
        scores = jnp.concatenate([state.finished_score,
                                  state.alive_log_prob / length_penalty(state.step, self.alpha)], axis=1)
        scores, pick = lax.top_k(scores, k)
        return _take(jnp.concatenate([state.finished_seq, state.alive_seq], axis=1), pick), scores

    def _going_on(self, state):
        # log-probabilities only fall and the penalty only grows (alpha >= 0): no live
        # hypothesis can score more than its log-probability now over the penalty of max_len
        best_reachable = state.alive_log_prob[:, 0] / length_penalty(self.max_len, self.alpha)
        settled = state.finished_score[:, -1] > best_reachable
        return (state.step < self.max_len) & ~jnp.all(settled)

    def _step(self, state):
        b, k, model = self.batch, self.beam, self.model
        log_probs, cache = model._next_log_probs(state.words, state.step, self.memory, self.memory_mask,
                                                 state.cache)
        vocab = log_probs.shape[-1]
        total = (state.alive_log_prob[:, :, None] + log_probs.reshape(b, k, vocab)).reshape(b, k * vocab)
        log_prob, index = lax.top_k(total, 2 * k)
        parent, token = index // vocab, (index % vocab).astype(jnp.int32)
        seq = _take(state.alive_seq, parent)
        seq = lax.dynamic_update_slice_in_dim(seq, token[:, :, None], state.step, axis=2)
        is_eos = token == model.eos_id

        alive_log_prob, alive = lax.top_k(jnp.where(is_eos, -jnp.inf, log_prob), k)
        rows = (jnp.arange(b)[:, None] * k + jnp.take_along_axis(parent, alive, axis=1)).reshape(-1)
        cache = [(own._replace(k=own.k[rows], v=own.v[rows]), static) for own, static in cache]

        in_first_ranks = jnp.arange(2 * k) < k
        new_scores = jnp.where(is_eos & in_first_ranks, log_prob / length_penalty(state.step + 1, self.alpha),
                               -jnp.inf)
        finished_score, pick = lax.top_k(jnp.concatenate([state.finished_score, new_scores], axis=1), k)
        finished_seq = _take(jnp.concatenate([state.finished_seq, seq], axis=1), pick)
        alive_seq = _take(seq, alive)
        words = lax.dynamic_index_in_dim(alive_seq, state.step, axis=2, keepdims=False).reshape(-1)
        return _Beams(state.step + 1, words, alive_seq, alive_log_prob, finished_seq, finished_score, cache)


def _take(seqs, index):
    """``seqs[b, index[b, j]]`` for sequences ``[batch, n, length]`` and ``index [batch, m]``."""
    return jnp.take_along_axis(seqs, index[:, :, None], axis=1)


class CrossEntropyCriterion(nn.Layer):
    """PaddleNLP's translation loss: softmax cross entropy against labels smoothed by
    ``label_smooth_eps`` (``(1 - eps) * one_hot + eps / vocab``), ignoring ``pad_idx`` tokens.

    ``criterion(logits [batch, len, vocab], labels [batch, len] or [batch, len, 1])`` returns
    ``(sum_cost, avg_cost, token_num)``: the summed loss, its mean over the non-pad tokens
    (0 when there are none) and their number (float32).

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 3, 4))
    >>> sum_cost, avg_cost, token_num = CrossEntropyCriterion(0.1, pad_idx=0)(logits, jnp.array([[2, 1, 0]]))
    >>> round(float(avg_cost), 4), float(token_num)   # uniform logits: log(4) per token
    (1.3863, 2.0)
    """

    def __init__(self, label_smooth_eps=0.1, pad_idx=0):
        self.label_smooth_eps = probability("CrossEntropyCriterion", "label_smooth_eps", label_smooth_eps)
        if not is_int(pad_idx):
            raise arg_error("CrossEntropyCriterion", "pad_idx", "an int", pad_idx)
        self.pad_idx = int(pad_idx)

    def forward(self, predict, label):
        label = jnp.asarray(label)
        if label.ndim == predict.ndim:
            label = label[..., 0]
        cost = ops.cross_entropy(predict, label, ignore_index=self.pad_idx, label_smoothing=self.label_smooth_eps,
                                 reduction="none")
        sum_cost = jnp.sum(cost)
        token_num = jnp.sum(label != self.pad_idx).astype(jnp.float32)
        return sum_cost, sum_cost / jnp.maximum(token_num, 1.0), token_num


def transformer_base(src_vocab_size, trg_vocab_size, max_length=256, *, pretrained=None, **kwargs) -> Transformer:
    """The base model: 6 + 6 layers, d_model 512, 8 heads, feed-forward 2048
    (:meth:`Transformer.from_config` ``"base"``).

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: transformer_base(100, 100)).decoder.num_layers
    6
    """
    return Transformer.from_config("base", src_vocab_size, trg_vocab_size, max_length, pretrained=pretrained, **kwargs)


def transformer_big(src_vocab_size, trg_vocab_size, max_length=256, *, pretrained=None, **kwargs) -> Transformer:
    """The big model: 6 + 6 layers, d_model 1024, 16 heads, feed-forward 4096
    (:meth:`Transformer.from_config` ``"big"``).

    >>> from flax import nnx
    >>> nnx.eval_shape(lambda: transformer_big(100, 100)).encoder.layers[0].self_attn.num_heads
    16
    """
    return Transformer.from_config("big", src_vocab_size, trg_vocab_size, max_length, pretrained=pretrained, **kwargs)


TransformerModel = Transformer
