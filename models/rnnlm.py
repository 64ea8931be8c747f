"""PaddingRNN: the word-level LSTM / GRU language model of Paddle's PTB example, with its loss
and data pipeline.

:class:`RNNLM` is embedding → dropout → stacked padded :class:`~paddlejax.nn.LSTM` or
:class:`~paddlejax.nn.GRU` → dropout → linear to the vocabulary, every parameter drawn from
Uniform(-init_scale, init_scale). ``forward`` returns the logits and the final recurrent state,
so truncated back-propagation through time carries the state from one batch to the next.
:func:`padding_rnn` builds PaddingRNN's small / medium / large configurations.

Training follows PaddingRNN: :func:`lm_loss` is the token cross entropy summed over time and
averaged over the batch (:func:`train_step` takes one jitted step with it), and perplexity is
exp(total token loss / number of real tokens), which :func:`perplexity` measures with
:class:`~paddlejax.train.metrics.Perplexity` on labels whose padding :func:`mask_padding` has
marked. The data helpers cut a token stream PTB-style: :func:`tokenize`, :func:`build_vocab`,
:func:`encode`, :func:`lm_batches`.

>>> import numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> model = RNNLM(vocab_size=12, hidden_size=8, num_steps=5)
>>> ids = encode(tokenize("the cat sat on the mat\\nthe dog sat on the log"), build_vocab(
...     tokenize("the cat sat on the mat"), size=12))
>>> ids.tolist()
[2, 3, 6, 5, 2, 4, 1, 2, 0, 6, 5, 2, 0, 1]
>>> state = model.initial_states(batch_size=2)
>>> for x, y in lm_batches(ids, batch_size=2, num_steps=3):
...     logits, state = model(x, state)   # the state carries over to the next window
...     loss = lm_loss(logits, y)
>>> logits.shape, state[0].shape, round(float(loss) / 3, 1)   # about log(12) per token at first
((2, 3, 12), (2, 2, 8), 2.5)
"""
from __future__ import annotations

import collections
import numbers
import os
import re
from collections.abc import Iterator, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from paddlejax import nn, ops
from paddlejax.nn.args import arg_error, choice, positive_int, probability
from paddlejax.nn.initializer import Uniform
from paddlejax.train.metrics import Perplexity

#: Label value that :func:`lm_loss` and ``Perplexity(ignore_index=IGNORE_INDEX)`` leave out
#: (Paddle's default ``ignore_index``).
IGNORE_INDEX = -100

UNK, EOS = "<unk>", "<eos>"

_CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}

#: PaddingRNN's configurations (each with a 10,000-word vocabulary).
PRESETS = {
    "small": dict(num_layers=2, hidden_size=200, num_steps=20, init_scale=0.1, dropout=0.0),
    "medium": dict(num_layers=2, hidden_size=650, num_steps=35, init_scale=0.05, dropout=0.5),
    "large": dict(num_layers=2, hidden_size=1500, num_steps=35, init_scale=0.04, dropout=0.65),
}


class RNNLM(nn.Layer):
    """PaddingRNN's language model: ``forward(input_ids) -> (logits, final_states)``.

    ``input_ids`` are int ``[batch, steps]`` (any number of steps; ``num_steps`` is the
    training window, used by :func:`lm_batches` and the presets). ``initial_states`` are the
    recurrent layers' state as they return it, ``[num_layers, batch, hidden_size]`` each:
    ``(h, c)`` for ``cell="lstm"``, ``h`` for ``"gru"``; None starts from zeros. With
    ``sequence_length [batch]``, positions at or past a row's length are padding: they
    leave the state alone, and :func:`lm_loss` ignores them when given the same lengths.

    Dropout with probability ``dropout`` applies, in training, to the embeddings, between the
    recurrent layers and to the last layer's outputs, as in PaddingRNN.

    Parameters: ``embedding.weight [vocab, hidden]``, ``rnn.weight_ih_l{k}``,
    ``rnn.weight_hh_l{k}``, ``rnn.bias_ih_l{k}``, ``rnn.bias_hh_l{k}`` (Paddle's LSTM / GRU
    layout), ``output.weight [hidden, vocab]`` and ``output.bias [vocab]``.

    >>> import jax.numpy as jnp
    >>> model = RNNLM(vocab_size=10, hidden_size=4, num_layers=1, cell="gru")
    >>> logits, h = model(jnp.zeros((3, 6), jnp.int32))
    >>> logits.shape, h.shape
    ((3, 6, 10), (1, 3, 4))
    >>> bool(abs(model.output.weight[...]).max() < model.init_scale)
    True
    """

    def __init__(self, vocab_size: int = 10000, hidden_size: int = 200, num_layers: int = 2, num_steps: int = 20,
                 init_scale: float = 0.1, dropout: float = 0.0, cell: str = "lstm", *,
                 rngs: nnx.Rngs | None = None):
        self.vocab_size = positive_int("RNNLM", "vocab_size", vocab_size)
        self.hidden_size = positive_int("RNNLM", "hidden_size", hidden_size)
        self.num_layers = positive_int("RNNLM", "num_layers", num_layers)
        self.num_steps = positive_int("RNNLM", "num_steps", num_steps)
        if isinstance(init_scale, bool) or not isinstance(init_scale, numbers.Real) or not init_scale > 0:
            raise arg_error("RNNLM", "init_scale", "a float > 0", init_scale)
        self.init_scale = float(init_scale)
        self.cell = choice("RNNLM", "cell", cell, tuple(_CELLS))
        init = Uniform(-self.init_scale, self.init_scale)
        self.embedding = nn.Embedding(self.vocab_size, self.hidden_size, weight_attr=init, rngs=rngs)
        self.rnn = _CELLS[self.cell](self.hidden_size, self.hidden_size, self.num_layers,
                                     dropout=probability("RNNLM", "dropout", dropout), weight_ih_attr=init,
                                     weight_hh_attr=init, bias_ih_attr=init, bias_hh_attr=init, rngs=rngs)
        self.dropout = nn.Dropout(dropout, rngs=rngs)
        self.output = nn.Linear(self.hidden_size, self.vocab_size, weight_attr=init, bias_attr=init, rngs=rngs)

    def initial_states(self, batch_size: int):
        """Zero recurrent state for ``batch_size`` rows: ``(h, c)`` (LSTM) or ``h`` (GRU).

        >>> [s.shape for s in RNNLM(vocab_size=5, hidden_size=3).initial_states(4)]
        [(2, 4, 3), (2, 4, 3)]
        """
        zeros = jnp.zeros((self.num_layers, positive_int("RNNLM.initial_states", "batch_size", batch_size),
                           self.hidden_size), jnp.float32)
        return (zeros, zeros) if self.cell == "lstm" else zeros

    def forward(self, input_ids, initial_states=None, sequence_length=None):
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise ValueError(f"RNNLM: input 'input_ids' expects int token ids of shape [batch, steps], "
                             f"got {input_ids.dtype}{list(input_ids.shape)}")
        x = self.dropout(self.embedding(input_ids))
        x, final_states = self.rnn(x, initial_states, sequence_length)
        return self.output(self.dropout(x)), final_states


def padding_rnn(size: str = "small", *, cell: str = "lstm", vocab_size: int = 10000,
                pretrained: str | os.PathLike | None = None, rngs: nnx.Rngs | None = None) -> RNNLM:
    """PaddingRNN's ``"small"``, ``"medium"`` or ``"large"`` model (see :data:`PRESETS`);
    ``pretrained`` is a safetensors file of this model's weights (as
    :func:`paddlejax.nn.save_weights` writes them).

    >>> model = nnx.eval_shape(lambda: padding_rnn("medium", cell="gru"))
    >>> model.hidden_size, model.num_steps, model.init_scale, model.rnn.dropout
    (650, 35, 0.05, 0.5)
    """
    config = PRESETS[choice("padding_rnn", "size", size, tuple(PRESETS))]
    model = RNNLM(vocab_size=vocab_size, cell=cell, rngs=rngs, **config)
    if pretrained is not None:
        nn.load_weights(model, pretrained)
    return model


def mask_padding(labels, sequence_length=None):
    """``labels [batch, steps]`` with the positions at or past each row's ``sequence_length``
    set to :data:`IGNORE_INDEX` (unchanged without lengths).

    >>> mask_padding(jnp.array([[4, 5, 6], [7, 8, 9]]), jnp.array([3, 1])).tolist()
    [[4, 5, 6], [7, -100, -100]]
    """
    labels = jnp.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"mask_padding: argument 'labels' expects shape [batch, steps], got {list(labels.shape)}")
    if sequence_length is None:
        return labels
    lengths = jnp.asarray(sequence_length)
    if lengths.shape != labels.shape[:1]:
        raise ValueError(f"mask_padding: argument 'sequence_length' expects shape [{labels.shape[0]}] "
                         f"(one length per row of labels), got {list(lengths.shape)}")
    valid = jnp.arange(labels.shape[1])[None, :] < lengths[:, None]
    return jnp.where(valid, labels, IGNORE_INDEX)


def lm_loss(logits, labels, sequence_length=None):
    """PaddingRNN's loss: token cross entropy summed over time steps and averaged over the
    batch; padded positions (see :func:`mask_padding`) and labels equal to
    :data:`IGNORE_INDEX` count for nothing. Divide by the steps for a per-token loss.

    >>> import math
    >>> loss = lm_loss(jnp.zeros((2, 3, 8)), jnp.ones((2, 3), jnp.int32), jnp.array([3, 1]))
    >>> round(float(loss) / math.log(8), 4)   # (3 + 1) uniform tokens over 2 rows
    2.0
    """
    labels = mask_padding(labels, sequence_length)
    if logits.shape[:2] != labels.shape or logits.ndim != 3:
        raise ValueError(f"lm_loss: argument 'logits' expects shape [batch, steps, vocab] matching labels "
                         f"{list(labels.shape)}, got {list(logits.shape)}")
    token_loss = ops.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")
    return jnp.sum(token_loss) / labels.shape[0]


@nnx.jit
def train_step(model: RNNLM, optimizer: nnx.Optimizer, input_ids, labels, initial_states, sequence_length=None):
    """One jitted truncated-BPTT step: :func:`lm_loss` of ``model`` on a window, its gradient
    and the ``optimizer`` update. Returns ``(loss, final_states)``; pass the states on as the
    next window's ``initial_states`` (no gradient flows back through them).

    PaddingRNN trains with ``optax.chain(optax.clip_by_global_norm(5.0), optax.sgd(1.0))``
    and decays the learning rate after a few epochs.

    >>> import optax
    >>> model = RNNLM(vocab_size=6, hidden_size=4, num_layers=1)
    >>> optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    >>> x = jnp.array([[0, 1, 2, 3, 4, 5, 0, 1]])
    >>> losses = [float(train_step(model, optimizer, x[:, :-1], x[:, 1:], model.initial_states(1))[0])
    ...           for _ in range(30)]
    >>> losses[-1] < losses[0] / 5
    True
    """
    def objective(model):
        logits, final_states = model(input_ids, initial_states, sequence_length)
        return lm_loss(logits, labels, sequence_length), final_states

    (loss, final_states), grads = nnx.value_and_grad(objective, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, final_states


_PERPLEXITY = Perplexity(ignore_index=IGNORE_INDEX)


@nnx.jit
def _perplexity_sums(model, input_ids, labels, states, sequence_length):
    logits, states = model(input_ids, states, sequence_length)
    return _PERPLEXITY.update(logits, mask_padding(labels, sequence_length)), states


def perplexity(model: RNNLM, batches) -> float:
    """Perplexity of ``model`` in eval mode over ``batches`` of ``(input_ids, labels)`` or
    ``(input_ids, labels, sequence_length)``: exp(total token loss / number of real tokens),
    the state carried from each batch to the next (as :func:`lm_batches` lays them out).
    The model's training mode is restored afterwards.

    >>> model = RNNLM(vocab_size=7, hidden_size=4, init_scale=1e-4)
    >>> round(perplexity(model, lm_batches(np.arange(50) % 7, batch_size=2, num_steps=4)), 2)  # uniform
    7.0
    """
    training = model.training
    model.eval()
    totals, states = None, None
    try:
        for input_ids, labels, *lengths in batches:
            if states is None:
                states = model.initial_states(len(input_ids))
            sums, states = _perplexity_sums(model, jnp.asarray(input_ids), jnp.asarray(labels), states,
                                            jnp.asarray(lengths[0]) if lengths else None)
            totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
    finally:
        if training:
            model.train()
    if totals is None:
        raise ValueError("perplexity: argument 'batches' is empty")
    return _PERPLEXITY.result(totals)["ppl"]


_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words, numbers and punctuation marks of ``text``, with :data:`EOS` after
    every non-empty line (PTB's sentence ends).

    >>> tokenize("It's 5 o'clock.\\n\\nDone!")
    ["it's", '5', "o'clock", '.', '<eos>', 'done', '!', '<eos>']
    """
    tokens = []
    for line in text.lower().splitlines():
        words = _TOKEN.findall(line)
        if words:
            tokens += words + [EOS]
    return tokens


def build_vocab(tokens: Sequence[str], size: int = 10000) -> dict[str, int]:
    """``{word: id}`` of :data:`UNK` (0), :data:`EOS` (1) and the ``size - 2`` most frequent
    other words of ``tokens``, ties broken alphabetically (ids in that order).

    >>> build_vocab("b a c b <eos> a b".split(), size=4)
    {'<unk>': 0, '<eos>': 1, 'b': 2, 'a': 3}
    """
    size = positive_int("build_vocab", "size", size, minimum=2)
    counts = collections.Counter(t for t in tokens if t not in (UNK, EOS))
    words = sorted(counts, key=lambda w: (-counts[w], w))[:size - 2]
    return {word: i for i, word in enumerate([UNK, EOS, *words])}


def encode(tokens: Sequence[str], vocab: Mapping[str, int]) -> np.ndarray:
    """The int32 ids of ``tokens``; words outside ``vocab`` become :data:`UNK`.

    >>> encode(["a", "zebra", "<eos>"], {"<unk>": 0, "<eos>": 1, "a": 2}).tolist()
    [2, 0, 1]
    """
    if UNK not in vocab:
        raise ValueError(f"encode: argument 'vocab' expects a mapping with {UNK!r} (see build_vocab)")
    unk = vocab[UNK]
    return np.fromiter((vocab.get(t, unk) for t in tokens), np.int32, count=len(tokens))


def lm_batches(ids, batch_size: int, num_steps: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """PTB-style training windows: the token stream ``ids`` is cut into ``batch_size`` rows
    (the tail that does not fill a row is dropped), then consecutive ``[batch_size,
    num_steps]`` windows ``x`` are yielded with ``y``, ``x`` shifted by one token. Row ``b`` of
    each window continues row ``b`` of the previous one, so a model's final state is the
    right initial state for the next window.

    >>> [(x.tolist(), y.tolist()) for x, y in lm_batches(np.arange(10), batch_size=2, num_steps=2)]
    [([[0, 1], [5, 6]], [[1, 2], [6, 7]]), ([[2, 3], [7, 8]], [[3, 4], [8, 9]])]
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"lm_batches: argument 'ids' expects a 1-D int array, got {ids.dtype}{list(ids.shape)}")
    batch_size = positive_int("lm_batches", "batch_size", batch_size)
    num_steps = positive_int("lm_batches", "num_steps", num_steps)
    row_len = len(ids) // batch_size
    windows = (row_len - 1) // num_steps
    if windows < 1:
        raise ValueError(f"lm_batches: argument 'ids' has {len(ids)} tokens, too few for one window of "
                         f"{batch_size} rows x {num_steps + 1} tokens")
    rows = ids[:batch_size * row_len].reshape(batch_size, row_len).astype(np.int32)
    # a generator expression, not a generator function, so that bad arguments fail here
    return ((rows[:, s:s + num_steps], rows[:, s + 1:s + num_steps + 1])
            for s in range(0, windows * num_steps, num_steps))
