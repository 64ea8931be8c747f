"""BERT's WordPiece tokenizer on the ``tokenizers`` package, giving the int32 arrays that
:class:`~paddlejax.models.bert.BertModel` takes.

A batch is padded to its longest text (or to ``max_length``), optionally rounded up to a
multiple of ``pad_to_multiple_of`` so that a jitted model sees few distinct lengths. Text
pairs get token types 0 and 1.

>>> vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s"])}
>>> tok = BertTokenizer.from_vocab(vocab)
>>> batch = tok(["hello worlds", "Hello"])
>>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
([[2, 4, 5, 6, 3], [2, 4, 3, 0, 0]], [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
>>> tok.decode(batch["input_ids"])
['hello worlds', 'hello']
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PADDINGS = ("longest", "max_length")
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}


def _texts(name: str, texts) -> list[str]:
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, Sequence) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"BertTokenizer: argument '{name}' expects a string or a non-empty list of strings, "
                         f"got {texts!r:.80}")
    return list(texts)


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"BertTokenizer: argument '{name}' expects an int >= 1, got {value!r}")
    return value


class BertTokenizer:
    """A WordPiece tokenizer (lower-casing, accent stripping and punctuation splitting as
    configured in it) with BERT's ``[CLS] a [SEP] b [SEP]`` template.

    Build it with :meth:`from_pretrained` (a model directory), :meth:`from_file`
    (``tokenizer.json``) or :meth:`from_vocab` (``vocab.txt``). ``model_max_length`` is the
    longest encoding it produces when truncating.

    >>> tok = BertTokenizer.from_vocab({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "b": 5})
    >>> pair = tok(["a a"], ["b"])
    >>> pair["input_ids"].tolist(), pair["token_type_ids"].tolist()
    ([[2, 4, 4, 3, 5, 3]], [[0, 0, 0, 0, 1, 1]])
    """

    def __init__(self, tokenizer: Tokenizer, *, model_max_length: int = 512):
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"BertTokenizer: argument 'tokenizer' expects a tokenizers.Tokenizer, got {tokenizer!r}")
        self.model_max_length = _positive("model_max_length", model_max_length)
        # a private copy: every call sets padding and truncation on it
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        ids = {role: self._tokenizer.token_to_id(token) for role, token in SPECIAL_TOKENS.items()}
        lacking = [SPECIAL_TOKENS[role] for role, i in ids.items() if i is None]
        if lacking:
            raise ValueError(f"BertTokenizer: the vocabulary lacks the special token(s) {', '.join(lacking)}")
        self.pad_token_id, self.unk_token_id = ids["pad"], ids["unk"]
        self.cls_token_id, self.sep_token_id = ids["cls"], ids["sep"]

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> BertTokenizer:
        """The tokenizer saved in a ``tokenizer.json`` file."""
        return cls(Tokenizer.from_file(os.fspath(path)), **kwargs)

    @classmethod
    def from_vocab(cls, vocab: str | os.PathLike | dict[str, int], *, lowercase: bool = True,
                   **kwargs) -> BertTokenizer:
        """BERT's tokenizer over a ``vocab.txt`` file (one token a line; its line number is its
        id) or a ``{token: id}`` dict; ``lowercase`` also strips accents, as BERT's uncased
        models expect."""
        if not isinstance(vocab, dict):
            lines = Path(vocab).read_text(encoding="utf-8").splitlines()
            vocab = {token: i for i, token in enumerate(lines)}
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=SPECIAL_TOKENS["unk"]))
        # registered as special, so that they are never split and decoding can skip them
        tokenizer.add_special_tokens([t for t in (*SPECIAL_TOKENS.values(), "[MASK]") if t in vocab])
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls_token, sep_token = SPECIAL_TOKENS["cls"], SPECIAL_TOKENS["sep"]
        if cls_token in vocab and sep_token in vocab:  # else __init__ reports what is lacking
            tokenizer.post_processor = processors.BertProcessing((sep_token, vocab[sep_token]),
                                                                 (cls_token, vocab[cls_token]))
        tokenizer.decoder = decoders.WordPiece()
        return cls(tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs) -> BertTokenizer:
        """The tokenizer of a Hugging Face model directory: its ``tokenizer.json``, else its
        ``vocab.txt`` with ``do_lower_case`` from ``tokenizer_config.json``, whose
        ``model_max_length`` also applies unless given."""
        path = Path(path)
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        kwargs.setdefault("model_max_length", min(int(config.get("model_max_length", 512)), 1 << 20))
        if (path / "tokenizer.json").is_file():
            return cls.from_file(path / "tokenizer.json", **kwargs)
        if (path / "vocab.txt").is_file():
            return cls.from_vocab(path / "vocab.txt", lowercase=bool(config.get("do_lower_case", True)), **kwargs)
        raise FileNotFoundError(f"{path}: neither tokenizer.json nor vocab.txt")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of ``text`` (no special tokens).

        >>> tok = BertTokenizer.from_vocab({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "un": 4, "##do": 5})
        >>> tok.tokenize("Undo!")
        ['un', '##do', '[UNK]']
        """
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        return self._tokenizer.encode(_texts("text", text)[0], add_special_tokens=False).tokens

    def __call__(self, text, text_pair=None, *, max_length: int | None = None, padding: str | bool = "longest",
                 truncation: bool = True, pad_to_multiple_of: int | None = None) -> dict[str, np.ndarray]:
        """Encode a text or a list of texts (with ``text_pair``: pairs) as a batch.

        Returns ``{"input_ids", "token_type_ids", "attention_mask"}``, int32 ``[batch, seq]``,
        ready for ``model(**batch)``. ``max_length`` defaults to ``model_max_length``;
        ``truncation`` shortens longer encodings to it (the longer text of a pair first),
        otherwise they raise. ``padding``: ``"longest"`` (or True) or ``"max_length"``.

        >>> tok = BertTokenizer.from_vocab({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4})
        >>> tok(["a a a a", "a"], max_length=4)["input_ids"].tolist()
        [[2, 4, 4, 3], [2, 4, 3, 0]]
        >>> tok("a", pad_to_multiple_of=8)["input_ids"].shape
        (1, 8)
        >>> tok("a a a", max_length=3, truncation=False)
        Traceback (most recent call last):
        ValueError: BertTokenizer: text 0 has 5 tokens, more than max_length 3 (truncation=True shortens it)
        """
        texts = _texts("text", text)
        if text_pair is not None:
            pairs = _texts("text_pair", text_pair)
            if len(pairs) != len(texts):
                raise ValueError(f"BertTokenizer: argument 'text_pair' expects {len(texts)} texts like 'text', "
                                 f"got {len(pairs)}")
            texts = list(zip(texts, pairs))
        max_length = self.model_max_length if max_length is None else _positive("max_length", max_length)
        padding = "longest" if padding is True else padding
        if padding not in PADDINGS:
            raise ValueError(f"BertTokenizer: argument 'padding' expects True or one of {list(PADDINGS)}, "
                             f"got {padding!r}")
        multiple = None if pad_to_multiple_of is None else _positive("pad_to_multiple_of", pad_to_multiple_of)
        tk = self._tokenizer
        if truncation:
            tk.enable_truncation(max_length)
        else:
            tk.no_truncation()
        tk.enable_padding(pad_id=self.pad_token_id, pad_token=SPECIAL_TOKENS["pad"], pad_to_multiple_of=multiple,
                          length=max_length if padding == "max_length" else None)
        encodings = tk.encode_batch(texts)
        for i, encoding in enumerate(encodings):
            if sum(encoding.attention_mask) > max_length:
                raise ValueError(f"BertTokenizer: text {i} has {sum(encoding.attention_mask)} tokens, more than "
                                 f"max_length {max_length} (truncation=True shortens it)")
        return {"input_ids": np.array([e.ids for e in encodings], np.int32),
                "token_type_ids": np.array([e.type_ids for e in encodings], np.int32),
                "attention_mask": np.array([e.attention_mask for e in encodings], np.int32)}

    def decode(self, ids, skip_special_tokens: bool = True) -> str | list[str]:
        """The text of a sequence of ids, or a list of texts for a ``[batch, seq]`` array;
        special tokens (padding included) are dropped unless ``skip_special_tokens=False``.

        >>> tok = BertTokenizer.from_vocab({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4})
        >>> tok.decode([2, 4, 4, 3, 0]), tok.decode([2, 4, 3], skip_special_tokens=False)
        ('a a', '[CLS] a [SEP]')
        """
        ids = np.asarray(ids)
        if ids.ndim not in (1, 2) or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"BertTokenizer.decode: argument 'ids' expects a sequence or a [batch, seq] array "
                             f"of ints, got {ids.dtype} {ids.shape}")
        if ids.ndim == 2:
            return self._tokenizer.decode_batch(ids.tolist(), skip_special_tokens=skip_special_tokens)
        return self._tokenizer.decode(ids.tolist(), skip_special_tokens=skip_special_tokens)
