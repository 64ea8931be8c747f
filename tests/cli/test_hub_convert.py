"""paddlejax hub convert: modules from a user's own ONNX and Keras models, with the task's
processor inferred from the model; each installs, loads and runs like any module, and a
model that does not fit its task is refused before anything is left behind."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main

FIXTURES = pathlib.Path(__file__).parents[1] / "convert" / "fixtures"
CNN = FIXTURES / "torch_rescnn.onnx"  # x [batch, 3, 16, 16] -> softmax probs [batch, 4]


def _package(name: str) -> pathlib.Path:
    return pathlib.Path(importlib.util.find_spec(name).submodule_search_locations[0])


def hub(capsys, *args) -> tuple[int, str, str]:
    code = main(["hub", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def rendered_line() -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (448, 96), 255)
    ImageDraw.Draw(image).text((16, 24), "Hello paddlejax 2026", fill=0, font=ImageFont.load_default(size=36))
    return np.asarray(image)


def test_an_onnx_classifier_converts_installs_and_runs(tmp_path, capsys):
    from PIL import Image

    (tmp_path / "labels.txt").write_text("circle\nsquare\ntriangle\nstar\n")
    code, out, _ = hub(capsys, "convert", CNN, "--task", "image-classification", "--labels", tmp_path / "labels.txt",
                       "-o", tmp_path / "shapes")
    assert code == 0 and out.startswith("wrote torch_rescnn 1.0.0 (image-classification)")
    spec = json.loads((tmp_path / "shapes" / "module.json").read_text())["processor"]
    assert spec["image"] == {"size": [16, 16], "mode": "RGB", "layout": "NCHW", "scale": 1 / 255}
    assert spec["postprocess"] == {"kind": "classification", "activation": "none"}  # the model ends in a softmax
    assert hub(capsys, "install", tmp_path / "shapes")[1] == "installed torch_rescnn 1.0.0 (image-classification)\n"
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "x.png")
    [result] = json.loads(hub(capsys, "run", "torch_rescnn", "--input", tmp_path / "x.png")[1])
    probs = np.asarray(pj.convert.from_onnx(CNN)(pixels.transpose(2, 0, 1)[None].astype(np.float32) / 255))[0]
    assert result == {"label": ["circle", "square", "triangle", "star"][int(probs.argmax())],
                      "score": round(float(probs.max()), 4)}


@pytest.mark.parametrize("args, message", [
    ([CNN, "--task", "image-classification", "--labels", "a,b,c"], "3 labels but the program's output is f32[b,4]"),
    ([CNN, "--task", "image-classification", "--input-shape", "x=1,3,16"], "has 3 dims, the model's input has 4"),
    ([CNN, "--task", "image-classification", "--input-shape", "x=1,3,a,b"], "each size must be an integer >= 1 or ?, got 'a'"),
    ([CNN, "--task", "image-classification", "--input-shape", "x=1,3,16,16", "--input-shape", "x=1,3,8,8"],
     "--input-shape 'x=1,3,8,8': each input given once"),
    ([CNN, "--task", "image-classification", "--input-shape", "=1,3,16,16"], "expects [NAME=]DIMS such as"),
    ([CNN, "--task", "text-recognition"], "needs --dictionary FILE"),
    ([CNN, "--task", "text-detection"], "det.limit_side_len: must be an int in 32..8192, got 16"),
    ([FIXTURES / "torch_encoder.onnx", "--task", "image-classification"], "takes one batch of images"),
    ([FIXTURES / "torch_encoder.onnx", "--task", "text-classification"], "needs --tokenizer"),
    ([CNN, "--task", "detection"], "--task must be one of"),
])
def test_models_that_do_not_fit_the_task_are_refused_leaving_nothing(tmp_path, capsys, args, message):
    code, out, err = hub(capsys, "convert", *args, "-o", tmp_path / "m")
    assert code == 2 and err.startswith("paddlejax hub: error: ") and err.count("\n") == 1, out + err
    assert message in err, err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_keras_h5_converts_with_grey_nhwc_from_its_input(tmp_path, capsys):
    from skimage import data

    h5 = _package("fer") / "data" / "emotion_model.hdf5"
    emotions = "angry,disgust,fear,happy,sad,surprise,neutral"
    assert hub(capsys, "convert", h5, "--task", "image-classification", "--name", "my_fer", "--labels", emotions,
               "--scale", 2 / 255, "--mean", 1, "-o", tmp_path / "fer")[0] == 0
    module = pj.hub.Module(directory=tmp_path / "fer")
    assert module.image.mode == "L" and module.image.layout == "NHWC" and module.image.size == (64, 64)
    assert module.postprocess["activation"] == "none"
    assert module.classification(data.astronaut()[30:230, 140:320])[0]["label"] == "happy"


@pytest.mark.slow
def test_paddleocr_models_convert_to_one_stage_ocr_modules(tmp_path, capsys):
    models = _package("rapidocr_onnxruntime") / "models"
    code, out, _ = hub(capsys, "convert", models / "ch_PP-OCRv4_rec_infer.onnx", "--task", "text-recognition",
                       "--name", "my_rec", "--input-shape", "?,3,48,320", "-o", tmp_path / "rec")
    assert code == 0 and out.startswith("wrote my_rec 1.0.0 (ocr)") and "dictionary.txt" in out
    line = rendered_line()
    rec = pj.hub.Module(directory=tmp_path / "rec")  # the dictionary came from the model's metadata
    [[result]] = rec.recognize_text(line[20:80, 5:375])
    assert result["text"] == "Hello paddlejax 2026" and result["box"] == [[0, 0], [370, 0], [370, 60], [0, 60]]
    assert hub(capsys, "convert", models / "ch_PP-OCRv4_det_infer.onnx", "--task", "text-detection", "--name",
               "my_det", "--input-shape", "x=1,3,96,448", "-o", tmp_path / "det")[0] == 0
    assert hub(capsys, "install", tmp_path / "det")[0] == 0
    [[found]] = pj.hub.Module(name="my_det").recognize_text(line)
    box = np.array(found["box"])
    rows, cols = np.nonzero(line < 128)  # the ink
    assert set(found) == {"box", "score"} and found["score"] > 0.7
    assert box[:, 0].min() <= cols.min() and box[:, 0].max() >= cols.max()
    assert box[:, 1].min() <= rows.min() and box[:, 1].max() >= rows.max()


def test_a_paddle_classifier_converts_and_runs(tmp_path, capsys):
    """A Paddle inference model (.pdmodel + .pdiparams) becomes a module as an ONNX file does."""
    (tmp_path / "labels.txt").write_text("\n".join(f"class {i}" for i in range(10)) + "\n")
    model = FIXTURES / "paddle_resnet_legacy.pdmodel"
    code, out, _ = hub(capsys, "convert", model, "--task", "image-classification", "--labels", tmp_path / "labels.txt",
                       "--name", "paddle_resnet", "-o", tmp_path / "resnet")
    assert code == 0 and out.startswith("wrote paddle_resnet 1.0.0 (image-classification)")
    spec = json.loads((tmp_path / "resnet" / "module.json").read_text())["processor"]
    assert spec["image"]["size"] == [32, 32] and spec["image"]["layout"] == "NCHW"
    module = pj.hub.Module(directory=tmp_path / "resnet")
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    [result] = module.classification([pixels])
    probs = np.asarray(pj.convert.from_paddle(model)(pixels.transpose(2, 0, 1)[None].astype(np.float32) / 255))[0]
    assert result["label"] == f"class {probs.argmax()}" and abs(result["score"] - probs.max()) < 1e-5
