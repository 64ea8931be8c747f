"""Wide & Deep and DeepFM: they learn click-through on generated Criteo-shaped logs (held-out AUC
well above chance), trace to programs that save and load, and refuse wrongly shaped inputs."""
from __future__ import annotations

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.data import SyntheticCriteo
from paddlejax.optimizer import lazy_adam
from paddlejax.train.metrics import Auc


@pytest.fixture(scope="module")
def data():
    return SyntheticCriteo(20_000, max_cardinality=5000).arrays(), SyntheticCriteo(5000, split="test",
                                                                                     max_cardinality=5000).arrays()


@pytest.mark.parametrize("name", ["DeepFM", "WideDeep"])
def test_ctr_models_learn_clicks_they_were_not_shown(data, name):
    train, test = data
    pj.nn.seed(0)
    model = getattr(pj.models, name)(sparse_feature_number=8192, sparse_feature_dim=8, layer_sizes=(32, 16))
    trainer = pj.Trainer(model, lazy_adam(0.003), loss="bce_with_logits", metrics=[Auc(from_logits=True)],
                         progress=False)
    before = trainer.evaluate(test, batch_size=1000)["auc"]
    trainer.fit(train, epochs=2, batch_size=500)
    result = trainer.evaluate(test, batch_size=1000)
    assert 0.4 < before < 0.6 and result["auc"] > 0.75 and result["loss"] < 0.52


def test_a_traced_model_saves_loads_and_predicts_the_same(tmp_path):
    pj.nn.seed(0)
    model = pj.models.DeepFM(sparse_feature_number=1024, sparse_feature_dim=4, layer_sizes=(8,))
    dense, sparse, _ = SyntheticCriteo(32, split="test").arrays()
    program = pj.to_static(model, pj.InputSpec((None, 13)), pj.InputSpec((None, 26), "int32"))
    pj.save(program, tmp_path / "deepfm")
    loaded = pj.load(tmp_path / "deepfm")
    np.testing.assert_allclose(np.asarray(loaded(dense, sparse)), np.asarray(model(dense, sparse)), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("dense_width, fields", [(12, 26), (13, 25)])
def test_wrong_feature_counts_are_refused(dense_width, fields):
    model = pj.models.WideDeep(sparse_feature_number=64, sparse_feature_dim=2, layer_sizes=(4,))
    with pytest.raises(ValueError, match=r"WideDeep: expects dense \[batch, 13\] and sparse \[batch, 26\]"):
        model(np.zeros((2, dense_width), np.float32), np.zeros((2, fields), np.int32))
