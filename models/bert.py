"""BERT and ERNIE encoders (PaddleNLP's ``BertModel``: embeddings, a post-norm
``TransformerEncoder`` and a pooler), classification heads, sentence embeddings, and loading of
Hugging Face BERT checkpoints (``model.safetensors`` + ``config.json``).

Inputs are int ``[batch, seq]`` token ids; ``attention_mask`` is 1 for tokens and 0 for
padding. Without a mask, positions holding ``pad_token_id`` are masked (PaddleNLP's default),
so a padded batch of ids alone is enough.

>>> import numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
...                     intermediate_size=64)
>>> ids = np.array([[2, 9, 4, 0, 0], [2, 7, 7, 7, 3]], np.int32)  # 0 is padding
>>> model = BertModel(config)
>>> model.eval()  # no dropout
>>> sequence, pooled = model(ids)
>>> sequence.shape, pooled.shape
((2, 5, 32), (2, 32))
>>> classifier = BertForSequenceClassification(config, num_classes=3)
>>> classifier.eval()
>>> classifier(ids).shape
(2, 3)
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import safetensors
from flax import nnx
from jax import lax

from paddlejax import nn, ops
from paddlejax.nn.args import arg_error, choice, is_int, positive_int, probability
from paddlejax.nn.weights import LoadResult, WeightsError, listing, load_weights

ACTIVATIONS = ("gelu", "relu", "gelu_new")  # gelu: exact (erf); gelu_new: tanh approximation

_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")

PRESETS = {
    "bert-base-uncased": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                              intermediate_size=3072),
    "bert-large-uncased": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096),
    "ernie-1.0": dict(vocab_size=18000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, hidden_act="relu", max_position_embeddings=513),
    "minilm-l6-h384": dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                           intermediate_size=1536),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The sizes and hyper-parameters of a BERT encoder, named as in Hugging Face's and
    PaddleNLP's ``config.json``. Defaults are BERT's.

    >>> BertConfig.from_name("bert-base-uncased").hidden_size
    768
    >>> BertConfig.from_name("ernie-1.0", num_hidden_layers=2).num_hidden_layers
    2
    >>> BertConfig(100, 30, 2, 4, 64)
    Traceback (most recent call last):
    ValueError: BertConfig: argument 'num_attention_heads' expects a divisor of hidden_size (30), got 4
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in (*_REQUIRED, "max_position_embeddings", "type_vocab_size"):
            positive_int("BertConfig", name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise arg_error("BertConfig", "num_attention_heads", f"a divisor of hidden_size ({self.hidden_size})",
                            self.num_attention_heads)
        choice("BertConfig", "hidden_act", self.hidden_act, ACTIVATIONS)
        probability("BertConfig", "hidden_dropout_prob", self.hidden_dropout_prob)
        probability("BertConfig", "attention_probs_dropout_prob", self.attention_probs_dropout_prob)
        if not (is_int(self.pad_token_id) and 0 <= self.pad_token_id < self.vocab_size):
            raise arg_error("BertConfig", "pad_token_id", f"an id in [0, {self.vocab_size})", self.pad_token_id)
        for name in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise arg_error("BertConfig", name, "a number >= 0", value)

    @classmethod
    def from_name(cls, name: str, **overrides) -> BertConfig:
        """A preset (see ``PRESETS``), with some fields replaced.

        >>> BertConfig.from_name("bert-tiny")
        Traceback (most recent call last):
        ValueError: BertConfig: argument 'name' expects one of ['bert-base-uncased', 'bert-large-uncased', \
'ernie-1.0', 'minilm-l6-h384'], got 'bert-tiny'
        """
        return cls(**{**PRESETS[choice("BertConfig", "name", name, tuple(PRESETS))], **overrides})

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> BertConfig:
        """A config from a Hugging Face / PaddleNLP config dict; keys that are not fields are
        ignored. ``source`` names the dict in errors.

        >>> BertConfig.from_dict({"hidden_size": 8, "model_type": "bert"})
        Traceback (most recent call last):
        ValueError: config: missing required key(s) 'vocab_size', 'num_hidden_layers', \
'num_attention_heads', 'intermediate_size'
        """
        missing = [key for key in _REQUIRED if key not in values]
        if missing:
            raise ValueError(f"{source}: missing required key(s) " + ", ".join(repr(k) for k in missing))
        if values.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{source}: position_embedding_type {values['position_embedding_type']!r} is not "
                             "supported (only 'absolute')")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in fields})

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> BertConfig:
        """The config in a ``config.json`` file, or in the ``config.json`` of a directory."""
        path = Path(path)
        path = path / "config.json" if path.is_dir() else path
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read a BERT config from {path}: {e}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expects a JSON object, got {type(values).__name__}")
        return cls.from_dict(values, source=str(path))


def _config(config) -> BertConfig:
    if isinstance(config, str):
        return BertConfig.from_name(config)
    if not isinstance(config, BertConfig):
        raise TypeError(f"argument 'config' expects a BertConfig or a preset name, got {config!r}")
    return config


def _init(config: BertConfig) -> nn.initializer.Initializer:
    """BERT's initialiser for every weight matrix and embedding table."""
    return nn.initializer.Normal(0.0, config.initializer_range)


def _check_ids(layer: str, name: str, x, like=None):
    """``x`` as an integer ``[batch, seq]`` array (of ``like``'s shape, when given)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{layer}: input '{name}' expects an int [batch, seq] array, got {x.dtype} "
                         f"{tuple(x.shape)}")
    if like is not None and x.shape != like.shape:
        raise ValueError(f"{layer}: input '{name}' expects the shape of input_ids {tuple(like.shape)}, "
                         f"got {tuple(x.shape)}")
    return x


class BertEmbeddings(nn.Layer):
    """Word + position + token-type embeddings, then LayerNorm and dropout. Positions default
    to ``0 .. seq-1`` and token types to 0.

    >>> import numpy as np
    >>> embeddings = BertEmbeddings(BertConfig(100, 32, 2, 4, 64))
    >>> embeddings.eval()
    >>> embeddings(np.zeros((2, 5), np.int32)).shape
    (2, 5, 32)
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        init = _init(config)
        self.max_positions = config.max_position_embeddings
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, weight_attr=init, rngs=rngs)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                weight_attr=init, rngs=rngs)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size, weight_attr=init,
                                                  rngs=rngs)
        self.layer_norm = nn.LayerNorm(config.hidden_size, config.layer_norm_eps, rngs=rngs)
        self.dropout = nn.Dropout(config.hidden_dropout_prob, rngs=rngs)

    def forward(self, input_ids, token_type_ids=None, position_ids=None):
        seq = input_ids.shape[1]
        if position_ids is None:
            if is_int(seq) and seq > self.max_positions:
                raise ValueError(f"BertEmbeddings: input 'input_ids' has {seq} tokens per row, more than the "
                                 f"{self.max_positions} position embeddings")
            position_ids = lax.broadcasted_iota(input_ids.dtype, input_ids.shape, 1)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.layer_norm(x))


class BertPooler(nn.Layer):
    """``tanh(dense(hidden state of the first token))``: the ``[CLS]`` summary.

    >>> import jax.numpy as jnp
    >>> BertPooler(BertConfig(100, 32, 2, 4, 64))(jnp.ones((2, 5, 32))).shape
    (2, 32)
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, weight_attr=_init(config), rngs=rngs)

    def forward(self, hidden_states):
        return ops.tanh(self.dense(hidden_states[:, 0]))


class BertModel(nn.Layer):
    """The BERT encoder of ``config`` (a :class:`BertConfig` or a preset name).

    ``forward(input_ids, token_type_ids=None, position_ids=None, attention_mask=None)`` returns
    ``(sequence_output [batch, seq, hidden], pooled_output [batch, hidden])``. Weights start
    as BERT's: Normal(0, ``initializer_range``) matrices and embeddings, zero biases, unit
    LayerNorms. Sub-layers: ``embeddings``, ``encoder`` (a ``TransformerEncoder`` of post-norm
    layers with the config's activation, no dropout after it), ``pooler``.

    >>> import numpy as np, paddlejax as pj
    >>> from flax import nnx
    >>> model = BertModel(BertConfig(100, 32, 2, 4, 64))
    >>> model.eval()  # no dropout
    >>> ids = np.array([[2, 9, 4, 0, 0], [2, 7, 7, 7, 3]], np.int32)
    >>> mask = (ids != 0).astype(np.int32)
    >>> model(ids, attention_mask=mask)[0].shape
    (2, 5, 32)
    >>> prog = pj.to_static(model, pj.InputSpec((None, "seq"), "int32"))  # any batch size and length
    >>> bool(np.allclose(prog(ids)[1], model(ids)[1], atol=1e-5))
    True
    >>> shapes = nnx.eval_shape(lambda: BertModel("bert-base-uncased"))  # no weights materialised
    >>> sum(p.size for _, p in shapes.named_parameters())
    109482240
    """

    def __init__(self, config: BertConfig | str, *, rngs: nnx.Rngs | None = None):
        self.config = config = _config(config)
        init = _init(config)
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        layer = nn.TransformerEncoderLayer(
            config.hidden_size, config.num_attention_heads, config.intermediate_size,
            dropout=config.hidden_dropout_prob, activation=config.hidden_act,
            attn_dropout=config.attention_probs_dropout_prob, act_dropout=0.0, weight_attr=init,
            layer_norm_eps=config.layer_norm_eps, rngs=rngs)
        self.encoder = nn.TransformerEncoder(layer, config.num_hidden_layers, rngs=rngs)
        self.pooler = BertPooler(config, rngs=rngs)

    def forward(self, input_ids, token_type_ids=None, position_ids=None, attention_mask=None):
        input_ids = _check_ids("BertModel", "input_ids", input_ids)
        token_type_ids = _check_ids("BertModel", "token_type_ids", token_type_ids, input_ids)
        position_ids = _check_ids("BertModel", "position_ids", position_ids, input_ids)
        keep = token_mask(input_ids, attention_mask, self.config.pad_token_id)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)
        hidden = self.encoder(hidden, keep[:, None, None, :])  # broadcast over heads and queries
        return hidden, self.pooler(hidden)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, strict: bool = True) -> BertModel:
        """The model of a Hugging Face BERT directory (``config.json`` and ``model.safetensors``);
        see :func:`load_hf_bert` for ``strict``."""
        model = cls(BertConfig.from_json(_directory(path)))
        load_hf_bert(model, path, strict=strict)
        return model


def token_mask(input_ids, attention_mask, pad_token_id: int):
    """Boolean ``[batch, seq]``: True for tokens. From ``attention_mask`` (nonzero keeps) when
    given, else every id other than ``pad_token_id``.

    >>> import numpy as np
    >>> token_mask(np.array([[5, 0]]), None, 0).tolist(), token_mask(np.array([[5, 0]]), [[1, 1]], 0).tolist()
    ([[True, False]], [[True, True]])
    """
    if attention_mask is None:
        return input_ids != pad_token_id
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"input 'attention_mask' expects the [batch, seq] shape of input_ids "
                         f"{tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    return attention_mask != 0


class _BertHead(nn.Layer):
    """A BERT encoder (``bert``), dropout and a ``classifier`` Linear (the layout and names
    of PaddleNLP's and Hugging Face's ``BertFor*`` models); subclasses pick the features."""

    def __init__(self, config: BertConfig | str, num_classes: int = 2, dropout: float | None = None, *,
                 rngs: nnx.Rngs | None = None):
        name = type(self).__name__
        self.bert = BertModel(config, rngs=rngs)
        config = self.bert.config
        self.num_classes = positive_int(name, "num_classes", num_classes)
        p = config.hidden_dropout_prob if dropout is None else probability(name, "dropout", dropout)
        self.dropout = nn.Dropout(p, rngs=rngs)
        self.classifier = nn.Linear(config.hidden_size, self.num_classes, weight_attr=_init(config), rngs=rngs)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, num_classes: int = 2, dropout: float | None = None, *,
                        strict: bool = True):
        """The encoder of a Hugging Face BERT directory with this head on top; the head is
        loaded too when the checkpoint has one (a ``BertFor*`` checkpoint), and otherwise keeps
        its fresh initialisation, ready for fine-tuning."""
        model = cls(BertConfig.from_json(_directory(path)), num_classes, dropout)
        load_hf_bert(model, path, strict=strict, new_modules=("classifier",))
        return model


class BertForSequenceClassification(_BertHead):
    """Logits ``[batch, num_classes]`` from the pooled ``[CLS]`` output (dropout, then
    ``classifier``). ``dropout`` defaults to the config's ``hidden_dropout_prob``.

    >>> import numpy as np
    >>> model = BertForSequenceClassification(BertConfig(100, 32, 2, 4, 64), num_classes=5)
    >>> model.eval()
    >>> model(np.ones((2, 5), np.int32)).shape
    (2, 5)
    """

    def forward(self, input_ids, token_type_ids=None, position_ids=None, attention_mask=None):
        _, pooled = self.bert(input_ids, token_type_ids, position_ids, attention_mask)
        return self.classifier(self.dropout(pooled))


class BertForTokenClassification(_BertHead):
    """Logits ``[batch, seq, num_classes]`` for every token (dropout, then ``classifier``).

    >>> import numpy as np
    >>> model = BertForTokenClassification(BertConfig(100, 32, 2, 4, 64), num_classes=7)
    >>> model.eval()
    >>> model(np.ones((2, 5), np.int32)).shape
    (2, 5, 7)
    """

    def forward(self, input_ids, token_type_ids=None, position_ids=None, attention_mask=None):
        sequence, _ = self.bert(input_ids, token_type_ids, position_ids, attention_mask)
        return self.classifier(self.dropout(sequence))


POOLINGS = ("mean", "cls")


class SentenceEmbedding(nn.Layer):
    """One vector per text from a :class:`BertModel` (sentence-transformers' Pooling and
    Normalize): the mean of the token outputs where the mask keeps tokens (``"mean"``) or the
    first token's output (``"cls"``), then, with ``normalize``, scaled to unit L2 norm.

    >>> import numpy as np
    >>> embed = SentenceEmbedding(BertModel(BertConfig(100, 32, 2, 4, 64)))
    >>> embed.eval()
    >>> v = embed(np.array([[2, 9, 4, 0, 0], [2, 7, 7, 7, 3]], np.int32))
    >>> v.shape, np.linalg.norm(v, axis=1).round(4).tolist()
    ((2, 32), [1.0, 1.0])
    """

    def __init__(self, bert: BertModel, pooling: str = "mean", normalize: bool = True):
        if not isinstance(bert, BertModel):
            raise arg_error("SentenceEmbedding", "bert", "a BertModel", bert)
        if not isinstance(normalize, bool):
            raise arg_error("SentenceEmbedding", "normalize", "a bool", normalize)
        self.bert = bert
        self.pooling = choice("SentenceEmbedding", "pooling", pooling, POOLINGS)
        self.normalize = normalize

    def forward(self, input_ids, token_type_ids=None, position_ids=None, attention_mask=None):
        sequence, _ = self.bert(input_ids, token_type_ids, position_ids, attention_mask)
        if self.pooling == "cls":
            pooled = sequence[:, 0]
        else:
            keep = token_mask(jnp.asarray(input_ids), attention_mask, self.bert.config.pad_token_id)
            keep = ops.cast(keep[..., None], dtype=sequence.dtype)
            total = ops.reduce_sum(ops.elementwise_mul(sequence, keep), axis=1)
            # sentence-transformers' clamp: a row with no tokens pools to zeros, not NaN
            pooled = total / jnp.maximum(ops.reduce_sum(keep, axis=1), 1e-9)
        if not self.normalize:
            return pooled
        norm = jnp.sqrt(ops.reduce_sum(pooled * pooled, axis=-1, keepdim=True))
        return pooled / jnp.maximum(norm, 1e-12)


# -- Hugging Face checkpoints ----------------------------------------------------------------

# Hugging Face's names for the sub-layers of one encoder layer (ours -> theirs)
_HF_LAYER = {
    "self_attn.q_proj": "attention.self.query", "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value", "self_attn.out_proj": "attention.output.dense",
    "norm1": "attention.output.LayerNorm", "linear1": "intermediate.dense", "linear2": "output.dense",
    "norm2": "output.LayerNorm",
}
_HF_IGNORED = ("embeddings.position_ids",)  # a constant buffer, not a weight


def _hf_module(module: str) -> str:
    """Hugging Face's name for one of our module paths inside a :class:`BertModel`."""
    layer = re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)", module)
    if layer:
        return f"encoder.layer.{layer[1]}.{_HF_LAYER.get(layer[2], layer[2])}"
    return {"embeddings.layer_norm": "embeddings.LayerNorm"}.get(module, module)


def _canonical(stored: str) -> str:
    """A checkpoint tensor name as a bare ``BertModel``'s (or a head's): without the ``bert.``
    prefix of ``BertFor*`` checkpoints, and ``weight``/``bias`` for old ``gamma``/``beta``."""
    module, _, leaf = stored.removeprefix("bert.").rpartition(".")
    if module.endswith("LayerNorm"):
        leaf = {"gamma": "weight", "beta": "bias"}.get(leaf, leaf)
    return f"{module}.{leaf}"


@dataclasses.dataclass(frozen=True)
class _Target:
    """One model parameter as a checkpoint holds it."""

    name: str  # ours
    shape: tuple  # as stored
    transpose: bool  # a Linear weight: Hugging Face stores [out, in], we hold [in, out]


def _hf_targets(model) -> dict[str, _Target]:
    """``{canonical Hugging Face name: target}`` for every parameter of ``model``: a
    :class:`BertModel`, or a layer holding exactly one (heads outside it keep their names)."""
    modules = {".".join(str(p) for p in path): node for path, node in nnx.iter_graph(model)
               if isinstance(node, nnx.Module)}
    berts = [path for path, node in modules.items() if isinstance(node, BertModel)]
    if len(berts) != 1:
        raise ValueError(f"load_hf_bert: argument 'model' expects a BertModel or a layer holding one, "
                         f"got {type(model).__name__} holding {len(berts)}")
    prefix = berts[0] + "." if berts[0] else ""
    targets = {}
    for name, param in model.named_parameters():
        module, _, leaf = name.rpartition(".")
        linear_weight = isinstance(modules[module], nn.Linear) and leaf == "weight"
        hf_module = _hf_module(module.removeprefix(prefix)) if name.startswith(prefix) else module
        shape = tuple(param.get_value().shape)
        targets[f"{hf_module}.{leaf}"] = _Target(name, shape[::-1] if linear_weight else shape, linear_weight)
    return targets


def _weights_file(path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
        if not path.is_file():
            raise WeightsError(f"{path.parent}: no model.safetensors (only safetensors checkpoints are read; "
                               "pytorch_model.bin would need unpickling)")
    return path


def _directory(path) -> Path:
    path = Path(path)
    return path.parent if path.is_file() else path


def _stored_names(file: Path) -> list[str]:
    try:
        with safetensors.safe_open(file, framework="numpy") as f:
            return list(f.keys())
    except (OSError, safetensors.SafetensorError) as e:
        raise WeightsError(f"cannot read {file}: {e}") from None


def load_hf_bert(model, path: str | os.PathLike, *, strict: bool = True,
                 new_modules: Sequence[str] = ()) -> LoadResult:
    """Load a Hugging Face BERT checkpoint (``model.safetensors``, or a directory holding it)
    into ``model``: a :class:`BertModel`, a ``BertFor*`` head or :class:`SentenceEmbedding`.

    Hugging Face names map to ours (``encoder.layer.0.attention.self.query`` is
    ``encoder.layers.0.self_attn.q_proj``, ...; an optional ``bert.`` prefix is accepted) and
    Linear weights are transposed (Hugging Face stores ``[out, in]``). ``embeddings.position_ids``
    is skipped. Every shape is checked first, and nothing changes if anything is wrong.

    ``strict``: every parameter must be in the checkpoint and every checkpoint tensor must
    belong to the model, else :class:`WeightsError` names the tensors. With ``strict=False``,
    parameters the checkpoint lacks keep their values (e.g. a pooler the checkpoint was saved
    without) and tensors the model lacks (e.g. pre-training heads) are skipped; both are
    listed in the result. ``new_modules`` are module paths of the model that the checkpoint
    may lack even when strict (a new classification head).

    >>> import os, tempfile, numpy as np, safetensors.numpy
    >>> model = BertModel(BertConfig(100, 32, 2, 4, 64))
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> safetensors.numpy.save_file({"embeddings.word_embeddings.weight": np.zeros((100, 32), np.float32)}, path)
    >>> load_hf_bert(model, path)
    Traceback (most recent call last):
    paddlejax.nn.weights.WeightsError: .../model.safetensors: missing 38 tensor(s) the model needs: \
'embeddings.LayerNorm.bias', ... and 33 more (strict=False keeps the model's own values)
    >>> result = load_hf_bert(model, path, strict=False)
    >>> result.loaded, len(result.missing), float(abs(model.embeddings.word_embeddings.weight[...]).max())
    (1, 38, 0.0)
    """
    file = _weights_file(path)
    targets = _hf_targets(model)
    stored = {_canonical(n): n for n in _stored_names(file) if _canonical(n) not in _HF_IGNORED}
    may_lack = tuple(m.rstrip(".") + "." for m in new_modules)
    missing = [hf for hf, t in targets.items() if hf not in stored]
    unexpected = [n for hf, n in stored.items() if hf not in targets]
    if strict:
        needed = [hf for hf in missing if not targets[hf].name.startswith(may_lack)]
        if needed:
            raise WeightsError(f"{file}: missing {len(needed)} tensor(s) the model needs: {listing(needed)} "
                               "(strict=False keeps the model's own values)")
        if unexpected:
            raise WeightsError(f"{file}: {len(unexpected)} tensor(s) the model does not have: "
                               f"{listing(unexpected)} (strict=False skips them)")
    load_weights(model, file, convert=_hf_converter(file, targets), strict=False)
    return LoadResult(len(targets) - len(missing), sorted(targets[hf].name for hf in missing), sorted(unexpected))


def _hf_converter(file: Path, targets: dict[str, _Target]) -> Callable:
    """The ``convert`` of :func:`~paddlejax.nn.weights.load_weights` for a Hugging Face file."""

    def convert(name: str, value: np.ndarray):
        target = targets.get(_canonical(name))
        if target is None:
            return None
        if tuple(value.shape) != target.shape:
            raise WeightsError(f"{file}: tensor {name!r} has shape {tuple(value.shape)}, the model's "
                               f"{target.name!r} needs {target.shape}")
        return target.name, value.T if target.transpose else value

    return convert
