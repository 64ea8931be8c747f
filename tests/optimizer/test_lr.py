"""Paddle's learning-rate schedulers: each against Paddle's own formula (its ``get_lr``, written
out below in plain Python) at a range of steps, as an optax schedule, eagerly with ``step()``,
and inside the Trainer."""
import math

import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.optimizer import lr


# -- Paddle's formulas, step by step as paddle.optimizer.lr computes them -----------------------
def paddle_cosine(base, t_max, eta_min, steps):
    """Paddle's recursive CosineAnnealingDecay.get_lr, stepped from epoch 0."""
    out, last = [base], base
    for t in range(1, steps):
        if (t - 1 - t_max) % (2 * t_max) == 0:
            last = last + (base - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        else:
            last = (1 + math.cos(math.pi * t / t_max)) / (1 + math.cos(math.pi * (t - 1) / t_max)) \
                * (last - eta_min) + eta_min
        out.append(last)
    return out


def paddle_one_cycle(peak, total, divide=25.0, end=1e-4, pct=0.3, strategy="cos", three=False):
    initial = peak / divide
    if three:
        steps = [0, pct * total - 1, 2 * pct * total - 2, total - 1, total - 1]
        sizes = [steps[1] - steps[0], steps[2] - steps[1], steps[3] - steps[2], steps[3] - steps[2]]
        rates = [initial, peak, initial, end]
    else:
        steps = [0, pct * total - 1, total - 1, total - 1]
        sizes = [steps[1] - steps[0], steps[2] - steps[1], steps[2] - steps[1]]
        rates = [initial, peak, end]

    def anneal(a, b, p):
        return b + (a - b) / 2.0 * (math.cos(math.pi * p) + 1) if strategy == "cos" else (b - a) * p + a

    def get(t):
        for i, (end_step, size) in enumerate(zip(steps[1:], sizes)):
            if t <= end_step or i == len(rates) - 2:
                return anneal(rates[i], rates[i + 1], (t - steps[i]) / size)

    return [get(t) for t in range(total)]


def paddle_cyclic(base, peak, up, down=None, mode="triangular", gamma=1.0, steps=20):
    down = float(down if down is not None else up)
    size = up + down
    scale_fn, scale_mode = {"triangular": (lambda x: 1.0, "cycle"),
                            "triangular2": (lambda x: 1 / (2.0 ** (x - 1)), "cycle"),
                            "exp_range": (lambda x: gamma ** x, "iterations")}[mode]
    out = []
    for iterations in range(steps):
        cycle = 1 + iterations // size
        pct = 1.0 + iterations / size - cycle
        factor = pct / (up / size) if pct <= up / size else (1 - pct) / (1 - up / size)
        out.append(base + (peak - base) * factor * scale_fn(cycle if scale_mode == "cycle" else iterations))
    return out


def paddle_polynomial(base, decay_steps, end_lr, power, cycle, t):
    steps = decay_steps
    if cycle:
        steps = decay_steps * (1 if t == 0 else math.ceil(t / decay_steps))
    else:
        t = min(t, decay_steps)
    return (base - end_lr) * (1 - t / steps) ** power + end_lr


def paddle_noam(d_model, warmup, base, t):
    a = 1 if t == 0 else t ** -0.5
    return base * d_model ** -0.5 * min(a, warmup ** -1.5 * t)


def paddle_piecewise(boundaries, values, t):
    for i, b in enumerate(boundaries):
        if t < b:
            return values[i]
    return values[-1]


def paddle_multistep(base, milestones, gamma, t):
    for i, m in enumerate(milestones):
        if t < m:
            return base * gamma ** i
    return base * gamma ** len(milestones)


STEPS = 24
CASES = {
    "NoamDecay": (lr.NoamDecay(d_model=16, warmup_steps=5, learning_rate=2.0),
                  [paddle_noam(16, 5, 2.0, t) for t in range(STEPS)]),
    "PiecewiseDecay": (lr.PiecewiseDecay([3, 6, 9], [0.1, 0.2, 0.3, 0.4]),
                       [paddle_piecewise([3, 6, 9], [0.1, 0.2, 0.3, 0.4], t) for t in range(STEPS)]),
    "NaturalExpDecay": (lr.NaturalExpDecay(0.5, gamma=0.1), [0.5 * math.exp(-0.1 * t) for t in range(STEPS)]),
    "InverseTimeDecay": (lr.InverseTimeDecay(0.5, gamma=0.1), [0.5 / (1 + 0.1 * t) for t in range(STEPS)]),
    "PolynomialDecay": (lr.PolynomialDecay(0.5, decay_steps=10, power=2.0),
                        [paddle_polynomial(0.5, 10, 1e-4, 2.0, False, t) for t in range(STEPS)]),
    "PolynomialDecay(cycle)": (lr.PolynomialDecay(0.5, decay_steps=5, end_lr=0.01, cycle=True),
                               [paddle_polynomial(0.5, 5, 0.01, 1.0, True, t) for t in range(STEPS)]),
    "LinearWarmup": (lr.LinearWarmup(0.5, warmup_steps=8, start_lr=0.0, end_lr=0.5),
                     [0.5 * t / 8 if t < 8 else 0.5 for t in range(STEPS)]),
    "LinearWarmup(StepDecay)": (lr.LinearWarmup(lr.StepDecay(0.4, step_size=5, gamma=0.5), warmup_steps=4,
                                                start_lr=0.1, end_lr=0.4),
                                [0.1 + 0.3 * t / 4 if t < 4 else 0.4 * 0.5 ** ((t - 4) // 5) for t in range(STEPS)]),
    "ExponentialDecay": (lr.ExponentialDecay(0.5, gamma=0.9), [0.5 * 0.9 ** t for t in range(STEPS)]),
    "MultiStepDecay": (lr.MultiStepDecay(0.5, milestones=[2, 4, 6], gamma=0.8),
                       [paddle_multistep(0.5, [2, 4, 6], 0.8, t) for t in range(STEPS)]),
    "StepDecay": (lr.StepDecay(0.5, step_size=5, gamma=0.8), [0.5 * 0.8 ** (t // 5) for t in range(STEPS)]),
    "LambdaDecay": (lr.LambdaDecay(0.5, lr_lambda=lambda t: 0.95 ** t), [0.5 * 0.95 ** t for t in range(STEPS)]),
    "CosineAnnealingDecay": (lr.CosineAnnealingDecay(0.5, T_max=10, eta_min=0.05),
                             paddle_cosine(0.5, 10, 0.05, STEPS)),
    "OneCycleLR": (lr.OneCycleLR(1.0, total_steps=STEPS), paddle_one_cycle(1.0, STEPS)),
    "OneCycleLR(linear, three phases)": (
        lr.OneCycleLR(0.8, total_steps=STEPS, phase_pct=0.25, anneal_strategy="linear", three_phase=True,
                      end_learning_rate=0.001),
        paddle_one_cycle(0.8, STEPS, end=0.001, pct=0.25, strategy="linear", three=True)),
    "CyclicLR": (lr.CyclicLR(0.5, 1.0, step_size_up=3, step_size_down=5), paddle_cyclic(0.5, 1.0, 3, 5)),
    "CyclicLR(triangular2)": (lr.CyclicLR(0.1, 1.0, step_size_up=4, mode="triangular2"),
                              paddle_cyclic(0.1, 1.0, 4, mode="triangular2")),
    "CyclicLR(exp_range)": (lr.CyclicLR(0.1, 1.0, step_size_up=2, mode="exp_range", exp_gamma=0.9),
                            paddle_cyclic(0.1, 1.0, 2, mode="exp_range", gamma=0.9)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_follows_paddles_formula(name):
    scheduler, expected = CASES[name]
    got = [float(scheduler(t)) for t in range(len(expected))]
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["StepDecay", "CosineAnnealingDecay", "OneCycleLR"])
def test_eager_step_walks_the_same_schedule(name):
    scheduler, expected = CASES[name]
    seen = []
    for _ in range(10):
        seen.append(scheduler())
        scheduler.step()
    np.testing.assert_allclose(seen, expected[:10], rtol=2e-6, atol=1e-7)
    scheduler.set_state_dict({"last_epoch": 0, "last_lr": expected[0]})  # CASES are shared
    assert scheduler.state_dict() == {"last_epoch": 0, "last_lr": expected[0]}


def test_a_scheduler_is_an_optax_schedule_that_the_trainer_follows_and_logs():
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    schedule = lr.MultiStepDecay(0.4, milestones=[1, 3], gamma=0.5)
    t = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.inject_hyperparams(optax.sgd)(learning_rate=schedule),
                   progress=False, log_every=1)
    t.fit((x, y), epochs=1, batch_size=8)
    np.testing.assert_allclose(t.history.series("train", "lr")[1], [0.4, 0.2, 0.2, 0.1], rtol=1e-6)


def test_reduce_on_plateau_follows_paddles_rule():
    plateau = lr.ReduceOnPlateau(1.0, factor=0.5, patience=2, cooldown=1, threshold=0.1, min_lr=0.2)
    rates = []
    for loss in (1.0, 0.95, 0.92, 0.91, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5):
        plateau.step(loss)
        rates.append(plateau.last_lr)
    # 0.95, 0.92, 0.91 are within 10 % of 1.0: the third is one too many; then a cooldown step;
    # 0.5 is a new best; three more without improvement reduce again; the floor is min_lr
    assert rates == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25]
    plateau.step(0.5)
    assert plateau.last_lr == 0.2
    with pytest.raises(TypeError, match="no optax schedule: pass learning_rate=scheduler.base_lr"):
        plateau(3)


def test_reduce_on_plateau_as_a_trainer_callback_lowers_the_rate_in_the_optimizer_state():
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    plateau = lr.ReduceOnPlateau(0.5, factor=0.1, patience=0, threshold=10.0, threshold_mode="abs")
    t = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.inject_hyperparams(optax.sgd)(learning_rate=0.5),
                   callbacks=[plateau], progress=False, log_every=1)
    t.fit((x, y), eval=(x, y), epochs=3, batch_size=16)  # none improves by 10 on the first
    assert t.history.series("train", "lr")[1] == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.05, 0.05])
    assert plateau.last_lr == pytest.approx(0.005)  # the first evaluation sets the best
    with pytest.raises(ValueError, match="keeps no learning_rate in its state; build it with optax.inject"):
        pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.5), callbacks=[lr.ReduceOnPlateau(0.5)],
                   progress=False).fit((x, y), eval=(x, y), epochs=1, batch_size=16)


def test_one_cycle_with_a_warm_up_of_one_step_has_no_nan():
    # phase_pct * total_steps == 1: the rising phase has no steps, so step 0 is already at the peak
    sched = lr.OneCycleLR(1.0, total_steps=10, phase_pct=0.1, anneal_strategy="linear", end_learning_rate=0.0)
    assert [round(float(sched(t)), 4) for t in (0, 1, 9)] == [1.0, round(8 / 9, 4), 0.0]
    three = lr.OneCycleLR(1.0, total_steps=10, phase_pct=0.1, three_phase=True)
    assert np.isfinite([float(three(t)) for t in range(10)]).all() and float(three(0)) == 1.0


@pytest.mark.parametrize("make, message", [
    (lambda: lr.StepDecay(0.5, step_size=0), "StepDecay: step_size expects a positive int, got 0"),
    (lambda: lr.StepDecay(0.5, step_size=2, gamma=1.5), "StepDecay: gamma expects a number below 1"),
    (lambda: lr.PiecewiseDecay([3, 2], [1.0, 0.5, 0.1]), "boundaries expects a non-empty increasing list"),
    (lambda: lr.PiecewiseDecay([3], [1.0]), "values expects one more element than boundaries"),
    (lambda: lr.OneCycleLR(1.0, 10, phase_pct=0.6, three_phase=True), r"phase_pct expects a fraction in \[0, 0.5\]"),
    (lambda: lr.CyclicLR(0.1, 1.0, 2, mode="sine"), "CyclicLR: mode expects 'triangular'"),
    (lambda: lr.ReduceOnPlateau(0.1, mode="best"), "ReduceOnPlateau: mode expects 'min' or 'max'"),
    (lambda: lr.ExponentialDecay(-0.1, gamma=0.5), "learning_rate expects a finite non-negative number"),
    (lambda: lr.StepDecay(float("nan"), step_size=2), "StepDecay: learning_rate expects a finite non-negative number"),
    (lambda: lr.CosineAnnealingDecay(float("inf"), T_max=2), "learning_rate expects a finite non-negative number"),
    (lambda: lr.ReduceOnPlateau(0.1, patience="3"), "ReduceOnPlateau: patience expects an int >= 0, got '3'"),
    (lambda: lr.ReduceOnPlateau(0.1, cooldown=-1), "ReduceOnPlateau: cooldown expects an int >= 0, got -1"),
])
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()
