"""Post-training int8 quantization of pretrained all-MiniLM-L6-v2 on BBC News sentences, with
the helpers of ``examples/minilm_int8.py`` (its full-corpus figures come from running it)."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.data import BBCNews
from paddlejax.models.minilm import all_minilm_l6_v2
from paddlejax.nn.weights import read_weights

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minilm_int8.py"
LAYERS, LINEARS_PER_LAYER = 6, 6  # q, k, v, out projections and the two feed-forward linears


def _example():
    spec = importlib.util.spec_from_file_location("minilm_int8", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _example()


@pytest.fixture(scope="module")
def minilm():
    """The float sentence program, its int8 version calibrated on 64 train-split sentences
    (``calib``), the tokenizer, and 96 other corpus sentences; all cut to 32 word pieces."""
    encoder = all_minilm_l6_v2()
    calib, calib_set = ex.calibration_split(seed=0, size=64)
    sentences = [s for s in ex.corpus_sentences(BBCNews("all"))[:160] if s not in calib_set][:96]
    program = ex.sentence_program(encoder)
    int8 = ex.quantize_sentence_program(program, encoder.tokenizer, calib, max_length=32)
    return SimpleNamespace(program=program, int8=int8, tokenizer=encoder.tokenizer, calib=calib,
                           sentences=sentences)


def test_sentences_are_lines_cut_after_full_stops_each_kept_once():
    assert ex.split_sentences("Ad sales up\n\nProfits jumped 76%. Sales rose 2% to $11.1bn.\n") == [
        "Ad sales up", "Profits jumped 76%.", "Sales rose 2% to $11.1bn."]
    sentences = ex.corpus_sentences(BBCNews("all"))
    assert len(sentences) == len(set(sentences)) == 38226
    assert sentences[:2] == ["Ad sales boost Time Warner profit",
                             "Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn (£600m) for the "
                             "three months to December, from $639m year-earlier."]


def test_calibration_sentences_come_from_the_train_split():
    calib, calib_set = ex.calibration_split(seed=0, size=64)
    train = set(ex.corpus_sentences(BBCNews("train")))
    assert len(calib) == len(calib_set) == 64 and calib_set <= train
    assert ex.calibration_split(seed=0, size=64)[0] == calib


def test_int8_embeddings_keep_cosine_above_0_99(minilm):
    fp32 = ex.embed(minilm.program, minilm.tokenizer, minilm.sentences, max_length=32)
    cos = ex.cosines(fp32, ex.embed(minilm.int8, minilm.tokenizer, minilm.sentences, max_length=32))
    assert fp32.shape == (96, 384)
    assert cos.mean() >= 0.99 and cos.min() >= 0.97
    # the same sentences in one batch, padded differently, give the same vectors
    np.testing.assert_allclose(ex.embed(minilm.program, minilm.tokenizer, minilm.sentences, batch_size=96,
                                        max_length=32), fp32, atol=2e-5)


@pytest.mark.parametrize("act_symmetric, algo, reaches_0_99", [(True, "hist", False), (False, "min_max", True)])
def test_every_linear_in_int8_needs_asymmetric_activations(minilm, act_symmetric, algo, reaches_0_99):
    every_linear = ex.quantize_sentence_program(minilm.program, minilm.tokenizer, minilm.calib, max_length=32,
                                                skip="", algo=algo, act_symmetric=act_symmetric)
    assert sum(op.type == "quantized_linear" for op in every_linear.walk()) == LAYERS * LINEARS_PER_LAYER
    fp32 = ex.embed(minilm.program, minilm.tokenizer, minilm.sentences, max_length=32)
    cos = ex.cosines(fp32, ex.embed(every_linear, minilm.tokenizer, minilm.sentences, max_length=32))
    assert (cos.mean() >= 0.99) == reaches_0_99


def test_every_linear_but_the_feed_forward_down_projections_runs_int8(minilm):
    quantized = [op for op in minilm.int8.walk() if op.type == "quantized_linear"]
    float_weights = [op.operands[1].producer.attrs["name"] for op in minilm.int8.walk() if op.type == "linear"]
    assert len(quantized) == LAYERS * (LINEARS_PER_LAYER - 1)
    assert float_weights == [f"bert.encoder.layers.{i}.linear2.weight" for i in range(LAYERS)]
    assert all(op.operands[1].type.dtype == "int8" for op in quantized)
    assert not any(op.type == "quantized_matmul" for op in minilm.int8.walk())  # attention is one fused op


def test_saved_int8_weights_take_a_quarter_of_the_space(minilm, tmp_path):
    pj.save(minilm.program, tmp_path / "fp32")
    pj.save(minilm.int8, tmp_path / "int8")
    fp32_tensors = read_weights(tmp_path / "fp32.safetensors")
    int8_tensors = read_weights(tmp_path / "int8.safetensors")
    quantized = {name.removesuffix(".int8"): t for name, t in int8_tensors.items() if name.endswith(".int8")}
    assert len(quantized) == LAYERS * (LINEARS_PER_LAYER - 1)
    assert all(t.dtype == np.int8 and fp32_tensors[name].nbytes == 4 * t.nbytes for name, t in quantized.items())
    assert not any(name in int8_tensors for name in quantized)  # the float copies are gone
    saved = sum(fp32_tensors[name].nbytes - t.nbytes for name, t in quantized.items())
    shrink = (tmp_path / "fp32.safetensors").stat().st_size - (tmp_path / "int8.safetensors").stat().st_size
    assert saved * 0.99 <= shrink <= saved  # what is added back: the scales
    reloaded = pj.load(tmp_path / "int8")
    _, ids = next(ex.sentence_batches(minilm.tokenizer, minilm.sentences[:8], 8, max_length=32))
    np.testing.assert_array_equal(np.asarray(reloaded(ids)), np.asarray(minilm.int8(ids)))
