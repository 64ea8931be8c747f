"""Pipeline parallel: GPipe and 1F1B equal the sequential model; recompute; bubble; errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import paddlejax as pj
from paddlejax.distributed.pipeline import (BACKWARD, FORWARD, IDLE, PipelineRunner, bubble, make_schedule)
from paddlejax.passes.pipeline import split_stages

S, M, BATCH = 4, 8, 16


def model(p, x):
    """Four residual tanh blocks and a classifier head: 5 linear ops to spread over 4 stages."""
    for i in range(4):
        x = x + pj.ops.linear(x, p[f"w{i}"], p[f"b{i}"], act="tanh")
    return pj.ops.linear(x, p["head"])


def params(seed=0):
    rng = np.random.default_rng(seed)
    p = {f"w{i}": rng.normal(size=(8, 8)) / 3 for i in range(4)}
    p.update({f"b{i}": rng.normal(size=8) / 3 for i in range(4)}, head=rng.normal(size=(8, 3)))
    return {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}


def loss_fn(logits, labels):
    return pj.ops.cross_entropy(logits, labels)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(BATCH, 8)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=(BATCH, 1)))
    ref_loss, ref_grads = jax.value_and_grad(lambda p: loss_fn(model(p, x), y))(params())
    return x, y, ref_loss, ref_grads


def split():
    return split_stages(pj.trace(model, pj.InputSpec((None, 8)), params=params()), S)


def assert_close(got, want, tol=1e-5):
    for k in want:
        rel = float(jnp.linalg.norm(got[k] - want[k]) / jnp.linalg.norm(want[k]))
        assert rel <= tol, f"{k}: relative difference {rel}"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("recompute", [False, True])
def test_loss_and_grads_equal_the_sequential_model(data, schedule, recompute):
    x, y, ref_loss, ref_grads = data
    runner = PipelineRunner(split(), loss_fn, micro_batches=M, schedule=schedule, recompute=recompute)
    loss, grads, work = jax.jit(runner.run)(params(), x, y)
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    assert sorted(grads) == sorted(ref_grads)
    assert_close(grads, ref_grads)
    np.testing.assert_array_equal(np.asarray(work), runner.schedule.kind.T)  # ran as planned
    b = bubble(runner.schedule, work)
    assert b.theory == 3 / 11
    assert b.idle_share == (0.2727,) * 4


def test_recompute_gives_the_same_numbers(data):
    x, y, _, _ = data
    kept, recomputed = (jax.jit(PipelineRunner(split(), loss_fn, micro_batches=M, recompute=r).value_and_grad)(
        params(), x, y) for r in (False, True))
    assert float(kept[0]) == pytest.approx(float(recomputed[0]), rel=1e-6)
    assert_close(recomputed[1], kept[1], tol=1e-6)


def test_a_program_returning_its_loss_carries_integer_labels_through_the_stages(data):
    x, y, ref_loss, ref_grads = data
    prog = pj.trace(lambda p, x, y: loss_fn(model(p, x), y), pj.InputSpec((None, 8)),
                    pj.InputSpec((None, 1), "int32"), params=params())
    runner = PipelineRunner(split_stages(prog, S), micro_batches=M, schedule="gpipe")
    loss, grads = jax.jit(runner.value_and_grad)(params(), (x, y.astype(jnp.int32)))
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    assert_close(grads, ref_grads)


def test_schedules_order_the_work():
    gpipe, one_f_one_b = make_schedule("gpipe", 3, 4), make_schedule("1f1b", 3, 4)
    assert gpipe.timeline() == (
        "stage 0 | F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3\n"
        "stage 1 | .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .\n"
        "stage 2 | .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .")
    assert one_f_one_b.timeline() == (
        "stage 0 | F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3\n"
        "stage 1 | .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .\n"
        "stage 2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .")
    assert gpipe.in_flight() == [4, 4, 4] and one_f_one_b.in_flight() == [3, 2, 1]
    for sched in (gpipe, one_f_one_b):
        assert (sched.kind == FORWARD).sum() == (sched.kind == BACKWARD).sum() == 12
        assert sched.ticks == 2 * (4 + 3 - 1)
        assert bubble(sched).idle_share == (round(2 / 6, 4),) * 3
    assert (make_schedule("1f1b", 4, 8).kind != IDLE).sum(axis=0).tolist() == [16] * 4


def test_errors_name_the_argument(data):
    x, y, _, _ = data
    with pytest.raises(ValueError, match=r"one of \['gpipe', '1f1b'\], got 'zb'"):
        PipelineRunner(split(), loss_fn, micro_batches=M, schedule="zb")
    with pytest.raises(ValueError, match="micro_batches expects a positive int"):
        make_schedule("gpipe", 4, 0)
    with pytest.raises(ValueError, match="mesh expects an axis 'pp' of 4 devices"):
        PipelineRunner(split(), loss_fn, micro_batches=M, mesh=Mesh(np.array(jax.devices()[:4]), ("dp",)))
    runner = PipelineRunner(split(), loss_fn, micro_batches=M)
    with pytest.raises(ValueError, match=r"inputs\[0\] has shape \(12, 8\); .* divisible by micro_batches=8"):
        runner.value_and_grad(params(), x[:12], y[:12])


def test_plot_timeline_draws_one_bar_per_unit_of_work():
    import matplotlib

    matplotlib.use("Agg")
    from paddlejax.distributed.pipeline import plot_timeline

    ax = plot_timeline(make_schedule("1f1b", 4, 8))
    assert len(ax.patches) == 2 * 4 * 8
    assert ax.get_title().startswith("1f1b: bubble theory 3/11")
