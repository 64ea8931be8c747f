"""The built-in modules: real, offline, built from shipped data and weights."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.hub import builtin, store
from paddlejax.hub.errors import HubError


@pytest.mark.slow
def test_digits_cnn_builds_on_first_use_and_classifies_held_out_digits():
    module = pj.hub.Module(name="digits_cnn", progress=False)  # not installed: built and installed
    assert [m.label for m in store.installed()] == ["digits_cnn 1.0.0"]
    test = pj.data.Digits("test")
    images = [np.round(x[0] * 255).astype(np.uint8) for x in test.images]  # as 8-bit grey images
    predicted = [int(r["label"]) for r in module.classification(images)]
    accuracy = np.mean(np.array(predicted) == test.labels)
    assert accuracy >= 0.97, accuracy
    assert f"held-out accuracy {accuracy:.2%}" in module.manifest.summary


@pytest.mark.slow
def test_all_minilm_l6_v2_gives_the_zoo_encoders_vectors():
    from paddlejax.models.minilm import all_minilm_l6_v2

    module = pj.hub.Module(name="all_minilm_l6_v2", progress=False)
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue.", "word " * 400]
    vectors = module.embedding(texts)
    np.testing.assert_allclose(vectors, all_minilm_l6_v2().encode(texts, progress=False), atol=2e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


# The minilm_bbc_news recipe is built, installed and served at tiny settings by the benchmark's
# smoke run (tests/test_benchmarks.py::test_hub_finetune_quick); its full build's accuracy is in
# benchmarks/hub_finetune.py.


def test_unknown_recipes_list_the_built_in_ones(tmp_path):
    with pytest.raises(HubError, match="no built-in module nope; the built-in modules are all_minilm_l6_v2, "
                                       "digits_cnn, fer_emotion, minilm_bbc_news, ppocr_v4"):
        builtin.build("nope", tmp_path / "x")
