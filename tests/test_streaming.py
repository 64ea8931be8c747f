"""Streaming inference: a model run segment by segment with its parameters in host memory gives
the program's outputs while the device holds at most two segments' parameters at once."""
from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.models.bert import BertConfig, BertForSequenceClassification


@pytest.fixture(scope="module")
def bert():
    pj.nn.seed(0)
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 16), "int32"))


def total_bytes(program) -> int:
    return sum(int(v.nbytes) for v in program.params.values())


def test_a_model_three_times_the_budget_streams_to_the_programs_outputs(bert):
    budget = total_bytes(bert) / 3
    streaming = pj.StreamingPredictor(bert, device_budget_mb=budget / 2**20)
    ids = np.random.default_rng(0).integers(1, 128, (3, 16)).astype(np.int32)
    np.testing.assert_allclose(streaming(ids), np.asarray(bert(ids)), rtol=1e-5, atol=1e-6)
    assert streaming.num_segments >= 6  # neighbours in pairs under a third of the model
    assert streaming.peak_param_bytes <= budget < total_bytes(bert)
    assert sum(streaming.segment_bytes) >= total_bytes(bert)  # every parameter is in some segment
    kinds = {v.sharding.memory_kind for p in streaming.host_params for v in p.values()}
    assert kinds == {"pinned_host"}  # between calls nothing stays on the device


def test_a_given_number_of_segments_splits_by_parameter_bytes(bert):
    streaming = pj.StreamingPredictor(bert, segments=3)
    assert streaming.num_segments == 3
    # balanced by bytes: no segment holds more than half the model
    assert max(streaming.segment_bytes) < total_bytes(bert) / 2
    ids = np.ones((2, 16), np.int32)
    np.testing.assert_allclose(streaming(ids), np.asarray(bert(ids)), rtol=1e-5, atol=1e-6)


def test_a_saved_program_streams_from_its_path(bert, tmp_path):
    pj.save(bert, tmp_path / "bert")
    ids = np.ones((1, 16), np.int32)
    np.testing.assert_allclose(pj.StreamingPredictor(tmp_path / "bert", segments=2)(ids), np.asarray(bert(ids)),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give segments or device_budget_mb"),
    ({"segments": 2, "device_budget_mb": 1.0}, "give segments or device_budget_mb"),
    ({"segments": 0}, "segments expects an int >= 1"),
    ({"device_budget_mb": -1}, "device_budget_mb expects a number > 0"),
    ({"device_budget_mb": 0.01}, r"one op reads 32768 bytes of parameters \('bert.embeddings.word_embeddings.weight'\)"),
])
def test_bad_requests_are_refused_by_name(bert, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pj.StreamingPredictor(bert, **kwargs)


def test_a_backend_without_host_memory_is_named(bert):
    device = types.SimpleNamespace(platform="tpu", addressable_memories=lambda: [types.SimpleNamespace(kind="device")])
    with pytest.raises(ValueError, match="StreamingPredictor: the tpu backend has no pinned_host memory"):
        pj.StreamingPredictor(bert, segments=2, device=device)


def test_split_stages_balances_parameter_bytes():
    from paddlejax.passes.pipeline import split_stages

    params = {"a": jnp.ones((64, 64)), "b": jnp.ones((8, 8)), "c": jnp.ones((8, 8)), "d": jnp.ones((64, 64))}
    prog = pj.trace(lambda p, x: ((x @ p["a"])[:, :8] @ p["b"] @ p["c"]).sum() * (x @ p["d"]), jnp.ones((1, 64)),
                    params=params)
    by_bytes = split_stages(prog, 2, balance="params")
    # the cut that leaves the larger half smallest: a and b | c and d, 16,640 bytes each
    assert [sorted(s.param_names) for s in by_bytes.stages] == [["a", "b"], ["c", "d"]]
    with pytest.raises(ValueError, match="balance expects 'flops' or 'params'"):
        split_stages(prog, 2, balance="memory")
