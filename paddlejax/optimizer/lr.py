"""Paddle's learning-rate schedulers (``paddle.optimizer.lr``) as optax schedules.

Each scheduler takes Paddle's arguments, with Paddle's names and defaults, and is an optax
schedule: called with a step count it returns the rate at that count (traceable, so it runs
inside the jitted step), which is what optax's ``learning_rate`` takes. Optax counts updates, so
a scheduler moves on every optimizer step, as under Paddle's ``Model.fit`` (which steps the
scheduler after every batch); scale the numbers (e.g. ``step_size=5 * steps_per_epoch``) to
decay per epoch. Paddle's eager interface is there too: ``step()`` advances ``last_epoch``, and
``scheduler()`` / ``last_lr`` / ``get_lr()`` give the current rate.

Where optax has the schedule it is used (``exponential_decay``, ``polynomial_schedule``,
``join_schedules``); the others follow Paddle's formulas where optax's differ (optax's
piecewise schedules change *after* a boundary, Paddle's *at* it; optax's cosine decay stops at
the end, Paddle's keeps cycling).

:class:`ReduceOnPlateau` depends on a measured value, not on the step count, so it is no optax
schedule: build the optimizer with ``optax.inject_hyperparams`` (which keeps the learning rate
in the optimizer state) and pass the scheduler to the Trainer as a callback; after every
evaluation it steps on the monitored value and writes its rate into the optimizer state.

>>> import optax
>>> sched = StepDecay(learning_rate=0.5, step_size=2, gamma=0.1)
>>> [round(float(sched(t)), 6) for t in range(5)]
[0.5, 0.5, 0.05, 0.05, 0.005]
>>> tx = optax.sgd(learning_rate=sched)          # an optax schedule as any other
>>> sched(), sched.step(), sched.step(), sched.last_epoch, round(sched(), 6)
(0.5, None, None, 2, 0.05)
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paddlejax.train.callbacks import Callback

__all__ = ["LRScheduler", "NoamDecay", "PiecewiseDecay", "NaturalExpDecay", "InverseTimeDecay", "PolynomialDecay",
           "LinearWarmup", "ExponentialDecay", "MultiStepDecay", "StepDecay", "LambdaDecay", "ReduceOnPlateau",
           "CosineAnnealingDecay", "OneCycleLR", "CyclicLR"]


def _positive_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{owner}: {name} expects a positive int, got {value!r}")
    return int(value)


def _rate(owner: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 0 \
            or not math.isfinite(value):
        raise ValueError(f"{owner}: {name} expects a finite non-negative number, got {value!r}")
    return float(value)


def _count_arg(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{owner}: {name} expects an int >= 0, got {value!r}")
    return int(value)


def _decay_factor(owner: str, name: str, value) -> float:
    value = _rate(owner, name, value)
    if not value < 1:
        raise ValueError(f"{owner}: {name} expects a number below 1 (the rate is multiplied by it), got {value!r}")
    return value


def _increasing(owner: str, name: str, values) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or not len(array) or not np.issubdtype(array.dtype, np.number) \
            or np.any(np.diff(array) <= 0):
        raise ValueError(f"{owner}: {name} expects a non-empty increasing list of step counts, got {values!r}")
    return array


class LRScheduler:
    """Base class: ``schedule(count)`` gives the rate at a step count; calling the scheduler
    with a count is that (an optax schedule), calling it without one gives the rate at
    ``last_epoch`` (Paddle's ``scheduler()``). A subclass defines :meth:`schedule` with jnp.

    >>> class Halving(LRScheduler):
    ...     def schedule(self, count):
    ...         return self.base_lr * 0.5 ** jnp.asarray(count, jnp.float32)
    >>> sched = Halving(1.0)
    >>> float(sched(3)), sched.last_epoch, sched()
    (0.125, 0, 1.0)
    """

    def __init__(self, learning_rate: float = 0.1, last_epoch: int = -1, verbose: bool = False):
        self.base_lr = _rate(type(self).__name__, "learning_rate", learning_rate)
        self.last_epoch, self.verbose = last_epoch, verbose
        self.step()

    def schedule(self, count) -> jax.Array:
        """The learning rate at step ``count`` (a jnp scalar; traceable)."""
        raise NotImplementedError(f"{type(self).__name__} defines no schedule(count)")

    def __call__(self, count=None):
        if count is None:
            return self.last_lr
        return self.schedule(count)

    def step(self, epoch: int | None = None) -> None:
        """Advance ``last_epoch`` by one (or set it to ``epoch``) and update ``last_lr``."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self.last_lr = self.get_lr()
        if self.verbose:
            print(f"Epoch {self.last_epoch}: {type(self).__name__} set learning rate to {self.last_lr}.")

    def get_lr(self) -> float:
        """The rate at ``last_epoch``."""
        return float(self.schedule(self.last_epoch))

    def state_dict(self) -> dict:
        """``{"last_epoch", "last_lr"}``, as Paddle saves a scheduler."""
        return {"last_epoch": self.last_epoch, "last_lr": self.last_lr}

    def set_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` gave."""
        self.last_epoch, self.last_lr = state["last_epoch"], state["last_lr"]


def _count(count) -> jax.Array:
    return jnp.asarray(count, jnp.float32)


class NoamDecay(LRScheduler):
    """``learning_rate * d_model**-0.5 * min(t**-0.5, t * warmup_steps**-1.5)`` (0 at t = 0),
    the Transformer's warm-up then inverse-square-root decay.

    >>> sched = NoamDecay(d_model=64, warmup_steps=4)
    >>> [round(float(sched(t)), 5) for t in (0, 1, 4, 16)]
    [0.0, 0.01562, 0.0625, 0.03125]
    """

    def __init__(self, d_model: int, warmup_steps: int, learning_rate: float = 1.0, last_epoch: int = -1,
                 verbose: bool = False):
        if not d_model > 0:
            raise ValueError(f"NoamDecay: d_model expects a positive number, got {d_model!r}")
        self.d_model = d_model
        self.warmup_steps = _positive_int("NoamDecay", "warmup_steps", warmup_steps)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        t = _count(count)
        a = jnp.where(t == 0, 1.0, jax.lax.rsqrt(jnp.maximum(t, 1.0)))
        return self.base_lr * self.d_model ** -0.5 * jnp.minimum(a, t * self.warmup_steps ** -1.5)


class PiecewiseDecay(LRScheduler):
    """``values[i]`` from step ``boundaries[i - 1]`` (inclusive) to ``boundaries[i]``.

    >>> sched = PiecewiseDecay(boundaries=[2, 4], values=[1.0, 0.5, 0.1])
    >>> [round(float(sched(t)), 6) for t in range(6)]
    [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    """

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], last_epoch: int = -1,
                 verbose: bool = False):
        self.boundaries = _increasing("PiecewiseDecay", "boundaries", boundaries)
        if len(values) != len(self.boundaries) + 1:
            raise ValueError(f"PiecewiseDecay: values expects one more element than boundaries "
                             f"({len(self.boundaries) + 1}), got {len(values)}")
        self.values = np.asarray([_rate("PiecewiseDecay", "values", v) for v in values], np.float32)
        super().__init__(self.values[0], last_epoch, verbose)

    def schedule(self, count):
        return jnp.asarray(self.values)[jnp.searchsorted(self.boundaries, _count(count), side="right")]


class NaturalExpDecay(LRScheduler):
    """``learning_rate * exp(-gamma * t)`` (optax's ``exponential_decay``).

    >>> round(float(NaturalExpDecay(0.5, gamma=0.1)(10)), 6)
    0.18394
    """

    def __init__(self, learning_rate: float, gamma: float, last_epoch: int = -1, verbose: bool = False):
        if not gamma > 0:
            raise ValueError(f"NaturalExpDecay: gamma expects a positive number, got {gamma!r}")
        self.gamma = float(gamma)
        self._optax = optax.exponential_decay(float(learning_rate), 1, math.exp(-self.gamma))
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self._optax(_count(count))


class InverseTimeDecay(LRScheduler):
    """``learning_rate / (1 + gamma * t)``.

    >>> float(InverseTimeDecay(0.5, gamma=0.1)(10))
    0.25
    """

    def __init__(self, learning_rate: float, gamma: float, last_epoch: int = -1, verbose: bool = False):
        self.gamma = _rate("InverseTimeDecay", "gamma", gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self.base_lr / (1 + self.gamma * _count(count))


class PolynomialDecay(LRScheduler):
    """``(learning_rate - end_lr) * (1 - t / decay_steps)**power + end_lr``, with ``t`` capped at
    ``decay_steps`` (optax's ``polynomial_schedule``); with ``cycle=True`` ``decay_steps``
    grows to the next multiple of itself above ``t`` instead, so the rate rises again.

    >>> sched = PolynomialDecay(1.0, decay_steps=4, end_lr=0.0, power=2.0)
    >>> [float(sched(t)) for t in (0, 2, 4, 8)]
    [1.0, 0.25, 0.0, 0.0]
    >>> [round(float(PolynomialDecay(1.0, 4, end_lr=0.0, cycle=True)(t)), 3) for t in (4, 5, 8)]
    [0.0, 0.375, 0.0]
    """

    def __init__(self, learning_rate: float, decay_steps: int, end_lr: float = 0.0001, power: float = 1.0,
                 cycle: bool = False, last_epoch: int = -1, verbose: bool = False):
        self.decay_steps = _positive_int("PolynomialDecay", "decay_steps", decay_steps)
        self.end_lr = _rate("PolynomialDecay", "end_lr", end_lr)
        if not power > 0:
            raise ValueError(f"PolynomialDecay: power expects a positive number, got {power!r}")
        self.power, self.cycle = float(power), bool(cycle)
        self._optax = optax.polynomial_schedule(float(learning_rate), self.end_lr, self.power, self.decay_steps)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        t = _count(count)
        if not self.cycle:
            return self._optax(t)
        steps = self.decay_steps * jnp.maximum(jnp.ceil(t / self.decay_steps), 1.0)
        return (self.base_lr - self.end_lr) * (1 - t / steps) ** self.power + self.end_lr


class LinearWarmup(LRScheduler):
    """From ``start_lr`` to ``end_lr`` linearly over ``warmup_steps``, then ``learning_rate``: a
    number, or a scheduler that starts counting when the warm-up ends (optax's
    ``linear_schedule`` and ``join_schedules``).

    >>> sched = LinearWarmup(StepDecay(0.5, step_size=2), warmup_steps=2, start_lr=0.0, end_lr=0.5)
    >>> [round(float(sched(t)), 6) for t in range(6)]
    [0.0, 0.25, 0.5, 0.5, 0.05, 0.05]
    """

    def __init__(self, learning_rate: float | Callable, warmup_steps: int, start_lr: float, end_lr: float,
                 last_epoch: int = -1, verbose: bool = False):
        self.warmup_steps = _positive_int("LinearWarmup", "warmup_steps", warmup_steps)
        self.start_lr, self.end_lr = _rate("LinearWarmup", "start_lr", start_lr), _rate("LinearWarmup", "end_lr",
                                                                                         end_lr)
        self.learning_rate = learning_rate
        after = learning_rate if callable(learning_rate) else optax.constant_schedule(
            _rate("LinearWarmup", "learning_rate", learning_rate))
        self._optax = optax.join_schedules(
            [optax.linear_schedule(self.start_lr, self.end_lr, self.warmup_steps), after], [self.warmup_steps])
        super().__init__(self.start_lr, last_epoch, verbose)

    def schedule(self, count):
        return self._optax(_count(count))


class ExponentialDecay(LRScheduler):
    """``learning_rate * gamma**t`` (optax's ``exponential_decay``).

    >>> round(float(ExponentialDecay(0.5, gamma=0.9)(3)), 6)
    0.3645
    """

    def __init__(self, learning_rate: float, gamma: float, last_epoch: int = -1, verbose: bool = False):
        self.gamma = _decay_factor("ExponentialDecay", "gamma", gamma)
        self._optax = optax.exponential_decay(float(learning_rate), 1, self.gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self._optax(_count(count))


class MultiStepDecay(LRScheduler):
    """``learning_rate * gamma**k`` where ``k`` counts the milestones reached (at or before ``t``).

    >>> sched = MultiStepDecay(0.5, milestones=[2, 4], gamma=0.1)
    >>> [round(float(sched(t)), 6) for t in (0, 1, 2, 3, 4, 9)]
    [0.5, 0.5, 0.05, 0.05, 0.005, 0.005]
    """

    def __init__(self, learning_rate: float, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False):
        self.milestones = _increasing("MultiStepDecay", "milestones", milestones)
        self.gamma = _decay_factor("MultiStepDecay", "gamma", gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        reached = jnp.searchsorted(self.milestones, _count(count), side="right")
        return self.base_lr * self.gamma ** reached.astype(jnp.float32)


class StepDecay(LRScheduler):
    """``learning_rate * gamma**(t // step_size)`` (optax's ``exponential_decay`` with ``staircase``).

    >>> [round(float(StepDecay(0.5, step_size=3, gamma=0.5)(t)), 6) for t in (0, 2, 3, 6)]
    [0.5, 0.5, 0.25, 0.125]
    """

    def __init__(self, learning_rate: float, step_size: int, gamma: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False):
        self.step_size = _positive_int("StepDecay", "step_size", step_size)
        self.gamma = _decay_factor("StepDecay", "gamma", gamma)
        self._optax = optax.exponential_decay(float(learning_rate), self.step_size, self.gamma, staircase=True)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self._optax(_count(count))


class LambdaDecay(LRScheduler):
    """``learning_rate * lr_lambda(t)``; ``lr_lambda`` must accept a jnp scalar (write it with
    ``jnp`` or arithmetic operators, not ``math``).

    >>> round(float(LambdaDecay(0.5, lr_lambda=lambda t: 0.95 ** t)(2)), 6)
    0.45125
    """

    def __init__(self, learning_rate: float, lr_lambda: Callable, last_epoch: int = -1, verbose: bool = False):
        if not callable(lr_lambda):
            raise TypeError(f"LambdaDecay: lr_lambda expects a function of the step, got {type(lr_lambda).__name__}")
        self.lr_lambda = lr_lambda
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self.base_lr * self.lr_lambda(_count(count))


class CosineAnnealingDecay(LRScheduler):
    """``eta_min + (learning_rate - eta_min) * (1 + cos(pi * t / T_max)) / 2``: down to
    ``eta_min`` at ``T_max``, then up again (Paddle's closed form; optax's cosine decay would
    stay at the bottom).

    >>> sched = CosineAnnealingDecay(1.0, T_max=4)
    >>> [round(float(sched(t)), 4) for t in (0, 2, 4, 6, 8)]
    [1.0, 0.5, 0.0, 0.5, 1.0]
    """

    def __init__(self, learning_rate: float, T_max: int, eta_min: float = 0, last_epoch: int = -1,  # noqa: N803
                 verbose: bool = False):
        self.T_max = _positive_int("CosineAnnealingDecay", "T_max", T_max)
        self.eta_min = _rate("CosineAnnealingDecay", "eta_min", eta_min)
        super().__init__(learning_rate, last_epoch, verbose)

    def schedule(self, count):
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + jnp.cos(jnp.pi * _count(count) / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """Up from ``max_learning_rate / divide_factor`` to ``max_learning_rate`` over the first
    ``phase_pct`` of ``total_steps``, then down to ``end_learning_rate`` (with ``three_phase``:
    back to the initial rate over as many steps first), by cosine or linear annealing. Past
    ``total_steps`` the rate stays at ``end_learning_rate`` (Paddle raises there).

    >>> sched = OneCycleLR(max_learning_rate=1.0, total_steps=10, anneal_strategy="linear", end_learning_rate=0.0)
    >>> [round(float(sched(t)), 3) for t in (0, 1, 2, 5, 9, 12)]
    [0.04, 0.52, 1.0, 0.571, 0.0, 0.0]
    """

    def __init__(self, max_learning_rate: float, total_steps: int, divide_factor: float = 25.0,
                 end_learning_rate: float = 0.0001, phase_pct: float = 0.3, anneal_strategy: str = "cos",
                 three_phase: bool = False, last_epoch: int = -1, verbose: bool = False):
        peak = _rate("OneCycleLR", "max_learning_rate", max_learning_rate)
        self.total_steps = _positive_int("OneCycleLR", "total_steps", total_steps)
        end = _rate("OneCycleLR", "end_learning_rate", end_learning_rate)
        if not 0 <= phase_pct <= (0.5 if three_phase else 1):
            raise ValueError(f"OneCycleLR: phase_pct expects a fraction in [0, {0.5 if three_phase else 1}]"
                             f"{' with three_phase' if three_phase else ''}, got {phase_pct!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy expects 'cos' or 'linear', got {anneal_strategy!r}")
        initial = peak / float(divide_factor)
        up = phase_pct * total_steps - 1
        # (first step, last step, start rate, end rate) of each phase, as Paddle lays them out
        if three_phase:
            self._phases = [(0, up, initial, peak), (up, 2 * up, peak, initial), (2 * up, total_steps - 1, initial, end)]
        else:
            self._phases = [(0, up, initial, peak), (up, total_steps - 1, peak, end)]
        self.anneal_strategy = anneal_strategy
        super().__init__(initial, last_epoch, verbose)

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2 * (jnp.cos(jnp.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, t, first, last, start, end):
        if last <= first:  # a phase of no steps (phase_pct * total_steps == 1) ends where it starts
            return jnp.full_like(t, end)
        return self._anneal(start, end, (t - first) / (last - first))

    def schedule(self, count):
        t = jnp.minimum(_count(count), self.total_steps - 1)
        rate = self._phase(t, *self._phases[-1])
        for phase in reversed(self._phases[:-1]):
            rate = jnp.where(t <= phase[1], self._phase(t, *phase), rate)
        return rate


class CyclicLR(LRScheduler):
    """Between ``base_learning_rate`` and ``max_learning_rate``: up over ``step_size_up`` steps,
    down over ``step_size_down`` (default the same), the amplitude scaled by ``mode``:
    ``"triangular"`` (1), ``"triangular2"`` (halved every cycle), ``"exp_range"``
    (``exp_gamma**t``), or by ``scale_fn`` of the cycle number (or the step, with
    ``scale_mode="iterations"``).

    >>> sched = CyclicLR(base_learning_rate=0.1, max_learning_rate=1.0, step_size_up=2, mode="triangular2")
    >>> [round(float(sched(t)), 3) for t in range(7)]
    [0.1, 0.55, 1.0, 0.55, 0.1, 0.325, 0.55]
    """

    def __init__(self, base_learning_rate: float, max_learning_rate: float, step_size_up: int,
                 step_size_down: int | None = None, mode: str = "triangular", exp_gamma: float = 1.0,
                 scale_fn: Callable | None = None, scale_mode: str = "cycle", last_epoch: int = -1,
                 verbose: bool = False):
        self.max_lr = _rate("CyclicLR", "max_learning_rate", max_learning_rate)
        up = _positive_int("CyclicLR", "step_size_up", step_size_up)
        down = up if step_size_down is None else _positive_int("CyclicLR", "step_size_down", step_size_down)
        self.cycle_size, self.step_up_pct = float(up + down), up / (up + down)
        if scale_fn is None and mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"CyclicLR: mode expects 'triangular', 'triangular2' or 'exp_range' (or pass scale_fn), "
                             f"got {mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"CyclicLR: scale_mode expects 'cycle' or 'iterations', got {scale_mode!r}")
        if scale_fn is None:
            gamma = float(exp_gamma)
            scale_fn, scale_mode = {"triangular": (lambda x: 1.0, "cycle"),
                                    "triangular2": (lambda x: 1 / 2.0 ** (x - 1), "cycle"),
                                    "exp_range": (lambda x: gamma ** x, "iterations")}[mode]
        self.mode, self.scale_fn, self.scale_mode = mode, scale_fn, scale_mode
        super().__init__(base_learning_rate, last_epoch, verbose)

    def schedule(self, count):
        t = _count(count)
        cycle = 1 + jnp.floor(t / self.cycle_size)
        pct = 1.0 + t / self.cycle_size - cycle
        factor = jnp.where(pct <= self.step_up_pct, pct / self.step_up_pct, (1 - pct) / (1 - self.step_up_pct))
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else t)
        return self.base_lr + (self.max_lr - self.base_lr) * factor * scale


class ReduceOnPlateau(LRScheduler, Callback):
    """Multiply the rate by ``factor`` when ``metrics`` (passed to :meth:`step`) has not improved
    for more than ``patience`` steps, then wait ``cooldown`` steps; never below ``min_lr``.

    With the Trainer it is a callback: it steps on ``monitor`` (an evaluation log, default
    ``"eval_loss"``) after every evaluation and writes its rate into the optimizer state, which
    must hold the learning rate (``optax.inject_hyperparams``); in Paddle's hapi this is the
    ``ReduceLROnPlateau`` callback.

    >>> import optax
    >>> plateau = ReduceOnPlateau(learning_rate=1.0, factor=0.5, patience=1)
    >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=plateau.base_lr)
    >>> for loss in (1.0, 0.9, 0.95, 0.95, 0.95, 0.95):
    ...     plateau.step(loss)
    >>> plateau.last_lr
    0.25
    """

    def __init__(self, learning_rate: float, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr: float = 0,
                 epsilon: float = 1e-8, verbose: bool = False, monitor: str = "eval_loss"):
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceOnPlateau: mode expects 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceOnPlateau: threshold_mode expects 'rel' or 'abs', got {threshold_mode!r}")
        self.mode, self.threshold_mode, self.monitor = mode, threshold_mode, monitor
        self.factor = _decay_factor("ReduceOnPlateau", "factor", factor)
        self.patience = _count_arg("ReduceOnPlateau", "patience", patience)
        self.cooldown = _count_arg("ReduceOnPlateau", "cooldown", cooldown)
        self.threshold = _rate("ReduceOnPlateau", "threshold", threshold)
        self.min_lr, self.epsilon = _rate("ReduceOnPlateau", "min_lr", min_lr), epsilon
        self.cooldown_counter, self.num_bad_epochs, self.best = 0, 0, None
        self.base_lr = self.last_lr = _rate("ReduceOnPlateau", "learning_rate", learning_rate)
        self.last_epoch, self.verbose = 0, verbose

    def schedule(self, count):
        raise TypeError("ReduceOnPlateau follows a measured value, not the step count, so it is no optax schedule: "
                        "pass learning_rate=scheduler.base_lr to optax.inject_hyperparams(...) and the scheduler "
                        "among the Trainer's callbacks")

    def step(self, metrics, epoch: int | None = None) -> None:
        """One observation of the monitored value (a number or a one-element array)."""
        value = float(np.asarray(metrics).reshape(()))
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            return
        if self.best is None or self._is_better(value, self.best):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.patience:
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
            new = max(self.last_lr * self.factor, self.min_lr)
            if self.last_lr - new > self.epsilon:
                self.last_lr = new
                if self.verbose:
                    print(f"Epoch {self.last_epoch}: ReduceOnPlateau set learning rate to {self.last_lr}.")

    def _is_better(self, current: float, best: float) -> bool:
        margin = best * self.threshold if self.threshold_mode == "rel" else self.threshold
        return current < best - margin if self.mode == "min" else current > best + margin

    def get_lr(self) -> float:
        return self.last_lr

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("cooldown_counter", "best", "num_bad_epochs", "last_epoch", "last_lr")}

    def set_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    def on_eval_end(self, trainer, logs: dict) -> None:
        if self.monitor not in logs:
            raise KeyError(f"ReduceOnPlateau: '{self.monitor}' is not logged; available: {sorted(logs)}")
        self.step(logs[self.monitor])
        found = optax.tree_utils.tree_get_all_with_path(trainer.state.opt, "learning_rate")
        if not found:
            raise ValueError("ReduceOnPlateau: the optimizer keeps no learning_rate in its state; build it with "
                             "optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)")
        old = found[0][1]
        new = jax.device_put(np.asarray(self.last_lr, old.dtype), old.sharding)
        trainer.state = trainer.state.replace(opt=optax.tree_utils.tree_set(trainer.state.opt, learning_rate=new))
