"""BERT inference in plain numpy (float64), written from the definition of BERT and
Hugging Face's checkpoint layout, sharing no code with paddlejax: the yardstick for
paddlejax.models.bert.

    embeddings = LayerNorm(word[ids] + position[0..L-1] + token_type[types])
    each layer:  x = LayerNorm(x + Attention(x) W_o + b_o)
                 x = LayerNorm(x + act(x W_i + b_i) W_out + b_out)
    Attention:   per head softmax(q k^T / sqrt(d) + (1 - mask) * -10000) v
    sentence:    mean of the outputs over the mask, divided by its L2 norm

Weights come from a Hugging Face ``model.safetensors`` (Linear weights stored [out, in]).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

_erf = np.vectorize(math.erf)

ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0.0),
}


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class ReferenceBert:
    """A Hugging Face BERT directory (``config.json`` + ``model.safetensors``) in numpy."""

    def __init__(self, directory):
        directory = Path(directory)
        self.config = json.loads((directory / "config.json").read_text())
        tensors = load_file(str(directory / "model.safetensors"))
        self.w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in tensors.items()}

    def dense(self, x, name):
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def norm(self, x, name):
        return layer_norm(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.config["layer_norm_eps"])

    def attention(self, x, mask, prefix):
        batch, seq, hidden = x.shape
        heads = self.config["num_attention_heads"]
        d = hidden // heads

        def split(t):  # [batch, heads, seq, d]
            return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

        q, k, v = (split(self.dense(x, f"{prefix}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + (1.0 - mask[:, None, None, :]) * -10000.0
        context = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        return self.dense(context, f"{prefix}.attention.output.dense")

    def __call__(self, input_ids, attention_mask, token_type_ids=None):
        """The last hidden states ``[batch, seq, hidden]``."""
        input_ids = np.asarray(input_ids)
        mask = np.asarray(attention_mask, np.float64)
        types = np.zeros_like(input_ids) if token_type_ids is None else np.asarray(token_type_ids)
        seq = input_ids.shape[1]
        x = (self.w["embeddings.word_embeddings.weight"][input_ids]
             + self.w["embeddings.position_embeddings.weight"][np.arange(seq)][None]
             + self.w["embeddings.token_type_embeddings.weight"][types])
        x = self.norm(x, "embeddings.LayerNorm")
        act = ACTIVATIONS[self.config.get("hidden_act", "gelu")]
        for i in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            x = self.norm(x + self.attention(x, mask, p), f"{p}.attention.output.LayerNorm")
            inner = act(self.dense(x, f"{p}.intermediate.dense"))
            x = self.norm(x + self.dense(inner, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        return x

    def pooled(self, hidden):
        """The pooler: tanh(dense(first token))."""
        return np.tanh(self.dense(hidden[:, 0], "pooler.dense"))

    def sentence_embeddings(self, input_ids, attention_mask):
        """Mean pooling over the mask, then L2 normalisation (sentence-transformers)."""
        hidden = self(input_ids, attention_mask)
        mask = np.asarray(attention_mask, np.float64)[..., None]
        mean = (hidden * mask).sum(1) / mask.sum(1)
        return mean / np.linalg.norm(mean, axis=-1, keepdims=True)


def write_random_checkpoint(directory, config: dict, seed: int = 0, prefix: str = "", extra=()) -> Path:
    """A Hugging Face BERT directory with random weights of ``config`` (names, shapes and
    the ``position_ids`` buffer as Hugging Face saves them); ``prefix`` is e.g. ``"bert."``;
    ``extra`` adds ``(name, shape)`` tensors."""
    rng = np.random.default_rng(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    shapes = {
        "embeddings.word_embeddings.weight": (config["vocab_size"], h),
        "embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
        "pooler.dense.weight": (h, h), "pooler.dense.bias": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes.update({f"{p}.{name}.weight": (h, h), f"{p}.{name}.bias": (h,)})
        shapes.update({f"{p}.intermediate.dense.weight": (inter, h), f"{p}.intermediate.dense.bias": (inter,),
                       f"{p}.output.dense.weight": (h, inter), f"{p}.output.dense.bias": (h,)})
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes.update({f"{p}.{name}.weight": (h,), f"{p}.{name}.bias": (h,)})
    tensors = {prefix + k: rng.normal(0, 0.2, s).astype(np.float32) for k, s in shapes.items()}
    for name, value in tensors.items():
        if "LayerNorm.weight" in name:
            value += 1.0
    tensors[prefix + "embeddings.position_ids"] = np.arange(config["max_position_embeddings"])[None]
    tensors.update({name: rng.normal(0, 0.2, s).astype(np.float32) for name, s in extra})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "bert", "architectures": ["BertModel"]}))
    return directory
