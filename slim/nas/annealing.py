"""Simulated annealing, shared by the architecture search (:class:`~paddlejax.slim.nas.SAController`)
and the auto pruner (:class:`~paddlejax.slim.pruning.AutoPruner`): PaddleSlim's rules, seeded,
with a JSON state that a later run resumes from.

A point is a JSON-able list (tokens, ratios). Each step the caller proposes a point near the
current one (:meth:`Annealing.propose` retries a bounded number of times), scores it, and
:meth:`Annealing.update` moves to it if the reward is not worse, or else with probability
``exp((reward - current) / T)``, the temperature ``T = init_temperature * reduce_rate ** step``
(PaddleSlim's defaults: 100 and 0.85). The best point is kept apart from the current one.

>>> search = Annealing(seed=0)
>>> search.update([1], 0.5), search.update([2], 0.7), search.update([3], -1e9)
(True, True, False)
>>> search.state["current"], search.state["best"], search.state["best_reward"], search.step
([2], [2], 0.7, 3)
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from paddlejax.files import write_together

T = TypeVar("T")


class Annealing:
    """The annealing state: ``step``, ``current`` / ``current_reward``, ``best`` /
    ``best_reward``, ``history`` (``[step, reward, accepted]`` per step) and the random
    generator's state, all in ``state`` (a JSON-able dict). ``state`` from a saved run resumes
    it exactly; ``seed`` then no longer matters.

    >>> draw = lambda rng: int(rng.integers(100))
    >>> a = Annealing(seed=3); a.update([0], 1.0)
    True
    >>> saved = json.loads(json.dumps(a.state))   # what a checkpoint file holds
    >>> a.propose(draw, tries=1) == Annealing(seed=99, state=saved).propose(draw, tries=1)
    True
    """

    def __init__(self, init_temperature: float = 100.0, reduce_rate: float = 0.85, seed: int = 0,
                 state: dict | None = None):
        if not 0 < reduce_rate < 1 or not init_temperature > 0:
            raise ValueError(f"simulated annealing needs init_temperature > 0 and reduce_rate in (0, 1); got "
                             f"{init_temperature!r} and {reduce_rate!r}")
        self.init_temperature, self.reduce_rate = float(init_temperature), float(reduce_rate)
        self.state = dict(state) if state is not None else {
            "step": 0, "rng": None, "current": None, "current_reward": None, "best": None, "best_reward": None,
            "history": []}
        self.rng = np.random.default_rng(seed)
        if self.state["rng"] is not None:
            self.rng.bit_generator.state = self.state["rng"]

    @property
    def step(self) -> int:
        """Steps scored so far."""
        return self.state["step"]

    @property
    def temperature(self) -> float:
        """The temperature of the next step."""
        return self.init_temperature * self.reduce_rate ** self.step

    def start(self, point: list, reward: float) -> None:
        """Begin at ``point`` scored ``reward`` (not a step: the first proposal is made around it)."""
        self.state.update(current=list(point), current_reward=float(reward), best=list(point),
                          best_reward=float(reward))

    def propose(self, draw: Callable[[np.random.Generator], T | None], tries: int) -> T | None:
        """The first of up to ``tries`` calls of ``draw(rng)`` that returns a proposal (not None);
        None if none did: the caller says why in its error."""
        for _ in range(tries):
            proposal = draw(self.rng)
            if proposal is not None:
                return proposal
        return None

    def update(self, point: list, reward: float) -> bool:
        """Score ``point``: move to it (returns True) when the reward is not worse than the
        current one, or by the annealing draw; the first point is always taken."""
        reward, current = float(reward), self.state["current_reward"]
        accept = current is None or reward >= current or \
            self.rng.random() < math.exp((reward - current) / max(self.temperature, 1e-12))
        if accept:
            self.state.update(current=list(point), current_reward=reward)
        if self.state["best_reward"] is None or reward > self.state["best_reward"]:
            self.state.update(best=list(point), best_reward=reward)
        self.state["step"] += 1
        self.state["history"].append([self.step, reward, bool(accept)])
        self.state["rng"] = self.rng.bit_generator.state
        return bool(accept)

    def save(self, path: str | os.PathLike, **extra) -> None:
        """Write the state (with ``extra`` keys beside it) to ``path`` atomically."""
        write_together({path: json.dumps({**extra, **self.state}).encode()})
