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
