"""A module's declarative pre- and post-processing: the ``processor`` of its ``module.json``.

Nothing here runs module code: a processor is data, read into one of a few built-in kinds.

- ``text``: ``{"tokenizer": "tokenizer.json", "max_length": 256, "inputs": ["input_ids",
  "token_type_ids", "attention_mask"]}`` — a Hugging Face ``tokenizers`` file (JSON, no code),
  texts truncated to ``max_length`` tokens, padded to the batch's longest; ``inputs`` names
  the arrays, in the program's input order.
- ``image``: ``{"size": [H, W], "mode": "L" | "RGB" | "BGR", "resize": "bilinear", "scale": 1/255,
  "mean": [...], "std": [...], "layout": "NCHW" | "NHWC", "dtype": "float32"}`` — pixels
  become ``(pixel * scale - mean) / std``; ``BGR`` is RGB with the channels reversed (models
  trained on OpenCV's images). OCR modules leave ``size`` out: their stages size the images.
- ``labels``: class names (a list, or the name of a text file in the module, one per line).
- ``postprocess``: ``{"kind": "embedding", "normalize": true}``, ``{"kind": "classification",
  "activation": "softmax" | "sigmoid", "top_k": 1, "threshold": 0.5}``, ``{"kind":
  "detection", "score_threshold": 0.5, "iou_threshold": 0.5, "box_format": "xyxy"}``, or for
  OCR ``{"kind": "ocr", "resize": {...}, "det": {...}, "cls": {...}, "rec": {...}}``, whose
  stages are post-processing kinds of their own (:data:`OCR_STAGES`; any may be left out, but
  not both ``det`` and ``rec``):

  - ``resize``: ``{"max_side_len": 2000, "min_side_len": 30, "min_height": 30,
    "width_height_ratio": 8}`` — larger images shrunk and smaller grown first, short or very
    wide ones padded above and below;
  - ``det``: ``{"kind": "db_text_boxes", "programs": [ROLE, ...], "limit_side_len": 736,
    "limit_type": "min" | "max", "threshold": 0.3, "box_threshold": 0.5, "unclip_ratio": 1.6,
    "max_candidates": 1000, "dilation": true, "min_size": 3}`` — the detector's programs, one
    per compiled input size; the image's short (``min``) or long (``max``) side is brought to
    ``limit_side_len`` and the smallest program that holds it runs (padded with zeros);
  - ``cls``: ``{"kind": "text_direction", "program": ROLE, "labels": ["0", "180"],
    "threshold": 0.9, "batch_size": 6}`` — lines the classifier finds upside down (above the
    threshold) are turned;
  - ``rec``: ``{"kind": "ctc_decode", "programs": [ROLE, ...], "dictionary": FILE,
    "use_space_char": true, "blank": 0, "score_threshold": 0.5, "batch_size": 6}`` — the
    recogniser's programs, one per compiled line width; its classes are the dictionary's lines
    (and a space), with the CTC blank inserted at ``blank``; lines scoring under the threshold
    are dropped.

>>> p = ImageProcessor({"size": [2, 2], "mode": "L", "scale": 0.5})
>>> p([np.full((4, 4), 2, np.uint8)]).tolist()
[[[[1.0, 1.0], [1.0, 1.0]]]]
>>> classify(np.array([[0.0, 2.0]]), {"kind": "classification"}, ["cat", "dog"])
[{'label': 'dog', 'score': 0.8808}]
"""
from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from paddlejax.hub.errors import ModuleFormatError, RequestError

RESAMPLING = ("nearest", "bilinear", "bicubic", "area")
POSTPROCESS = {"embedding": {"normalize"}, "classification": {"activation", "top_k", "threshold"},
               "detection": {"score_threshold", "iou_threshold", "box_format"},
               "ocr": {"resize", "det", "cls", "rec"}}
# The stages of OCR post-processing: section -> (its kind, its keys).
OCR_STAGES = {"det": ("db_text_boxes", {"programs", "limit_side_len", "limit_type", "threshold", "box_threshold",
                                        "unclip_ratio", "max_candidates", "dilation", "min_size"}),
              "cls": ("text_direction", {"program", "labels", "threshold", "batch_size"}),
              "rec": ("ctc_decode", {"programs", "dictionary", "use_space_char", "blank", "score_threshold",
                                     "batch_size"})}
OCR_RESIZE = {"max_side_len", "min_side_len", "min_height", "width_height_ratio"}
# Decoding refuses images over this many pixels unless the caller allows more (decompression bombs).
MAX_IMAGE_PIXELS = 4096 * 4096


def _spec_error(where: str, message: str) -> ModuleFormatError:
    return ModuleFormatError(f"processor.{where}: {message}")


def _check_keys(spec, allowed: set, where: str) -> dict:
    if not isinstance(spec, dict):
        raise _spec_error(where, f"must be an object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise _spec_error(where, f"unknown keys {unknown}; known: {sorted(allowed)}")
    return spec


def _module_file(directory: Path | None, name, where: str) -> Path:
    if not isinstance(name, str) or name.startswith("/") or ".." in name.split("/") or directory is None:
        raise _spec_error(where, f"{name!r:.60} must name a file inside the module")
    return directory / name


class TextProcessor:
    """Texts → the int32 arrays a text program takes, from a ``tokenizers`` JSON file.

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hi": 2, "there": 3}, unk_token="[UNK]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> p = TextProcessor({"max_length": 4, "inputs": ["input_ids", "attention_mask"]}, tokenizer=tok)
    >>> {k: v.tolist() for k, v in p(["hi there", "hi"]).items()}
    {'input_ids': [[2, 3], [2, 0]], 'attention_mask': [[1, 1], [1, 0]]}
    """

    KEYS = {"tokenizer", "max_length", "inputs", "pad_token"}
    ARRAYS = ("input_ids", "token_type_ids", "attention_mask")

    def __init__(self, spec: dict, directory: Path | None = None, tokenizer=None):
        from tokenizers import Tokenizer

        spec = _check_keys(spec, self.KEYS, "text")
        self.max_length = spec.get("max_length", 512)
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise _spec_error("text", f"max_length must be a positive int, got {self.max_length!r}")
        self.inputs = list(spec.get("inputs", self.ARRAYS))
        if not self.inputs or any(name not in self.ARRAYS for name in self.inputs):
            raise _spec_error("text", f"inputs must be some of {list(self.ARRAYS)}, got {self.inputs!r:.80}")
        if tokenizer is None:
            path = _module_file(directory, spec.get("tokenizer"), "text.tokenizer")
            try:
                tokenizer = Tokenizer.from_file(os.fspath(path))
            except Exception as e:  # tokenizers raises its own exception types
                raise _spec_error("text.tokenizer", f"cannot read {path.name}: {e}") from None
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        pad = spec.get("pad_token", "[PAD]")
        self.pad_id = self.tokenizer.token_to_id(pad) if isinstance(pad, str) else None
        if self.pad_id is None:
            raise _spec_error("text.pad_token", f"{pad!r:.40} is not in the tokenizer's vocabulary")

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``{input name: int32 [len(texts), longest]}``, padded with the pad token."""
        encodings = self.tokenizer.encode_batch(list(texts))
        length = max(1, max(len(e.ids) for e in encodings))
        out = {name: np.zeros((len(encodings), length), np.int32) for name in self.inputs}
        if "input_ids" in out:
            out["input_ids"][:] = self.pad_id
        for row, e in enumerate(encodings):
            n = len(e.ids)
            for name, values in (("input_ids", e.ids), ("token_type_ids", e.type_ids),
                                 ("attention_mask", e.attention_mask)):
                if name in out:
                    out[name][row, :n] = values
        return out


class ImageProcessor:
    """Images → a float batch for an image program: decoded (encoded bytes, base64 text, a
    file path or an array), converted to the mode, resized, scaled, normalised and laid out.

    >>> p = ImageProcessor({"mode": "BGR", "scale": 1.0}, require_size=False)
    >>> pixels = p.pixels([np.array([[[10, 20, 30]]], np.uint8)])[0]
    >>> pixels.tolist(), p.normalize(pixels).shape
    ([[[30, 20, 10]]], (3, 1, 1))
    """

    KEYS = {"size", "mode", "resize", "scale", "mean", "std", "layout", "dtype"}
    MODES = ("L", "RGB", "BGR")

    def __init__(self, spec: dict, require_size: bool = True):
        spec = _check_keys(spec, self.KEYS, "image")
        size = spec.get("size")
        if size is None and not require_size:
            self.size = None
        elif (not isinstance(size, list) or len(size) != 2
                or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 8192 for s in size)):
            raise _spec_error("image.size", f"must be [height, width] in 1..8192, got {size!r:.40}")
        else:
            self.size = tuple(size)
        self.mode = spec.get("mode", "RGB")
        if self.mode not in self.MODES:
            raise _spec_error("image.mode", f"must be one of {', '.join(self.MODES)}, got {self.mode!r:.20}")
        self.resize = spec.get("resize", "bilinear")
        if self.resize not in RESAMPLING:
            raise _spec_error("image.resize", f"must be one of {RESAMPLING}, got {self.resize!r:.20}")
        self.layout = spec.get("layout", "NCHW")
        if self.layout not in ("NCHW", "NHWC"):
            raise _spec_error("image.layout", f"must be 'NCHW' or 'NHWC', got {self.layout!r:.20}")
        channels = 1 if self.mode == "L" else 3
        self.scale = self._numbers(spec, "scale", 1 / 255, 1)
        self.mean = self._numbers(spec, "mean", 0.0, channels)
        self.std = self._numbers(spec, "std", 1.0, channels)
        if np.any(self.std == 0):
            raise _spec_error("image.std", "must not be zero")
        self.dtype = spec.get("dtype", "float32")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise _spec_error("image.dtype", f"must be a float type, got {self.dtype!r:.20}")

    @staticmethod
    def _numbers(spec, key, default, count) -> np.ndarray:
        value = spec.get(key, default)
        values = value if isinstance(value, list) else [value]
        if (len(values) not in (1, count)
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) for v in values)):
            raise _spec_error(f"image.{key}", f"must be a number or {count} numbers, got {value!r:.40}")
        return np.asarray(values, np.float32)

    def __call__(self, images: Sequence, max_pixels: int = MAX_IMAGE_PIXELS, allow_paths: bool = True) -> np.ndarray:
        """A ``[len(images), ...]`` batch in the module's layout and dtype (see
        :func:`decode_image` for what an image may be)."""
        import jax.numpy as jnp

        if self.size is None:
            raise ModuleFormatError("processor.image: this module's images keep their size (no image.size); "
                                    "its task's own method sizes them")
        rows = [self._pixels(image, max_pixels, allow_paths) for image in images]
        batch = (np.stack(rows) * self.scale - self.mean) / self.std
        if self.layout == "NCHW":
            batch = batch.transpose(0, 3, 1, 2)
        return np.asarray(jnp.asarray(batch, self.dtype)) if self.dtype != "float32" else batch.astype(np.float32)

    def pixels(self, images: Sequence, max_pixels: int = MAX_IMAGE_PIXELS, allow_paths: bool = True) -> list:
        """Each image decoded and converted to the module's mode, at its own size: uint8
        ``[H, W, C]`` arrays."""
        out = []
        for image in images:
            pixels = np.asarray(self._picture(image, max_pixels, allow_paths), np.uint8)
            pixels = pixels[..., None] if pixels.ndim == 2 else pixels
            out.append(np.ascontiguousarray(pixels[..., ::-1]) if self.mode == "BGR" else pixels)
        return out

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """One image's uint8 ``[H, W, C]`` pixels scaled and normalised, float32 in the
        module's layout without the batch axis (``[C, H, W]`` for NCHW)."""
        values = (pixels.astype(np.float32) * self.scale - self.mean) / self.std
        return (values.transpose(2, 0, 1) if self.layout == "NCHW" else values).astype(np.float32)

    def _picture(self, image, max_pixels: int, allow_paths: bool):
        from PIL import Image

        if isinstance(image, np.ndarray):
            array = image
            if array.ndim == 3 and array.shape[-1] == 1:
                array = array[..., 0]
            if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
                raise RequestError(f"an image array must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4], "
                                   f"got {list(array.shape)}")
            if array.size == 0:
                raise RequestError(f"an image array is empty ({list(image.shape)})")
            if array.dtype.kind not in "biuf":
                raise RequestError(f"an image array must hold numbers (uint8, or floats in [0, 1]), got {array.dtype}")
            if array.dtype != np.uint8:
                # float images are taken as [0, 1], booleans as black and white
                array = np.clip(np.nan_to_num(array.astype(np.float32)) * (1 if array.dtype.kind in "iu" else 255),
                                0, 255).astype(np.uint8)
            picture = Image.fromarray(array)
        elif isinstance(image, Image.Image):
            picture = image
        else:
            picture = decode_image(image, max_pixels, allow_paths)
        if 0 in picture.size:
            raise RequestError("an image has no pixels")
        return picture.convert("L" if self.mode == "L" else "RGB")

    def _pixels(self, image, max_pixels: int, allow_paths: bool) -> np.ndarray:
        from PIL import Image

        picture = self._picture(image, max_pixels, allow_paths)
        if picture.size != (self.size[1], self.size[0]):
            method = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
                      "bicubic": Image.Resampling.BICUBIC, "area": Image.Resampling.BOX}[self.resize]
            picture = picture.resize((self.size[1], self.size[0]), method)
        pixels = np.asarray(picture, np.float32)
        pixels = pixels[..., None] if pixels.ndim == 2 else pixels
        return pixels[..., ::-1] if self.mode == "BGR" else pixels


def decode_image(image, max_pixels: int = MAX_IMAGE_PIXELS, allow_paths: bool = False):
    """A PIL image from encoded bytes (PNG, JPEG, ...), base64 text of them (optionally a
    ``data:`` URL), or, with ``allow_paths`` (in-process calls; never for requests from a
    network), a file path. A :class:`RequestError` for anything else, for damaged data and for
    images over ``max_pixels`` (checked from the header, before decoding the pixels)."""
    from paddlejax._extras import require

    Image = require("PIL.Image", extra="hub", feature="images in pj.hub")
    if isinstance(image, os.PathLike) or (allow_paths and isinstance(image, str) and Path(image).is_file()):
        if not allow_paths:
            raise RequestError("file paths are not accepted here; send the image's bytes as base64")
        data = Path(image).read_bytes()
    elif isinstance(image, str):
        try:
            data = base64.b64decode(image.split(",", 1)[1] if image.startswith("data:") else image, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("an image string is not base64" + (" nor the path of a file" if allow_paths else "")) \
                from None
    elif isinstance(image, (bytes, bytearray)):
        data = bytes(image)
    else:
        raise RequestError(f"an image must be encoded bytes, base64 text, a file path or an array, "
                           f"got {type(image).__name__}")
    try:
        picture = Image.open(io.BytesIO(data))
        width, height = picture.size
        if width * height > max_pixels:
            raise RequestError(f"an image of {width}x{height} pixels is over the limit of {max_pixels:,}", 413)
        picture.load()
    except RequestError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as e:
        raise RequestError(f"an image could not be decoded ({type(e).__name__}: {str(e)[:80]})") from None
    return picture


def labels(spec, directory: Path | None) -> list[str] | None:
    """The class names: a list, or read from a text file of the module (one per line)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        path = _module_file(directory, spec, "labels")
        names = path.read_text(encoding="utf-8").splitlines()
    elif isinstance(spec, list):
        names = spec
    else:
        raise _spec_error("labels", "must be a list of names or the name of a text file")
    if not names or not all(isinstance(n, str) for n in names):
        raise _spec_error("labels", "must be non-empty strings")
    return list(names)


def check_postprocess(spec) -> dict:
    """``spec`` if it is one of the built-in post-processings; a clear error otherwise."""
    spec = _check_keys(spec, {"kind"} | set().union(*POSTPROCESS.values()), "postprocess")
    kind = spec.get("kind")
    if kind not in POSTPROCESS:
        raise _spec_error("postprocess.kind", f"must be one of {sorted(POSTPROCESS)}, got {kind!r:.20}")
    _check_keys(spec, {"kind"} | POSTPROCESS[kind], f"postprocess ({kind})")
    if spec.get("activation", "softmax") not in ("softmax", "sigmoid", "none"):
        raise _spec_error("postprocess.activation", "must be 'softmax', 'sigmoid' or 'none'")
    top_k = spec.get("top_k", 1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise _spec_error("postprocess.top_k", f"must be a positive int, got {top_k!r:.20}")
    if kind == "ocr":
        _check_ocr(spec)
    return spec


def _number(spec: dict, key: str, where: str, low: float, high: float, integer: bool = False) -> None:
    if key not in spec:
        return
    value = spec[key]
    if (isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
            or not np.isfinite(value) or not low <= value <= high):
        raise _spec_error(f"{where}.{key}", f"must be {'an int' if integer else 'a number'} in {low}..{high}, "
                                            f"got {value!r:.20}")


def _names(value, where: str, single: bool = False) -> None:
    names = [value] if single else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise _spec_error(where, f"must be {'a name' if single else 'a non-empty list of names'}, got {value!r:.60}")


def _check_ocr(spec: dict) -> None:
    """The sections of an ``ocr`` post-processing: each stage's kind, keys and values."""
    if "det" not in spec and "rec" not in spec:
        raise _spec_error("postprocess (ocr)", "needs a det stage, a rec stage or both")
    if "cls" in spec and "rec" not in spec:
        raise _spec_error("postprocess (ocr)", "a cls stage turns lines for the recogniser; it needs a rec stage")
    resize = _check_keys(spec.get("resize", {}), OCR_RESIZE, "postprocess.resize")
    for key in ("max_side_len", "min_side_len", "min_height"):
        _number(resize, key, "postprocess.resize", 1, 1 << 16, integer=True)
    if resize.get("width_height_ratio") != -1:  # -1: never pad wide images
        _number(resize, "width_height_ratio", "postprocess.resize", 0.01, 1e4)
    for section, (kind, keys) in OCR_STAGES.items():
        if section not in spec:
            continue
        where = f"postprocess.{section}"
        stage = _check_keys(spec[section], {"kind"} | keys, where)
        if stage.get("kind", kind) != kind:
            raise _spec_error(f"{where}.kind", f"must be {kind!r}, got {stage['kind']!r:.30}")
        if section == "cls":
            _names(stage.get("program"), f"{where}.program", single=True)
            _names(stage.get("labels", ["0", "180"]), f"{where}.labels")
        else:
            _names(stage.get("programs"), f"{where}.programs")
        for key in ("threshold", "box_threshold", "score_threshold"):
            _number(stage, key, where, 0, 1)
        _number(stage, "batch_size", where, 1, 1 << 16, integer=True)
    det = spec.get("det", {})
    _number(det, "limit_side_len", "postprocess.det", 32, 8192, integer=True)
    _number(det, "unclip_ratio", "postprocess.det", 0, 100)
    _number(det, "max_candidates", "postprocess.det", 1, 1 << 20, integer=True)
    _number(det, "min_size", "postprocess.det", 0, 1 << 16)
    if det.get("limit_type", "min") not in ("min", "max"):
        raise _spec_error("postprocess.det.limit_type", f"must be 'min' or 'max', got {det['limit_type']!r:.20}")
    if not isinstance(det.get("dilation", True), bool):
        raise _spec_error("postprocess.det.dilation", "must be true or false")
    rec = spec.get("rec", {})
    if "rec" in spec and not isinstance(rec.get("dictionary"), str):
        raise _spec_error("postprocess.rec.dictionary", "must name the dictionary file (one character a line)")
    _number(rec, "blank", "postprocess.rec", 0, 1 << 20, integer=True)
    if not isinstance(rec.get("use_space_char", True), bool):
        raise _spec_error("postprocess.rec.use_space_char", "must be true or false")


def ocr_classes(spec: dict, directory: Path | None) -> list[str]:
    """The recogniser's classes: the dictionary file's lines, a space when ``use_space_char``,
    and the CTC blank (shown as ``""``) inserted at ``blank``."""
    path = _module_file(directory, spec["dictionary"], "postprocess.rec.dictionary")
    try:
        characters = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise _spec_error("postprocess.rec.dictionary", f"cannot read {path.name}: {e}") from None
    if characters and characters[-1] == "":
        characters.pop()  # the file's final newline
    characters = [c.rstrip("\r") for c in characters] + ([" "] if spec.get("use_space_char", True) else [])
    blank = spec.get("blank", 0)
    if blank > len(characters):
        raise _spec_error("postprocess.rec.blank", f"{blank} is past the {len(characters)} characters")
    return characters[:blank] + [""] + characters[blank:]


def _activate(logits: np.ndarray, activation: str) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    if activation == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    return logits


def classify(logits: np.ndarray, spec: dict, names: list[str] | None, top_k: int | None = None) -> list:
    """Per row, the ``top_k`` classes as ``{"label", "score"}`` (one dict when ``top_k`` is 1);
    with a ``threshold`` (multi-label), every class whose score reaches it, best first."""
    scores = _activate(logits, spec.get("activation", "softmax"))
    names = names or [str(i) for i in range(scores.shape[-1])]
    k = min(top_k or spec.get("top_k", 1), scores.shape[-1])
    results = []
    for row in scores:
        order = np.argsort(-row, kind="stable")
        if "threshold" in spec:
            picked = [{"label": names[i], "score": round(float(row[i]), 4)} for i in order
                      if row[i] >= spec["threshold"]]
        else:
            picked = [{"label": names[i], "score": round(float(row[i]), 4)} for i in order[:k]]
            picked = picked[0] if k == 1 else picked
        results.append(picked)
    return results


def embed(vectors: np.ndarray, spec: dict) -> np.ndarray:
    """float32 vectors, scaled to unit length when the spec says ``normalize``."""
    vectors = np.asarray(vectors, np.float32)
    if spec.get("normalize"):
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors
