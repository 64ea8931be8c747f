"""Fine-tuning a module PaddleHub's way: Module(task=..., num_classes=...) + hub.Trainer."""
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax.hub import store
from paddlejax.hub.errors import HubError
from paddlejax.hub.finetune import Trainer
from paddlejax.hub.module import Module

POSITIVE = ["good movie", "great plot", "a good plot", "the great movie", "good", "great"]
NEGATIVE = ["bad movie", "awful plot", "a bad plot", "the awful movie", "bad", "awful"]


def sentiment():
    texts = POSITIVE + NEGATIVE
    return texts, np.array([1] * len(POSITIVE) + [0] * len(NEGATIVE))


def test_text_classifier_fine_tunes_and_saves_installable_modules(text_module, tmp_path):
    pj.nn.seed(0)
    model = Module(directory=text_module, task="seq-cls", label_list=["negative", "positive"])
    trainer = Trainer(model, optax.adam(3e-2), checkpoint_dir=tmp_path / "ckpt", progress=False)
    trainer.train(sentiment(), epochs=6, batch_size=4, eval_dataset=sentiment(), save_interval=3)
    assert trainer.evaluate(sentiment())["acc"] == 1.0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["best_model", "epoch_3", "epoch_6"]
    best = Module(directory=tmp_path / "ckpt" / "best_model")
    assert best.task == "text-classification" and best.labels == ["negative", "positive"]
    assert [r["label"] for r in best.predict(["great movie", "awful plot"])] == ["positive", "negative"]
    # the saved program takes any sequence length, and installs like any module
    assert best.program.inputs[0].type.shape == ("b", "seq")
    assert store.install_directory(tmp_path / "ckpt" / "best_model").name == "tiny_text_text_classification"


def test_the_backbone_weights_train_too(text_module, tmp_path):
    model = Module(directory=text_module, task="seq-cls", num_classes=2)
    before = np.asarray(model.model.backbone.params["table"][...]).copy()
    Trainer(model, optax.adam(1e-2), checkpoint_dir=tmp_path / "c", progress=False).train(sentiment(), epochs=1,
                                                                                        batch_size=4)
    after = np.asarray(model.model.backbone.params["table"][...])
    assert not np.allclose(before, after)


def test_image_classifier_fine_tunes_on_its_features(image_module, tmp_path):
    rng = np.random.default_rng(0)
    bright = [rng.integers(180, 255, (4, 4)).astype(np.uint8) for _ in range(8)]
    dark = [rng.integers(0, 60, (4, 4)).astype(np.uint8) for _ in range(8)]
    data = (bright + dark, np.array([1] * 8 + [0] * 8))
    pj.nn.seed(0)
    model = Module(directory=image_module, task="img-cls", label_list=["dark", "bright"])
    trainer = Trainer(model, optax.adam(3e-2), checkpoint_dir=tmp_path / "ckpt", progress=False)
    trainer.train(data, epochs=8, batch_size=8, eval_dataset=data)
    best = Module(directory=tmp_path / "ckpt" / "best_model")
    assert [r["label"] for r in best.classification([bright[0], dark[0]])] == ["bright", "dark"]


def test_multi_label_heads_train_with_sigmoid_and_threshold(text_module, tmp_path):
    texts = ["good movie", "great plot", "bad movie", "awful plot", "good plot", "bad plot"]
    labels = np.array([[1, 1, 0], [1, 0, 1], [0, 1, 0], [0, 0, 1], [1, 0, 1], [0, 0, 1]])  # positive, movie, plot
    pj.nn.seed(0)
    model = Module(directory=text_module, task="seq-multilabel", label_list=["positive", "movie", "plot"])
    trainer = Trainer(model, optax.adam(5e-2), checkpoint_dir=tmp_path / "ckpt", progress=False)
    trainer.train((texts, labels), epochs=30, batch_size=6, eval_dataset=(texts, labels), save_interval=30)
    best = Module(directory=tmp_path / "ckpt" / "best_model")
    assert best.postprocess["activation"] == "sigmoid"
    assert [sorted(r["label"] for r in found) for found in best.predict(["good movie", "awful plot"])] == \
        [["movie", "positive"], ["plot"]]


@pytest.mark.parametrize("kwargs, message", [
    ({"task": "seq-cls"}, "needs num_classes >= 2 or a label_list"),
    ({"task": "seq-cls", "num_classes": 3, "label_list": ["a", "b"]}, "num_classes=3 but label_list has 2"),
    ({"task": "img-cls", "num_classes": 2}, "is a text-embedding module; task 'img-cls' needs an image module"),
    ({"task": "translate", "num_classes": 2}, "not a fine-tuning task"),
    ({"num_classes": 2}, "go with a fine-tuning task="),
])
def test_bad_fine_tuning_requests_are_explained(text_module, kwargs, message):
    with pytest.raises(HubError, match=message):
        Module(directory=text_module, **kwargs)


def test_trainer_checks_its_data(text_module, tmp_path):
    trainer = Trainer(Module(directory=text_module, task="seq-cls", num_classes=2), checkpoint_dir=tmp_path,
                      progress=False)
    with pytest.raises(HubError, match=r"labels must be class numbers in \[0, 2\)"):
        trainer.train((["good"], np.array([5])))
    with pytest.raises(HubError, match="takes texts"):
        trainer.train(([np.zeros((4, 4))], np.array([0])))
    with pytest.raises(HubError, match="give a module made for fine-tuning"):
        Trainer(Module(directory=text_module))
