"""Conv algorithm autotuning: time each kernel variant of every conv op, then whole programs.

**Per op.** For each ``conv2d`` / ``depthwise_conv2d`` op the ``autotune`` pass builds random
inputs of the op's real shapes and dtypes, jits the reference kernel (``"default"``, the op's
primitive) and every registered variant (``registry.get("conv2d").variants``: lax.conv in
NHWC, im2col + matmul, shifted matmuls, Winograd, ...; reduced-precision ones only when
allowed), warms each up and takes the low quartile of repeated timed runs. The fastest candidate is
the op's choice. Variants are alternative implementations of the same function, so the tuned
program agrees with the original to float32 rounding (the tests use a tolerance of 1e-4;
reduced-precision variants round their inputs to bfloat16, about 1e-2).

**Whole program** (``check``, on by default). Kernels that win alone can lose together: XLA
fuses across ops and chooses buffer layouts for the whole program. So the pass also compiles
and times the whole program with and without the per-op choices and, with ``layout=auto``,
in the other data format (:mod:`paddlejax.passes.layout`): the ops are tuned in NHWC, which
the CPU and GPU kernels favour, and NCHW runs the same choices (``layout=search`` tunes both
layouts' ops, for about twice the tuning time); calls interleaved; the fastest plan is
applied: its layout, and each op's choice as a ``kernel`` annotation that lowering honours. The untuned program is always a plan, so the result is never slower than
it (within timing noise).

Decisions go into a persistent JSON cache keyed by the op's signature (type, input shapes and
dtypes, kernel attributes) or the program's text and sizes, the device kind and the jax
version, together with every candidate's time; a later run takes its choices from the cache
and times nothing. The cache lives at ``$PADDLEJAX_AUTOTUNE_CACHE`` or
``~/.cache/paddlejax/autotune.json`` unless the ``cache`` option names a file. It is written
atomically; a corrupt or foreign file, or an entry that does not match its key, is reported
with a warning and ignored.

>>> import jax.numpy as jnp, paddlejax as pj, tempfile, os
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(x, p["w"], padding=1), pj.InputSpec((None, 2, 6, 6)),
...                 params={"w": jnp.ones((3, 2, 3, 3))})
>>> folder = tempfile.TemporaryDirectory()
>>> tune = pj.passes.get_pass("autotune", sizes="b=2", repeats=2, warmup=1,
...                           cache=os.path.join(folder.name, "autotune.json"))
>>> first = tune.apply(prog.clone(), pj.passes.PassContext()).stats   # the conv's kernels, then plans
>>> again = tune.apply(prog.clone(), pj.passes.PassContext()).stats   # every choice from the cache
>>> first["tuned"], first["plans_cached"], again["tuned"], again["cached"], again["plans_cached"]
(1, 0, 0, 1, 1)
>>> folder.cleanup()
"""
from __future__ import annotations

import dataclasses
import functools
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
from paddlejax.ops import onednn, registry
from paddlejax.ops.common import channel_axis
from paddlejax.ops.conv import paddle_padding, winograd_applies
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.layout import INTO, ConvertLayout, program_layout
from paddlejax.passes.options import parse_sizes

# Ops with alternative kernels to time: conv2d, depthwise_conv2d and the int8 kernels
# (attention's one variant is its XLA form, which the ``implementation`` attribute chooses).
TUNABLE = frozenset(name for name, opdef in registry.all_ops().items()
                    if opdef.variants and name != "scaled_dot_product_attention")
KERNEL_ATTR = "kernel"
DEFAULT = "default"
CACHE_ENV = "PADDLEJAX_AUTOTUNE_CACHE"
CACHE_FORMAT = "paddlejax-autotune"
# 2: a candidate loses by its fastest run; version 1 judged some by their warm-up, so oneDNN
# kernels (slow on their first calls) lost where they are faster: its entries are retuned.
# 3: training timings take a gradient that varies; version 2's all-ones gradient let XLA
# simplify batch norm's backward pass, which then beat oneDNN's on paper only
# 4: oneDNN convolutions are cut across XLA's threads on two or more CPUs; version 3 timed them
# on oneDNN's own OpenMP team, which lost to XLA's kernels where they now win
CACHE_VERSION = 4
# A progress bar (ops tuned, rate, time left) shows when at least this many ops are to be timed
PROGRESS_MIN_OPS = 4


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


def candidates(op_type: str, reduced_precision: bool = False) -> list[str]:
    """What the pass times for an op of ``op_type``: ``"default"`` (its primitive), then its
    variants that can run here (:attr:`~paddlejax.ops.registry.OpDef.requires`); those
    computing in a narrower type only with ``reduced_precision``.

    >>> candidates("depthwise_conv2d")[:5]
    ['default', 'lax_nhwc', 'im2col', 'shifted_matmul', 'depthwise_shifted']
    >>> "lax_bf16" in candidates("conv2d", reduced_precision=True), "lax_bf16" in candidates("conv2d")
    (True, False)
    >>> from paddlejax.ops import onednn
    >>> ("onednn" in candidates("conv2d")) == onednn.available()
    True
    """
    opdef = registry.get(op_type)
    return [DEFAULT, *(v for v in opdef.variants if (reduced_precision or v not in opdef.reduced_precision)
                       and (v not in opdef.requires or opdef.requires[v]()))]


def device_kind() -> str:
    """The kind of the default device that timings hold for, e.g. ``"NVIDIA H100 80GB HBM3"``; on a
    CPU with the number of CPUs this process may run on (its affinity: the fastest kernel changes
    with the threads it gets), and whether oneDNN's calls are cut across them
    (:func:`paddlejax.ops.onednn.cuts_calls`), e.g. ``"cpu, 2 threads"``.

    >>> device_kind().startswith(jax.devices()[0].device_kind)
    True
    """
    device = jax.devices()[0]
    if device.platform != "cpu":
        return device.device_kind
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return f"{device.device_kind}, {n} thread{'s' * (n > 1)}" + ", oneDNN uncut" * (not onednn.cuts_calls())


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

    Each entry holds the op signature, device, jax version, every candidate's low-quartile
    milliseconds (``None``: skipped) and the chosen candidate.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        self.writable = True
        self._stored: set[str] = set()  # keys this process measured: they win when merging
        self._classes: dict[str, tuple | None] = {}  # class_of's answers, by key
        self.entries = self._read(warn=True)

    def _read(self, warn: bool) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        ignore = self._ignore if warn else lambda why: None
        try:
            data = json.loads(text)
        except ValueError as e:
            return ignore(f"is not valid JSON ({e}); it will be rewritten") or {}
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            self.writable = False  # someone else's file: never overwrite it
            return ignore("is not a paddlejax autotune cache; it is left untouched") or {}
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            return ignore(f"has version {data.get('version')!r} or no entries (expected version "
                          f"{CACHE_VERSION}); it will be rewritten") or {}
        return data["entries"]

    def _ignore(self, why: str) -> None:
        warnings.warn(f"autotune cache {self.path} {why}", AutotuneCacheWarning, stacklevel=4)

    def lookup(self, key: str, signature: dict, candidates: list[str]) -> dict | None:
        """The entry for ``key`` if it matches ``signature`` and timed every one of
        ``candidates``; its ``"chosen"`` is the fastest of them when the stored choice is not one
        (excluded here, or not a kernel at all). None when it did not time them all: a kernel
        that has become available since, such as the oneDNN variants, gets its turn."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        times = entry.get("times_ms") if isinstance(entry, dict) else None
        if (not isinstance(times, dict) or entry.get("signature") != signature
                or not all(t is None or isinstance(t, (int, float)) and math.isfinite(t) and t >= 0
                           for t in times.values())):
            what = f"{signature['op']} {signature['shapes']}" if "op" in signature else "a program"
            warnings.warn(f"autotune cache {self.path}: entry for {what} does not match its key; retuning",
                          AutotuneCacheWarning, stacklevel=3)
            return None
        timed = {c: times[c] for c in candidates if times.get(c) is not None}
        if not set(candidates) <= set(times) or not timed:
            return None
        return entry if entry.get("chosen") in timed else {**entry, "chosen": min(timed, key=timed.get)}

    def store(self, key: str, entry: dict) -> None:
        self.entries[key] = entry
        self._stored.add(key)
        self._classes.pop(key, None)

    def class_of(self, key: str) -> tuple | None:
        """``(device, jax version, op_class)`` of the op entry under ``key``, decoded once per
        entry; None for a plan's entry or a malformed one (which teaches nothing)."""
        if key not in self._classes:
            entry = self.entries.get(key)
            try:
                self._classes[key] = (entry["device"], entry["jax"], op_class(entry["signature"]))
            except (KeyError, TypeError, IndexError, ValueError, AttributeError):
                self._classes[key] = None
        return self._classes[key]

    def save(self) -> None:
        """Write the file atomically (a temporary file in the same folder, then a rename),
        holding a lock on ``<path>.lock`` and merging what other processes wrote since this one
        read it, so that processes tuning at once keep each other's entries."""
        import fcntl

        if not self.writable:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged = self._read(warn=False)
            if not self.writable:  # replaced by someone else's file meanwhile
                return
            self.entries = {**merged, **{k: self.entries[k] for k in self._stored}}
            self._classes.clear()
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

def low_quartile(times: list[float]) -> float:
    """The time a quarter of the way up from the fastest of ``times``: what a kernel takes when
    the machine lets it run. On a shared machine another job's burst slows whole runs (a median
    of five then follows a burst over three; a 20 % slower layout was chosen so), while the very
    fastest run can be a lucky one of a kernel whose threads wake unevenly.

    >>> low_quartile([5.0, 1.0, 9.0, 2.0, 8.0])
    2.0
    """
    return sorted(times)[len(times) // 4]


def measure(candidate: str, fn: Callable, args: tuple, *, warmup: int, repeats: int, deadline: float,
            slower_than: float = math.inf) -> float:
    """The :func:`low_quartile` of ``fn(*args)``'s seconds after ``warmup`` untimed calls; stops repeating at
    ``deadline`` (``time.perf_counter()`` value) after at least one timed run, and once a
    candidate has lost against ``slower_than`` seconds: its fastest of three runs was slower,
    or of two runs twice as slow. Losing is judged by the fastest run, never by the warm-up:
    the first calls may compile, or build a library's kernel (oneDNN generates its code then
    and takes a few calls to reach its pace), and that costs nothing later.

    A warm-up call past :func:`lost_at_warmup` of ``slower_than`` ends it there: its time is
    the result (XLA's int8 depthwise convolution takes seconds where oneDNN's takes 0.1 ms).

    The pass calls this module attribute, so tests can replace it with fixed timings.
    """
    for _ in range(max(warmup, 1)):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        warm = time.perf_counter() - start
        if lost_at_warmup(warm, slower_than):
            return warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
        if (time.perf_counter() > deadline or len(times) >= 2 and min(times) > 2 * slower_than
                or len(times) >= 3 and min(times) > slower_than):
            break
    return low_quartile(times)


def workspace_bytes(candidate: str, signature: dict) -> int:
    """Estimated extra buffer bytes of a conv ``candidate`` beyond its inputs and output:
    im2col's patch matrix, the padded (and, for a channel multiplier, repeated) input of the
    shifted variants, the channels-last copies of lax_nhwc on NCHW data, winograd's transformed
    input and product tiles (none where it falls back to lax.conv), lax_bf16's bfloat16 copies
    of the input and weight, as the int8 ops' bf16 variants make; 0 for the other kernels
    (oneDNN's, and the variants of ops that are not convolutions: pooling, batch norm)."""
    if candidate not in ("lax_bf16", "im2col", "shifted_matmul", "depthwise_shifted", "lax_nhwc", "winograd") \
            and not candidate.startswith("bf16_"):
        return 0
    (x, w), itemsize = signature["shapes"][:2], np.dtype(signature["dtypes"][0]).itemsize
    if candidate == "lax_bf16" or candidate.startswith("bf16_"):
        return (math.prod(x) + math.prod(w)) * np.dtype("bfloat16").itemsize
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
    if candidate == "winograd" and winograd_applies(w, attrs["stride"], dil, attrs.get("groups", 1),
                                                    signature["dtypes"][0]):
        tiles = x[0] * math.prod(-(-n // 2) for n in out)
        return 16 * tiles * (x[axis] + w[0]) * itemsize   # 4x4 tiles of the input and of the product
    return 0


# -- the pass -------------------------------------------------------------------------------

@dataclasses.dataclass
class Trial:
    """One op's race: its signature, the random ``args`` its candidates run on, every
    candidate (the default first) and how to compile each one to be timed."""

    signature: dict
    args: tuple
    candidates: list[str]
    builds: dict[str, Callable]


@dataclasses.dataclass
class Decision:
    """One tuned op: its signature, each candidate's low-quartile ms (``None``: skipped), the choice,
    and whether it came from the cache."""

    op: Op
    signature: dict
    times_ms: dict[str, float | None]
    chosen: str
    cached: bool


@dataclasses.dataclass
class Plan:
    """A whole-program candidate: the program in ``layout`` (``""``: as it is), with the
    per-op kernel choices (``kernels``) or with every op's default kernel, as ``program``;
    ``ms`` is its measured low-quartile latency (``None``: not timed; see :func:`low_quartile`);
    ``floor_ms`` the sum of its tunable ops' times measured alone, which it cannot beat by much."""

    layout: str
    kernels: bool
    program: Program | None = dataclasses.field(default=None, repr=False)
    ms: float | None = None
    runners_up: bool = False  # the close calls' runners-up in place of their winners (see runners_up)
    floor_ms: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.layout or 'as is'}{', tuned kernels' if self.kernels else ''}" + \
            (", runners-up" if self.runners_up else "")


def lost_at_warmup(seconds: float, slower_than: float) -> bool:
    """Whether a warm-up call of ``seconds`` already loses against ``slower_than`` seconds: it
    took :data:`WARMUP_LOSS` times as long and :data:`WARMUP_SLACK` more (what a first call's
    compile or kernel generation may add).

    >>> lost_at_warmup(2.0, 0.001), lost_at_warmup(0.02, 0.001)
    (True, False)
    """
    return seconds > WARMUP_LOSS * slower_than + WARMUP_SLACK


def measure_programs(fns: dict[str, Callable], args: tuple, *, warmup: int, repeats: int,
                     deadline: float, race: bool = False, min_seconds: float = 0.0,
                     floors: dict[str, float] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns`` on ``args``, round by round: every round calls each
    once, so that one round's calls share the machine's state; ``repeats`` rounds, more until
    ``min_seconds`` have been spent timing (small programs get enough rounds for a stable
    statistic); stops at ``deadline`` after at least one round. With ``race``, from the third
    round on a function whose :func:`low_quartile` is past :data:`RACE_MARGIN` times the best
    one's is called no more (its list is shorter), and one whose warm-up call already lost
    (:func:`lost_at_warmup`) against the fastest warm-up is not timed: its list holds that call.
    ``floors`` (seconds a function takes at least, as the sum of its ops' times alone) order
    the warm-ups, lowest first, and with ``race`` a function whose floor has already lost
    against the fastest warm-up is never called: its list is empty. (A program running XLA's
    int8 depthwise convolutions takes 40 s a call where the tuned one takes 20 ms.)

    The pass calls this module attribute, so tests can replace it with fixed timings.

    >>> slow = lambda x: 1 / 0  # never called: its floor already lost
    >>> rounds = measure_programs({"fast": abs, "slow": slow}, (1.0,), warmup=1, repeats=2, deadline=math.inf,
    ...                           race=True, floors={"fast": 0.0, "slow": 60.0})
    >>> len(rounds["fast"]), rounds["slow"]
    (2, [])
    """
    floors = floors or {}
    warm, skipped = {}, set()
    for label in sorted(fns, key=lambda k: floors.get(k, 0.0)):
        if race and warm and lost_at_warmup(floors.get(label, 0.0), min(warm.values())):
            skipped.add(label)
            continue
        for _ in range(max(warmup, 1)):  # the first call may still compile
            start = time.perf_counter()
            jax.block_until_ready(fns[label](*args))
            warm[label] = time.perf_counter() - start
    times: dict[str, list[float]] = {label: [] for label in fns}
    running, began = {k: f for k, f in fns.items() if k not in skipped}, time.perf_counter()
    if race:
        fastest = min(warm.values())
        for label in [k for k in running if lost_at_warmup(warm[k], fastest)]:
            times[label] = [warm[label]]
            del running[label]
    for i in range(MAX_ROUNDS):
        if i >= repeats and time.perf_counter() - began >= min_seconds:
            break
        for label, fn in running.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[label].append(time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
        if race and i >= 1:
            best = min(low_quartile(times[label]) for label in running)
            running = {k: f for k, f in running.items() if low_quartile(times[k]) <= RACE_MARGIN * best}
    return times


def fastest_plan(rounds: dict[str, list[float]], unchanged: str, min_gain: float) -> str:
    """The plan to keep from :func:`measure_programs`' ``rounds``: the one with the fastest
    :func:`low_quartile`; it must beat the ``unchanged`` program's by ``min_gain`` (a fraction)
    to replace it; a plan never called (an empty list, see ``floors``) is out of the running.

    >>> fastest_plan({"as is": [3.0, 3.1, 2.9], "tuned": [2.0, 2.6, 2.5], "other": [4.0, 4.2]}, "as is", 0.03)
    'tuned'
    >>> fastest_plan({"as is": [3.0, 3.0, 3.0], "tuned": [2.95, 2.92, 3.0]}, "as is", 0.03)
    'as is'
    """
    best = {label: low_quartile(t) for label, t in rounds.items() if t}  # an empty list: never called
    fastest = min(best, key=best.get)
    if unchanged in best and best[fastest] > (1 - min_gain) * best[unchanged]:
        return unchanged
    return fastest


def compile_all(builders: dict[str, Callable]) -> dict:
    """``builders``' results by key, built in threads: XLA compiles without the GIL, so the
    candidates of one op (or the plans of one program) compile on every core at once.

    >>> compile_all({"a": lambda: 1, "b": lambda: 2})
    {'a': 1, 'b': 2}
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(builders), os.cpu_count() or 1))) as pool:
        futures = {k: pool.submit(b) for k, b in builders.items()}
        return {k: f.result() for k, f in futures.items()}


def random_inputs(program: Program, env: dict) -> tuple:
    """Inputs for ``program`` with sizes from ``env``: normal floats, zero integers (valid ids).

    >>> import paddlejax as pj
    >>> prog = pj.trace(lambda x, ids: x[ids], pj.InputSpec((None, 3)), pj.InputSpec((2,), "int32"))
    >>> [a.shape for a in random_inputs(prog, {"b": 5})]
    [(5, 3), (2,)]
    """
    rng = np.random.default_rng(0)
    leaves = [np.asarray(rng.standard_normal(concrete_shape(v.type, env)), v.type.dtype)
              if np.issubdtype(np.dtype(v.type.dtype), np.floating)
              else np.zeros(concrete_shape(v.type, env), v.type.dtype) for v in program.inputs]
    return tuple(jax.tree_util.tree_unflatten(program.in_tree, leaves))


def _square_sum(out):
    """Half the sum of squares of ``out``'s float leaves: a loss whose gradient (``out``
    itself) varies over every element, as a real loss's does. A plain sum's gradient, all ones,
    lets XLA simplify the backward pass (batch norm's by 30x) and would misjudge kernels."""
    return sum(0.5 * jax.numpy.vdot(leaf, leaf) for leaf in jax.tree_util.tree_leaves(out)
               if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating))


def gradient_step(program: Program, training: bool = False) -> Callable:
    """``f(params, *inputs)``: half the sum of squares of ``program``'s float outputs (of a
    ``training``-mode capture, its outputs without the state updates) and its gradient with
    respect to the float parameters: what the autotuner times to choose kernels for training.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"], jnp.ones((1, 2)), params={"w": jnp.eye(2)})
    >>> loss, grads = gradient_step(prog)(prog.params, jnp.ones((1, 2)))
    >>> float(loss), grads["w"].tolist()
    (1.0, [[1.0, 1.0], [1.0, 1.0]])
    """
    def loss(weights, fixed, *inputs):
        out = program.apply({**fixed, **weights}, *inputs)
        return _square_sum(out[0] if training else out)

    def step(params, *inputs):
        floating = {k: v for k, v in params.items() if jax.numpy.issubdtype(v.dtype, jax.numpy.floating)}
        fixed = {k: v for k, v in params.items() if k not in floating}
        return jax.value_and_grad(loss)(floating, fixed, *inputs)

    return step


def _without_kernels(program: Program) -> Program:
    bare = program.clone()
    rewriter = Rewriter(bare)
    for op in bare.walk():
        rewriter.remove_attr(op, KERNEL_ATTR)
    return bare


def _annotate(rewriter: Rewriter, decisions: list[Decision], kernels: bool) -> None:
    """Record each decision as its op's ``kernel`` annotation (none for the default kernel, and
    none at all unless ``kernels``)."""
    for d in decisions:
        if d.chosen == DEFAULT or not kernels:
            rewriter.remove_attr(d.op, KERNEL_ATTR)
        elif d.op.attrs.get(KERNEL_ATTR) != d.chosen:
            rewriter.set_attr(d.op, KERNEL_ATTR, d.chosen)


def _carried(program: Program, decisions: list[Decision]) -> list[Decision]:
    """``decisions`` (made on another layout of ``program``: its tunable ops in the same
    order) moved onto ``program``'s ops, with the times measured there."""
    ops = [op for op in program.walk() if op.type in TUNABLE]
    assert len(ops) == len(decisions), "a layout conversion changed the tunable ops"
    return [dataclasses.replace(d, op=op) for op, d in zip(ops, decisions)]


def _floor_ms(decisions: list[Decision], kernels: bool) -> float:
    """The sum of the ops' times alone with their chosen kernels (``kernels``) or their default
    ones: a program running them takes about that long at least. A default not timed was
    hopeless (:func:`hopeless_default`): infinite.

    >>> from paddlejax.ir import Op
    >>> d = Decision(Op("conv2d", [], []), {}, {"default": 9.0, "onednn": 0.5}, "onednn", False)
    >>> _floor_ms([d, d], True), _floor_ms([d, d], False)
    (1.0, 18.0)
    >>> _floor_ms([dataclasses.replace(d, times_ms={"default": None, "onednn": 0.5})], False)
    inf
    """
    times = [d.times_ms.get(d.chosen if kernels else DEFAULT) for d in decisions]
    return sum(math.inf if t is None else t for t in times)


def runners_up(decisions: list[Decision]) -> list[Decision] | None:
    """``decisions`` with every close call (a runner-up within :data:`CLOSE_CALL` of the winner)
    given to its runner-up, or None when there is none. A race times an op alone, call by call;
    in the program its kernel runs between others, on threads kept awake, and two kernels a few
    per cent apart alone can be far apart there (the digits CNN at two threads: Winograd and
    oneDNN tied alone on one convolution, and the program ran 0.57 ms with Winograd against
    0.34 ms with oneDNN). So the program is also timed with the runners-up.

    >>> from paddlejax.ir import Op
    >>> close = Decision(Op("conv2d", [], []), {}, {"default": 1.0, "onednn": 0.50, "winograd": 0.52}, "onednn", False)
    >>> [d.chosen for d in runners_up([close])]
    ['winograd']
    """
    flipped, changed = [], False
    for d in decisions:
        timed = sorted((t, c) for c, t in d.times_ms.items() if t is not None and c != d.chosen)
        best = d.times_ms.get(d.chosen)
        if timed and best is not None and timed[0][0] <= best * (1 + CLOSE_CALL):
            d, changed = dataclasses.replace(d, chosen=timed[0][1]), True
        flipped.append(d)
    return flipped if changed else None


def _annotated(program: Program, decisions: list[Decision], kernels: bool) -> Program:
    """A copy of ``program`` annotated with ``decisions`` (made on ``program``'s ops)."""
    copy = program.clone()
    position = {id(op): i for i, op in enumerate(program.walk())}
    ops = list(copy.walk())  # a clone walks in the same order
    _annotate(Rewriter(copy), [dataclasses.replace(d, op=ops[position[id(d.op)]]) for d in decisions], kernels)
    return copy


# a candidate whose low quartile passes this multiple of the best so far has lost: it stops being timed
RACE_MARGIN = 1.3
# a warm-up call this many times as slow as the best, and WARMUP_SLACK seconds more, has lost
WARMUP_LOSS, WARMUP_SLACK = 10.0, 0.05
# the most rounds measure_programs runs to fill its min_seconds
MAX_ROUNDS = 1000
# whole-program plans are timed for at least this long together
PLAN_MIN_SECONDS = 0.3
# an op whose runner-up is within this fraction of its winner is a close call, settled by timing
# the whole program both ways (see runners_up)
CLOSE_CALL = 0.1
# A candidate the cost model expects to run at under this fraction of the default's speed is
# not timed (unless ``top_k=0``): im2col or shifted matmuls on a CPU, Winograd on large maps
EXPECTED_LOSS = 2 / 3


# An op's default kernel is not timed once it lost to the fastest kernel by this factor or more
# on every op of its kind measured, at least HOPELESS_EVIDENCE of them (see hopeless_default)
HOPELESS_DEFAULT, HOPELESS_EVIDENCE = 20.0, 3

# Feature maps of at most this many positions are "small": kernels rank differently there
# (Winograd's tiles, say, pay off on ResNet's 8x8 and 4x4 stages and not on its 32x32 one)
SMALL_MAP = 100
# Convolutions reading fewer input channels (per group) than this are "thin": a network's stem,
# on 1 or 3 colour channels, where the kernels take other code paths than on the layers after
THIN_INPUT = 8


def op_class(signature: dict) -> tuple:
    """What makes conv ops alike for the kernels: type, dtypes, layout, kernel size, stride,
    groups, whether the feature map is small (:data:`SMALL_MAP`) and the input thin
    (:data:`THIN_INPUT`), whether the weights are compile-time constants and whether the
    backward pass is timed too (not the exact sizes).

    >>> op_class({"op": "conv2d", "shapes": [[8, 3, 32, 32], [16, 3, 3, 3]], "dtypes": ["float32"] * 2,
    ...           "attrs": {"stride": {"tuple": [2, 2]}, "data_format": "NCHW"}})
    ('conv2d', ('float32', 'float32'), 'NCHW', (3, 3), (2, 2), 1, 'large', 'thin', ())
    """
    attrs = _kernel_attrs(signature) if "attrs" in signature else {}
    weight = signature["shapes"][1] if len(signature["shapes"]) > 1 else []  # a conv's; a norm's running mean
    kernel = tuple(weight[2:])
    x = signature["shapes"][0]
    spatial = x[1:-1] if attrs.get("data_format", "NCHW") in ("NHWC", "NLC", "NDHWC") else x[2:]
    return (signature["op"], tuple(signature["dtypes"]), attrs.get("data_format"), kernel,
            tuple(attrs.get("stride") or ()), attrs.get("groups", 1),
            "small" if math.prod(spatial) <= SMALL_MAP else "large",
            "thin" if len(weight) > 1 and weight[1] < THIN_INPUT else "wide",
            tuple(signature.get("constant_operands", ())),
            *(("training",) if signature.get("training") else ()))


def predicted_speedups(signature: dict, platform: str | None = None) -> dict[str, float | None]:
    """``default time / its time`` for each variant of the op of ``signature`` by the op
    library's cost model (:attr:`~paddlejax.ops.registry.OpDef.estimate`) on ``platform`` (the
    default device's), ``None`` for a variant that computes as the default does there; empty
    for an op without a model. Ranks candidates before the cache has measured ops like this.

    >>> sig = {"op": "conv2d", "shapes": [[32, 16, 16, 64], [64, 64, 1, 1]], "dtypes": ["float32"] * 2,
    ...        "attrs": {"data_format": "NHWC"}}
    >>> predicted = predicted_speedups(sig, "cpu")
    >>> predicted["lax_nhwc"], predicted["winograd"], predicted["im2col"] < 1
    (None, None, True)
    """
    opdef = registry.get(signature["op"])
    if opdef.estimate is None:
        return {}
    platform = platform or jax.devices()[0].platform
    shapes, dtypes, attrs = [tuple(s) for s in signature["shapes"]], signature["dtypes"], _kernel_attrs(signature)
    base = opdef.estimate(DEFAULT, shapes, dtypes, attrs, platform)
    out = {}
    for variant in opdef.variants:
        t = opdef.estimate(variant, shapes, dtypes, attrs, platform)
        out[variant] = None if t is None else base / t
    return out


def hopeless_default(store: "TuneCache", signature: dict) -> bool:
    """Whether the default kernel of the op of ``signature`` is not worth timing: on every one
    of at least :data:`HOPELESS_EVIDENCE` ops of its kind (same op, dtypes and layout, grouped
    or not, constant operands, training) measured on this device and jax version, it took
    :data:`HOPELESS_DEFAULT` times as long as the fastest kernel or more. XLA's int8 grouped
    convolutions on a CPU are so: 7 s a call on one of PP-OCR's layers where oneDNN takes
    0.3 ms, and timing them took half of a cold int8 Predictor's creation.

    >>> store = TuneCache("/nonexistent/c.json")
    >>> sig = lambda c: {"op": "quantized_conv2d", "shapes": [[3, 8, 8, c], [c, 1, 3, 3]],
    ...                  "dtypes": ["int8"] * 2, "attrs": {"groups": c, "data_format": "NHWC"}}
    >>> for i, c in enumerate((16, 32, 64)):
    ...     store.store(str(i), {"signature": sig(c), "device": device_kind(), "jax": jax.__version__,
    ...                          "times_ms": {"default": 30.0 * c, "onednn": 0.2}, "chosen": "onednn"})
    >>> hopeless_default(store, sig(480)), hopeless_default(store, {**sig(480), "dtypes": ["float32"] * 2})
    (True, False)
    """
    def kind(cls: tuple) -> tuple:  # op_class without sizes, kernel size, stride or group count
        return (*cls[:3], (cls[5] or 1) > 1, *cls[8:])

    wanted, seen = (device_kind(), jax.__version__, kind(op_class(signature))), 0
    for key, entry in store.entries.items():
        cls = store.class_of(key)  # None for a plan's entry or a malformed one
        if cls is None or (*cls[:2], kind(cls[2])) != wanted:
            continue
        try:
            times = entry["times_ms"]
            default = times[DEFAULT]
            fastest = min(t for c, t in times.items() if c != DEFAULT and isinstance(t, (int, float)) and t > 0)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if default is None:
            continue  # judged hopeless already: no new evidence
        if not (isinstance(default, (int, float)) and math.isfinite(default)) or default < HOPELESS_DEFAULT * fastest:
            return False
        seen += 1
    return seen >= HOPELESS_EVIDENCE


def learned_speedups(store: "TuneCache", signature: dict) -> dict[str, float]:
    """For each variant measured on ops of the same :func:`op_class` on this device and jax
    version, the median of ``default time / its time`` over those ops: the cost model that ranks
    candidates, refined by every op the cache has measured."""
    wanted = (device_kind(), jax.__version__, op_class(signature))
    ratios: dict[str, list[float]] = {}
    for key, entry in store.entries.items():
        if store.class_of(key) != wanted:
            continue
        times = entry.get("times_ms")
        if not isinstance(times, dict) or not isinstance(times.get(DEFAULT), (int, float)) or not times[DEFAULT]:
            continue
        for c, t in times.items():
            if c != DEFAULT and isinstance(t, (int, float)) and t > 0:
                ratios.setdefault(c, []).append(times[DEFAULT] / t)
    return {c: statistics.median(r) for c, r in ratios.items()}


def decision_table(decisions: list[Decision], reduced_precision: bool = False) -> list[tuple[str, ...]]:
    """Rows of strings, a header first: per decision its op, input shapes, each candidate's
    low-quartile ms (``skip``: not timed; ``-``: not a candidate of that op), the choice and whether
    it came from the cache.

    >>> d = Decision(None, {"op": "conv2d", "shapes": [[2, 3, 8, 8], [4, 3, 3, 3]]},
    ...              {"default": 2.0, "lax_nhwc": 1.5}, "lax_nhwc", cached=True)
    >>> decision_table([d])[1][:5]
    ('0', 'conv2d', '2x3x8x8, 4x3x3x3', '2.000', '1.500')
    """
    columns = list(dict.fromkeys(c for d in decisions for c in candidates(d.signature["op"], reduced_precision)))
    rows = [("#", "op", "input shapes", *columns, "chosen", "from")]
    for i, d in enumerate(decisions):
        shapes = ", ".join("x".join(map(str, s)) for s in d.signature["shapes"])
        times = [("-" if c not in d.times_ms else "skip" if d.times_ms[c] is None else f"{d.times_ms[c]:.3f}")
                 for c in columns]
        rows.append((str(i), d.signature["op"], shapes, *times, d.chosen, "cache" if d.cached else "measured"))
    return rows


@register_pass
@dataclasses.dataclass(frozen=True)
class Autotune(Pass):
    """Pick the fastest kernel of every conv op on this device, then the fastest whole program
    (see the module doc).

    ``sizes`` gives symbolic sizes (``b=32``; several as ``b=32:t=8``; others are those of the
    :class:`PassContext`, as a :class:`~paddlejax.Trainer` gives its first batch's, else 1);
    in a training program (``PassContext.training``, as the Trainer runs its ``passes``) ops and
    plans are timed forward and backward, so the choices are those for training;
    ``repeats`` timed runs per candidate after ``warmup`` ones (fewer for a candidate that is
    clearly slower than the best so far); ``top_k`` times only the default and the ``top_k``
    variants ranked fastest by the cost model: what the cache measured on ops like this one,
    else the op library's estimate (:func:`predicted_speedups`; variants with neither are always
    timed, those that compute as the default does never, those expected at under 2/3 of its
    speed neither; 0: time all; on a cold cache one op of each kind is timed on every candidate
    first, so that the others of its kind are ranked by it); ``max_seconds`` bounds the
    timing of one op (candidates not started by then are skipped; 0: no bound) and of each
    whole-program plan; ``workspace_mb`` skips variants whose :func:`workspace_bytes` exceed it
    (0: no limit); ``reduced_precision`` lets variants that compute in a narrower type
    (``lax_bf16``) compete; ``exclude`` names variants never to use (comma-separated, e.g.
    ``onednn``); ``cache`` is the cache file (empty: :func:`default_cache_path`).

    ``check`` times the whole program with and without the per-op choices and keeps the
    faster, so the tuned program is never slower than the untuned one (ops that win alone
    can lose together: XLA fuses across ops and picks layouts for the whole program); a plan
    must beat the program as it is by ``min_gain`` (a fraction; default 3 %, above the timing
    noise) to replace it;
    ``layout`` is ``auto`` (tune the ops in NHWC and time the program in both data formats,
    see :mod:`paddlejax.passes.layout`, NCHW with the kernels chosen in NHWC; needs ``check``),
    ``search`` (the same, with that layout's ops tuned on their own: slower to tune, at times
    a faster program), ``keep``, ``NCHW`` or ``NHWC``;
    ``frozen`` times ops with their parameter operands compiled in as constants, and plans with
    the parameters frozen into the executable, as the inference
    :class:`~paddlejax.inference.Predictor` runs them (XLA then folds weight transforms such as
    Winograd's or a layout change into the constants). ``progress`` shows a bar on stderr
    while ops are timed, when there are at least :data:`PROGRESS_MIN_OPS` of them (tqdm's
    ``TQDM_DISABLE=1`` silences it too).

    The per-op decisions are left in ``ctx.cache["autotune"]`` as a list of :class:`Decision`,
    the plans in ``ctx.cache["autotune_plans"]`` (:class:`Plan`, the chosen one first).
    """

    name = "autotune"
    sizes: str = ""
    repeats: int = 5
    warmup: int = 1
    top_k: int = 2
    max_seconds: float = 10.0
    workspace_mb: float = 0.0
    reduced_precision: bool = False
    exclude: str = ""
    check: bool = True
    layout: str = "auto"
    frozen: bool = False
    min_gain: float = 0.03
    cache: str = ""
    progress: bool = True

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.repeats < 1 or self.warmup < 0 or self.max_seconds < 0 or self.workspace_mb < 0:
            raise ValueError(f"autotune: repeats must be >= 1 and warmup, max_seconds, workspace_mb >= 0; got "
                             f"repeats={self.repeats}, warmup={self.warmup}, max_seconds={self.max_seconds}, "
                             f"workspace_mb={self.workspace_mb}")
        if self.layout not in ("auto", "search", "keep", *INTO):
            raise ValueError(f"autotune: layout must be auto, search, keep, NCHW or NHWC; got {self.layout!r}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"autotune: min_gain must be a fraction in [0, 1), got {self.min_gain}")
        if self.layout in ("auto", "search") and not self.check:
            raise ValueError(f"autotune: layout={self.layout} times whole programs, so it needs check=true; "
                             "give layout=keep, NCHW or NHWC with check=false")
        store = TuneCache(self.cache or default_cache_path())
        current = program_layout(program)
        layouts = [current]
        if self.layout in INTO and current in INTO:
            layouts = [self.layout]
        elif self.layout in ("auto", "search") and current in INTO:
            layouts = [current, next(f for f in INTO if f != current)]
        # layout=auto tunes the ops in channels-last, which the CPU and GPU kernels favour, and
        # carries those choices into the other layout, judged as a whole program only
        tuned_in = "NHWC" if self.layout == "auto" and "NHWC" in layouts else current
        plans, tried, carried = [], {}, set()
        for layout in sorted(layouts, key=lambda f: f != tuned_in):
            variant = program.clone()
            if layout != current:
                ConvertLayout(to=layout).apply(variant, PassContext())
            if layout == tuned_in or self.layout != "auto":
                tried[layout] = self.decide(variant, store, ctx)
            else:
                carried.add(layout)
                tried[layout] = _carried(variant, tried[tuned_in])
            options = self._kernel_options(tried[layout])
            if self.layout == "auto" and layout != current:  # the converted program runs tuned only
                options = options[-1:]
            plans += [Plan(layout, kernels, program=_annotated(variant, tried[layout], kernels),
                           floor_ms=_floor_ms(tried[layout], kernels)) for kernels in options]
            flipped = runners_up(tried[layout]) if layout not in carried and True in options else None
            if flipped is not None and self.check and any(d.chosen != DEFAULT for d in flipped):
                plans.append(Plan(layout, True, program=_annotated(variant, flipped, True), runners_up=True,
                                  floor_ms=_floor_ms(flipped, True)))
        plans_cached = len(plans) > 1 and self._choose(program, plans, store, ctx)
        tuned = [d for layout, ds in tried.items() if layout not in carried for d in ds]
        if any(not d.cached for d in tuned) or len(plans) > 1 and not plans_cached:
            store.save()
        chosen = plans[0]
        rewriter = Rewriter(program)
        if chosen.layout != current:
            ConvertLayout(to=chosen.layout).apply(program, ctx)
            rewriter.changed = True
        # every choice is in the cache by now; the plan's own decisions say which were measured
        decisions = (_carried(program, tried[tuned_in]) if chosen.layout in carried else
                     [dataclasses.replace(d, cached=timed.cached) for d, timed in
                      zip(self.decide(program, store, ctx), tried[chosen.layout])])
        if chosen.runners_up:
            decisions = runners_up(decisions)
        _annotate(rewriter, decisions, chosen.kernels)
        ctx.cache["autotune"] = decisions
        ctx.cache["autotune_plans"] = plans
        return PassResult(rewriter.changed, {
            "tuned": sum(not d.cached for d in tuned), "cached": sum(d.cached for d in tuned),
            "annotated": sum(op.attrs.get(KERNEL_ATTR) is not None for op in program.walk()),
            "plans": len(plans), "plans_cached": int(plans_cached)})

    def _kernel_options(self, decisions: list[Decision]) -> tuple[bool, ...]:
        """Whether a layout's plans run its ops' chosen kernels: both ways when ``check``
        has something to compare, else the per-op choice alone."""
        if not any(d.chosen != DEFAULT for d in decisions):
            return (False,)
        return (False, True) if self.check else (True,)

    def _choose(self, program: Program, plans: list[Plan], store: TuneCache, ctx: PassContext) -> bool:
        """Sort ``plans`` fastest first, each with its milliseconds, from ``store`` or timed
        (and stored); returns whether they came from the cache. A training program
        (``ctx.training``) is timed as a gradient step (:func:`gradient_step`)."""
        env, training = self._sizes(program, ctx), ctx.training
        labels = [p.label for p in plans]
        # each plan's text holds its kernel choices: new choices (a kernel excluded, or newly
        # available) are new plans to time
        signature = {"program": hashlib.sha256(str(_without_kernels(program)).encode()).hexdigest(),
                     "sizes": dict(sorted(env.items())), "frozen": self.frozen,
                     "reduced_precision": self.reduced_precision, "plans": labels,
                     **({"training": True} if training else {}),
                     "kernels": [hashlib.sha256(str(p.program).encode()).hexdigest()[:16] for p in plans]}
        key = cache_key(signature, device_kind(), jax.__version__)
        entry = store.lookup(key, signature, labels)
        cached = entry is not None
        if not cached:
            args = random_inputs(program, env)
            # a plan running a hopeless default kernel (an infinite floor) is not even compiled
            runnable = [plan for plan in plans if plan.floor_ms < math.inf]
            if training:
                args = (program.params, *args)
                fns = compile_all({plan.label: lambda p=plan.program: jax.jit(gradient_step(p, True)).lower(
                    *args).compile() for plan in runnable})
            else:
                fns = compile_all({plan.label: functools.partial(plan.program.compile, *args,
                                                                 freeze_params=self.frozen) for plan in runnable})
            deadline = time.perf_counter() + self.max_seconds * len(runnable) if self.max_seconds else math.inf
            rounds = measure_programs(fns, args, warmup=self.warmup, repeats=self.repeats, deadline=deadline,
                                      race=True, min_seconds=PLAN_MIN_SECONDS,
                                      floors={plan.label: plan.floor_ms / 1e3 for plan in runnable})
            times = {label: 1e3 * low_quartile(rounds[label]) if rounds.get(label) else None for label in labels}
            entry = {"signature": signature, "device": device_kind(), "jax": jax.__version__, "times_ms": times,
                     "chosen": fastest_plan(rounds, Plan(program_layout(program), False).label, self.min_gain)}
            store.store(key, entry)
        for plan in plans:
            plan.ms = entry["times_ms"][plan.label]
        plans.sort(key=lambda p: (p.label != entry["chosen"], math.inf if p.ms is None else p.ms))
        return cached

    def decide(self, program: Program, store: TuneCache, ctx: PassContext | None = None) -> list[Decision]:
        """A decision for every tunable op of ``program``, from ``store`` or measured (and stored);
        in a training program (``ctx.training``) each op's forward and backward pass are timed
        together."""
        ctx = ctx or PassContext()
        env, training = self._sizes(program, ctx), ctx.training
        device, version = device_kind(), jax.__version__
        ops = [op for op in program.walk() if op.type in TUNABLE]
        signatures = [self._signature(op, env, training) for op in ops]
        keys = [cache_key(signature, device, version) for signature in signatures]
        entries, pending = {}, {}  # the cache's entries; the ops to time (once per signature)
        for op, signature, key in zip(ops, signatures, keys):
            if key in entries or key in pending:
                continue
            entry = store.lookup(key, signature, self._candidates(op.type))
            if entry is None:
                pending[key] = (op, signature)
            else:
                entries[key] = entry
        # two waves: first one op of each kind the cache knows nothing about, every candidate
        # timed; then the rest, ranked by what the first wave measured (top_k of them timed)
        first, kinds = {}, set()
        for key, (op, signature) in pending.items():
            kind = op_class(signature)
            if kind not in kinds and not learned_speedups(store, signature):
                first[key] = (op, signature)
            kinds.add(kind)
        waves = [first, {k: v for k, v in pending.items() if k not in first}]
        bar = self._progress_bar(len(pending))
        for wave in waves:
            trials = {key: self._trial(op, signature, store) for key, (op, signature) in wave.items()}
            # a wave's candidates compile at once, so that a slow compile (Winograd's) never
            # leaves a core idle; then each op is timed alone
            bar.set_description("autotune (compiling)")
            compiled = compile_all({(key, c): build for key, trial in trials.items()
                                    for c, build in trial.builds.items()})
            bar.set_description("autotune")
            for key, trial in trials.items():
                times = self._race(trial, {c: compiled[key, c] for c in trial.builds}, store)
                timed = {c: t for c, t in times.items() if t is not None}
                entries[key] = {"signature": trial.signature, "device": device, "jax": version, "times_ms": times,
                                "chosen": min(timed, key=timed.get)}
                store.store(key, entries[key])
                bar.update()
        bar.close()
        decisions, seen = [], set()
        for op, signature, key in zip(ops, signatures, keys):  # an op like one timed before: served by it
            decisions.append(Decision(op, signature, entries[key]["times_ms"], entries[key]["chosen"],
                                      key not in pending or key in seen))
            seen.add(key)
        return decisions

    def _sizes(self, program: Program, ctx: PassContext) -> dict:
        """The symbolic sizes to time at: the ``sizes`` option, else the context's (the batch a
        Trainer saw), else 1."""
        return size_env(program, {**ctx.sizes, **parse_sizes(self.sizes)})

    def _candidates(self, op_type: str) -> list[str]:
        excluded = {name.strip() for name in self.exclude.split(",")} - {DEFAULT}
        return [c for c in candidates(op_type, self.reduced_precision) if c not in excluded]

    def _signature(self, op: Op, env: dict, training: bool) -> dict:
        signature = op_signature(op, env)
        if training:  # the kernels' backward passes differ more than their forward ones
            signature["training"] = True
        # separate entries: with reduced precision or constant weights the choice may differ
        if self.reduced_precision:
            signature["reduced_precision"] = True
        if self.frozen:
            constant = [i for i, v in enumerate(op.operands) if v.producer is not None
                        and v.producer.type in ("param", "constant")]
            if constant:
                signature["constant_operands"] = constant
        return signature

    def _progress_bar(self, total: int):
        """A bar over the ``total`` ops to time, with their rate and the time left; disabled
        unless ``progress`` and there are at least :data:`PROGRESS_MIN_OPS`."""
        from tqdm.auto import tqdm

        # left unset otherwise, so that tqdm's TQDM_DISABLE still applies
        quiet = {"disable": True} if not self.progress or total < PROGRESS_MIN_OPS else {}
        return tqdm(total=total, desc="autotune", unit="op", leave=False, **quiet)

    def _trial(self, op: Op, signature: dict, store: TuneCache) -> Trial:
        """The op's candidates to time on random inputs of its shapes: not one over the
        workspace limit, ranked below ``top_k`` by what the cache has measured on ops like this
        one (:func:`learned_speedups`) or else by the op library's estimate
        (:func:`predicted_speedups`), expected to be a clear loss (:data:`EXPECTED_LOSS`), or
        computing as the default does there. The default is timed too, so there is always a
        choice, unless another kernel is and the cache shows the default hopeless on ops of
        this kind (:func:`hopeless_default`)."""
        opdef = registry.get(op.type)
        attrs = _kernel_attrs(signature)
        rng = np.random.default_rng(0)
        arrays = [jax.numpy.asarray(rng.standard_normal(shape, np.float32), dtype)
                  for shape, dtype in zip(signature["shapes"], signature["dtypes"])]
        constant = set(signature.get("constant_operands", ()))
        args = tuple(a for i, a in enumerate(arrays) if i not in constant)

        def call(kernel, *variable):  # constant operands compiled in, as frozen parameters are
            operands, rest = [], iter(variable)
            for i, a in enumerate(arrays):
                operands.append(a if i in constant else next(rest))
            return kernel(*operands, **attrs)

        if signature.get("training"):
            # the first output and the gradients of every float operand (the other outputs of
            # an op with several are statistics and state, as batch norm's, not differentiated)
            floats = tuple(i for i, a in enumerate(args) if jax.numpy.issubdtype(a.dtype, jax.numpy.floating))
            forward = call
            call = lambda kernel, *variable: jax.value_and_grad(  # noqa: E731
                lambda *v: _square_sum(jax.tree.leaves(forward(kernel, *v))[0]), argnums=floats)(*variable)

        limit = self.workspace_mb * 2 ** 20
        predicted = predicted_speedups(signature)
        speedups = {**predicted, **learned_speedups(store, signature)}
        others = [c for c in self._candidates(op.type) if c != DEFAULT]
        # with no estimate and never measured on ops like this: first in line; then the fastest
        others.sort(key=lambda c: -(speedups.get(c) or math.inf))
        known = [c for c in others if speedups.get(c) is not None]
        skipped = {c for c in others if limit and workspace_bytes(c, signature) > limit
                   or c in predicted and predicted[c] is None
                   or self.top_k and (c in known[self.top_k:] or c in known and speedups[c] < EXPECTED_LOSS)}
        # the default last: a slow one (XLA's int8 convolution takes seconds a call) must not
        # use up the op's time before the kernels ranked first are timed
        timed = [c for c in others if c not in skipped]
        if not (timed and self.top_k and hopeless_default(store, signature)):
            timed.append(DEFAULT)
        builds = {c: lambda c=c: jax.jit(functools.partial(call, opdef.bind if c == DEFAULT else opdef.variants[c])
                                         ).lower(*args).compile() for c in timed}
        return Trial(signature, args, [DEFAULT, *others], builds)

    def _race(self, trial: Trial, fns: dict, store: TuneCache) -> dict[str, float | None]:
        """Low-quartile milliseconds of each of ``trial``'s compiled candidates ``fns``, in their ranked
        order with the default last; ``None`` for one not timed or not reached before the op's
        deadline. A candidate stops being timed once it is clearly slower than the best so far.
        The default is timed unless another kernel was and ``store`` shows it hopeless on ops
        of this kind (:func:`hopeless_default`; unless ``top_k=0``, which times everything)."""
        deadline = time.perf_counter() + self.max_seconds if self.max_seconds else math.inf
        times: dict[str, float | None] = dict.fromkeys(trial.candidates)
        for c in trial.builds:
            if c != DEFAULT and time.perf_counter() > deadline:
                continue
            best = min((t for t in times.values() if t is not None), default=math.inf)
            if c == DEFAULT and best < math.inf and self.top_k and hopeless_default(store, trial.signature):
                continue
            times[c] = 1e3 * measure(c, fns[c], trial.args, warmup=self.warmup, repeats=self.repeats,
                                     deadline=deadline, slower_than=RACE_MARGIN * best / 1e3)
        return times
