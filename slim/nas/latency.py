"""Latency on this device: a table of per-block times, measured once and kept on disk.

Each :class:`~paddlejax.slim.nas.search_space.Block` (its kind, arguments and input shape) is
captured as a program, compiled with its weights frozen as the Predictor runs them, and timed
(median of ``repeats`` calls at ``batch_size``); a network's predicted latency is the sum over
its blocks. Whole networks are timed the same way (:func:`measure_latency`), so the two agree
up to what XLA fuses across block boundaries.

The table is a JSON file keyed by the block, batch size, device kind and jax version: at
``$PADDLEJAX_LATENCY_CACHE`` or ``~/.cache/paddlejax/latency.json`` unless a path is given (as
the autotune cache). It is written atomically after each new measurement; a file that is not
valid JSON, or an entry that does not match its key, is reported with a warning and measured
again; a JSON file of another format is left untouched. It is never unpickled.

>>> import os, tempfile
>>> from paddlejax.slim.nas import search_space
>>> space = search_space(("ResNetSpace", {"input_size": 8, "output_size": 1, "block_num": 1,
...                                       "input_channels": 1, "class_dim": 10}))
>>> path = os.path.join(tempfile.mkdtemp(), "latency.json")
>>> table = LatencyTable(path, batch_size=2, repeats=2)
>>> table.predict(space.blocks([0, 0])) > 0, table.measured     # stem, one basic block, classifier
(True, 3)
>>> again = LatencyTable(path, batch_size=2, repeats=2)
>>> again.predict(space.blocks([0, 0])) == table.predict(space.blocks([0, 0])), again.measured
(True, 0)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import warnings
from pathlib import Path

import jax
import numpy as np

from paddlejax.capture import InputSpec
from paddlejax.files import FileReadError, read_regular, write_together
from paddlejax.passes.autotune import device_kind, measure_programs
from paddlejax.slim.nas.search_space import Block
from paddlejax.static import to_static

CACHE_ENV = "PADDLEJAX_LATENCY_CACHE"
CACHE_FORMAT = "paddlejax-latency"
CACHE_VERSION = 1
MAX_CACHE_BYTES = 64 << 20


class LatencyCacheWarning(UserWarning):
    """The latency table's file could not be used (corrupt, foreign or mismatched); it was ignored."""


def default_cache_path() -> Path:
    """``$PADDLEJAX_LATENCY_CACHE`` if set, else ``~/.cache/paddlejax/latency.json``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "paddlejax" / "latency.json")


def measure_latency(model, in_shape, batch_size: int = 32, repeats: int = 20, warmup: int = 2) -> float:
    """Median milliseconds of one inference call of ``model`` (an NNX module, in eval mode) on a
    batch of ``batch_size`` inputs of ``in_shape`` (without the batch), with its weights frozen
    into the executable, as the Predictor runs it.

    >>> from paddlejax import nn
    >>> measure_latency(nn.Linear(4, 2), (4,), batch_size=2, repeats=2) > 0
    True
    """
    program = to_static(model, InputSpec((None, *in_shape)))
    shape = (batch_size, *in_shape)
    run = program.compile(jax.ShapeDtypeStruct(shape, "float32"), freeze_params=True)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    times = measure_programs({"model": run}, (x,), warmup=warmup, repeats=repeats, deadline=math.inf)["model"]
    return 1e3 * statistics.median(times)


class LatencyTable:
    """Milliseconds per block on this device at ``batch_size``, measured on first use and kept
    in the JSON file ``path`` (see the module doc). ``measured`` counts the blocks this table
    timed itself."""

    def __init__(self, path: str | os.PathLike | None = None, *, batch_size: int = 32, repeats: int = 20,
                 warmup: int = 2):
        self.path = Path(path) if path is not None else default_cache_path()
        self.batch_size, self.repeats, self.warmup = batch_size, repeats, warmup
        self.device, self.jax_version = device_kind(), jax.__version__
        self.entries: dict[str, dict] = {}
        self.writable = True
        self.measured = 0
        self._read()

    def _read(self) -> None:
        try:
            data = json.loads(read_regular(self.path, limit=MAX_CACHE_BYTES))
        except FileReadError:
            if self.path.exists() or self.path.is_symlink():
                self._ignore("cannot be read; it is left untouched", writable=False)
            return
        except ValueError as e:  # not UTF-8 or not JSON
            return self._ignore(f"is not valid JSON ({e}); it will be rewritten")
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            return self._ignore("is not a paddlejax latency table; it is left untouched", writable=False)
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            return self._ignore(f"has version {data.get('version')!r} or no entries (expected version "
                                f"{CACHE_VERSION}); it will be rewritten")
        self.entries = data["entries"]

    def _ignore(self, why: str, writable: bool = True) -> None:
        self.writable = writable
        warnings.warn(f"latency table {self.path} {why}", LatencyCacheWarning, stacklevel=4)

    def key_fields(self, block: Block) -> dict:
        """What a block's time depends on: the block, batch size, device kind and jax version."""
        return {"block": block.describe(), "batch_size": self.batch_size, "device": self.device,
                "jax": self.jax_version}

    def block_ms(self, block: Block) -> float:
        """The block's milliseconds: from the table, or measured now (and kept)."""
        fields = self.key_fields(block)
        key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        entry = self.entries.get(key)
        if entry is not None:
            ms = entry.get("ms") if isinstance(entry, dict) else None
            if ({k: entry.get(k) for k in fields} == fields and isinstance(ms, (int, float))
                    and not isinstance(ms, bool) and math.isfinite(ms) and ms > 0):
                return float(ms)
            warnings.warn(f"latency table {self.path}: the entry for {block.kind} {list(block.in_shape)} does not "
                          f"match its key; measuring it again", LatencyCacheWarning, stacklevel=3)
        ms = measure_latency(block.build(), block.in_shape, self.batch_size, self.repeats, self.warmup)
        self.entries[key] = {**fields, "ms": ms}
        self.measured += 1
        return ms

    def predict(self, blocks: list[Block]) -> float:
        """Predicted milliseconds of a network of ``blocks``: the sum of theirs. Blocks not yet
        in the table are measured, and the file is written once after them."""
        before = self.measured
        total = sum(self.block_ms(b) for b in blocks)
        if self.measured > before:
            self.save()
        return total

    def save(self) -> None:
        """Write the table atomically (not a file of another format, which is left alone)."""
        if self.writable:
            data = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": self.entries}
            write_together({self.path: json.dumps(data, indent=1, sort_keys=True).encode()})
