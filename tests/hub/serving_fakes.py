"""Small servables for the serving tests (pure NumPy and Pillow), and a loader for Ray replicas.

Each has what the server needs of a hub module: ``name``, ``version``, ``task``,
``max_batch_size``, ``parse_request``, ``run_batch`` and ``info``.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import threading
import time

import numpy as np

from paddlejax.hub.errors import RequestError


def texts_of(payload: dict, limits) -> list[str]:
    """``payload["texts"]``, checked as a module checks it."""
    if "texts" not in payload:
        raise RequestError(f"missing key 'texts' (got keys {sorted(payload)[:5]})")
    texts = payload["texts"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise RequestError("'texts' must be a list of strings")
    if len(texts) > limits.max_items:
        raise RequestError(f"too many texts: {len(texts)} (at most {limits.max_items})", status=413)
    for i, t in enumerate(texts):
        if len(t) > limits.max_text_chars:
            raise RequestError(f"texts[{i}] has {len(t)} characters (at most {limits.max_text_chars})", status=413)
    return texts


class TextLengths:
    """Each text's length, with the size of the batch it ran in and this process's id;
    ``run_batch`` sleeps ``delay`` seconds (a model's compute) and records batch sizes."""

    task = "text-classification"
    version = "1.0.0"

    def __init__(self, name: str = "lengths", delay: float = 0.0, max_batch_size: int = 16):
        self.name, self.delay, self.max_batch_size = name, delay, max_batch_size
        self.batches: list[int] = []
        self._lock = threading.Lock()
        self._running = 0
        self.most_at_once = 0

    def parse_request(self, payload: dict, limits) -> list:
        return texts_of(payload, limits)

    def run_batch(self, items: list) -> list:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        try:
            if self.delay:
                time.sleep(self.delay)
            self.batches.append(len(items))
            return [{"text": t, "length": len(t), "batch": len(items), "pid": os.getpid()} for t in items]
        finally:
            with self._lock:
                self._running -= 1

    def info(self) -> dict:
        return {"name": self.name, "version": self.version, "task": self.task, "summary": "text lengths",
                "inputs": {"texts": "list[str]"}, "outputs": {"length": "int"}, "hub_home": os.environ.get("HUB_HOME")}


class Failing(TextLengths):
    """Raises on a batch holding the text "boom" (a crash), and a 400 RequestError on "refuse"."""

    def run_batch(self, items: list) -> list:
        if "boom" in items:
            raise ZeroDivisionError("boom")
        if "refuse" in items:
            raise RequestError("the module refuses 'refuse'")
        return super().run_batch(items)


class ImageSizes:
    """Each image's width, height and mean pixel value, from base64 PNG or JPEG files."""

    name = "sizes"
    version = "0.1.0"
    task = "image-classification"
    max_batch_size = 8

    def parse_request(self, payload: dict, limits) -> list:
        from PIL import Image

        images = payload.get("images")
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise RequestError("'images' must be a list of base64 strings")
        if len(images) > limits.max_items:
            raise RequestError(f"too many images: {len(images)} (at most {limits.max_items})", status=413)
        decoded = []
        for i, text in enumerate(images):
            if len(text) > limits.max_image_bytes * 4 // 3 + 4:  # before decoding it
                raise RequestError(f"images[{i}] is over {limits.max_image_bytes} bytes", status=413)
            try:
                data = base64.b64decode(text, validate=True)
                image = Image.open(io.BytesIO(data))
            except (binascii.Error, ValueError, OSError) as e:
                raise RequestError(f"images[{i}] is not a base64 PNG or JPEG file: {e}") from None
            if image.width * image.height > limits.max_image_pixels:
                raise RequestError(f"images[{i}] has {image.width}x{image.height} pixels (at most "
                                   f"{limits.max_image_pixels})", status=413)
            decoded.append(np.asarray(image.convert("L"), np.float32))
        return decoded

    def run_batch(self, items: list) -> list:
        return [{"width": a.shape[1], "height": a.shape[0], "mean": float(a.mean())} for a in items]

    def info(self) -> dict:
        return {"name": self.name, "version": self.version, "task": self.task, "summary": "image sizes"}


class Doubler:
    """A real paddlejax Predictor: ``x * 2`` on rows of 3 numbers, compiled for batches up to 8."""

    name = "doubler"
    version = "1.0.0"
    task = "regression"
    max_batch_size = 8

    def __init__(self):
        import paddlejax as pj

        program = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
        self.predictor = pj.inference.Predictor(program, pj.inference.Config(max_batch_size=self.max_batch_size))

    def parse_request(self, payload: dict, limits) -> list:
        rows = payload.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 3 and
                                                 all(isinstance(v, (int, float)) for v in r) for r in rows):
            raise RequestError("'rows' must be a list of [x, y, z] numbers")
        return rows

    def run_batch(self, items: list) -> list:
        return self.predictor(np.asarray(items, np.float32)).tolist()

    def info(self) -> dict:
        return {"name": self.name, "version": self.version, "task": self.task}


def load_servable(spec: str):
    """The loader Ray replicas call: ``"lengths"`` or ``"lengths:0.01"`` (its delay in seconds)."""
    name, _, delay = spec.partition(":")
    if name != "lengths":
        raise ValueError(f"no fake servable {name!r}")
    return TextLengths(delay=float(delay or 0))
