"""BERT: configs and presets with their parameter counts, the encoder against an independent
numpy BERT on a random Hugging Face checkpoint, masks, heads, sentence pooling, static
capture and saved programs, training, and the Hugging Face loader's errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import optax
import pytest
import safetensors.numpy
from flax import nnx

import paddlejax as pj
from paddlejax.models.bert import (BertConfig, BertForSequenceClassification, BertForTokenClassification, BertModel,
                                   SentenceEmbedding, load_hf_bert)
from paddlejax.nn.weights import WeightsError

sys.path.insert(0, str(Path(__file__).parent))  # the numpy reference beside this file
from bert_reference import ReferenceBert, write_random_checkpoint  # noqa: E402

TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12)
rng = np.random.default_rng(0)


def tiny(cls=BertModel, *args, **overrides):
    pj.nn.seed(0)
    model = cls(BertConfig(**{**TINY, **overrides}), *args)
    model.eval()
    return model


def padded_batch():
    """Three rows of 3, 6 and 4 tokens, padded with id 0 to 6."""
    ids = rng.integers(1, 100, (3, 6)).astype(np.int32)
    mask = (np.arange(6) < np.array([[3], [6], [4]])).astype(np.int32)
    return ids * mask, mask


def param_count(model):
    return sum(p.size for _, p in model.named_parameters())


def rewrite(directory, change):
    """The checkpoint in ``directory`` with its tensors passed through ``change``."""
    path = directory / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    change(tensors)
    safetensors.numpy.save_file(tensors, path)
    return path


# -- configs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, count", [("bert-base-uncased", 109_482_240), ("bert-large-uncased", 335_141_888),
                                         ("ernie-1.0", 99_866_112), ("minilm-l6-h384", 22_713_216)])
def test_presets_have_the_published_parameter_counts(name, count):
    # ernie-1.0: embeddings (18000 + 513 + 2) * 768 + 2 * 768, 12 layers of 7,087,872, pooler 590,592
    assert param_count(nnx.eval_shape(lambda: BertModel(name))) == count


def test_ernie_preset_is_relu_with_513_positions():
    config = BertConfig.from_name("ernie-1.0")
    assert (config.hidden_act, config.max_position_embeddings, config.vocab_size) == ("relu", 513, 18000)


def test_config_from_a_hugging_face_config_json_ignores_unknown_keys(tmp_path):
    values = {**TINY, "hidden_act": "gelu_new", "layer_norm_eps": 1e-7, "model_type": "bert", "use_cache": True}
    (tmp_path / "config.json").write_text(json.dumps(values))
    config = BertConfig.from_json(tmp_path)
    assert (config.hidden_size, config.hidden_act, config.layer_norm_eps, config.type_vocab_size) == \
        (32, "gelu_new", 1e-7, 2)


@pytest.mark.parametrize("values, message", [
    ({"hidden_size": 32}, r"missing required key\(s\) 'vocab_size', 'num_hidden_layers'"),
    ({**TINY, "hidden_act": "swish"}, r"argument 'hidden_act' expects one of \['gelu', 'relu', 'gelu_new'\]"),
    ({**TINY, "num_attention_heads": 5}, r"'num_attention_heads' expects a divisor of hidden_size \(32\)"),
    ({**TINY, "pad_token_id": 100}, r"'pad_token_id' expects an id in \[0, 100\)"),
    ({**TINY, "position_embedding_type": "relative_key"}, r"position_embedding_type 'relative_key'"),
])
def test_bad_configs_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        BertConfig.from_dict(values)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"argument 'name' expects one of \['bert-base-uncased'"):
        BertModel("bert-huge")


# -- numerics against the numpy reference ------------------------------------------------------

@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_new"])
def test_loaded_checkpoint_matches_the_numpy_bert(tmp_path, act):
    directory = write_random_checkpoint(tmp_path, {**TINY, "hidden_act": act})
    model = BertModel.from_pretrained(directory)
    model.eval()
    ids, mask = padded_batch()
    types = (np.arange(6) >= 2).astype(np.int32) * mask
    sequence, pooled = model(ids, types, attention_mask=mask)
    reference = ReferenceBert(directory)
    want = reference(ids, mask, types)
    keep = mask.astype(bool)  # padded positions are garbage in both, by design
    np.testing.assert_allclose(np.asarray(sequence)[keep], want[keep], atol=2e-5)
    np.testing.assert_allclose(pooled, reference.pooled(want), atol=2e-5)


def test_bert_prefixed_checkpoint_with_a_classifier_loads_into_the_head(tmp_path):
    directory = write_random_checkpoint(tmp_path, TINY, prefix="bert.",
                                        extra=[("classifier.weight", (3, 32)), ("classifier.bias", (3,))])
    model = BertForSequenceClassification.from_pretrained(directory, num_classes=3)
    model.eval()
    stored = safetensors.numpy.load_file(directory / "model.safetensors")
    np.testing.assert_array_equal(model.classifier.weight[...], stored["classifier.weight"].T)
    ids, mask = padded_batch()
    reference = ReferenceBert(directory)
    want = reference.pooled(reference(ids, mask)) @ stored["classifier.weight"].T + stored["classifier.bias"]
    np.testing.assert_allclose(model(ids, attention_mask=mask), want, atol=2e-5)


def test_head_on_a_plain_encoder_checkpoint_keeps_its_fresh_classifier(tmp_path):
    directory = write_random_checkpoint(tmp_path, TINY)
    pj.nn.seed(0)
    fresh = BertForTokenClassification(BertConfig(**TINY), num_classes=4).classifier.weight[...]
    pj.nn.seed(0)
    model = BertForTokenClassification.from_pretrained(directory, num_classes=4)
    stored = safetensors.numpy.load_file(directory / "model.safetensors")
    np.testing.assert_array_equal(model.bert.encoder.layers[1].linear1.weight[...],
                                  stored["encoder.layer.1.intermediate.dense.weight"].T)
    np.testing.assert_array_equal(model.classifier.weight[...], fresh)


def test_old_gamma_beta_names_load_into_a_sentence_embedding(tmp_path):
    def rename(tensors):
        for name in [n for n in tensors if "LayerNorm" in n]:
            tensors[name.replace(".weight", ".gamma").replace(".bias", ".beta")] = tensors.pop(name)

    path = rewrite(write_random_checkpoint(tmp_path, TINY), rename)
    embed = SentenceEmbedding(tiny())
    assert load_hf_bert(embed, path).loaded == 39
    stored = safetensors.numpy.load_file(path)
    np.testing.assert_array_equal(embed.bert.encoder.layers[0].norm2.weight[...],
                                  stored["encoder.layer.0.output.LayerNorm.gamma"])


# -- masks, shapes, heads ----------------------------------------------------------------------

def test_padding_does_not_change_the_outputs_of_real_tokens():
    model = tiny()
    ids, mask = padded_batch()
    other = np.where(mask == 1, ids, rng.integers(1, 100, ids.shape)).astype(np.int32)  # new ids where padded
    a, pa = model(ids, attention_mask=mask)
    b, pb = model(other, attention_mask=mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(a)[keep], np.asarray(b)[keep], atol=1e-6)
    np.testing.assert_allclose(pa, pb, atol=1e-6)
    assert not np.allclose(np.asarray(a)[~keep], np.asarray(b)[~keep])


def test_without_a_mask_pad_ids_are_masked():
    model = tiny()
    ids, mask = padded_batch()
    np.testing.assert_array_equal(model(ids)[0], model(ids, attention_mask=mask)[0])


def test_token_types_and_positions_are_inputs():
    model = tiny()
    ids, mask = padded_batch()
    base = model(ids, attention_mask=mask)[0]
    assert not np.allclose(model(ids, np.ones_like(ids), attention_mask=mask)[0], base)
    shifted = np.broadcast_to(np.arange(1, 7, dtype=np.int32), ids.shape)
    assert not np.allclose(model(ids, None, shifted, mask)[0], base)
    np.testing.assert_array_equal(model(ids, None, np.broadcast_to(np.arange(6, dtype=np.int32), ids.shape),
                                        mask)[0], base)


def test_heads_give_logits_per_text_and_per_token():
    ids, mask = padded_batch()
    assert tiny(BertForSequenceClassification, 5)(ids, attention_mask=mask).shape == (3, 5)
    assert tiny(BertForTokenClassification, 7)(ids, attention_mask=mask).shape == (3, 6, 7)


def test_sentence_embedding_is_the_normalised_masked_mean_or_the_first_token():
    model = tiny()
    ids, mask = padded_batch()
    sequence = np.asarray(model(ids, attention_mask=mask)[0], np.float64)
    mean = (sequence * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(SentenceEmbedding(model)(ids, attention_mask=mask),
                               mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(SentenceEmbedding(model, "cls", normalize=False)(ids, attention_mask=mask),
                               sequence[:, 0], atol=1e-6)


@pytest.mark.parametrize("call, message", [
    (lambda m: m(np.ones((2, 3, 4), np.int32)), r"input 'input_ids' expects an int \[batch, seq\] array"),
    (lambda m: m(np.ones((2, 3), np.float32)), r"input 'input_ids' expects an int"),
    (lambda m: m(np.ones((2, 3), np.int32), attention_mask=np.ones((2, 4))), r"'attention_mask' expects the"),
    (lambda m: m(np.ones((2, 3), np.int32), np.ones((2, 4), np.int32)), r"'token_type_ids' expects the shape"),
    (lambda m: m(np.ones((1, 17), np.int32)), r"17 tokens per row, more than the 16 position embeddings"),
])
def test_bad_inputs_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny())


def test_sentence_embedding_refuses_unknown_pooling():
    with pytest.raises(ValueError, match=r"'pooling' expects one of \['mean', 'cls'\], got 'max'"):
        SentenceEmbedding(tiny(), "max")


# -- static programs ---------------------------------------------------------------------------

def test_program_with_symbolic_batch_and_length_equals_eager_and_survives_saving(tmp_path):
    model = tiny()
    spec = pj.InputSpec((None, "seq"), "int32")
    prog = pj.to_static(model, spec, spec, None, spec)
    pj.save(prog, tmp_path / "bert")
    loaded = pj.load(tmp_path / "bert")
    for length in (6, 4):
        ids, mask = (a[:, :length] for a in padded_batch())
        types = np.ones_like(ids)
        want = model(ids, types, attention_mask=mask)
        for program in (prog, loaded):
            got = program(ids, types, None, mask)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, atol=1e-5)


@pytest.mark.parametrize("make", [lambda: tiny(BertForSequenceClassification, 3),
                                  lambda: tiny(BertForTokenClassification, 3),
                                  lambda: SentenceEmbedding(tiny())], ids=["sequence", "token", "sentence"])
def test_heads_trace_to_programs_equal_to_eager(make):
    model = make()
    ids, mask = padded_batch()
    prog = pj.to_static(model, pj.InputSpec((None, 6), "int32"))
    np.testing.assert_allclose(prog(ids), model(ids, attention_mask=mask), atol=1e-5)


# -- training ----------------------------------------------------------------------------------

def test_sequence_classifier_learns_which_token_a_text_holds():
    model = tiny(BertForSequenceClassification, 2)
    model.train()  # dropout on, attention dropout included
    ids = rng.integers(10, 100, (16, 8)).astype(np.int32)
    labels = rng.integers(0, 2, 16).astype(np.int32)
    ids[:, 3] = np.where(labels == 1, 5, 6)  # the label is readable from one token
    trainer = pj.Trainer(model, optax.adam(1e-2), progress=False)
    losses = [trainer.train_batch((ids,), labels) for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses


# -- the loader's errors -----------------------------------------------------------------------

def test_a_wrong_shape_names_the_tensor_and_changes_nothing(tmp_path):
    name = "encoder.layer.1.intermediate.dense.weight"
    path = rewrite(write_random_checkpoint(tmp_path, TINY),
                   lambda t: t.update({name: np.zeros((64, 31), np.float32)}))
    model = tiny()
    before = np.asarray(model.embeddings.word_embeddings.weight[...])
    with pytest.raises(WeightsError, match=rf"tensor '{name}' has shape \(64, 31\), the model's "
                                           r"'encoder.layers.1.linear1.weight' needs \(64, 32\)"):
        load_hf_bert(model, path)
    np.testing.assert_array_equal(model.embeddings.word_embeddings.weight[...], before)


def test_a_missing_tensor_is_named(tmp_path):
    path = rewrite(write_random_checkpoint(tmp_path, TINY), lambda t: t.pop("encoder.layer.0.output.LayerNorm.bias"))
    with pytest.raises(WeightsError, match=r"missing 1 tensor\(s\) the model needs: "
                                           r"'encoder.layer.0.output.LayerNorm.bias'"):
        load_hf_bert(tiny(), path)


def test_a_checkpoint_without_a_pooler_loads_when_not_strict(tmp_path):
    path = rewrite(write_random_checkpoint(tmp_path, TINY),
                   lambda t: [t.pop(n) for n in ("pooler.dense.weight", "pooler.dense.bias")])
    with pytest.raises(WeightsError, match=r"missing 2 tensor\(s\) the model needs: 'pooler.dense.bias'"):
        load_hf_bert(tiny(), path)
    result = load_hf_bert(tiny(), path, strict=False)
    assert (result.loaded, result.missing, result.unexpected) == (37, ["pooler.dense.bias", "pooler.dense.weight"], [])


def test_unknown_tensors_fail_unless_not_strict(tmp_path):
    directory = write_random_checkpoint(tmp_path, TINY, extra=[("cls.predictions.bias", (100,))])
    with pytest.raises(WeightsError, match=r"1 tensor\(s\) the model does not have: 'cls.predictions.bias'"):
        BertModel.from_pretrained(directory)
    result = load_hf_bert(tiny(), directory, strict=False)
    assert (result.loaded, result.unexpected) == (39, ["cls.predictions.bias"])


def test_a_directory_without_safetensors_is_refused(tmp_path):
    with pytest.raises(WeightsError, match="no model.safetensors"):
        load_hf_bert(tiny(), tmp_path)
