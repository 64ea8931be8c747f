"""Tiny real modules for the hub's tests (imported as ``tiny_modules``; ``conftest.py`` registers it): a text-embedding module (a word-level tokenizer and a
masked mean of an embedding table), a text classifier, and an image classifier (a convolution
and a linear layer), each a saved program with its declarative processor."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

import paddlejax as pj
from paddlejax.hub.writer import write_module

WORDS = ["[PAD]", "[UNK]", "good", "bad", "movie", "plot", "great", "awful", "the", "a"]


def tokenizer_json() -> str:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str()


def _embed(p, input_ids, attention_mask):
    mask = attention_mask.astype(jnp.float32)
    rows = p["table"][input_ids] * mask[..., None]
    return rows.sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1.0)


def text_program(dim: int = 4, seed: int = 0):
    table = np.random.default_rng(seed).standard_normal((len(WORDS), dim)).astype(np.float32)
    specs = [pj.InputSpec((None, "seq"), "int32", name="input_ids"),
             pj.InputSpec((None, "seq"), "int32", name="attention_mask")]
    return pj.trace(_embed, *specs, params={"table": jnp.asarray(table)}, name="tiny_text")


TEXT_PROCESSOR = {"tokenizer": "tokenizer.json", "max_length": 8, "inputs": ["input_ids", "attention_mask"]}


def write_text_module(directory, name="tiny_text", version="1.0.0", task="text-embedding", **fields):
    post = {"kind": "embedding", "normalize": True} if task == "text-embedding" else {"kind": "classification"}
    processor = {"text": TEXT_PROCESSOR, "postprocess": post, **fields.pop("processor", {})}
    return write_module(directory, programs={"model": text_program(**fields.pop("program", {}))},
                        files={"tokenizer.json": tokenizer_json()}, name=name, version=version, task=task,
                        summary=fields.pop("summary", "A tiny text module for tests"), processor=processor,
                        predictor={"max_batch_size": 4, "length_buckets": [4, 8]}, **fields)


def image_program(classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w": jnp.asarray(rng.standard_normal((2, 1, 3, 3)).astype(np.float32)),
              "fc": jnp.asarray(rng.standard_normal((2 * 4 * 4, classes)).astype(np.float32))}

    def net(p, image):
        h = pj.ops.relu(pj.ops.conv2d(image, p["w"], padding=1))
        return h.reshape(h.shape[0], -1) @ p["fc"]

    return pj.trace(net, pj.InputSpec((None, 1, 4, 4), "float32", name="image"), params=params, name="tiny_cnn")


def write_image_module(directory, name="tiny_cnn", version="1.0.0", labels=("cat", "dog", "owl"), **fields):
    return write_module(directory, programs={"model": image_program(len(labels))}, name=name, version=version,
                        task="image-classification", summary="A tiny image classifier for tests",
                        processor={"image": {"size": [4, 4], "mode": "L", "scale": 1 / 255},
                                   "labels": list(labels), "postprocess": {"kind": "classification"}},
                        predictor={"max_batch_size": 4}, **fields)


def png(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


OCR_CHARACTERS = ["a", "b"]  # with the blank first and a space last: 4 classes


def ocr_programs(det_size=(32, 64), rec_size=(8, 32)):
    """A tiny detector (dark pixels are text) and recogniser (dark quarters of a line read
    'a', others nothing: the padding too) over PP-OCR's normalised BGR batches ``[b, 3, H, W]``."""
    import jax

    def det(x):
        return jax.nn.sigmoid(-6.0 * x.mean(axis=1, keepdims=True) - 2.0)

    def rec(x):
        dark = (1.0 - x.mean(axis=(1, 2))) / 2  # [b, W]: 1 where black
        steps = dark.reshape(dark.shape[0], 4, -1).mean(-1)  # [b, 4]
        logits = jnp.stack([8 * (0.75 - steps), 8 * (steps - 0.75), jnp.full_like(steps, -8.0),
                            jnp.full_like(steps, -8.0)], axis=-1)
        return jax.nn.softmax(logits, axis=-1)

    return (pj.trace(det, pj.InputSpec((None, 3, *det_size), "float32", name="x"), name="tiny_det"),
            pj.trace(rec, pj.InputSpec((None, 3, *rec_size), "float32", name="x"), name="tiny_rec"))


def write_ocr_module(directory, name="tiny_ocr", characters=OCR_CHARACTERS, programs=None, **postprocess):
    """A tiny OCR module: detector on a 32x64 canvas (long side brought to 64), recogniser of
    8x32 lines, no direction classifier; ``programs`` (det, rec) and ``postprocess`` replace
    its programs and sections of its spec."""
    det, rec = programs or ocr_programs()
    spec = {"kind": "ocr",
            "det": {"kind": "db_text_boxes", "programs": ["det"], "limit_type": "max", "limit_side_len": 64,
                    "unclip_ratio": 0.2},
            "rec": {"kind": "ctc_decode", "programs": ["rec"], "dictionary": "chars.txt", "score_threshold": 0.5},
            **postprocess}
    return write_module(directory, programs={"det": det, "rec": rec}, files={"chars.txt": "\n".join(characters) + "\n"},
                        name=name, version="1.0.0", task="ocr", summary="A tiny OCR module for tests",
                        processor={"image": {"mode": "BGR", "mean": [0.5] * 3, "std": [0.5] * 3},
                                   "postprocess": spec}, predictor={"max_batch_size": 4})
