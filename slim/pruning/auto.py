"""``AutoPruner``: per-group pruning ratios found by simulated annealing under a FLOPs target
(PaddleSlim's auto pruner; its defaults: initial temperature 100, reduce rate 0.85).

Each step perturbs the ratios of a few groups (a third of them, or one more), keeps only
proposals that remove at least the target fraction of FLOPs (retrying up to ``max_try_times``),
scores the pruned program with ``eval_fn`` (higher is better), and accepts a worse proposal with
probability ``exp((reward - current) / T)``, ``T`` shrinking by ``reduce_rate`` each step (the
annealing of :mod:`paddlejax.slim.nas.annealing`, which the architecture search shares). Seeded;
with ``checkpoint`` the search state is saved after every step and a new search resumes from it.

FLOPs are not time: on a CPU a network cut to half its FLOPs by one ratio may run barely
faster, or slower, than the original (odd channel counts fit the vector units badly). With
``speedup`` a proposal must also run that many times faster than the original on this device
(batch ``batch_size``, weights frozen into the executable as the Predictor runs them; medians
of interleaved calls), and ``round_to`` keeps channel counts the kernels like. Timings make
such a search depend on the machine and its load, not only on the seed.

>>> import jax.numpy as jnp, numpy as np, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["a"])), p["b"]).mean((2, 3)),
...                 pj.InputSpec((None, 2, 6, 6)), params={"a": jnp.ones((8, 2, 3, 3)), "b": jnp.ones((3, 8, 1, 1))})
>>> best = AutoPruner(prog, lambda p: -float(np.asarray(p.params["a"]).size), pruned_flops=0.3,
...                   search_steps=5, seed=0, progress=False).search()
>>> best.flops_removed >= 0.3
True
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import numpy as np

from paddlejax import analysis
from paddlejax.ir.core import Program
from paddlejax.slim.nas.annealing import Annealing
from paddlejax.slim.pruning.groups import ChannelGraph
from paddlejax.slim.pruning.pruner import prune


@dataclasses.dataclass
class SearchResult:
    """The best ratios found, the program they give, its reward and the FLOPs it removed;
    ``history`` holds ``(step, reward, accepted)`` for every step."""

    ratios: dict[str, float]
    program: Program
    reward: float
    flops_removed: float
    history: list[tuple[int, float, bool]]
    speedup: float | None = None  # measured against the original, when the search had a speed-up target


class AutoPruner:
    """Simulated annealing over per-group ratios (see the module docstring)."""

    def __init__(self, program: Program, eval_fn: Callable[[Program], float], *, pruned_flops: float = 0.5,
                 init_temperature: float = 100.0, reduce_rate: float = 0.85, search_steps: int = 300,
                 max_try_times: int = 300, min_ratio: float = 0.0, max_ratio: float = 0.9, step_size: float = 0.1,
                 criterion: str = "l1_norm", round_to: int = 1, speedup: float | None = None,
                 batch_size: int = 32, seed: int = 0, checkpoint: str | os.PathLike | None = None,
                 progress: bool = True):
        if not 0 < pruned_flops < 1:
            raise ValueError(f"AutoPruner: pruned_flops is the fraction of FLOPs to remove, in (0, 1); got {pruned_flops!r}")
        if speedup is not None and not (isinstance(speedup, (int, float)) and speedup > 1):
            raise ValueError(f"AutoPruner: speedup is a measured speed-up over the original, > 1; got {speedup!r}")
        if not 0 < reduce_rate < 1 or init_temperature <= 0:
            raise ValueError("AutoPruner: init_temperature must be positive and reduce_rate in (0, 1)")
        self.program, self.eval_fn = program, eval_fn
        self.pruned_flops, self.criterion, self.round_to = pruned_flops, criterion, round_to
        self.init_temperature, self.reduce_rate = init_temperature, reduce_rate
        self.search_steps, self.max_try_times = search_steps, max_try_times
        self.min_ratio, self.max_ratio, self.step_size = min_ratio, max_ratio, step_size
        self.seed, self.checkpoint, self.progress = seed, checkpoint, progress
        self.names = [g.producers[0] for g in ChannelGraph(program).groups()]
        if not self.names:
            raise ValueError(f"AutoPruner: {program.name} has no prunable group")
        self.sizes = {d: 1 for v in program.inputs for d in v.type.shape if isinstance(d, str)}
        self.base_flops = analysis.flops(program, self.sizes)
        self.speedup, self.batch_size = speedup, batch_size
        self._original = None  # the original, compiled, and inputs to time it on

    def measure_speedup(self, pruned: Program) -> float:
        """How many times faster ``pruned`` runs than the original here: the median over rounds
        of the two programs' times, called in turn (see the module doc)."""
        import math
        import statistics

        from paddlejax.passes.autotune import measure_programs, random_inputs

        if self._original is None:
            inputs = random_inputs(self.program, {d: self.batch_size for d in self.sizes})  # symbolic sizes: batch_size
            self._original = (self.program.compile(*inputs, freeze_params=True), inputs)
        original, inputs = self._original
        times = measure_programs({"original": original, "pruned": pruned.compile(*inputs, freeze_params=True)},
                                 tuple(inputs), warmup=2, repeats=30, deadline=math.inf)
        return statistics.median(a / b for a, b in zip(times["original"], times["pruned"]))

    def _fits(self, pruned: Program) -> bool:
        return self._removed(pruned) >= self.pruned_flops and \
            (self.speedup is None or self.measure_speedup(pruned) >= self.speedup)

    def _removed(self, pruned: Program) -> float:
        return 1 - analysis.flops(pruned, self.sizes) / self.base_flops

    def _propose(self, rng: np.random.Generator, ratios: np.ndarray) -> tuple[np.ndarray, Program] | None:
        new = ratios.copy()
        # a few groups at a time, sometimes one more: moving one group's share of the FLOPs to
        # another is a step that keeps to the targets
        count = min(len(new), int(rng.integers(1, max(1, len(new) // 3) + 2)))
        picked = rng.choice(len(new), size=count, replace=False)
        new[picked] = np.clip(new[picked] + rng.uniform(-self.step_size, self.step_size, len(picked)),
                              self.min_ratio, self.max_ratio)
        pruned = self._prune(new)
        return (new, pruned) if self._fits(pruned) else None

    def _prune(self, ratios: np.ndarray) -> Program:
        return prune(self.program, dict(zip(self.names, map(float, ratios))), criterion=self.criterion,
                     round_to=self.round_to)

    def _start(self, search: Annealing) -> None:
        """Begin at the best-rewarded of the first points that meet the targets along a few
        lines: one ratio for every group, and each group alone (a network whose time goes to one
        layer meets a speed-up target best by cutting that layer)."""
        lines = [np.ones(len(self.names))] + [row for row in np.eye(len(self.names))
                                              if self._removed(self._prune(row * self.max_ratio)) >= self.pruned_flops]
        best = None
        for line in lines:
            for ratio in np.linspace(0.05, self.max_ratio, 18):
                pruned = self._prune(line * ratio)
                if self._fits(pruned):
                    reward = float(self.eval_fn(pruned))
                    if best is None or reward > best[1]:
                        best = ((line * ratio).tolist(), reward)
                    break
        if best is None:
            raise RuntimeError(f"AutoPruner: even {self.max_ratio:.0%} of every group removes less than "
                               f"{self.pruned_flops:.0%} of the FLOPs" +
                               (f" or runs less than {self.speedup}x faster" if self.speedup else ""))
        search.start(*best)

    def search(self) -> SearchResult:
        """Run (or resume) the search; the best ratios and their pruned program."""
        from tqdm.auto import tqdm

        state = None
        if self.checkpoint is not None and os.path.exists(self.checkpoint):
            with open(self.checkpoint) as f:
                state = json.load(f)
            if state.pop("names", None) != self.names:
                raise ValueError(f"AutoPruner: {self.checkpoint} is the search of another program's groups")
        search = Annealing(self.init_temperature, self.reduce_rate, self.seed, state)
        if state is None:
            self._start(search)
        with tqdm(total=self.search_steps, initial=search.step, desc="auto-prune", unit="step",
                  disable=not self.progress) as bar:
            while search.step < self.search_steps:
                current = np.array(search.state["current"])
                proposed = search.propose(lambda rng: self._propose(rng, current), self.max_try_times)
                if proposed is None:
                    raise RuntimeError(f"AutoPruner: no proposal in {self.max_try_times} tries removes "
                                       f"{self.pruned_flops:.0%} of the FLOPs" +
                                       (f" and runs {self.speedup}x faster" if self.speedup else "") +
                                       "; raise max_ratio or lower the targets")
                ratios, pruned = proposed
                reward = float(self.eval_fn(pruned))
                search.update(ratios.tolist(), reward)
                bar.update(1)
                bar.set_postfix(reward=f"{reward:.4g}", best=f"{search.state['best_reward']:.4g}")
                if self.checkpoint is not None:
                    search.save(self.checkpoint, names=self.names)
        best = np.array(search.state["best"])
        program = self._prune(best)
        return SearchResult(dict(zip(self.names, map(float, best))), program, search.state["best_reward"],
                            self._removed(program), [tuple(h) for h in search.state["history"]],
                            self.measure_speedup(program) if self.speedup else None)
