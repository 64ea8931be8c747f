"""Sensitivity analysis (PaddleSlim's ``sensitivity`` and ``get_ratios_by_loss``): how much a
metric drops when each group alone is pruned by each ratio, and the per-group ratios a loss
budget allows.

>>> sens = {"conv1": {0.1: 0.0, 0.3: 0.01, 0.5: 0.05}, "conv2": {0.1: 0.02, 0.3: 0.08, 0.5: 0.2}}
>>> get_ratios_by_loss(sens, 0.02)
{'conv1': 0.35, 'conv2': 0.1}
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from paddlejax.ir.core import Program
from paddlejax.slim.pruning.groups import ChannelGraph
from paddlejax.slim.pruning.pruner import prune


def sensitivity(program: Program, eval_fn: Callable[[Program], float], ratios: Sequence[float] = (0.1, 0.2, 0.3,
                0.4, 0.5, 0.6, 0.7, 0.8, 0.9), *, groups: Sequence[str] | None = None, criterion: str = "l1_norm",
                sensitivities_file: str | os.PathLike | None = None, progress: bool = True) -> dict:
    """``{producer: {ratio: loss}}``: the relative drop of ``eval_fn`` (higher is better, e.g.
    accuracy) when only that group (named by its first producer weight) is pruned by
    ``ratio``. With ``sensitivities_file`` (JSON), results already there are kept and each new
    one is written as it comes, so an interrupted analysis resumes."""
    from tqdm.auto import tqdm

    names = [g.producers[0] for g in ChannelGraph(program).groups()]
    if groups is not None:
        unknown = sorted(set(groups) - set(names))
        if unknown:
            raise ValueError(f"sensitivity: {unknown} name no prunable group; groups: {names}")
        names = [n for n in names if n in groups]
    results: dict = {}
    if sensitivities_file is not None and os.path.exists(sensitivities_file):
        with open(sensitivities_file) as f:
            results = {k: {float(r): float(v) for r, v in d.items()} for k, d in json.load(f).items()}
    baseline = float(eval_fn(program))
    todo = [(n, float(r)) for n in names for r in ratios if float(r) not in results.get(n, {})]
    for name, ratio in tqdm(todo, desc="sensitivity", unit="run", disable=not progress or not todo, leave=False):
        metric = float(eval_fn(prune(program, {name: ratio}, criterion=criterion)))
        results.setdefault(name, {})[ratio] = (baseline - metric) / baseline if baseline else baseline - metric
        if sensitivities_file is not None:
            tmp = f"{sensitivities_file}.tmp"
            with open(tmp, "w") as f:
                json.dump({k: {str(r): v for r, v in sorted(d.items())} for k, d in results.items()}, f, indent=1)
            os.replace(tmp, sensitivities_file)
    return {n: dict(sorted(results[n].items())) for n in names if n in results}


def get_ratios_by_loss(sensitivities: dict, loss: float) -> dict[str, float]:
    """Per group, the largest ratio whose loss stays within ``loss``, interpolated linearly
    between the measured ratios (PaddleSlim's rule); groups that lose more already at their
    smallest ratio are left out."""
    ratios = {}
    for name, points in sensitivities.items():
        items = sorted(points.items())
        best = None
        for i, (ratio, lost) in enumerate(items):
            if lost > loss:
                if i > 0:
                    (r0, l0), (r1, l1) = items[i - 1], (ratio, lost)
                    best = r0 + (loss - l0) * (r1 - r0) / (l1 - l0) if l1 != l0 else r0
                break
            best = ratio
        if best is not None:
            ratios[name] = round(best, 6)
    return ratios


def prune_by_sensitivity(program: Program, sensitivities: dict, flops: float, criterion: str = "l1_norm",
                         steps: int = 200) -> tuple[Program, float]:
    """``program`` pruned by the ratios of the smallest loss bound (searched in ``steps`` steps
    up to the largest measured loss) whose :func:`get_ratios_by_loss` removes at least ``flops``
    of the FLOPs (PaddleSlim's sensitive strategy), those ratios then scaled down together
    while they still do (groups that lose nothing would otherwise all go to their largest
    measured ratio and overshoot); returns the program and that bound.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> p = {"w1": jnp.ones((4, 2, 3, 3)), "w2": jnp.ones((3, 4, 3, 3))}
    >>> prog = pj.trace(lambda p, x: pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["w1"])), p["w2"]),
    ...                 pj.InputSpec((None, 2, 8, 8)), params=p)
    >>> small, bound = prune_by_sensitivity(prog, {"w1": {0.25: 0.0, 0.5: 0.1, 0.75: 0.3}}, 0.4)
    >>> small.params["w1"].shape[0], round(bound, 3)
    (2, 0.1)
    """
    from paddlejax import analysis

    sizes = {d: 1 for v in program.inputs for d in v.type.shape if isinstance(d, str)}
    goal = analysis.flops(program, sizes) * (1 - flops)
    top = max((lost for points in sensitivities.values() for lost in points.values()), default=0.0)
    def pruned(ratios, scale=1.0):
        return prune(program, ratios={k: v * scale for k, v in ratios.items()}, criterion=criterion) \
            if ratios else program

    for k in range(steps + 1):
        bound = top * k / steps
        ratios = get_ratios_by_loss(sensitivities, bound)
        best = pruned(ratios)
        if analysis.flops(best, sizes) <= goal:
            low, high = 0.0, 1.0
            for _ in range(10):  # bisection on the common scale of the ratios
                candidate = pruned(ratios, (low + high) / 2)
                if analysis.flops(candidate, sizes) <= goal:
                    high, best = (low + high) / 2, candidate
                else:
                    low = (low + high) / 2
            return best, bound
    raise ValueError(f"prune_by_sensitivity: the measured ratios cannot remove {flops:.0%} of the FLOPs; "
                     f"measure larger ratios")


def plot_sensitivity(sensitivities: dict, path: str, title: str = "sensitivity") -> str:
    """Loss against ratio, one line per group, as an image at ``path``; returns ``path``."""
    from paddlejax.slim.figures import line_chart

    def draw(ax):
        for name, points in sensitivities.items():
            ax.plot(list(points), [100 * v for v in points.values()], marker="o", label=name)

    return line_chart(draw, path, "pruned ratio", "metric lost (%)", title, "plot_sensitivity", legend_size=7)
