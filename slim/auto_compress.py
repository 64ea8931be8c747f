"""Auto-compression (Paddle 2.3's ACT): from a saved program and unlabelled samples alone, try
compression strategies on this device and keep the one that meets a speed target with the
least output drift.

The original program is the teacher: every strategy that trains does so by distillation on its
outputs (mean squared difference), so no labels and no training code are needed. Candidates:

- ``ptq``: post-training int8 (histogram calibration on the samples);
- ``prune_distill``: structured pruning of ``prune_flops`` of the FLOPs (``l1_norm``; by default
  ``1 - 1/target_speedup``, what the target asks if time followed FLOPs), then distillation from
  the original;
- ``qat_distill``: fake-quantized (calibrated) and trained by distillation, then converted to int8;
- ``prune_distill+ptq``: the pruned, distilled program quantized after training.

Each candidate's latency is measured through a :class:`~paddlejax.inference.Predictor` (the
deployment path: optimised, frozen) at ``batch_size``, all candidates interleaved with the
original so that they share the machine's noise. Drift is measured on held-out samples (the
last ``holdout`` fraction, never trained or calibrated on): the relative error of the outputs
and, for 2-d outputs (logits), how often the top-1 class changes.

>>> import numpy as np, jax.numpy as jnp, paddlejax as pj
>>> w = np.random.default_rng(0).normal(size=(64, 64)).astype("float32")
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 64)), params={"w": w})
>>> x = np.random.default_rng(1).normal(size=(80, 64)).astype("float32")
>>> result = auto_compress(prog, [x], target_speedup=1.0, strategies=("ptq",), batch_size=8, progress=False)
>>> [c.name for c in result.candidates]
['original', 'ptq']
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from paddlejax._extras import new_figure
from paddlejax.ir.core import Program

STRATEGIES = ("ptq", "prune_distill", "qat_distill", "prune_distill+ptq")


@dataclasses.dataclass
class Candidate:
    """One strategy's result: its program, median latency (ms), speed-up over the original,
    drift on the held-out samples (``error``: relative L2 of the outputs; ``flips``: fraction
    of top-1 classes changed, None for outputs that are not logits), and the seconds spent."""

    name: str
    program: Program
    latency_ms: float = math.nan
    speedup: float = math.nan
    error: float = 0.0
    flips: float | None = None
    seconds: float = 0.0

    def drift(self) -> tuple[float, float]:
        return (self.flips or 0.0, self.error)


@dataclasses.dataclass
class CompressionResult:
    """What :func:`auto_compress` found: ``program`` (the chosen candidate's, the original if
    none met the target), ``chosen`` its name, every candidate measured, and whether the
    target was ``met`` (:func:`compress_with_config` has no target: None)."""

    program: Program
    chosen: str
    candidates: list[Candidate]
    target_speedup: float | None
    met: bool

    def table(self) -> str:
        """The candidates as a text table: latency, speed-up, drift, time spent, the choice marked."""
        lines = [f"{'candidate':<20}{'ms':>9}{'speed-up':>10}{'rel. error':>12}{'top-1 changed':>15}{'spent s':>9}"]
        for c in self.candidates:
            flips = "-" if c.flips is None else f"{c.flips:.2%}"
            mark = "  <- chosen" if c.name == self.chosen else ""
            lines.append(f"{c.name:<20}{c.latency_ms:>9.3f}{c.speedup:>9.2f}x{c.error:>12.4f}{flips:>15}"
                         f"{c.seconds:>9.1f}{mark}")
        if self.target_speedup is not None:
            verdict = "met" if self.met else "not met by any candidate: the original is kept"
            lines.append(f"target: {self.target_speedup:.2f}x speed-up, {verdict}")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> None:
        """Speed-up against output drift, one point per candidate, the target as a line."""
        fig = new_figure("CompressionResult.plot", figsize=(5.5, 4))
        ax = fig.subplots()
        for c in self.candidates:
            ax.scatter(c.error, c.speedup, s=60 if c.name == self.chosen else 30)
            ax.annotate(c.name, (c.error, c.speedup), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if self.target_speedup is not None:
            ax.axhline(self.target_speedup, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("relative output error on held-out samples")
        ax.set_ylabel("speed-up over the original")
        ax.set_title("auto-compression candidates")
        fig.tight_layout()
        fig.savefig(path, dpi=120)


def load_samples(source, program: Program) -> list[np.ndarray]:
    """The samples for ``program``'s inputs, in input order, from arrays (one per input), a dict
    by input name, an ``.npz`` file (keys by input name, or ``arr_0``... in order), an ``.npy``
    file (a one-input program), or a directory of ``<input name>.npy`` files. Never unpickles.

    >>> import numpy as np, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3), name="x"))
    >>> [a.shape for a in load_samples({"x": np.zeros((5, 3), "float32")}, prog)]
    [(5, 3)]
    """
    from paddlejax.arrays import npz_names, read_arrays

    names = [v.name for v in program.inputs]
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            source = {p.stem: read_arrays(str(p))[0] for p in sorted(path.glob("*.npy"))}
        elif path.suffix == ".npz":
            stored = npz_names(str(path))
            source = dict(zip(stored, read_arrays(str(path), stored)))
        elif path.suffix == ".npy":
            source = read_arrays(str(path))
        else:
            raise ValueError(f"auto_compress: samples must be a directory of .npy files, an .npz or an .npy file; "
                             f"got {path}")
    if isinstance(source, dict):
        if set(source) >= set(names):
            source = [source[n] for n in names]
        elif set(source) == {f"arr_{i}" for i in range(len(names))}:
            source = [source[f"arr_{i}"] for i in range(len(names))]
        else:
            raise ValueError(f"auto_compress: the samples name {sorted(source)}; the program's inputs are {names}")
    arrays = [np.asarray(a) for a in source]
    if len(arrays) != len(names):
        raise ValueError(f"auto_compress: {len(arrays)} sample arrays for {len(names)} inputs {names}")
    for v, a in zip(program.inputs, arrays):
        shape = v.type.shape
        if a.ndim != len(shape) or any(not isinstance(d, str) and d != n for d, n in zip(shape, a.shape)):
            raise ValueError(f"auto_compress: samples for input '{v.name}' have shape {a.shape}, the program "
                             f"takes {v.type}")
        if a.dtype.kind != np.dtype(v.type.dtype).kind:
            raise ValueError(f"auto_compress: samples for input '{v.name}' are {a.dtype}, the program takes "
                             f"{v.type.dtype}")
    if len({a.shape[0] for a in arrays}) != 1 or arrays[0].shape[0] < 2:
        raise ValueError(f"auto_compress: the sample arrays need one common number (>= 2) of rows, got "
                         f"{[a.shape[0] for a in arrays]}")
    return [a.astype(v.type.dtype) for v, a in zip(program.inputs, arrays)]


def auto_compress(program: Program | str | os.PathLike, samples, target_speedup: float = 1.5, *,
                  strategies: Sequence[str] = STRATEGIES, prune_flops: float | None = None, epochs: int = 3,
                  learning_rate: float = 2e-4, batch_size: int = 32, holdout: float = 0.2, repeats: int = 20,
                  seed: int = 0, progress: bool = True) -> CompressionResult:
    """Try ``strategies`` on ``program`` (or a saved program's path) with unlabelled ``samples``
    (see :func:`load_samples`) and keep the candidate that is at least ``target_speedup``
    times faster with the least drift (fewest top-1 changes, then smallest relative error).
    Training strategies distil from the original for ``epochs`` on the non-held-out samples
    (0: they are built without training).

    >>> import numpy as np, jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
    >>> auto_compress(prog, [np.ones((4, 3), "float32")], strategies=("nas",))
    Traceback (most recent call last):
    ...
    ValueError: auto_compress: unknown strategies ['nas']; choose among ptq, prune_distill, qat_distill, prune_distill+ptq
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"auto_compress: unknown strategies {unknown}; choose among {', '.join(STRATEGIES)}")
    if not 0 < holdout < 1:
        raise ValueError(f"auto_compress: holdout is the fraction of samples kept for measuring drift, in (0, 1); "
                         f"got {holdout!r}")
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"auto_compress: epochs must be an int >= 0 (0: no distillation), got {epochs!r}")
    if not target_speedup > 0:
        raise ValueError(f"auto_compress: target_speedup must be positive, got {target_speedup!r}")
    if prune_flops is None:
        prune_flops = min(0.9, max(0.1, 1 - 1 / target_speedup))
    if not 0 < prune_flops < 1:
        raise ValueError(f"auto_compress: prune_flops is the fraction of FLOPs to remove, in (0, 1); got {prune_flops!r}")
    work = _Work(program, samples, holdout, batch_size, epochs, learning_rate, prune_flops, seed, progress)
    original = work.original
    candidates = [Candidate("original", original)]
    for name in strategies:
        start = time.perf_counter()
        built = work.build(name)
        candidates.append(Candidate(name, built, seconds=time.perf_counter() - start))
        if progress:
            print(f"auto_compress: {name} built in {candidates[-1].seconds:.1f} s", file=sys.stderr)
    work.measure(candidates, repeats)
    best = choose(candidates, target_speedup)
    return CompressionResult(best.program, best.name, candidates, target_speedup, best is not candidates[0])


def choose(candidates: list[Candidate], target_speedup: float) -> Candidate:
    """Among the candidates after the first (the original), the one with the least drift of
    those at least ``target_speedup`` times faster; the original when none is.

    >>> import math
    >>> cs = [Candidate("original", None, speedup=1.0), Candidate("a", None, speedup=1.6, error=0.2),
    ...       Candidate("b", None, speedup=1.5, error=0.1), Candidate("c", None, speedup=3.0, error=0.1, flips=0.02)]
    >>> choose(cs, 1.5).name, choose(cs, 5.0).name
    ('b', 'original')
    """
    fast = [c for c in candidates[1:] if c.speedup >= target_speedup]
    return min(fast, key=Candidate.drift) if fast else candidates[0]


class _Work:
    """The strategies, sharing the original program, the sample split and the settings."""

    def __init__(self, program, samples, holdout, batch_size, epochs, learning_rate, prune_flops, seed, progress):
        from paddlejax.io import load

        self.original = program if isinstance(program, Program) else load(program)
        arrays = load_samples(samples, self.original)
        n = arrays[0].shape[0]
        split = min(n - 1, max(1, int(round(n * (1 - holdout)))))  # the held-out rows never train or calibrate
        self.train, self.held = [a[:split] for a in arrays], [a[split:] for a in arrays]
        self.batch_size, self.epochs, self.lr = batch_size, epochs, learning_rate
        self.prune_flops, self.seed, self.progress = prune_flops, seed, progress
        self.built: dict[str, Program] = {}

    def build(self, name: str) -> Program:
        if name not in self.built:
            self.built[name] = getattr(self, name.replace("+", "_"))()
        return self.built[name]

    def calibration(self, limit: int = 8) -> list[tuple]:
        rows = self.train[0].shape[0]
        return [tuple(a[i:i + self.batch_size] for a in self.train) for i in range(0, rows, self.batch_size)][:limit]

    def ptq(self, program: Program | None = None) -> Program:
        from paddlejax.slim.quant import quant_post

        return quant_post(program or self.original, self.calibration(), "hist", progress=self.progress)

    def prune_distill(self) -> Program:
        from paddlejax.slim.pruning import prune

        return self.distill(prune(self.original, flops=self.prune_flops))

    def prune_distill_ptq(self) -> Program:
        return self.ptq(self.build("prune_distill"))

    def qat_distill(self, program: Program | None = None) -> Program:
        from paddlejax.slim.quant import calibrate, convert, quant_aware

        program = program or self.original
        fake = quant_aware(program)
        calibrate(fake, self.calibration(), "hist", progress=self.progress)
        # the scales stay as calibrated: the weights learn around them (straight-through gradients)
        return convert(self.distill(fake, frozen=set(fake.params) - set(program.params)))

    def distill(self, student: Program, frozen=(), distillers: Sequence[dict] = ()) -> Program:
        """``student`` trained to reproduce the original on the training samples: its outputs
        (mean squared difference), or what ``distillers`` (PaddleSlim 1.x entries) pair up."""
        import optax

        import paddlejax as pj
        from paddlejax.slim.distill import DistillLayer, distill_loss, l2_loss, merge

        if self.epochs == 0:
            return student
        merged = merge(self.original, student)
        if distillers:
            for entry in distillers:
                _add_distiller(entry, self.original, student, merged)
        else:
            for t, s in zip(self.original.outputs, student.outputs):
                l2_loss(t, s, merged)
        layer = DistillLayer(merged, frozen=frozen)
        rows = self.train[0].shape[0]
        steps = max(1, self.epochs * (rows // self.batch_size))
        schedule = optax.warmup_cosine_decay_schedule(0.0, self.lr, max(1, steps // 10), steps)
        trainer = pj.Trainer(layer, optax.adamw(schedule, weight_decay=0.0), loss=distill_loss(task_weight=0.0),
                             grad_clip=1.0, progress=self.progress)
        trainer.fit((*self.train, np.zeros(rows, np.int32)), epochs=self.epochs, batch_size=self.batch_size,
                    seed=self.seed)
        return layer.student()

    def measure(self, candidates: list[Candidate], repeats: int) -> None:
        """Latency through Predictors, interleaved; drift on the held-out samples."""
        from paddlejax.inference import Config, Predictor
        from paddlejax.passes.autotune import measure_programs

        batch = [a[:self.batch_size] for a in self.held]
        if batch[0].shape[0] < self.batch_size:  # fewer held-out rows than a batch: repeat them
            batch = [np.resize(a, (self.batch_size, *a.shape[1:])) for a in batch]
        sizes = {d: (n,) for v, a in zip(self.original.inputs, batch) for d, n in zip(v.type.shape[1:], a.shape[1:])
                 if isinstance(d, str)}
        config = Config(max_batch_size=self.batch_size, batch_buckets=(self.batch_size,), size_buckets=sizes or None,
                        progress=False)
        predictors = {c.name: Predictor(c.program, config) for c in candidates}
        times = measure_programs({k: (lambda p=p: p(*batch)) for k, p in predictors.items()}, (), warmup=3,
                                 repeats=repeats, deadline=math.inf)
        reference = _outputs(predictors["original"], self.held, self.batch_size)
        base = statistics.median(times["original"])
        for c in candidates:
            c.latency_ms = 1e3 * statistics.median(times[c.name])
            c.speedup = base / statistics.median(times[c.name])
            c.error, c.flips = _drift(reference, _outputs(predictors[c.name], self.held, self.batch_size))


def _add_distiller(entry: dict, teacher: Program, student: Program, merged: Program) -> None:
    from paddlejax.slim import distill
    from paddlejax.slim.compress_config import feature

    where = f"distillers.{entry['name']}"
    weight = float(entry.get("distillation_loss_weight", 1.0))
    if entry["class"] == "FSPDistiller":
        pairs = list(zip(entry.get("teacher_pairs") or [], entry.get("student_pairs") or []))
        if not pairs or len(entry["teacher_pairs"]) != len(entry["student_pairs"]):
            raise ValueError(f"compress config: {where} needs as many teacher_pairs as student_pairs")
        for (t1, t2), (s1, s2) in pairs:
            distill.fsp_loss(feature(teacher, t1, where), feature(teacher, t2, where), feature(student, s1, where),
                             feature(student, s2, where), merged, weight=weight)
        return
    t = feature(teacher, entry.get("teacher_feature_map", "output"), where)
    s = feature(student, entry.get("student_feature_map", "output"), where)
    if entry["class"] == "L2Distiller":
        distill.l2_loss(t, s, merged, weight=weight)
    else:
        distill.soft_label_loss(t, s, merged, float(entry.get("teacher_temperature", 1.0)),
                                float(entry.get("student_temperature", 1.0)), weight=weight)


def compress_with_config(program: Program | str | os.PathLike, samples, config, *, batch_size: int = 32,
                         learning_rate: float = 2e-4, holdout: float = 0.2, repeats: int = 20, seed: int = 0,
                         progress: bool = True) -> CompressionResult:
    """Run a PaddleSlim 1.x compression config (a YAML path, text or mapping; see
    :mod:`paddlejax.slim.compress_config`) on ``program`` with unlabelled ``samples``: its
    pruning strategies in order, fine-tuning by distillation from the original for the
    compressor's ``epoch`` s, then its quantization; measured against the original.

    >>> import numpy as np, jax.numpy as jnp, paddlejax as pj
    >>> w = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 16)), params={"w": w})
    >>> x = np.random.default_rng(1).normal(size=(40, 16)).astype("float32")
    >>> config = {"strategies": {"q": {"class": "QuantizationStrategy"}}, "compressor": {"strategies": ["q"]}}
    >>> result = compress_with_config(prog, [x], config, batch_size=8, repeats=2, progress=False)
    >>> result.chosen, result.candidates[1].error < 0.05
    ('config', True)
    """
    from paddlejax.slim.compress_config import fidelity, read_config

    plan = read_config(config)
    work = _Work(program, samples, holdout, batch_size, plan.epochs, learning_rate, 0.5, seed, progress)
    original = work.original
    reference = _outputs(original, work.held, batch_size)

    def metric(candidate: Program) -> float:
        return fidelity(reference, _outputs(candidate, work.held, batch_size))

    current, distillers, quantization, pruned = original, [], None, False
    for strategy in plan.strategies:
        current, pruned = _run_strategy(strategy, current, metric, seed, progress, pruned)
        distillers = strategy.options["distillers"] if strategy.kind == "distillation" else distillers
        quantization = strategy.options if strategy.kind == "quantization" else quantization
    if plan.epochs > 0 and (pruned or distillers):
        current = work.distill(current, distillers=distillers)
    if quantization is not None:
        if quantization["train"] and plan.epochs > 0:
            current = work.qat_distill(current)
        else:
            current = work.ptq(current)
    candidates = [Candidate("original", original), Candidate("config", current)]
    work.measure(candidates, repeats)
    return CompressionResult(current, "config", candidates, None, True)


def _run_strategy(strategy, current: Program, metric, seed: int, progress: bool, pruned: bool):
    """One pruning strategy of a config applied to ``current``; others pass through."""
    from paddlejax.slim.pruning import AutoPruner, prune, prune_by_sensitivity, sensitivity

    o = strategy.options
    if strategy.kind == "light_nas":
        raise ValueError(f"compress config: strategies.{strategy.name} is a LightNASStrategy, which searches new "
                         f"networks in a search space rather than compressing a program; run it with "
                         f"pj.slim.nas.light_nas(config, search_space_configs)")
    if strategy.kind == "uniform":
        return prune(current, flops=o["target_ratio"], criterion=o["criterion"],
                     pruned_params=o.get("pruned_params")), True
    if strategy.kind == "sensitive":
        delta = float(o.get("delta_rate", 0.1))
        sens = sensitivity(current, metric, tuple(np.arange(delta, 1.0 - 1e-9, delta).round(6)),
                           criterion=o["criterion"], sensitivities_file=o.get("sensitivities_file"), progress=progress)
        if o.get("pruned_params"):
            sens = {k: v for k, v in sens.items() if re.fullmatch(o["pruned_params"], k)}
        try:
            return prune_by_sensitivity(current, sens, o["target_ratio"], o["criterion"])[0], True
        except ValueError:
            raise ValueError(f"compress config: strategies.{strategy.name} cannot reach target_ratio "
                             f"{o['target_ratio']} within the measured sensitivities") from None
    if strategy.kind == "auto":
        c = o["controller"]
        search = AutoPruner(current, metric, pruned_flops=o["target_ratio"],
                            init_temperature=float(c.get("init_temperature", 100.0)),
                            reduce_rate=float(c.get("reduce_rate", 0.85)), search_steps=int(c.get("max_iter_number", 300)),
                            min_ratio=float(o.get("min_ratio", 0.0)), max_ratio=float(o.get("max_ratio", 0.9)),
                            criterion=o["criterion"], seed=seed, progress=progress)
        return search.search().program, True
    return current, pruned


def _outputs(run, arrays: list[np.ndarray], batch_size: int) -> list[np.ndarray]:
    """The outputs of ``run`` (a Predictor or a program) on ``arrays``, batch by batch, joined."""
    import jax

    parts = [jax.tree_util.tree_leaves(run(*[a[i:i + batch_size] for a in arrays]))
             for i in range(0, arrays[0].shape[0], batch_size)]
    return [np.concatenate([np.asarray(p[k], np.float64) for p in parts]) for k in range(len(parts[0]))]


def _drift(reference: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float | None]:
    error = max(float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-12)) for r, g in zip(reference, got))
    first, other = reference[0], got[0]
    flips = float(np.mean(first.argmax(-1) != other.argmax(-1))) if first.ndim == 2 and first.shape[1] > 1 else None
    return error, flips
