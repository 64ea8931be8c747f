"""pj.hub.Module: a module directory, verified, with its processor and task methods."""
import base64
import json

import numpy as np
import pytest

from paddlejax.hub import store
from paddlejax.hub.errors import HubError, ModuleFormatError, ModuleNotFound, RequestError
from paddlejax.hub.module import Module
from paddlejax.hub.serving import Limits

from tiny_modules import WORDS, png, text_program, write_image_module, write_text_module


def test_text_embedding_matches_the_program_on_padded_batches(text_module):
    module = Module(directory=text_module)
    vectors = module.embedding(["good movie", "the plot was awful", "great"])
    assert vectors.shape == (3, 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)  # postprocess normalize
    ids = np.array([[WORDS.index("good"), WORDS.index("movie"), 0, 0]], np.int32)
    raw = np.asarray(text_program()(ids, np.array([[1, 1, 0, 0]], np.int32)))
    np.testing.assert_allclose(vectors[0], raw[0] / np.linalg.norm(raw[0]), rtol=1e-5)
    assert module.predict("good movie")[0].shape == (4,)


def test_texts_longer_than_max_length_are_truncated_not_refused(text_module):
    module = Module(directory=text_module)
    long = " ".join(["good"] * 50)
    np.testing.assert_allclose(module.embedding([long]), module.embedding(["good"]), rtol=1e-6)
    assert module.predictor.num_compilations == len(module.predictor.buckets) * 2  # length buckets 4 and 8


def test_image_classification_from_arrays_bytes_base64_and_paths(image_module, tmp_path):
    module = Module(directory=image_module)
    pixels = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16
    (tmp_path / "x.png").write_bytes(png(pixels))
    results = module.classification([pixels, png(pixels), base64.b64encode(png(pixels)).decode(),
                                      str(tmp_path / "x.png"), pixels / 255.0])
    assert len({json.dumps(r) for r in results}) == 1, results
    assert results[0]["label"] in ("cat", "dog", "owl") and 0 < results[0]["score"] <= 1
    top = module.classification(pixels, top_k=3)[0]
    assert [r["label"] for r in top] != [] and abs(sum(r["score"] for r in top) - 1) < 1e-3


def test_image_processor_resizes_and_converts_colour(image_module):
    module = Module(directory=image_module)
    rgb = np.zeros((40, 30, 3), np.uint8)
    rgb[..., 0] = 255
    assert module.image([rgb]).shape == (1, 1, 4, 4)
    assert module.classification([rgb])[0]["label"] in ("cat", "dog", "owl")


def test_task_methods_refuse_the_wrong_kind_of_module(text_module, image_module):
    text, image = Module(directory=text_module), Module(directory=image_module)
    with pytest.raises(HubError, match="is a text-embedding module; classification\\(\\) needs an image classifier"):
        text.classification([np.zeros((4, 4))])
    with pytest.raises(HubError, match="is a image-classification module; embedding\\(\\) needs a text-embedding"):
        image.embedding(["x"])
    with pytest.raises(HubError, match="recognize_text\\(\\) needs an OCR module"):
        image.recognize_text([np.zeros((4, 4))])
    with pytest.raises(HubError, match="takes images, not texts"):
        image._texts(["x"], "predict")


def test_a_changed_file_is_refused_on_load(text_module):
    (text_module / "model.safetensors").write_bytes(b"\0" * 10)
    with pytest.raises(ModuleFormatError, match="model.safetensors does not match its sha256"):
        Module(directory=text_module)


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "extra.py").write_text("print('hi')"), "extra.py is not listed in module.json"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json, listed in module.json, is missing"),
    (lambda d: (d / "link").symlink_to("/etc/passwd"), "link is a link; modules hold plain files only"),
    (lambda d: (d / "module.json").write_text("{"), "module.json: not valid JSON"),
    (lambda d: (d / "module.json").write_text("[]"), "not a paddlejax module manifest"),
    (lambda d: _edit(d, format_version=99), "format version 99 is newer than this paddlejax reads"),
    (lambda d: _edit(d, name="../evil"), "module name '../evil' is not lower case"),
    (lambda d: _edit(d, version="one"), "module version 'one' is not a version"),
    (lambda d: _edit(d, task="mind-reading"), "task 'mind-reading' is not one of"),
    (lambda d: _edit(d, surprise=1), r"unknown fields \['surprise'\]"),
    (lambda d: _edit(d, requires="fast"), "'fast' is not a version range"),
    (lambda d: _edit(d, files={"../x": "0" * 64}), "'../x' is not a plain relative path"),
    (lambda d: _edit(d, processor={"text": {"tokenizer": "../../etc/passwd"}}), "must name a file inside the module"),
    (lambda d: _edit(d, processor={"sound": {}}), r"processor keys \['sound'\] are unknown"),
    (lambda d: _edit(d, requires=">=99"), "needs paddlejax >=99"),
])
def test_malformed_or_tampered_modules_are_refused_with_what_is_wrong(text_module, change, message):
    change(text_module)
    with pytest.raises(HubError, match=message):
        if "needs paddlejax" in message:
            store.install_directory(text_module)
        else:
            Module(directory=text_module)


def _edit(directory, **changes):
    """Change module.json's fields and re-list the files' digests, as a forger would."""
    doc = json.loads((directory / "module.json").read_text())
    doc.update(changes)
    (directory / "module.json").write_text(json.dumps(doc))


def test_module_code_runs_only_when_trusted(tmp_path):
    directory = tmp_path / "coded"
    (tmp_path / "hook.py").write_text("def postprocess(module, outputs):\n    return ['hooked'] * len(outputs)\n")
    _coded(directory, tmp_path / "hook.py")
    with pytest.raises(HubError, match="ships Python code \\(hook.py\\).*trust_code=True"):
        Module(directory=directory)
    assert Module(directory=directory, trust_code=True).predict(["good"]) == ["hooked"]


def _coded(directory, hook):
    from paddlejax.hub.writer import write_module
    from tiny_modules import TEXT_PROCESSOR, tokenizer_json

    write_module(directory, programs={"model": text_program()}, name="coded", version="1.0", task="text-embedding",
                 files={"tokenizer.json": tokenizer_json(), "hook.py": hook}, code="hook.py",
                 processor={"text": TEXT_PROCESSOR})


def test_name_and_version_ranges_pick_the_newest_match(tmp_path):
    for version in ("1.0", "1.5", "2.0"):
        write_text_module(tmp_path / version, version=version)
        store.install_directory(tmp_path / version)
    assert Module(name="tiny_text").version == "2.0"
    assert Module(name="tiny_text", version=">=1,<2").version == "1.5"
    assert Module(name="tiny_text==1.0").version == "1.0"
    assert Module(name="tiny_text", version="1.5").version == "1.5"
    with pytest.raises(ModuleNotFound, match="no installed version of tiny_text matches >=3; installed: 1.0, 1.5, 2.0"):
        Module(name="tiny_text", version=">=3", install=False)
    with pytest.raises(HubError, match="give the version in the name or as version=, not both"):
        Module(name="tiny_text==1.0", version="1.5")


def test_parse_request_follows_paddlehub_serving_shapes_and_limits(text_module, image_module):
    text, image = Module(directory=text_module), Module(directory=image_module)
    limits = Limits(max_items=2, max_text_chars=10)
    assert text.parse_request({"texts": ["good", "bad"]}, limits) == ["good", "bad"]
    cases = [({"images": ["x"]}, 'expects a JSON object with "texts"'), ({"texts": "good"}, "must be a list of strings"),
             ({"texts": []}, "is empty"), ({"texts": ["a", "b", "c"]}, "3 texts in one request; the limit is 2"),
             ({"texts": ["good " * 5]}, "text 0 has 25 characters; the limit is 10"), ({"texts": [1]}, "list of strings")]
    for payload, message in cases:
        with pytest.raises(RequestError, match=message):
            text.parse_request(payload, limits)
    ok = base64.b64encode(png(np.zeros((4, 4)))).decode()
    assert len(image.parse_request({"images": [ok]}, limits)) == 1
    for payload, message, status in [({"images": ["!!notbase64"]}, "image 0: an image string is not base64", 400),
                                     ({"images": [base64.b64encode(b"GIF89a").decode()]}, "could not be decoded", 400),
                                     ({"images": ["/etc/hostname"]}, "not base64", 400),
                                     ({"images": [base64.b64encode(png(np.zeros((300, 300)))).decode()]},
                                      "over the limit of 4,096", 413)]:
        with pytest.raises(RequestError, match=message) as e:
            image.parse_request(payload, Limits(max_image_pixels=4096))
        assert e.value.status == status


def test_run_batch_gives_json_results_in_order(text_module, image_module):
    text = Module(directory=text_module)
    results = text.run_batch(["good", "bad", "good movie"])
    assert json.loads(json.dumps(results)) == results and len(results) == 3
    np.testing.assert_allclose(results[0], text.embedding(["good"])[0], rtol=1e-6)
    image = Module(directory=image_module)
    decoded = image.parse_request({"images": [base64.b64encode(png(np.zeros((4, 4)))).decode()]}, Limits())
    assert image.run_batch(decoded)[0]["label"] in ("cat", "dog", "owl")


def test_info_describes_the_module(image_module):
    info = Module(directory=image_module).info()
    assert info["name"] == "tiny_cnn" and info["labels"] == ["cat", "dog", "owl"]
    assert info["task"] == "image-classification"


def test_a_missing_module_names_how_to_get_it():
    with pytest.raises(ModuleNotFound, match="module tiny_text is not installed"):
        Module(name="tiny_text", install=False)
    with pytest.raises(HubError, match="give a name .* or a directory"):
        Module()


@pytest.mark.parametrize("fields, message", [
    ({"predictor": {"max_batch_size": 10 ** 9}}, r"batch sizes and lengths must be ints in 1\.\.65536"),
    ({"processor": {"text": {"tokenizer": "tokenizer.json", "max_length": 10 ** 9,
                             "inputs": ["input_ids", "attention_mask"]}}}, "must be ints in"),
    ({"predictor": {"warp": 9}}, r"predictor keys \['warp'\] are unknown"),
    ({"processor": {"text": {"tokenizer": "tokenizer.json", "inputs": ["input_ids"]}}},
     r"the processor gives 1 input\(s\) \(input_ids\) but the program takes 2"),
])
def test_a_module_that_does_not_fit_its_program_is_refused_before_compiling(tmp_path, fields, message):
    doc_dir = tmp_path / "m"
    write_text_module(doc_dir)
    _edit(doc_dir, **fields)
    with pytest.raises(ModuleFormatError, match=message):
        Module(directory=doc_dir).predictor


def test_labels_must_match_the_classifier_outputs(tmp_path):
    write_image_module(tmp_path / "m", labels=("cat", "dog", "owl"))
    _edit(tmp_path / "m", processor={"image": {"size": [4, 4], "mode": "L"}, "labels": ["cat", "dog"],
                                     "postprocess": {"kind": "classification"}})
    with pytest.raises(ModuleFormatError, match=r"2 labels but the program's output is f32\[b,3\]"):
        Module(directory=tmp_path / "m").classification(np.zeros((4, 4)))
