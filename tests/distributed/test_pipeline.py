"""Pipeline parallel: GPipe and 1F1B equal the sequential model; recompute; bubble; errors; the
Trainer with a pipeline strategy trains as on one device."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import paddlejax as pj
from paddlejax import nn
from paddlejax.distributed import Pipeline, Strategy
from paddlejax.distributed.pipeline import (BACKWARD, FORWARD, IDLE, PipelineRunner, bubble, make_schedule)
from paddlejax.nn.weights import state_dict
from paddlejax.passes.pipeline import split_stages
from paddlejax.static import ModelState

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


def test_parameters_placed_on_the_mesh_give_the_same_numbers_with_any_loss(data):
    """The runner's plan of each stage's backward pass is made for shard_map's mesh, whatever the
    placement of the parameters it is given (e.g. the parameters a previous step updated)."""
    x, y, _, _ = data
    mesh = Mesh(np.array(jax.devices()).reshape(S, 2), ("pp", "dp"))
    square = lambda logits, labels: jnp.mean((logits - jax.nn.one_hot(labels[:, 0], 3)) ** 2)  # noqa: E731
    runner = PipelineRunner(split(), square, micro_batches=M, mesh=mesh)
    placed = jax.device_put(params(), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    loss, grads = jax.jit(runner.value_and_grad)(placed, x, y)
    ref_loss, ref_grads = jax.value_and_grad(lambda p: square(model(p, x), y))(params())
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_close(grads, ref_grads)


def test_parameters_kept_packed_by_stage_give_the_same_numbers_and_shared_ones_their_summed_gradient(data):
    """A weight used by the first and the last stage sits in both of their rows; each copy's
    gradient is the sum of both stages', which is the sequential model's gradient."""
    from paddlejax.distributed.pipeline import StageParams

    x, y, _, _ = data

    def tied(p, x):
        x = pj.ops.linear(x, p["w"], act="tanh")
        for i in range(2):
            x = pj.ops.linear(x, p[f"w{i}"], act="tanh")
        return pj.ops.linear(pj.ops.linear(x, p["w"]), p["head"])

    p = {k: v for k, v in params().items() if k in ("w0", "w1", "head")} | {"w": params(1)["w0"]}
    runner = PipelineRunner(split_stages(pj.trace(tied, pj.InputSpec((None, 8)), params=p), S), loss_fn,
                            micro_batches=M)
    layout = StageParams(runner.split, p)
    assert layout.shared == {"w"} and "w" in layout.names[0] and "w" in layout.names[-1]
    loss, packed_grads, _ = jax.jit(runner.run_packed, static_argnums=0)(layout, layout.pack(p), x, y)
    ref_loss, ref_grads = jax.value_and_grad(lambda p: loss_fn(tied(p, x), y))(p)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_close(layout.unpack(packed_grads), ref_grads)
    last = dict(zip(layout.names[-1], layout.layouts[-1].unpack({k: v[-1] for k, v in packed_grads.items()})))
    assert_close({"w": last["w"]}, {"w": ref_grads["w"]})  # the last stage's copy too


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
    with pytest.raises(ValueError, match=r"has_aux=True needs a loss_fn returning \(loss, aux\)"):
        PipelineRunner(split(), None, micro_batches=M, has_aux=True)
    runner = PipelineRunner(split(), loss_fn, micro_batches=M)
    with pytest.raises(ValueError, match=r"inputs\[0\] has shape \(12, 8\); .* divisible by micro_batches=8"):
        runner.value_and_grad(params(), x[:12], y[:12])


def test_plot_timeline_draws_one_bar_per_unit_of_work():
    import matplotlib

    matplotlib.use("Agg")
    from paddlejax.distributed.pipeline import plot_timeline

    import matplotlib.pyplot as plt

    ax = plot_timeline(make_schedule("1f1b", 4, 8))
    try:
        assert len(ax.patches) == 2 * 4 * 8
        assert ax.get_title().startswith("1f1b: bubble theory 3/11")
    finally:
        plt.close(ax.figure)  # a pyplot figure lives until closed; later tests count them


# -- the Trainer with a pipeline strategy -------------------------------------------------------------
def mlp():
    nn.seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3))


def pipelined(schedule="1f1b", stages=S, micro_batches=M, **kw):
    return Strategy(pp_degree=stages, pipeline=Pipeline(stages=stages, micro_batches=micro_batches,
                                                        schedule=schedule), **kw)


def train(model, strategy, steps=3):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(steps, BATCH, 8)).astype(np.float32)
    y = rng.integers(0, 3, (steps, BATCH)).astype(np.int32)
    trainer = pj.Trainer(model, optax.adam(0.01), metrics=["accuracy"], progress=False, strategy=strategy)
    losses = [trainer.train_batch((x[i],), y[i]) for i in range(steps)]
    trainer.sync_model()
    return trainer, losses


@pytest.fixture(scope="module")
def one_device():
    trainer, losses = train(mlp(), None)
    return state_dict(trainer.model), losses


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_trainer_with_a_pipeline_strategy_trains_as_on_one_device(one_device, schedule):
    want, want_losses = one_device
    trainer, losses = train(mlp(), pipelined(schedule))
    assert [len(st.ops) for st in trainer.pipeline.stages.stages] == [2, 2, 2, 1]  # balanced by FLOPs
    assert dict(trainer.pipeline.mesh.shape) == {"pp": 4, "dp": 2}  # two pipelines, each on half the rows
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    got = state_dict(trainer.model)
    assert_close(got, want)
    # between steps each device holds its stage's parameters (and their optimizer state) only: the
    # largest stage's 272 of the 739 floats
    for leaf in (trainer.state.params["float32"], trainer.state.opt[0].mu["float32"]):
        assert leaf.shape == (4, 272) and {s.data.shape for s in leaf.addressable_shards} == {(1, 272)}
    assert not np.allclose(got["0.weight"], state_dict(mlp())["0.weight"])  # it did train
    assert trainer.evaluate((np.ones((4, 8), np.float32), np.zeros(4, np.int32)))["acc"] >= 0


def test_zero1_with_a_pipeline_shards_the_optimizer_state_over_every_device(one_device, capfd):
    want, want_losses = one_device
    trainer, losses = train(mlp(), pipelined(sharding={"stage": 1}))
    # the stages' parameters go to their devices as they are, not resharded from ZeRO's layout
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_close(state_dict(trainer.model), want)
    # the parameters packed by stage: 4 rows of the largest stage's 272, 1,088 floats, 136 on each device
    mu = trainer.state.opt[0].mu
    assert mu.shape == (1088,) and {s.data.shape for s in mu.addressable_shards} == {(136,)}


def test_a_layer_two_stages_share_trains_as_on_one_device_under_gradient_clipping():
    """Its weights sit in both stages' rows: each copy gets the summed gradient and the clip's
    norm counts them once."""
    def tied():
        nn.seed(0)
        shared = nn.Linear(8, 8)
        return nn.Sequential(shared, nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), shared,
                             nn.Linear(8, 3))

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(2, BATCH, 8)).astype(np.float32), rng.integers(0, 3, (2, BATCH)).astype(np.int32)
    results = []
    for strategy in (None, pipelined(), pipelined(sharding={"stage": 1})):
        trainer = pj.Trainer(tied(), optax.sgd(0.5), grad_clip=0.05, progress=False, strategy=strategy)
        losses = [trainer.train_batch((x[i],), y[i]) for i in range(2)]
        trainer.sync_model()
        results.append((losses, state_dict(trainer.model)))
        if strategy is not None:
            assert trainer.pipeline.layout.shared == {"0.bias", "0.weight"}
    (want_losses, want), *pipelines = results
    for losses, got in pipelines:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        assert_close(got, want)


@pytest.mark.parametrize("optimizer", [
    optax.adafactor(0.01), optax.lamb(0.01),
    optax.masked(optax.sgd(0.1), lambda p: {n: n.endswith("weight") for n in p}),
], ids=["adafactor", "lamb", "masked"])
@pytest.mark.parametrize("zero", [0, 1])
def test_an_optimizer_that_reads_parameters_by_name_or_shape_is_refused_by_a_pipeline(optimizer, zero):
    x, y = np.ones((BATCH, 8), np.float32), np.zeros(BATCH, np.int32)
    trainer = pj.Trainer(mlp(), optimizer, progress=False, strategy=pipelined(sharding={"stage": zero}))
    with pytest.raises(ValueError, match=r"packed by stage .* use an element-wise optimizer .*grad_clip"):
        trainer.train_batch((x,), y)


def test_a_clip_in_the_optimizer_chain_is_exact_in_a_pipeline_unless_stages_share_a_parameter():
    x, y = np.ones((BATCH, 8), np.float32), np.zeros(BATCH, np.int32)
    clipped = optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5))
    one = pj.Trainer(mlp(), clipped, progress=False)
    many = pj.Trainer(mlp(), clipped, progress=False, strategy=pipelined())
    one.train_batch((x,), y), many.train_batch((x,), y)
    one.sync_model(), many.sync_model()
    assert_close(state_dict(many.model), state_dict(one.model))
    nn.seed(0)
    shared = nn.Linear(8, 8)
    tied = nn.Sequential(shared, nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), shared)
    with pytest.raises(ValueError, match="packed by stage"):  # its norm would count the shared weight twice
        pj.Trainer(tied, clipped, progress=False, strategy=pipelined()).train_batch((x,), y)


class Marked(nn.Layer):
    """Two stages cut by a mark: the first linear layer, then the rest."""

    def __init__(self):
        super().__init__()
        self.first, self.rest = nn.Linear(8, 16), nn.Sequential(nn.Tanh(), nn.Linear(16, 16), nn.Linear(16, 3))

    def forward(self, x):
        return self.rest(pj.ops.pipeline_stage(self.first(x)))


def test_trainer_cuts_the_program_at_pipeline_stage_marks():
    trainer, _ = train(Marked(), pipelined(stages=2, micro_batches=4), steps=1)
    assert [[op.type for op in st.ops] for st in trainer.pipeline.stages.stages] == [
        ["linear"], ["tanh", "linear", "linear"]]


def test_batch_norm_statistics_in_a_pipeline_are_the_mean_of_the_micro_batches_updates():
    """2 stages x 4 micro-batches x 4 replicas: 16 chunks of 4 rows, each normalised by its own
    statistics (as on 16 devices); gradients and running-statistic updates are their means."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(64, 8)).astype(np.float32) * 3 + 1, rng.integers(0, 3, 64).astype(np.int32)
    nn.seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1D(8), nn.Tanh(), nn.Linear(8, 3))
    state = ModelState(model)
    program = pj.to_static(model, pj.InputSpec((None, 8)), train=True)
    params = {n: v for n, v in state.values.items() if n in state.trainable}
    stats = {n: v for n, v in state.values.items() if n not in state.trainable}

    def chunk(p, xc, yc):
        outputs, updates = program.apply({**p, **stats}, xc)
        return pj.ops.cross_entropy(outputs, yc), updates

    grads, updates = jax.vmap(jax.grad(chunk, has_aux=True), in_axes=(None, 0, 0))(
        params, x.reshape(16, 4, 8), y.reshape(16, 4))
    trainer = pj.Trainer(model, optax.sgd(0.1), progress=False, strategy=pipelined(stages=2, micro_batches=4))
    trainer.train_batch((x,), y)
    trainer.sync_model()
    got = ModelState(model).values
    assert dict(trainer.pipeline.mesh.shape) == {"pp": 2, "dp": 4}
    assert sorted(stats) == ["1.mean", "1.variance"]
    for name in stats:
        np.testing.assert_allclose(got[name], np.mean(updates[name], axis=0), rtol=1e-5, atol=1e-6)
        assert not np.allclose(got[name], stats[name])
    for name, value in params.items():
        np.testing.assert_allclose(got[name], value - 0.1 * np.mean(grads[name], axis=0), rtol=1e-5, atol=1e-6)


def test_trainer_pipeline_errors_say_what_is_wrong():
    x, y = np.ones((BATCH, 8), np.float32), np.zeros(BATCH, np.int32)
    with pytest.raises(ValueError, match="4 stages asked for, but program 'Sequential' has only 3 op"):
        pj.Trainer(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)), optax.sgd(0.1), progress=False,
                   strategy=pipelined()).train_batch((x,), y)
    with pytest.raises(ValueError, match="batch size 12 is not divisible by strategy.pipeline.micro_batches=8 "
                                         "x the data-parallel size 2"):
        pj.Trainer(mlp(), optax.sgd(0.1), progress=False, strategy=pipelined()).train_batch((x[:12],), y[:12])
    with pytest.raises(ValueError, match=r"sharding.stage=2 \(ZeRO\) cannot be combined with pipeline .* stage 1 can"):
        pj.Trainer(mlp(), optax.sgd(0.1), strategy=pipelined(sharding={"stage": 2}))
