"""``SAController``: PaddleSlim's simulated-annealing controller over integer tokens.

The first proposal is the initial tokens; every later one changes one token of the current
tokens to another value within its range and must satisfy ``constrain_func`` (if given); tokens
proposed before are passed over while the ``max_try_times`` draws find new ones. If no draw
meets the constraints, a RuntimeError says so. Rewards go to :meth:`SAController.update`, which follows
:class:`~paddlejax.slim.nas.annealing.Annealing`: a worse reward is accepted with probability
``exp((reward - current_reward) / T)``.

>>> sa = SAController([3, 3], init_tokens=[0, 0], seed=0)
>>> first = sa.next_tokens(); sa.update(first, 0.5)
True
>>> second = sa.next_tokens()
>>> first, sum(a != b for a, b in zip(first, second))
([0, 0], 1)
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from paddlejax.slim.nas.annealing import Annealing


def _bounds(range_table) -> tuple[list[int], list[int]]:
    """(lows, highs): Paddle's ``(lows, highs)`` pair, or a list of highs with lows of 0."""
    if isinstance(range_table, tuple) and len(range_table) == 2 and all(isinstance(r, (list, tuple))
                                                                        for r in range_table):
        lows, highs = (list(map(int, r)) for r in range_table)
    else:
        highs = list(map(int, range_table))
        lows = [0] * len(highs)
    if len(lows) != len(highs) or any(lo >= hi for lo, hi in zip(lows, highs)):
        raise ValueError(f"SAController: each token needs a range low < high, got {range_table!r}")
    return lows, highs


class SAController:
    """Simulated annealing over tokens ``t[i]`` in ``lows[i] <= t[i] < highs[i]``
    (``range_table``: a list of highs, or Paddle's ``(lows, highs)``). Paddle's arguments and
    defaults (``init_temperature`` 100, ``reduce_rate`` 0.85, ``max_try_times`` 300), plus
    ``seed``; ``state`` (a :meth:`state_dict`) resumes a search exactly.

    >>> sa = SAController([4], init_tokens=[0], constrain_func=lambda t: t[0] < 1)
    >>> sa.update(sa.next_tokens(), 1.0)
    True
    >>> sa.next_tokens()
    Traceback (most recent call last):
    ...
    RuntimeError: SAController: none of 300 proposals around [0] meets the constraints
    """

    def __init__(self, range_table, reduce_rate: float = 0.85, init_temperature: float = 100.0,
                 max_try_times: int = 300, init_tokens=None, constrain_func: Callable[[list[int]], bool] | None = None,
                 *, seed: int = 0, state: dict | None = None):
        self.lows, self.highs = _bounds(range_table)
        self.max_try_times = max_try_times
        self.constrain_func = constrain_func
        state = state or {}
        self.annealing = Annealing(init_temperature, reduce_rate, seed, state.get("annealing"))
        self.init_tokens = self.check(state.get("init_tokens", self.lows if init_tokens is None else init_tokens))
        self.searched = {tuple(t) for t in state.get("searched", [])}
        self._current_tokens: list[int] | None = None

    def check(self, tokens) -> list[int]:
        """``tokens`` as a list of ints, each within its range; else a ValueError naming the position."""
        tokens = list(tokens)
        if len(tokens) != len(self.highs):
            raise ValueError(f"SAController: expected {len(self.highs)} tokens, got {len(tokens)}")
        for i, (t, lo, hi) in enumerate(zip(tokens, self.lows, self.highs)):
            if not isinstance(t, (int, np.integer)) or not lo <= t < hi:
                raise ValueError(f"SAController: token {i} is {t!r}, outside {lo}..{hi - 1}")
        return [int(t) for t in tokens]

    @property
    def best_tokens(self) -> list[int] | None:
        """The tokens of the best reward so far."""
        return self.annealing.state["best"]

    @property
    def max_reward(self) -> float | None:
        """The best reward so far."""
        return self.annealing.state["best_reward"]

    @property
    def current_tokens(self) -> list[int] | None:
        """The tokens proposed last (Paddle's meaning); the annealing's current point is
        ``annealing.state["current"]``."""
        return self._current_tokens

    def neighbour(self, rng: np.random.Generator, tokens: list[int]) -> list[int]:
        """``tokens`` with one token (of those with a choice) changed to another of its values."""
        free = [i for i, (lo, hi) in enumerate(zip(self.lows, self.highs)) if hi - lo > 1]
        if not free:
            raise ValueError("SAController: every token has a single value; there is nothing to search")
        i = free[int(rng.integers(len(free)))]
        lo, n = self.lows[i], self.highs[i] - self.lows[i]
        new = list(tokens)
        new[i] = lo + (tokens[i] - lo + int(rng.integers(1, n))) % n
        return new

    def feasible_start(self, excess: Callable[[list[int]], float]) -> list[int]:
        """Make the initial tokens feasible: ``excess(tokens)`` says how far tokens are over the
        limits (0: within). From the initial tokens, up to ``max_try_times`` neighbours are drawn
        and the walk moves to each that is less over; a RuntimeError if it ends still over.

        >>> sa = SAController([8, 8], init_tokens=[7, 7], seed=0)
        >>> start = sa.feasible_start(lambda t: max(0, sum(t) - 4)); sum(start) <= 4, sa.init_tokens == start
        (True, True)
        """
        tokens, over = self.init_tokens, excess(self.init_tokens)
        for _ in range(self.max_try_times):
            if over == 0:
                break
            candidate = self.neighbour(self.annealing.rng, tokens)
            if (candidate_over := excess(candidate)) < over:
                tokens, over = candidate, candidate_over
        if over > 0:
            raise RuntimeError(f"SAController: no tokens within the constraints in {self.max_try_times} steps from "
                               f"{self.init_tokens} (the closest, {tokens}, is {over:.0%} over); raise the limits or "
                               f"give initial tokens that meet them")
        self.init_tokens = tokens
        return tokens

    def next_tokens(self) -> list[int]:
        """The next tokens to score: the initial ones first, then a neighbour of the current
        ones that meets the constraints -- one not proposed before if any of the draws finds
        one, else one proposed before (scored again)."""
        if self.annealing.state["current"] is None:
            if self.constrain_func is not None and not self.constrain_func(self.init_tokens):
                raise RuntimeError(f"SAController: the initial tokens {self.init_tokens} do not meet the constraints")
            tokens = self.init_tokens
        else:
            current, again = self.annealing.state["current"], []

            def draw(rng):
                tokens = self.neighbour(rng, current)
                if tuple(tokens) in self.searched:  # proposed before, so it met the constraints then
                    again.append(tokens)
                    return None
                return tokens if self.constrain_func is None or self.constrain_func(tokens) else None

            tokens = self.annealing.propose(draw, self.max_try_times) or (again[0] if again else None)
            if tokens is None:
                raise RuntimeError(f"SAController: none of {self.max_try_times} proposals around {current} meets "
                                   f"the constraints")
        self.searched.add(tuple(tokens))
        self._current_tokens = list(tokens)
        return list(tokens)

    def update(self, tokens, reward: float) -> bool:
        """Score ``tokens``; True if the search moved to them."""
        tokens = self.check(tokens)
        self.searched.add(tuple(tokens))
        return self.annealing.update(tokens, reward)

    def state_dict(self) -> dict:
        """The JSON-able state that ``SAController(..., state=...)`` resumes from."""
        return {"annealing": self.annealing.state, "init_tokens": self.init_tokens,
                "searched": sorted(list(t) for t in self.searched)}
