"""Program.compile and the inference Predictor: buckets, padding, chunks, frozen parameters, errors."""
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import nn
from paddlejax.inference import Config, Predictor


class TinyCNN(nn.Layer):
    def __init__(self):
        self.conv = nn.Conv2D(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2D(4)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def __call__(self, x):
        return self.fc(pj.ops.relu(self.bn(self.conv(x * 1.0))).reshape(x.shape[0], -1))


@pytest.fixture(scope="module")
def prog():
    nn.seed(0)
    model = TinyCNN()
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 2, 4, 4)))


def batch(n, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 2, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("freeze", [False, True])
def test_compile_ahead_of_time_matches_the_program(prog, freeze):
    x = batch(3)
    f = prog.compile(jax.ShapeDtypeStruct(x.shape, x.dtype), freeze_params=freeze)
    np.testing.assert_allclose(f(x), prog(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError):  # an ahead-of-time executable takes only the shapes it was built for
        f(batch(2))


def test_frozen_parameters_are_constants_not_arguments(prog):
    spec = jax.ShapeDtypeStruct((2, 2, 4, 4), "float32")
    args = prog.compile(spec).func.memory_analysis().argument_size_in_bytes
    frozen = prog.compile(spec, freeze_params=True).func.memory_analysis().argument_size_in_bytes
    assert frozen == 2 * 2 * 4 * 4 * 4
    assert args == frozen + 4 * prog.num_params()


def test_compile_is_a_snapshot_of_the_program():
    p = pj.trace(lambda p, x: x * p["s"], jnp.ones(2), params={"s": jnp.float32(2.0)})
    f = p.compile()
    p.params["s"] = jnp.float32(5.0)
    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]


def test_config_buckets_and_pipeline():
    assert Config(max_batch_size=8).buckets() == (1, 2, 4, 8)
    assert Config(max_batch_size=5, batch_buckets=(3,)).buckets() == (3, 5)
    assert Config().pipeline() == pj.passes.inference_pipeline()
    assert Config().pipeline("b=32", frozen=True).split(",")[-2] == "autotune{sizes=b=32 frozen=true}"
    assert "reduced_precision=true" in Config(precision="bf16").pipeline("b=32")
    assert Config(passes="dce", precision="bf16").pipeline() == "dce,amp{dtype=bfloat16}"
    assert Config(passes="").pipeline() == ""
    assert "autotune{sizes=b=8 progress=false}" in Config(progress=False).pipeline("b=8")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_batch_size": 0}, "max_batch_size must be a positive int, got 0"),
    ({"precision": "fp16"}, "precision must be one of \\('fp32', 'bf16'\\), got 'fp16'"),
    ({"max_batch_size": 4, "batch_buckets": (2, 8)}, "batch_buckets must be sizes in 1..max_batch_size=4"),
    ({"max_batch_size": True}, "max_batch_size must be a positive int, got True"),
    ({"max_batch_size": 4, "batch_buckets": (True,)}, "batch_buckets must be sizes in 1..max_batch_size=4"),
    ({"max_batch_size": 4.0}, "max_batch_size must be a positive int, got 4.0"),
])
def test_bad_configs_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(**kwargs)


def test_config_takes_numpy_integers_as_sizes():
    config = Config(max_batch_size=np.int64(6), batch_buckets=[np.int32(3)])
    assert config.buckets() == (3, 6) and all(type(b) is int for b in config.buckets())
    assert config.pipeline("b=6").count("sizes=b=6") == 1


def test_predictor_names_what_it_was_given_instead_of_a_program():
    with pytest.raises(TypeError, match="Predictor: expected a Program or the path of a saved one, got NoneType"):
        Predictor(None)


@pytest.fixture(scope="module")
def predictor(prog):
    return Predictor(prog, Config(max_batch_size=4))


@pytest.mark.parametrize("n", [1, 3, 4, 9, 0])
def test_outputs_equal_the_programs_on_any_batch_size(prog, predictor, n):
    x = batch(n, seed=n)
    out = predictor.run(x)
    assert isinstance(out, np.ndarray) and out.shape == (n, 3)
    np.testing.assert_allclose(out, prog(x), rtol=1e-5, atol=1e-5)
    out += 1  # the caller's own array, whether or not the batch filled a bucket
    np.testing.assert_array_equal(x, batch(n, seed=n))  # and the input is left alone


def test_default_predictor_runs_the_inference_pipeline_with_frozen_parameters(predictor):
    assert predictor.buckets == (1, 2, 4) and predictor.freeze_params  # small model on CPU
    ops = [op.type for op in predictor.program.walk()]
    assert "lax.mul" not in ops  # eliminate_identity removed ``x * 1.0``
    assert "Predictor TinyCNN: buckets (1, 2, 4), frozen parameters on cpu" in repr(predictor)


def test_kernels_and_layout_are_tuned_at_the_largest_bucket_as_they_will_run(prog, tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLEJAX_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    Predictor(prog, Config(max_batch_size=4))
    entries = json.loads((tmp_path / "tune.json").read_text())["entries"].values()
    convs = [e["signature"] for e in entries if "op" in e["signature"]]
    plans = [e["signature"] for e in entries if "program" in e["signature"]]
    assert convs and {s["shapes"][0][0] for s in convs} == {4}
    assert [(p["sizes"], p["frozen"]) for p in plans] == [({"b": 4}, True)]


def test_no_compilation_after_construction(prog, predictor, caplog):
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        prog(batch(7))  # a plain program call with a new size compiles, and the log sees it
        assert any("Compiling" in r.getMessage() for r in caplog.records)
        caplog.clear()
        for n in range(1, 10):
            predictor(batch(n))
    assert [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()] == []
    assert predictor.num_compilations == 3


def test_frozen_and_argument_parameters_agree(prog):
    x = batch(3)
    frozen = Predictor(prog, Config(max_batch_size=4, freeze_params=True, passes=""))
    args = Predictor(prog, Config(max_batch_size=4, freeze_params=False, passes=""))
    assert frozen.freeze_params and not args.freeze_params
    np.testing.assert_allclose(frozen(x), args(x), rtol=1e-5, atol=1e-5)


def test_bf16_precision_casts_and_stays_close(prog):
    x = batch(2)
    bf16 = Predictor(prog, Config(max_batch_size=2, precision="bf16"))
    assert "cast" in [op.type for op in bf16.program.walk()]
    out = bf16(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, prog(x), rtol=0.05, atol=0.05)


def test_a_saved_program_path_works(prog, tmp_path):
    pj.save(prog, tmp_path / "tiny")
    x = batch(3)
    np.testing.assert_allclose(Predictor(tmp_path / "tiny", Config(max_batch_size=2))(x), prog(x),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Predictor(str(tmp_path / "tiny"), Config(max_batch_size=2))(x), prog(x),
                               rtol=1e-5, atol=1e-5)


def test_several_inputs_and_outputs_keep_their_structure():
    p = pj.trace(lambda p, x, y: {"sum": x @ p["w"] + y, "x": x}, pj.InputSpec((None, 2)), pj.InputSpec((None, 3)),
                 params={"w": jnp.ones((2, 3))})
    x, y = np.ones((5, 2), np.float32), np.full((5, 3), 2.0, np.float32)
    out = Predictor(p, Config(max_batch_size=2))(x, y)
    assert out["sum"].tolist() == [[4.0] * 3] * 5 and out["x"].shape == (5, 2)


def test_a_batch_filling_a_bucket_goes_straight_to_the_executable(monkeypatch):
    # no padding, casting or slicing for the common call; the same outputs as the general path
    p = pj.trace(lambda p, x, y: {"sum": x @ p["w"] + y, "x": x}, pj.InputSpec((None, 2)), pj.InputSpec((None, 3)),
                 params={"w": jnp.arange(6.0).reshape(2, 3)})
    predictor = Predictor(p, Config(max_batch_size=4))
    x, y = np.random.default_rng(0).normal(size=(4, 2)), np.ones((4, 3))
    general = predictor(x, y)  # float64: cast on the general path
    monkeypatch.setattr(predictor, "_run_padded", lambda leaves: pytest.fail("took the general path"))
    short = predictor(x.astype(np.float32), y.astype(np.float32))
    for k in ("sum", "x"):
        np.testing.assert_allclose(short[k], general[k], rtol=1e-6)
    short["sum"] += 1  # the caller's own arrays
    np.testing.assert_allclose(predictor(x.astype(np.float32), y.astype(np.float32))["sum"], general["sum"],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="input 'x' expects f32"):
        predictor(np.ones((4, 5), np.float32), y.astype(np.float32))  # a wrong shape still gets the clear error


@pytest.mark.parametrize("inputs, message", [
    ((np.zeros((2, 2, 4, 4), np.int32),),
     "input 'x' expects f32\\[b,2,4,4\\] \\(batch dimension 'b' first\\), got int32\\[2, 2, 4, 4\\]"),
    ((np.zeros((2, 2, 4, 4), np.float16),), "input 'x' expects f32\\[b,2,4,4\\].*got float16\\[2, 2, 4, 4\\]"),
    ((np.full((2, 2, 4, 4), "a"),), "input 'x' expects f32\\[b,2,4,4\\].*got str32\\[2, 2, 4, 4\\]"),
    ((np.zeros((2, 3, 4, 4), np.float32),), "input 'x' expects f32\\[b,2,4,4\\].*got float32\\[2, 3, 4, 4\\]"),
    ((np.zeros((2, 4, 4), np.float32),), "input 'x' expects f32\\[b,2,4,4\\].*got float32\\[2, 4, 4\\]"),
])
def test_bad_inputs_name_the_input(predictor, inputs, message):
    with pytest.raises(ValueError, match=message):
        predictor(*inputs)


def test_float64_inputs_are_cast_as_the_program_casts_them(prog, predictor):
    x = batch(3).astype(np.float64)
    out = predictor(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, prog(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(prog(x), prog(x.astype(np.float32)), rtol=0, atol=0)


def test_batch_coupled_programs_are_refused_with_how_to_trace_in_eval_mode():
    nn.seed(0)
    model = TinyCNN()  # training mode: batch norm normalises with the batch's own statistics
    training = pj.trace(model, pj.InputSpec((None, 2, 4, 4)))
    x = batch(3)
    # padding three rows with a zero row would change every row's output
    assert not np.allclose(training(np.concatenate([x, np.zeros_like(x[:1])]))[:3], training(x), atol=1e-2)
    with pytest.raises(ValueError, match="TinyCNN has 1 batch-coupled op\\(s\\) \\(batch_norm\\) whose outputs for a "
                                         "row depend on the other rows.*trace the model in eval mode: model.eval"):
        Predictor(training, Config(max_batch_size=4, passes=""))
    model.eval()
    Predictor(pj.trace(model, pj.InputSpec((None, 2, 4, 4))), Config(max_batch_size=4, passes=""))


def test_wrong_number_of_inputs_and_disagreeing_batches():
    p = pj.trace(lambda x, y: x + y, pj.InputSpec((None, 2)), pj.InputSpec((None, 2)))
    predictor = Predictor(p, Config(max_batch_size=2))
    with pytest.raises(TypeError, match="expects inputs structured as"):
        predictor(np.ones((1, 2), np.float32))
    with pytest.raises(ValueError, match="inputs disagree on the batch size \\('x': 1, 'y': 2\\)"):
        predictor(np.ones((1, 2), np.float32), np.ones((2, 2), np.float32))


@pytest.mark.parametrize("fn, specs, message", [
    (lambda x: x * 2.0, [pj.InputSpec((3, 2))], "input 0 \\('x': f32\\[3,2\\]\\) does not lead with a symbolic batch"),
    (lambda x: x.sum(), [pj.InputSpec((None, 2))], "output 0 \\(f32\\[\\]\\) does not lead with a symbolic batch"),
    (lambda x: x * 2.0, [pj.InputSpec((None, "n"))], "input 0 \\('x': f32\\[b,n\\]\\) has symbolic sizes \\['n'\\]"),
])
def test_programs_without_a_batch_dimension_are_refused(fn, specs, message):
    with pytest.raises(ValueError, match=message):
        Predictor(pj.trace(fn, *specs), Config(max_batch_size=2))


@pytest.mark.parametrize("fn", [lambda x: x - x.mean(0), lambda x: jax.nn.softmax(x, axis=0),
                                lambda x: jnp.cumsum(x, 0), lambda x: x[::-1]],
                         ids=["mean", "softmax", "cumsum", "reverse"])
def test_a_program_mixing_batch_rows_through_generic_ops_is_refused(fn):
    prog = pj.trace(fn, pj.InputSpec((None, 3)))
    with pytest.raises(ValueError, match="mixes the rows of its batch"):
        Predictor(prog, Config(max_batch_size=4, passes=""))


def test_row_independent_programs_with_integer_inputs_are_accepted():
    table = jnp.arange(12.0).reshape(6, 2)
    prog = pj.trace(lambda p, ids: jnp.take(p["t"], ids, axis=0).sum(1), pj.InputSpec((None, 3), "int32"),
                    params={"t": table})
    ids = np.array([[0, 5, 1], [2, 2, 3], [4, 0, 0]], np.int64)
    np.testing.assert_array_equal(Predictor(prog, Config(max_batch_size=2))(ids), np.asarray(table)[ids].sum(1))


def _masked_mean():
    def embed(p, ids, mask):
        rows = p["emb"][ids] * mask[..., None]
        return rows.sum(1) / mask.sum(1, keepdims=True), rows
    return pj.trace(embed, pj.InputSpec((None, "seq"), "int32"), pj.InputSpec((None, "seq"), "float32"),
                    params={"emb": jnp.arange(20.0).reshape(10, 2)})


def test_sequence_lengths_run_on_their_own_buckets_padded_and_sliced_back():
    prog = _masked_mean()
    predictor = Predictor(prog, Config(max_batch_size=4, size_buckets={"seq": (4, 8)}))
    assert predictor.num_compilations == 3 * 2  # batch buckets 1, 2, 4 times sequence buckets 4, 8
    for n, length in [(3, 3), (1, 8), (5, 5)]:
        ids = np.arange(n * length, dtype=np.int32).reshape(n, length) % 10
        mask = np.ones((n, length), np.float32)
        mean, rows = predictor(ids, mask)
        want_mean, want_rows = prog(ids, mask)
        assert rows.shape == (n, length, 2)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
        np.testing.assert_allclose(rows, want_rows, rtol=1e-6)
    assert predictor.num_compilations == 6


@pytest.mark.parametrize("kwargs, inputs, message", [
    ({}, None, r"symbolic sizes \['seq'\] besides the batch.*size_buckets"),
    ({"size_buckets": {"sq": (4,)}}, None, r"size_buckets names \['sq'\], which no input"),
    ({"size_buckets": {"seq": (4,)}}, ((2, 5), (2, 5)), r"size 'seq' of 5, outside the compiled buckets"),
    ({"size_buckets": {"seq": (4,)}}, ((2, 3), (2, 4)), r"inputs disagree on size 'seq' \(3 and 4"),
])
def test_sequence_buckets_are_checked(kwargs, inputs, message):
    with pytest.raises(ValueError, match=message):
        predictor = Predictor(_masked_mean(), Config(max_batch_size=2, **kwargs))
        predictor(np.zeros(inputs[0], np.int32), np.ones(inputs[1], np.float32))


def test_size_buckets_must_be_positive_ints():
    with pytest.raises(ValueError, match=r"size_buckets\['seq'\] must be positive ints"):
        Config(size_buckets={"seq": (0, 4)})
