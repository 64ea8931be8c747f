"""BertTokenizer on the all-MiniLM-L6-v2 vocabulary: known ids, pairs and token types,
padding and buckets, truncation, decoding, and tokenizer.json agreeing with vocab.txt."""
from __future__ import annotations

import numpy as np
import pytest

from paddlejax.models.minilm import minilm_path
from paddlejax.models.tokenizer import BertTokenizer

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Ünïcödé naïve café, tokenization!"]


@pytest.fixture(scope="module")
def tok():
    return BertTokenizer.from_pretrained(minilm_path())


def test_known_ids(tok):
    assert tok("hello world")["input_ids"].tolist() == [[101, 7592, 2088, 102]]
    assert tok.tokenize("Tokenization") == ["token", "##ization"]
    assert (tok.vocab_size, tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (30522, 0, 101, 102)


def test_batch_is_padded_to_the_longest_with_a_mask(tok):
    batch = tok(["hello world", "hello"])
    assert {k: v.dtype for k, v in batch.items()} == {k: np.int32 for k in ("input_ids", "token_type_ids",
                                                                           "attention_mask")}
    assert batch["input_ids"].tolist() == [[101, 7592, 2088, 102], [101, 7592, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_pairs_get_token_types_zero_then_one(tok):
    batch = tok(["hello world"], ["hello"])
    assert batch["input_ids"].tolist() == [[101, 7592, 2088, 102, 7592, 102]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1]]


def test_padding_to_max_length_and_to_a_multiple(tok):
    assert tok("hello", padding="max_length", max_length=10)["input_ids"].shape == (1, 10)
    batch = tok(TEXTS, pad_to_multiple_of=8)
    assert batch["input_ids"].shape == (3, 16)
    assert batch["attention_mask"].sum(1).tolist() == [4, 12, 9]


def test_truncation_keeps_the_special_tokens(tok):
    ids = tok(TEXTS[1], max_length=5)["input_ids"][0]
    assert ids.tolist() == [101, 1996, 4248, 2829, 102]
    pair = tok(["hello world hello world"], ["hello"], max_length=6)
    assert pair["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1]]  # the longer text lost tokens first


def test_truncation_defaults_to_the_model_max_length():
    tok = BertTokenizer.from_pretrained(minilm_path(), model_max_length=8)
    assert tok(TEXTS)["input_ids"].shape == (3, 8)


def test_decode_drops_special_tokens_and_padding(tok):
    batch = tok(TEXTS[:2])
    assert tok.decode(batch["input_ids"]) == ["hello world", "the quick brown fox jumps over the lazy dog."]
    assert tok.decode(batch["input_ids"][0, :6], skip_special_tokens=False) == "[CLS] hello world [SEP] [PAD] [PAD]"


def test_vocab_txt_tokenizes_like_tokenizer_json(tok):
    from_vocab = BertTokenizer.from_vocab(minilm_path() / "vocab.txt", lowercase=True)
    for key, value in tok(TEXTS, TEXTS[::-1]).items():
        np.testing.assert_array_equal(from_vocab(TEXTS, TEXTS[::-1])[key], value, err_msg=key)


@pytest.mark.parametrize("call, message", [
    (lambda t: t([]), r"argument 'text' expects a string or a non-empty list of strings"),
    (lambda t: t(["a", "b"], ["c"]), r"argument 'text_pair' expects 2 texts like 'text', got 1"),
    (lambda t: t("a", padding="left"), r"argument 'padding' expects True or one of \['longest', 'max_length'\]"),
    (lambda t: t("a", max_length=0), r"argument 'max_length' expects an int >= 1, got 0"),
    (lambda t: t(TEXTS[1], max_length=5, truncation=False), r"text 0 has 12 tokens, more than max_length 5"),
    (lambda t: t.decode([[1.5]]), r"argument 'ids' expects a sequence or a \[batch, seq\] array of ints"),
])
def test_bad_arguments_are_named(tok, call, message):
    with pytest.raises(ValueError, match=message):
        call(tok)


def test_a_vocabulary_without_special_tokens_is_refused():
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \[CLS\], \[SEP\]"):
        BertTokenizer.from_vocab({"[PAD]": 0, "[UNK]": 1, "a": 2})
