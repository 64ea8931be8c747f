"""Memory passes: liveness and peak, in-place reuse, the estimate beside XLA's, remat segments."""
import jax
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.lowering import run_program
from paddlejax.passes.memory import compare_with_xla, liveness, offloaded_bytes, plan_inplace, stored_bytes, value_names


def cnn(p, x):
    h = pj.ops.relu(pj.ops.conv2d(x, p["w1"], padding=1))
    h = pj.ops.relu(pj.ops.conv2d(h, p["w2"], padding=1))
    return pj.ops.matmul(h.reshape(h.shape[0], -1), p["w3"])


def params(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda scale, *s: (scale * rng.normal(size=s)).astype(np.float32)  # noqa: E731
    return {"w1": f(0.3, 8, 3, 3, 3), "w2": f(0.1, 8, 8, 3, 3), "w3": f(0.05, 512, 10)}


@pytest.fixture
def prog():
    return pj.trace(cnn, pj.InputSpec((None, 3, 8, 8)), params=params())


def test_timeline_counts_activations_and_frees_after_last_use(prog):
    live = liveness(prog, sizes={"b": 8})
    x, act, flat, out = 8 * 3 * 64 * 4, 8 * 8 * 64 * 4, 8 * 512 * 4, 8 * 10 * 4
    # params (3 ops), conv, relu, conv, relu, reshape, matmul, return
    assert live.timeline == [x, x, x, x + act, 2 * act, 2 * act, 2 * act, 2 * act, flat + out, out]
    assert live.peak_bytes == 2 * act and live.peak_op == 4
    assert live.param_bytes == (8 * 3 * 9 + 8 * 8 * 9 + 512 * 10) * 4 and live.constant_bytes == 0
    names = value_names(prog)
    assert [(names[v], n) for v, n in live.top_live(live.peak_op)] == [("%3", act), ("%4", act)]
    # the input is freed after the first conv; the output outlives the last op
    assert prog.inputs[0] not in live.live_after(3) and prog.outputs[0] in live.live_after(9)


def test_symbolic_sizes_scale_the_estimate(prog):
    assert liveness(prog, sizes={"b": 32}).peak_bytes == 4 * liveness(prog, sizes={"b": 8}).peak_bytes
    assert liveness(prog).peak_bytes == liveness(prog, sizes={"b": 1}).peak_bytes


def test_inplace_plan_reuses_dead_operands_of_equal_size(prog):
    plan = plan_inplace(prog, sizes={"b": 8})
    ops = prog.body.ops
    # relu, conv, relu and reshape take their input's buffer; the first conv may not (x is the caller's)
    assert [ops[r.op_index].type for r in plan.reuses] == ["relu", "conv2d", "relu", "lax.reshape"]
    assert plan.peak_bytes == 32768 and plan.peak_bytes_reused == 22528 and plan.saved_bytes == 10240


def test_inplace_pass_is_an_analysis_that_leaves_the_program_unchanged(prog):
    pm = pj.passes.PassManager("inplace{sizes=b=8}")
    out = pm.run(prog)
    assert str(out) == str(prog)
    assert pm.records[0].changed is False and pm.records[0].stats == {"reuses": 4, "bytes_saved": 10240}


def test_estimate_is_within_a_fifth_below_xla(prog):
    # Measured (jax 0.10.2, CPU): estimate / XLA's argument + output + temp bytes is 0.97 at b=1,
    # 0.90 at b=8 and 0.86 at b=32 (XLA keeps a padded copy of each conv input in temp).
    for b in (1, 8, 32):
        c = compare_with_xla(prog, {"b": b})
        assert c.xla_argument_bytes >= c.param_bytes + 3 * 64 * 4 * b
        # conv weights are copied to XLA's layout before the first op; at the peak (the second
        # conv) only the second weight's copy is still held
        assert c.layout_copy_bytes == 8 * 8 * 9 * 4
        assert 0.8 * c.xla_bytes <= c.estimate_bytes <= c.xla_bytes


# Stored bytes at b=8 under the table of what each op's backward pass reads: the convs keep
# their operands (x is the caller's, weights are parameters; the second conv keeps the first
# relu's result), each relu a boolean mask, the reshape nothing, the matmul its input.
ACT, MASK = 8 * 8 * 64 * 4, 8 * 8 * 64
STORED = ACT + MASK + MASK + ACT
# Segments of 3 ops, [conv, relu, conv] and [relu, reshape, matmul], keep their inputs (the
# second conv's result) and recompute one segment at a time (a relu result and mask, or a mask
# and the flattened input); the other lengths keep more.
SMALLEST = ACT + (ACT + MASK)
BUDGET = SMALLEST + 1000


def test_remat_marks_segments_that_fit_the_budget(prog):
    assert stored_bytes(prog, {"b": 8}) == STORED == 40960
    out = pj.passes.run(prog, f"remat{{budget={BUDGET},sizes=b=8}}")
    marks = [(op.type, op.attrs.get("remat_segment")) for op in out.body.ops if op.type not in ("param", "return")]
    assert marks == [("conv2d", 0), ("relu", 0), ("conv2d", 0), ("relu", 1), ("lax.reshape", 1), ("matmul", 1)]
    assert "%4 = relu(%3) {remat_segment=0} : f32[b,8,8,8]" in str(out)
    assert stored_bytes(out, {"b": 8}) == SMALLEST <= BUDGET


def test_remat_keeps_values_and_gradients_and_shows_checkpoints_in_the_grad(prog):
    out = pj.passes.run(prog, f"remat{{budget={BUDGET},sizes=b=8}}")
    x = np.random.default_rng(1).normal(size=(8, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(out(x), prog(x))
    grad = lambda p, program: jax.grad(lambda q: program.apply(q, x).sum())(p)  # noqa: E731
    ref, got = grad(prog.params, prog), grad(out.params, out)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-6)
    eqns = lambda program: str(jax.make_jaxpr(lambda p: grad(p, program))(program.params))  # noqa: E731
    assert "checkpoint" in eqns(out) or "remat" in eqns(out)
    assert "checkpoint" not in eqns(prog) and "remat" not in eqns(prog)


def test_remat_marks_survive_save_and_load(prog, tmp_path):
    out = pj.passes.run(prog, f"remat{{budget={BUDGET},sizes=b=8}}")
    pj.save(out, tmp_path / "m")
    loaded = pj.load(tmp_path / "m")
    assert str(loaded) == str(out)
    x = np.ones((2, 3, 8, 8), np.float32)
    np.testing.assert_array_equal(loaded(x), prog(x))


def test_remat_without_a_budget_keeps_the_least(prog):
    pm = pj.passes.PassManager("remat{sizes=b=8}")
    out = pm.run(prog)
    assert stored_bytes(out, {"b": 8}) == SMALLEST
    assert pm.records[0].stats == {"segments": 2, "stored_bytes": SMALLEST}
    with pytest.raises(pj.passes.PassError, match="budget expects a number of bytes >= 0"):
        pj.passes.run(prog, "remat{budget=-1}")


def test_remat_with_a_budget_already_met_changes_nothing(prog):
    pm = pj.passes.PassManager(f"remat{{budget={STORED},sizes=b=8}}")
    out = pm.run(prog)
    assert str(out) == str(prog) and pm.records[0].changed is False


def test_remat_refuses_a_budget_it_cannot_meet(prog):
    with pytest.raises(pj.passes.PassError, match=f"budget 1000 B cannot be met; the smallest stored size found is {SMALLEST} B"):
        pj.passes.run(prog, "remat{budget=1000,sizes=b=8}")


def host_copies(jaxpr) -> int:
    """How many values the (forward and backward) jaxpr sends to host memory."""
    return str(jaxpr).count("devices=(MemorySpace.Host,)")


def test_remat_offload_keeps_the_segment_inputs_in_host_memory(prog):
    pm = pj.passes.PassManager("remat{offload=true,sizes=b=8}")
    out = pm.run(prog)
    # the smallest device figure has segments of two ops, [conv, relu] [conv, relu] [reshape,
    # matmul]: each relu result waits on the host, the device holds one segment's recompute (the
    # flattened input the matmul keeps)
    assert pm.records[0].stats == {"segments": 3, "stored_bytes": ACT, "offloaded_bytes": 2 * ACT}
    assert stored_bytes(out, {"b": 8}) == ACT and offloaded_bytes(out, {"b": 8}) == 2 * ACT
    assert stored_bytes(out, {"b": 8}, offload=False) == 3 * ACT  # the same marks, kept on the device
    assert "%4 = relu(%3) {remat_segment=0, remat_offload=True} : f32[b,8,8,8]" in str(out)
    x = np.random.default_rng(1).normal(size=(8, 3, 8, 8)).astype(np.float32)
    grad = lambda p, program: jax.grad(lambda q: program.apply(q, x).sum())(p)  # noqa: E731
    ref, got = grad(prog.params, prog), grad(out.params, out)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-6)
    # the two relu results go to the host in the forward pass (the input x is the caller's)
    plain = pj.passes.run(prog, "remat{sizes=b=8}")
    assert host_copies(jax.make_jaxpr(lambda p: grad(p, out))(out.params)) == 2
    assert host_copies(jax.make_jaxpr(lambda p: grad(p, plain))(plain.params)) == 0


def test_remat_offload_marks_survive_save_and_load_and_are_verified(prog, tmp_path):
    out = pj.passes.run(prog, "remat{offload=true,sizes=b=8}")
    pj.save(out, tmp_path / "m")
    assert str(pj.load(tmp_path / "m")) == str(out)
    text = str(prog).replace("relu(%3) :", "relu(%3) {remat_offload=True} :")
    with pytest.raises(pj.ir.VerificationError, match="remat_offload must be true and only on an op with a remat_segment"):
        pj.parse(text).verify()


LAYERS, WIDTH = 8, 128


def scan_mlp(p, x):
    """A residual tanh MLP as one ``lax.scan`` over stacked layer weights."""
    def layer(h, w):
        w1, b1, w2 = w
        return h + (jax.numpy.tanh(h @ w1 + b1) @ w2) * 0.5, None
    return jax.lax.scan(layer, x, (p["w1"], p["b1"], p["w2"]))[0]


@pytest.fixture
def scan_prog():
    rng = np.random.default_rng(0)
    f = lambda *s: (rng.normal(size=s) / np.sqrt(WIDTH)).astype(np.float32)  # noqa: E731
    p = {"w1": f(LAYERS, WIDTH, WIDTH), "b1": f(LAYERS, WIDTH), "w2": f(LAYERS, WIDTH, WIDTH)}
    return pj.trace(scan_mlp, pj.InputSpec((None, WIDTH)), params=p)


def scan_body_marks(program):
    (scan,) = [op for op in program.body.ops if op.type == "scan"]
    return [(op.type, op.attrs.get("remat_segment")) for op in scan.blocks[0].ops[:-1]]


def test_stored_bytes_counts_a_scan_body_once_per_iteration(scan_prog):
    act = 64 * WIDTH * 4
    # per iteration: the first dot keeps the carry h (its weight is a parameter), tanh its result
    # and 1 - result; the second dot's input is tanh's result; broadcast, adds and the mul by 0.5
    # keep nothing
    assert stored_bytes(scan_prog, {"b": 64}) == LAYERS * 3 * act


def test_remat_marks_ops_inside_a_scan_body(scan_prog):
    budget = stored_bytes(scan_prog, {"b": 64}) // 2
    out = pj.passes.run(scan_prog, f"remat{{budget={budget},sizes=b=64}}")
    # shorter segments keep two activations per iteration (their inputs); one of 6 ops keeps only
    # the carry, the constant 0.5 goes along and the last add, alone, is left unmarked
    assert scan_body_marks(out) == [("lax.dot_general", 0), ("lax.broadcast_in_dim", 0), ("lax.add", 0),
                                    ("lax.tanh", 0), ("lax.dot_general", 0), ("constant", 0), ("lax.mul", 0),
                                    ("lax.add", None)]
    assert "%11 = lax.tanh(%10) {remat_segment=0} : f32[b,128]" in str(out)
    # kept per iteration: the carry; recompute: one iteration's tanh result and 1 - result
    act = 64 * WIDTH * 4
    assert stored_bytes(out, {"b": 64}) == LAYERS * act + 2 * act <= budget


def test_remat_in_a_scan_keeps_values_and_gradients_and_checkpoints_the_body(scan_prog):
    out = pj.passes.run(scan_prog, f"remat{{budget={stored_bytes(scan_prog, {'b': 64}) // 2},sizes=b=64}}")
    x = np.random.default_rng(1).normal(size=(64, WIDTH)).astype(np.float32)
    np.testing.assert_array_equal(out(x), scan_prog(x))
    loss = lambda q, program: (program.apply(q, x) ** 2).mean()  # noqa: E731
    ref, got = jax.grad(loss)(scan_prog.params, scan_prog), jax.grad(loss)(out.params, out)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-6)

    def primitives_in_scans(jaxpr, inside=False):
        found = set()
        for eqn in jaxpr.eqns:
            if inside:
                found.add(eqn.primitive.name)
            for sub in eqn.params.values():
                if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                    found |= primitives_in_scans(getattr(sub, "jaxpr", sub), inside or eqn.primitive.name == "scan")
        return found

    in_scans = lambda program: primitives_in_scans(  # noqa: E731
        jax.make_jaxpr(lambda q: jax.grad(loss)(q, program))(program.params).jaxpr)
    assert {"checkpoint", "remat2", "remat"} & in_scans(out)
    assert not {"checkpoint", "remat2", "remat"} & in_scans(scan_prog)


def test_remat_in_a_scan_lowers_xla_temporary_memory_of_the_training_step(scan_prog):
    out = pj.passes.run(scan_prog, f"remat{{budget={stored_bytes(scan_prog, {'b': 64}) // 2},sizes=b=64}}")
    x = np.ones((64, WIDTH), np.float32)

    def temp_bytes(program):
        step = jax.jit(jax.grad(lambda q: (run_program(program, q, (x,)) ** 2).mean()))
        return step.lower(program.params).compile().memory_analysis().temp_size_in_bytes

    # measured (jax 0.10.2, CPU): 1114384 B without remat, 557320 B with a budget of half the
    # estimate (786432 B); the rest of XLA's figure is the backward pass's own temporaries
    assert temp_bytes(out) < 0.55 * temp_bytes(scan_prog)
