"""Conv algorithm autotuning: time each kernel variant of every conv op and record the fastest.

For each ``conv2d`` / ``depthwise_conv2d`` op the ``autotune`` pass builds random inputs of the
op's real shapes and dtypes, jits the reference kernel (``"default"``, the op's primitive) and
every registered variant (``registry.get("conv2d").variants``), warms each up and takes the
median of repeated timed runs. The fastest candidate is recorded as the op's ``kernel``
annotation, which lowering honours; nothing is recorded when the default wins. Variants are
alternative implementations of the same function, so the tuned program agrees with the
original to float32 rounding (the tests use a tolerance of 1e-4).

Decisions go into a persistent JSON cache keyed by the op's signature (type, input shapes and
dtypes, kernel attributes), the device kind and the jax version, together with every
candidate's time; a later run takes its choices from the cache and times nothing. The cache
lives at ``$PADDLEJAX_AUTOTUNE_CACHE`` or ``~/.cache/paddlejax/autotune.json`` unless the
``cache`` option names a file. It is written atomically; a corrupt or foreign file, or an entry
that does not match its key, is reported with a warning and ignored.

>>> import jax.numpy as jnp, paddlejax as pj, tempfile, os
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(x, p["w"], padding=1), pj.InputSpec((None, 2, 6, 6)),
...                 params={"w": jnp.ones((3, 2, 3, 3))})
>>> tune = pj.passes.get_pass("autotune", sizes="b=2", repeats=2, warmup=1,
...                           cache=os.path.join(tempfile.mkdtemp(), "autotune.json"))
>>> first = tune.apply(prog, pj.passes.PassContext()).stats
>>> again = tune.apply(prog, pj.passes.PassContext()).stats   # every choice from the cache
>>> first["tuned"], again["tuned"], again["cached"]
(1, 0, 1)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from paddlejax.analysis import concrete_shape, size_env
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Op, Program
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.ops.common import channel_axis
from paddlejax.ops.conv import paddle_padding
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.memory import parse_sizes

TUNABLE = frozenset({"conv2d", "depthwise_conv2d"})
KERNEL_ATTR = "kernel"
DEFAULT = "default"
CACHE_ENV = "PADDLEJAX_AUTOTUNE_CACHE"
CACHE_FORMAT = "paddlejax-autotune"
CACHE_VERSION = 1


class AutotuneCacheWarning(UserWarning):
    """The autotune cache could not be used (corrupt, foreign or mismatched); it was ignored."""


def default_cache_path() -> Path:
    """``$PADDLEJAX_AUTOTUNE_CACHE`` if set, else ``~/.cache/paddlejax/autotune.json``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "paddlejax" / "autotune.json")


# -- what a decision depends on ---------------------------------------------------------

def op_signature(op: Op, env: dict) -> dict:
    """The JSON-able signature of ``op`` with symbolic sizes from ``env``: type, input shapes
    and dtypes, and its kernel attributes (annotations such as ``kernel`` left out)."""
    return {"op": op.type,
            "shapes": [list(concrete_shape(v.type, env)) for v in op.operands],
            "dtypes": [v.type.dtype for v in op.operands],
            "attrs": {k: attrs_lib.encode(attrs_lib.resolve(v, env))
                      for k, v in attrs_lib.kernel_attrs(op.attrs).items()}}


def candidates(op_type: str) -> list[str]:
    """What the pass times for an op of ``op_type``: ``"default"`` (its primitive), then its variants.

    >>> candidates("depthwise_conv2d")
    ['default', 'lax_nhwc', 'im2col', 'shifted_matmul', 'depthwise_shifted']
    """
    return [DEFAULT, *registry.get(op_type).variants]


def device_kind() -> str:
    """The kind of the default device, e.g. ``"cpu"`` or ``"NVIDIA H100 80GB HBM3"``."""
    return jax.devices()[0].device_kind


def _kernel_attrs(signature: dict) -> dict:
    return {k: attrs_lib.decode(v) for k, v in signature["attrs"].items()}


def cache_key(signature: dict, device: str, jax_version: str) -> str:
    """The cache key of an op ``signature`` timed on ``device`` under ``jax_version``.

    >>> sig = {"op": "conv2d", "shapes": [[1, 2, 4, 4], [3, 2, 3, 3]], "dtypes": ["float32"] * 2, "attrs": {}}
    >>> cache_key(sig, "cpu", "0.10.2") == cache_key(dict(sig), "cpu", "0.10.2")
    True
    >>> cache_key(sig, "cpu", "0.10.2") == cache_key(sig, "TPU v5", "0.10.2")
    False
    """
    text = json.dumps({"signature": signature, "device": device, "jax": jax_version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# -- the cache file -------------------------------------------------------------------------

class TuneCache:
    """Decisions by :func:`cache_key`, read from and written (atomically) to ``path``.

    Each entry holds the op signature, device, jax version, every candidate's median
    milliseconds (``None``: skipped) and the chosen candidate.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        self.writable = True
        self._read()

    def _read(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        try:
            data = json.loads(text)
        except ValueError as e:
            return self._ignore(f"is not valid JSON ({e}); it will be rewritten")
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            self.writable = False  # someone else's file: never overwrite it
            return self._ignore("is not a paddlejax autotune cache; it is left untouched")
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            return self._ignore(f"has version {data.get('version')!r} or no entries (expected version "
                                f"{CACHE_VERSION}); it will be rewritten")
        self.entries = data["entries"]

    def _ignore(self, why: str) -> None:
        warnings.warn(f"autotune cache {self.path} {why}", AutotuneCacheWarning, stacklevel=4)

    def lookup(self, key: str, signature: dict, candidates: list[str]) -> dict | None:
        """The entry for ``key`` if it matches ``signature`` and chose one of ``candidates``."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        times = entry.get("times_ms") if isinstance(entry, dict) else None
        if (not isinstance(times, dict) or entry.get("signature") != signature or entry.get("chosen") not in candidates
                or not all(t is None or isinstance(t, (int, float)) for t in times.values())):
            warnings.warn(f"autotune cache {self.path}: entry for {signature['op']} {signature['shapes']} "
                          f"does not match its key or names an unknown kernel; retuning", AutotuneCacheWarning,
                          stacklevel=3)
            return None
        return entry

    def store(self, key: str, entry: dict) -> None:
        self.entries[key] = entry

    def save(self) -> None:
        """Write the file atomically (a temporary file in the same folder, then a rename)."""
        if not self.writable:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": self.entries}
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise


# -- timing ---------------------------------------------------------------------------------

def measure(candidate: str, fn: Callable, args: tuple, *, warmup: int, repeats: int, deadline: float) -> float:
    """Median seconds of ``fn(*args)`` after ``warmup`` calls (the first compiles); stops
    repeating at ``deadline`` (``time.perf_counter()`` value) after at least one timed run.

    The pass calls this module attribute, so tests can replace it with fixed timings.
    """
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    while len(times) < repeats and (not times or time.perf_counter() < deadline):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def workspace_bytes(candidate: str, signature: dict) -> int:
    """Estimated extra buffer bytes of a conv ``candidate`` beyond its inputs and output:
    im2col's patch matrix, the padded (and, for a channel multiplier, repeated) input of the
    shifted variants, the channels-last copies of lax_nhwc on NCHW data."""
    (x, w), itemsize = signature["shapes"][:2], np.dtype(signature["dtypes"][0]).itemsize
    attrs = _kernel_attrs(signature)
    axis = channel_axis(attrs["data_format"], 4)
    hw = [n for i, n in enumerate(x) if i not in (0, axis)]
    pads, dil = paddle_padding(attrs["padding"], hw, w[2:], attrs["stride"], attrs["dilation"])
    padded = [n + lo + hi for n, (lo, hi) in zip(hw, pads)]
    out = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(padded, w[2:], attrs["stride"], dil)]
    if candidate == "im2col":
        return x[0] * math.prod(out) * x[axis] * w[2] * w[3] * itemsize
    if candidate in ("shifted_matmul", "depthwise_shifted"):
        channels = w[0] if candidate == "depthwise_shifted" else x[axis]
        return x[0] * math.prod(padded) * channels * itemsize
    if candidate == "lax_nhwc" and axis == 1:
        return (math.prod(x) + x[0] * math.prod(out) * w[0]) * itemsize
    return 0


# -- the pass -------------------------------------------------------------------------------

@dataclasses.dataclass
class Decision:
    """One tuned op: its signature, each candidate's median ms (``None``: skipped), the choice,
    and whether it came from the cache."""

    op: Op
    signature: dict
    times_ms: dict[str, float | None]
    chosen: str
    cached: bool


@register_pass
@dataclasses.dataclass(frozen=True)
class Autotune(Pass):
    """Pick the fastest kernel of every conv op on this device (see the module doc).

    ``sizes`` gives symbolic sizes (``b=32``; several as ``b=32:t=8``; others are 1);
    ``repeats`` timed runs per candidate after ``warmup`` ones; ``max_seconds`` bounds the
    timing of one op (candidates not started by then are skipped; 0: no bound);
    ``workspace_mb`` skips variants whose :func:`workspace_bytes` exceed it (0: no limit);
    ``cache`` is the cache file (empty: :func:`default_cache_path`). The decisions are left in
    ``ctx.cache["autotune"]`` as a list of :class:`Decision`.
    """

    name = "autotune"
    sizes: str = ""
    repeats: int = 10
    warmup: int = 2
    max_seconds: float = 10.0
    workspace_mb: float = 0.0
    cache: str = ""

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.repeats < 1 or self.warmup < 0 or self.max_seconds < 0 or self.workspace_mb < 0:
            raise ValueError(f"autotune: repeats must be >= 1 and warmup, max_seconds, workspace_mb >= 0; got "
                             f"repeats={self.repeats}, warmup={self.warmup}, max_seconds={self.max_seconds}, "
                             f"workspace_mb={self.workspace_mb}")
        store = TuneCache(self.cache or default_cache_path())
        decisions = self.decide(program, store)
        if any(not d.cached for d in decisions):
            store.save()
        rw = Rewriter(program)
        for d in decisions:
            if d.chosen == DEFAULT:
                rw.remove_attr(d.op, KERNEL_ATTR)
            elif d.op.attrs.get(KERNEL_ATTR) != d.chosen:
                rw.set_attr(d.op, KERNEL_ATTR, d.chosen)
        ctx.cache["autotune"] = decisions
        return PassResult(rw.changed, {"tuned": sum(not d.cached for d in decisions),
                                       "cached": sum(d.cached for d in decisions),
                                       "annotated": sum(d.chosen != DEFAULT for d in decisions)})

    def decide(self, program: Program, store: TuneCache) -> list[Decision]:
        """A decision for every tunable op of ``program``, from ``store`` or measured (and stored)."""
        env = size_env(program, parse_sizes(self.sizes))
        device, version = device_kind(), jax.__version__
        decisions = []
        for op in program.walk():
            if op.type not in TUNABLE:
                continue
            signature = op_signature(op, env)
            key = cache_key(signature, device, version)
            entry = store.lookup(key, signature, candidates(op.type))
            cached = entry is not None
            if not cached:
                times = self._time_candidates(op, signature)
                timed = {c: t for c, t in times.items() if t is not None}
                entry = {"signature": signature, "device": device, "jax": version, "times_ms": times,
                         "chosen": min(timed, key=timed.get)}
                store.store(key, entry)
            decisions.append(Decision(op, signature, entry["times_ms"], entry["chosen"], cached))
        return decisions

    def _time_candidates(self, op: Op, signature: dict) -> dict[str, float | None]:
        """Median milliseconds of each candidate on random inputs of the op's shapes; ``None``
        for one over the workspace limit or not reached before the op's deadline. The default
        is always timed, so there is always a choice."""
        opdef = registry.get(op.type)
        attrs = _kernel_attrs(signature)
        rng = np.random.default_rng(0)
        args = tuple(jax.numpy.asarray(rng.standard_normal(shape), dtype)
                     for shape, dtype in zip(signature["shapes"], signature["dtypes"]))
        limit = self.workspace_mb * 2 ** 20
        deadline = time.perf_counter() + self.max_seconds if self.max_seconds else math.inf
        times: dict[str, float | None] = {}
        for c in candidates(op.type):
            kernel = opdef.bind if c == DEFAULT else opdef.variants[c]
            if c != DEFAULT and (limit and workspace_bytes(c, signature) > limit or time.perf_counter() > deadline):
                times[c] = None
                continue
            fn = jax.jit(lambda *a, k=kernel: k(*a, **attrs))
            times[c] = 1e3 * measure(c, fn, args, warmup=self.warmup, repeats=self.repeats, deadline=deadline)
        return times
