"""``SANAS``: PaddleSlim's simulated-annealing architecture search, in one process.

Ask for networks with :meth:`SANAS.next_archs`, score them, report with :meth:`SANAS.reward`;
the :class:`~paddlejax.slim.nas.controller.SAController` proposes the next tokens (one token
changed, within the ``flops`` and ``latency`` limits). Every reward is logged (``history``,
and a line on the ``paddlejax.slim.nas`` logger) and, with ``save_checkpoint``, the search
state is written atomically to that JSON file; ``load_checkpoint`` resumes it, and the resumed
search proposes what the uninterrupted one would have.

>>> from paddlejax.slim.nas import SANAS
>>> config = {"input_size": 8, "output_size": 1, "block_num": 2, "input_channels": 1, "class_dim": 10}
>>> nas = SANAS([("MobileNetV2Space", config)], search_steps=3, seed=0, flops=150_000)
>>> while not nas.done:
...     archs = nas.next_archs()                      # one network per search space
...     accepted = nas.reward(-nas.measures()["flops"] / 1e5)   # a stand-in score: fewer FLOPs is better
>>> info = nas.current_info()
>>> sorted(info), info["best_reward"] == max(h["reward"] for h in nas.history)
(['best_reward', 'best_tokens', 'current_tokens'], True)
"""
from __future__ import annotations

import json
import logging
import math
import os

from paddlejax import nn
from paddlejax.files import FileReadError, read_regular, write_together
from paddlejax.slim.nas.constraints import Constraint
from paddlejax.slim.nas.controller import SAController
from paddlejax.slim.nas.latency import LatencyTable
from paddlejax.slim.nas.search_space import search_space

CHECKPOINT_FORMAT = "paddlejax-sanas"
CHECKPOINT_VERSION = 1
MAX_CHECKPOINT_BYTES = 256 << 20
LOCAL_HOSTS = ("", None, "127.0.0.1", "localhost", "::1")
logger = logging.getLogger("paddlejax.slim.nas")


def _local_only(server_addr, is_server: bool) -> None:
    """Refuse Paddle's remote-controller settings: the controller runs in this process."""
    if not is_server:
        raise ValueError("SANAS: is_server=False asks for a controller in another process, which is not "
                         "supported; the controller runs in this process (leave is_server=True)")
    host = server_addr[0] if isinstance(server_addr, (tuple, list)) and server_addr else server_addr
    if host not in LOCAL_HOSTS:
        raise ValueError(f"SANAS: server_addr {server_addr!r} names another machine; the search runs in this "
                         f"process only (server_addr is accepted for Paddle's signature and its port is ignored)")


def _plain(configs) -> list:
    """``configs`` as JSON would give them back: a list of ``[name, {arguments}]``."""
    if isinstance(configs, tuple) and len(configs) == 2 and isinstance(configs[0], str):
        configs = [configs]
    return json.loads(json.dumps([list(c) for c in configs]))


class SANAS:
    """Simulated-annealing search over the tokens of the spaces in ``configs`` (Paddle's
    ``[(name, {input_size, output_size, block_num, ...})]``), with Paddle's arguments:

    - ``init_temperature`` (100), ``reduce_rate`` (0.85): the annealing schedule;
      ``search_steps``: how many networks are scored; ``init_tokens``: where to start (default:
      the spaces' initial tokens; if they break a limit, a walk through neighbours finds
      tokens that meet it, or a RuntimeError says it found none).
    - ``save_checkpoint`` / ``load_checkpoint``: JSON file paths (Paddle's are folders);
      None saves nothing / starts afresh.
    - ``server_addr`` and ``is_server`` are accepted for Paddle's signature: the controller
      always runs in this process; a non-local address or ``is_server=False`` is refused and
      the port is ignored.

    and ours: ``seed``; ``flops`` (at most that many FLOPs per image) and ``latency`` (at most
    that many milliseconds per batch on this device, predicted by ``latency_table``, by default
    a :class:`~paddlejax.slim.nas.latency.LatencyTable` in the user cache); ``max_try_times``
    (draws per proposal before giving up). The networks of step ``k`` are initialised after
    ``pj.nn.seed(seed + k)``, so a resumed search trains the same networks.
    """

    def __init__(self, configs, server_addr=("", 8881), init_temperature: float = 100, reduce_rate: float = 0.85,
                 search_steps: int = 300, init_tokens=None, save_checkpoint: str | os.PathLike | None = None,
                 load_checkpoint: str | os.PathLike | None = None, is_server: bool = True, *, seed: int = 0,
                 flops: float | None = None, latency: float | None = None, latency_table: LatencyTable | None = None,
                 max_try_times: int = 300):
        _local_only(server_addr, is_server)
        self.configs = _plain(configs)
        self.space = search_space([tuple(c) for c in self.configs])
        self.search_steps, self.seed, self.save_checkpoint = search_steps, seed, save_checkpoint
        self._flops = Constraint.flops(self.space, math.inf if flops is None else flops)
        self.constraints = [] if flops is None else [self._flops]
        if latency is not None:
            self.constraints.append(Constraint.latency(self.space, latency, latency_table or LatencyTable()))
        state = self._load(load_checkpoint) if load_checkpoint is not None else None
        self.controller = SAController(self.space.range_table(), reduce_rate, init_temperature, max_try_times,
                                       self.space.init_tokens() if init_tokens is None else init_tokens,
                                       self.feasible if self.constraints else None, seed=seed,
                                       state=state and state["controller"])
        self._records: list[dict] = state["records"] if state else []
        if state is None and not self.feasible(self.controller.init_tokens):
            self.controller.feasible_start(lambda t: sum(c.excess(t) for c in self.constraints))
        self._pending: list[int] | None = None

    # -- checkpoints ----------------------------------------------------------------------
    def _load(self, path) -> dict:
        try:
            state = json.loads(read_regular(path, limit=MAX_CHECKPOINT_BYTES))
        except (FileReadError, ValueError) as e:
            raise ValueError(f"SANAS: cannot resume from {path}: {e}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"SANAS: {path} is not a SANAS checkpoint")
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"SANAS: {path} has version {state.get('version')!r}; this reads version "
                             f"{CHECKPOINT_VERSION}")
        if state.get("configs") != self.configs:
            raise ValueError(f"SANAS: {path} is the search of {state.get('configs')!r}, not of {self.configs!r}")
        return state

    def _save(self) -> None:
        state = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "configs": self.configs,
                 "controller": self.controller.state_dict(), "records": self._records}
        write_together({self.save_checkpoint: json.dumps(state).encode()})

    # -- Paddle's methods -----------------------------------------------------------------
    @property
    def step(self) -> int:
        """Networks scored so far."""
        return self.controller.annealing.step

    @property
    def done(self) -> bool:
        """Whether ``search_steps`` networks have been scored."""
        return self.step >= self.search_steps

    def feasible(self, tokens) -> bool:
        """Whether ``tokens`` meet every limit."""
        return all(c(tokens) for c in self.constraints)

    def measures(self, tokens=None) -> dict[str, float]:
        """The constrained quantities of ``tokens`` (default: the last proposed), e.g.
        ``{"flops": 182960}``; FLOPs are counted even without a FLOPs limit."""
        tokens = self.controller.current_tokens if tokens is None else tokens
        return {"flops": self._flops.measure(tokens), **{c.name: c.measure(tokens) for c in self.constraints}}

    def next_archs(self) -> list[nn.Layer]:
        """The networks (one per search space) of the next tokens to score."""
        if self.done:
            raise RuntimeError(f"SANAS: all {self.search_steps} search steps are done")
        self._pending = self.controller.next_tokens()
        logger.info("SANAS step %d: tokens %s", self.step + 1, self._pending)
        nn.seed(self.seed + self.step)
        return self.tokens2arch(self._pending)

    def reward(self, score: float) -> bool:
        """Report the score of the networks from :meth:`next_archs`; returns whether the search
        moved to them (Paddle returns whether its server took the score)."""
        if self._pending is None:
            raise RuntimeError("SANAS.reward: call next_archs() first")
        tokens, self._pending = self._pending, None
        record = {"tokens": tokens, **{c.name: c.measure(tokens) for c in self.constraints}}
        accepted = self.controller.update(tokens, score)
        self._records.append(record)
        logger.info("SANAS step %d: reward %.6g (%s), best %.6g", self.step, score,
                    "accepted" if accepted else "rejected", self.controller.max_reward)
        if self.save_checkpoint is not None:
            self._save()
        return accepted

    def tokens2arch(self, tokens) -> list[nn.Layer]:
        """The networks of ``tokens``, one per search space."""
        return self.space.token2arch(tokens)

    def current_info(self) -> dict:
        """``best_tokens``, ``best_reward`` (the best so far) and ``current_tokens`` (the last proposed)."""
        return {"best_tokens": self.controller.best_tokens, "best_reward": self.controller.max_reward,
                "current_tokens": self.controller.current_tokens}

    # -- what the search did ----------------------------------------------------------------
    @property
    def history(self) -> list[dict]:
        """One dict per scored step: ``step``, ``tokens``, ``reward``, ``accepted``, the best
        reward so far and the constrained quantities."""
        rows, best = [], None
        for (step, reward, accepted), record in zip(self.controller.annealing.state["history"], self._records):
            best = reward if best is None else max(best, reward)
            rows.append({"step": step, **record, "reward": reward, "accepted": accepted, "best_reward": best})
        return rows

    def search(self, score_fn) -> dict:
        """Run the remaining steps: ``score_fn(networks) -> float`` scores each proposal;
        returns :meth:`current_info`."""
        while not self.done:
            self.reward(float(score_fn(self.next_archs())))
        return self.current_info()

    def plot_rewards(self, path: str, title: str = "SANAS") -> str:
        """The reward of every step, as an image at ``path`` (:func:`plot_rewards`)."""
        return plot_rewards(self.history, path, title)


def plot_rewards(history: list[dict], path: str, title: str = "SANAS") -> str:
    """Reward per step (accepted and rejected steps marked apart) and the best so far, as an
    image at ``path``; returns ``path``.

    >>> import os, tempfile
    >>> path = plot_rewards([{"step": 1, "reward": 0.5, "accepted": True, "best_reward": 0.5},
    ...                      {"step": 2, "reward": 0.4, "accepted": False, "best_reward": 0.5}],
    ...                     os.path.join(tempfile.mkdtemp(), "rewards.png"))
    >>> os.path.getsize(path) > 1000
    True
    """
    from paddlejax.slim.figures import line_chart

    def draw(ax):
        for accepted, style, label in ((True, "o", "accepted"), (False, "x", "rejected")):
            steps = [h for h in history if h["accepted"] is accepted]
            ax.plot([h["step"] for h in steps], [h["reward"] for h in steps], style, label=label)
        ax.plot([h["step"] for h in history], [h["best_reward"] for h in history], "-", color="k", alpha=0.6,
                label="best so far")

    return line_chart(draw, path, "step", "reward", title, "plot_rewards")
