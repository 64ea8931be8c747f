"""Pipeline stage splitting: balanced by FLOPs or at marks, boundaries, parameters, errors."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.passes.pipeline import balanced_partition, split_stages

WIDTHS = [8, 32, 8, 8, 16, 8]  # five linear layers of unequal cost


def mlp_params(widths=WIDTHS, seed=0):
    rng = np.random.default_rng(seed)
    return {f"w{i}": jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32)
            for i, (a, b) in enumerate(zip(widths, widths[1:]))}


def mlp(p, x, marks=()):
    for i in range(len(p)):
        x = pj.ops.linear(x, p[f"w{i}"], act="tanh")
        if i in marks:
            x = pj.ops.pipeline_stage(x)
    return x


def test_summary_lists_ops_flops_params_and_boundaries():
    prog = pj.trace(mlp, pj.InputSpec((None, 8)), params=mlp_params())
    split = split_stages(prog, 3)
    assert split.summary(sizes={"b": 4}) == (
        "stage  ops  FLOPs  params  boundary out\n"
        "0      1    2048   256     f32[b,32]\n"
        "1      2    2560   320     f32[b,8]\n"
        "2      2    2048   256\n"
        "total  5    6656   832")
    assert [st.param_names for st in split.stages] == [["w0"], ["w1", "w2"], ["w3", "w4"]]


def test_split_minimises_the_largest_stage():
    prog = pj.trace(mlp, pj.InputSpec((None, 8)), params=mlp_params())
    costs = [st.flops for st in split_stages(prog, 5).stages]  # one layer per stage
    for n in (2, 3, 4):
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cut), (*cut, 5)))
                   for cut in itertools.combinations(range(1, 5), n - 1))
        assert max(st.flops for st in split_stages(prog, n).stages) == best


def test_balanced_partition_keeps_every_group_non_empty():
    assert balanced_partition([0, 0, 0, 9], 3) == [[0, 1], [2], [3]]
    assert balanced_partition([5, 1, 1, 1], 4) == [[0], [1], [2], [3]]
    assert balanced_partition([1, 2, 3], 1, items="abc") == [["a", "b", "c"]]


def test_stages_chained_compute_the_program():
    params = mlp_params()
    prog = pj.trace(mlp, pj.InputSpec((None, 8)), params=params)
    split = split_stages(prog, 4)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 8))
    np.testing.assert_allclose(split(x), prog(x), rtol=1e-6)
    for st in split.stages:
        st.program.verify()


def test_marks_cut_the_program_and_disappear():
    prog = pj.trace(lambda p, x: mlp(p, x, marks=(0, 3)), pj.InputSpec((None, 8)), params=mlp_params())
    split = split_stages(prog)
    assert [[op.type for op in st.program.walk()] for st in split.stages] == [
        ["param", "linear", "return"],
        ["param", "param", "param", "linear", "linear", "linear", "return"],
        ["param", "linear", "return"]]
    x = jnp.ones((2, 8))
    np.testing.assert_allclose(split(x), prog(x), rtol=1e-6)
    assert split_stages(prog, 3).num_stages == 3


def test_a_value_read_two_stages_later_passes_through_the_stage_between():
    def residual(p, x):
        h = pj.ops.pipeline_stage(pj.ops.linear(x, p["a"]))
        h = pj.ops.pipeline_stage(pj.ops.linear(h, p["b"]))
        return pj.ops.linear(h, p["c"]) + x

    params = {k: jnp.eye(4) * (i + 1) for i, k in enumerate("abc")}
    prog = pj.trace(residual, pj.InputSpec((None, 4)), params=params)
    split = split_stages(prog)
    assert [len(st.outputs) for st in split.stages[:2]] == [2, 2]  # the activation and x
    assert split.stages[1].inputs[0] is prog.inputs[0]
    x = jnp.arange(8.0).reshape(2, 4)
    np.testing.assert_allclose(split(x), prog(x))


def test_a_parameter_read_by_two_stages_is_in_both():
    def tied(p, x):
        h = pj.ops.pipeline_stage(pj.ops.linear(x, p["w"], act="tanh"))
        return pj.ops.linear(h, p["w"])

    prog = pj.trace(tied, pj.InputSpec((None, 4)), params={"w": jnp.eye(4)})
    split = split_stages(prog)
    assert [st.param_names for st in split.stages] == [["w"], ["w"]]
    assert split.shared_params == ["w"]


def test_errors_name_the_problem():
    prog = pj.trace(mlp, pj.InputSpec((None, 8)), params=mlp_params())
    with pytest.raises(ValueError, match="6 stages asked for, but program 'mlp' has only 5 op"):
        split_stages(prog, 6)
    with pytest.raises(ValueError, match="give num_stages"):
        split_stages(prog)
    with pytest.raises(ValueError, match="positive int"):
        split_stages(prog, 0)
    marked = pj.trace(lambda p, x: mlp(p, x, marks=(1,)), pj.InputSpec((None, 8)), params=mlp_params())
    with pytest.raises(ValueError, match="num_stages=3, but the program has 1 pipeline_stage mark"):
        split_stages(marked, 3)
    trailing = pj.trace(lambda p, x: mlp(p, x, marks=(4,)), pj.InputSpec((None, 8)), params=mlp_params())
    with pytest.raises(ValueError, match=r"stage\(s\) \[1\] hold no ops"):
        split_stages(trailing)
