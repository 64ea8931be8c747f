"""Structured pruning: channel groups from the op traits, and programs with really smaller weights."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax import analysis
from paddlejax.models.digits import DigitsCNN
from paddlejax.slim.pruning import ChannelGraph, prune


def digits_program():
    pj.nn.seed(0)
    model = DigitsCNN()
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))


def groups_of(program):
    return [(g.producers, len(g.classes)) for g in ChannelGraph(program).groups()]


def test_conv_bn_relu_chains_and_flatten_to_linear_form_one_group_per_conv():
    prog = digits_program()
    assert groups_of(prog) == [(("features.0.weight",), 32), (("features.3.weight",), 64),
                               (("features.7.weight",), 128)]  # the classifier's outputs are frozen
    small = prune(prog, 0.5)
    shapes = {k: v.shape for k, v in small.params.items()}
    assert shapes["features.0.weight"] == (16, 1, 3, 3) and shapes["features.1.weight"] == (16,)
    assert shapes["features.3.weight"] == (32, 16, 3, 3) and shapes["features.4.mean"] == (32,)
    assert shapes["features.7.weight"] == (64, 32, 3, 3)
    assert shapes["fc.weight"] == (64 * 2 * 2, 10)  # flatten: each channel's 2x2 positions go together
    assert np.asarray(small(np.zeros((3, 1, 8, 8), np.float32))).shape == (3, 10)


def _silence(prog, conv: str, bn: str, channels):
    """Zero the filters of ``channels`` and their batch-norm scale and shift: they then output 0."""
    for name in (conv, f"{bn}.weight", f"{bn}.bias"):
        value = np.array(prog.params[name])
        value[list(channels)] = 0
        prog.params[name] = jnp.asarray(value)


@pytest.mark.parametrize("criterion", ["l1_norm", "l2_norm", "bn_scale"])
def test_pruning_silent_channels_keeps_the_outputs(criterion):
    prog = digits_program()
    _silence(prog, "features.0.weight", "features.1", range(0, 32, 2))
    _silence(prog, "features.3.weight", "features.4", range(1, 64, 2))
    _silence(prog, "features.7.weight", "features.8", range(64))
    small = prune(prog, 0.5, criterion=criterion)
    x = np.random.default_rng(0).random((5, 1, 8, 8), np.float32)
    np.testing.assert_allclose(np.asarray(small(x)), np.asarray(prog(x)), atol=1e-5)
    assert small.params["fc.weight"].shape == (256, 10)


def _residual(p, x):
    a = pj.ops.relu(pj.ops.conv2d(x, p["a"], padding=1))
    b = pj.ops.conv2d(a, p["b"], padding=1)
    return pj.ops.conv2d(pj.ops.relu(a + b), p["c"]).mean((2, 3))


def _params(**shapes):
    rng = np.random.default_rng(0)
    return {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}


def test_a_residual_add_prunes_both_branches_together():
    prog = pj.trace(_residual, pj.InputSpec((None, 2, 6, 6)), params=_params(a=(4, 2, 3, 3), b=(4, 4, 3, 3),
                                                                             c=(3, 4, 1, 1)))
    assert groups_of(prog) == [(("a", "b"), 4)]
    small = prune(prog, 0.5)
    assert small.params["a"].shape == (2, 2, 3, 3) and small.params["b"].shape == (2, 2, 3, 3)
    assert small.params["c"].shape == (3, 2, 1, 1)
    # silent channels in both branches go without changing anything
    p = dict(prog.params)
    p["a"] = p["a"].at[jnp.array([1, 3])].set(0)
    p["b"] = p["b"].at[jnp.array([1, 3])].set(0)
    prog.params.update(p)
    x = np.random.default_rng(1).random((2, 2, 6, 6), np.float32)
    np.testing.assert_allclose(np.asarray(prune(prog, 0.5)(x)), np.asarray(prog(x)), atol=1e-5)


def test_depthwise_convolutions_keep_their_channels_one_to_one():
    def net(p, x):
        h = pj.ops.relu(pj.ops.conv2d(x, p["a"], padding=1))
        h = pj.ops.relu(pj.ops.conv2d(h, p["dw"], padding=1, groups=4))
        return pj.ops.conv2d(h, p["c"]).mean((2, 3))

    prog = pj.trace(net, pj.InputSpec((None, 2, 6, 6)), params=_params(a=(4, 2, 3, 3), dw=(4, 1, 3, 3),
                                                                       c=(3, 4, 1, 1)))
    assert groups_of(prog) == [(("a",), 4)]
    small = prune(prog, 0.5)
    assert small.params["dw"].shape == (2, 1, 3, 3) and small.params["c"].shape == (3, 2, 1, 1)
    conv = next(op for op in small.body.ops if op.type == "conv2d" and op.attrs["groups"] > 1)
    assert conv.attrs["groups"] == 2
    x = np.random.default_rng(2).random((2, 2, 6, 6), np.float32)
    assert np.asarray(small(x)).shape == (2, 3)


def test_concat_keeps_each_inputs_offsets():
    def net(p, x):
        a = pj.ops.relu(pj.ops.conv2d(x, p["a"]))
        b = pj.ops.relu(pj.ops.conv2d(x, p["b"]))
        return pj.ops.conv2d(jnp.concatenate([a, b], axis=1), p["c"]).mean((2, 3))

    params = _params(a=(4, 2, 1, 1), b=(6, 2, 1, 1), c=(3, 10, 1, 1))
    prog = pj.trace(net, pj.InputSpec((None, 2, 5, 5)), params=params)
    assert groups_of(prog) == [(("a",), 4), (("b",), 6)]
    small = prune(prog, {"b": 0.5})
    assert small.params["a"].shape == (4, 2, 1, 1) and small.params["b"].shape == (3, 2, 1, 1)
    assert small.params["c"].shape == (3, 7, 1, 1)
    kept_b = [i for i in range(6) if np.abs(np.asarray(params["b"][i])).sum() >= sorted(
        np.abs(np.asarray(params["b"])).reshape(6, -1).sum(1))[3]]
    np.testing.assert_array_equal(np.asarray(small.params["c"])[:, 4:], np.asarray(params["c"])[:, [4 + i for i in kept_b]])


def test_channels_an_op_without_a_channel_rule_reads_are_frozen():
    def net(p, x):
        h = pj.ops.conv2d(x, p["a"])
        return pj.ops.linear(jnp.sort(h, axis=1).mean((2, 3)), p["w"])

    prog = pj.trace(net, pj.InputSpec((None, 2, 4, 4)), params=_params(a=(4, 2, 1, 1), w=(4, 3)))
    assert groups_of(prog) == []
    assert prune(prog, 0.5).params["a"].shape == (4, 2, 1, 1)


def test_channels_last_convolutions_prune_on_their_last_axis():
    def net(p, x):
        h = pj.ops.relu(pj.ops.conv2d(x, p["a"], data_format="NHWC"))
        return pj.ops.conv2d(h, p["b"], data_format="NHWC").mean((1, 2))

    prog = pj.trace(net, pj.InputSpec((None, 5, 5, 2)), params=_params(a=(4, 2, 1, 1), b=(3, 4, 1, 1)))
    small = prune(prog, 0.5)
    assert small.params["a"].shape == (2, 2, 1, 1) and small.params["b"].shape == (3, 2, 1, 1)


def test_a_flops_target_is_reached_with_one_ratio():
    prog = digits_program()
    base = analysis.flops(prog, {"b": 1})
    small = prune(prog, flops=0.5)
    assert 0.35 * base < analysis.flops(small, {"b": 1}) <= 0.5 * base


def test_round_to_keeps_channel_counts_that_are_multiples_and_still_meets_the_flops_target():
    prog = digits_program()
    base = analysis.flops(prog, {"b": 1})
    plain, rounded = prune(prog, flops=0.5), prune(prog, flops=0.5, round_to=8)
    widths = lambda p: [p.params[f"features.{i}.weight"].shape[0] for i in (0, 3, 7)]  # noqa: E731
    assert any(w % 8 for w in widths(plain))  # 32/64/128 cut by one ratio: odd widths
    assert all(w % 8 == 0 for w in widths(rounded)) and widths(rounded) != [32, 64, 128]
    assert analysis.flops(rounded, {"b": 1}) <= 0.5 * base
    assert [p.params["features.0.weight"].shape[0] for p in (prune(prog, 0.9, round_to=8),
                                                              prune(prog, 0.9, round_to=64))] == [8, 32]


def test_the_pruned_program_saves_loads_and_fine_tunes(tmp_path):
    from paddlejax.nn.program_layer import ProgramLayer

    small = prune(digits_program(), 0.5)
    pj.save(small, tmp_path / "small")
    loaded = pj.load(tmp_path / "small")
    x, y = pj.data.Digits("train").arrays()
    trainer = pj.Trainer(ProgramLayer(loaded), optax.adam(3e-3), metrics=["accuracy"], progress=False)
    before = trainer.evaluate((x[:256], y[:256]))["loss"]
    trainer.fit((x[:256], y[:256]), epochs=3, batch_size=64)
    assert trainer.evaluate((x[:256], y[:256]))["loss"] < before


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give ratios or flops"), ({"ratios": 0.5, "flops": 0.5}, "give ratios or flops"),
    ({"ratios": 1.0}, r"a ratio is in \[0, 1\)"), ({"flops": 1.5}, r"in \(0, 1\)"),
    ({"ratios": {"fc.weight": 0.5}}, r"\['fc.weight'\] produce no prunable channels"),
    ({"ratios": 0.5, "criterion": "vibes"}, "criterion must be one of"),
    ({"ratios": 0.5, "round_to": 0}, "round_to expects an int >= 1, got 0"),
])
def test_bad_requests_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune(digits_program(), **kwargs)


def _agreement(reference, x):
    """A metric for tests: how often a pruned program's class agrees with the original's."""
    want = np.asarray(reference(x)).argmax(1)
    return lambda p: float((np.asarray(p(x)).argmax(1) == want).mean())


def test_sensitivity_measures_each_group_alone_and_resumes_from_its_file(tmp_path):
    from paddlejax.slim import get_ratios_by_loss, sensitivity
    from paddlejax.slim.pruning import plot_sensitivity

    prog = digits_program()
    metric = _agreement(prog, pj.data.Digits("test").images[:64])
    calls = []

    def counted(p):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # interrupted after two of the six pruned runs
        return metric(p)

    path = tmp_path / "sens.json"
    with pytest.raises(KeyboardInterrupt):
        sensitivity(prog, counted, ratios=(0.25, 0.5), sensitivities_file=path, progress=False)
    calls.clear()
    sens = sensitivity(prog, lambda p: calls.append(1) or metric(p), ratios=(0.25, 0.5), sensitivities_file=path,
                       progress=False)
    assert len(calls) == 1 + 4  # the baseline, then only the four runs the file lacked
    assert list(sens) == ["features.0.weight", "features.3.weight", "features.7.weight"]
    assert all(list(points) == [0.25, 0.5] and all(0 <= v <= 1 for v in points.values()) for points in sens.values())
    assert get_ratios_by_loss(sens, 1.0) == {name: 0.5 for name in sens}
    plot_sensitivity(sens, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 1000


@pytest.mark.slow
def test_auto_pruner_is_seeded_meets_the_flops_target_and_resumes(tmp_path):
    from paddlejax.slim import AutoPruner

    prog = digits_program()
    metric = _agreement(prog, pj.data.Digits("test").images[:48])
    options = dict(pruned_flops=0.4, seed=3, progress=False)
    straight = AutoPruner(prog, metric, search_steps=4, **options).search()
    assert straight.flops_removed >= 0.4 and len(straight.history) == 4
    assert set(straight.ratios) == {"features.0.weight", "features.3.weight", "features.7.weight"}
    assert straight.reward >= max(r for _, r, _ in straight.history)
    assert straight.reward == metric(straight.program)
    checkpoint = tmp_path / "search.json"
    AutoPruner(prog, metric, search_steps=2, checkpoint=checkpoint, **options).search()
    resumed = AutoPruner(prog, metric, search_steps=4, checkpoint=checkpoint, **options).search()
    assert resumed.history == straight.history and resumed.ratios == straight.ratios


def test_auto_pruner_with_a_speedup_target_keeps_only_proposals_that_reach_it(monkeypatch):
    from paddlejax.slim import AutoPruner

    prog = digits_program()
    base = analysis.flops(prog, {"b": 1})
    # a stand-in for timings, so that the test is about the search: the second conv is the slow one
    seen = []

    def speedup(self, pruned):
        seen.append(pruned.params["features.3.weight"].shape[0])
        return 64 / seen[-1]

    monkeypatch.setattr(AutoPruner, "measure_speedup", speedup)
    metric = _agreement(prog, pj.data.Digits("test").images[:48])
    found = AutoPruner(prog, metric, pruned_flops=0.3, speedup=2.0, round_to=8, search_steps=4, seed=0,
                       progress=False).search()
    widths = [found.program.params[f"features.{i}.weight"].shape[0] for i in (0, 3, 7)]
    assert widths[1] <= 32 and all(w % 8 == 0 for w in widths)
    assert found.speedup == 64 / widths[1] >= 2.0
    assert analysis.flops(found.program, {"b": 1}) <= 0.7 * base
    with pytest.raises(ValueError, match="speedup is a measured speed-up over the original, > 1; got 0.5"):
        AutoPruner(prog, metric, speedup=0.5)


def test_measured_speedup_times_both_programs_frozen_on_this_device():
    from paddlejax.slim import AutoPruner

    prog = digits_program()
    search = AutoPruner(prog, lambda p: 0.0, batch_size=4, progress=False)
    assert search.measure_speedup(prune(prog, 0.9)) > 0
    assert search._original[1][0].shape == (4, 1, 8, 8)  # the batch size it was asked for


def test_the_taylor_criterion_ranks_by_weight_times_gradient_on_samples():
    prog = digits_program()
    x, y = pj.data.Digits("train").arrays()
    _silence(prog, "features.3.weight", "features.4", range(0, 64, 2))  # no effect on the loss: first to go
    small = prune(prog, {"features.3.weight": 0.5}, criterion="taylor", samples=(x[:64], y[:64]))
    np.testing.assert_allclose(np.asarray(small(x[:8])), np.asarray(prog(x[:8])), atol=1e-5)
    with pytest.raises(ValueError, match="needs samples=\\(inputs, labels\\)"):
        prune(prog, 0.5, criterion="taylor")


def test_a_per_channel_parameter_read_twice_is_cut_once():
    def net(p, x):
        h = pj.ops.conv2d(x, p["a"])
        h = pj.ops.relu(h * p["s"]) * p["s"]
        return pj.ops.conv2d(h, p["c"]).mean((2, 3))

    prog = pj.trace(net, pj.InputSpec((None, 2, 4, 4)), params=_params(a=(4, 2, 1, 1), s=(1, 4, 1, 1), c=(3, 4, 1, 1)))
    small = prune(prog, 0.5)
    assert small.params["s"].shape == (1, 2, 1, 1) and small.params["c"].shape == (3, 2, 1, 1)
    assert np.asarray(small(np.ones((2, 2, 4, 4), np.float32))).shape == (2, 3)


# -- transformers: attention heads, feed-forward widths, embedding widths ----------------------------

def tiny_bert(seq=8):
    from flax import nnx

    from paddlejax.models.bert import BertConfig, BertForSequenceClassification

    config = BertConfig.from_name("minilm-l6-h384", num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=50, max_position_embeddings=16)
    model = BertForSequenceClassification(config, num_classes=3, rngs=nnx.Rngs(0))
    model.eval()
    return pj.trace(model, pj.InputSpec((None, seq), "int32"))


ATTN = "bert.encoder.layers.0.self_attn"


def test_attention_heads_prune_whole_query_key_and_value_heads_together():
    prog = tiny_bert()
    groups = dict(groups_of(prog))
    assert groups[(f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight")] == 4  # 4 heads
    assert groups[("bert.encoder.layers.0.linear1.weight",)] == 64  # the feed-forward width
    small = prune(prog, ratios={f"{ATTN}.q_proj.weight": 0.5})
    assert small.params[f"{ATTN}.v_proj.weight"].shape == (32, 16)  # 2 heads of 8 left
    assert small.params[f"{ATTN}.out_proj.weight"].shape == (16, 32)
    reshapes = [op.attrs["shape"] for op in small.body.ops if op.type == "reshape"]
    assert reshapes == [(0, 0, 2, 8)] * 3 + [(0, 0, 16)]  # the written head counts follow
    # dropping a head is exactly silencing it: its values zeroed, its output adds nothing
    kept = {int(c) // 8 for c in np.flatnonzero(np.isin(np.asarray(prog.params[f"{ATTN}.q_proj.weight"][0]),
                                                        np.asarray(small.params[f"{ATTN}.q_proj.weight"][0])))}
    silenced = prog.clone()
    for name in (f"{ATTN}.v_proj.weight", f"{ATTN}.v_proj.bias"):
        value = np.array(prog.params[name])
        for head in set(range(4)) - kept:
            value[..., head * 8:(head + 1) * 8] = 0
        silenced.params[name] = jnp.asarray(value)
    ids = np.random.default_rng(0).integers(1, 50, (3, 8)).astype("int32")
    np.testing.assert_allclose(np.asarray(small(ids)), np.asarray(silenced(ids)), atol=1e-5)


def test_heads_prune_with_a_symbolic_sequence_length():
    small = prune(tiny_bert(seq="s"), ratios=0.25)
    assert small.params[f"{ATTN}.k_proj.weight"].shape == (32, 24)
    assert np.asarray(small(np.ones((2, 5), np.int32))).shape == (2, 3)


def _embedding_classifier(p, ids, positions):
    hidden = pj.ops.embedding(ids, p["words"]) + pj.ops.embedding(positions, p["positions"])
    return pj.ops.linear(pj.ops.reduce_mean(hidden, axis=1), p["head"])


def test_embedding_widths_added_together_prune_as_one_hidden_width():
    rng = np.random.default_rng(0)
    p = {"words": jnp.asarray(rng.normal(size=(20, 8)), jnp.float32),
         "positions": jnp.asarray(rng.normal(size=(6, 8)), jnp.float32),
         "head": jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)}
    prog = pj.trace(_embedding_classifier, pj.InputSpec((None, 6), "int32"), pj.InputSpec((None, 6), "int32"),
                    params=p)
    assert groups_of(prog) == [(("words", "positions"), 8)]
    small = prune(prog, 0.5)
    assert [small.params[k].shape for k in ("words", "positions", "head")] == [(20, 4), (6, 4), (4, 3)]
    # the kept columns of the table and rows of the head are the same hidden channels
    kept = [c for c in range(8) if np.any(np.all(np.asarray(p["words"])[:, [c]] == np.asarray(small.params["words"]),
                                                  axis=0))]
    silenced = prog.clone()
    head = np.array(p["head"])
    head[[c for c in range(8) if c not in kept]] = 0
    silenced.params["head"] = jnp.asarray(head)
    ids, positions = rng.integers(0, 20, (4, 6)).astype("int32"), np.tile(np.arange(6, dtype="int32"), (4, 1))
    np.testing.assert_allclose(np.asarray(small(ids, positions)), np.asarray(silenced(ids, positions)), atol=1e-5)


def test_a_sum_over_the_channels_freezes_them():
    p = {"w": jnp.ones((4, 2, 3, 3)), "v": jnp.ones((4, 5))}
    prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.conv2d(x, p["w"]).mean((2, 3)), p["v"]).sum(1),
                    pj.InputSpec((None, 2, 8, 8)), params=p)
    # the conv's channels are pooled over space and stay prunable; the linear's are summed together
    assert groups_of(prog) == [(("w",), 4)]


def test_pruned_params_limits_pruning_to_the_matching_groups():
    prog = digits_program()
    small = prune(prog, 0.5, pruned_params=r"features\.[03]\.weight")
    assert [small.params[f"features.{i}.weight"].shape[0] for i in (0, 3, 7)] == [16, 32, 128]
    assert analysis.flops(prune(prog, flops=0.2, pruned_params=r"features\.7\..*"), {"b": 1}) <= 0.8 * analysis.flops(
        prog, {"b": 1})
    with pytest.raises(ValueError, match="matches no prunable weight"):
        prune(prog, 0.5, pruned_params="fc.*")
    with pytest.raises(ValueError, match="not a regular expression"):
        prune(prog, 0.5, pruned_params="(")


def test_the_hidden_width_of_a_mean_pooled_transformer_prunes_through_its_layer_norms():
    from flax import nnx

    from paddlejax.models.bert import BertConfig, BertModel, SentenceEmbedding

    config = BertConfig.from_name("minilm-l6-h384", num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=50, max_position_embeddings=16)

    class Classifier(pj.nn.Layer):  # the encoder's unused pooler stays in the program: pruning looks past it
        def __init__(self):
            self.encoder = SentenceEmbedding(BertModel(config, rngs=nnx.Rngs(0)), pooling="mean", normalize=False)
            self.head = pj.nn.Linear(32, 3)

        def __call__(self, ids):
            return self.head(self.encoder(ids))

    model = Classifier()
    model.eval()
    prog = pj.to_static(model, pj.InputSpec((None, 8), "int32"))
    hidden = next(g for g in ChannelGraph(prog).groups() if any("word_embeddings" in n for n in g.producers))
    assert len(hidden.classes) == 32 and any("out_proj" in n for n in hidden.producers)  # residual stream, one width
    small = prune(prog, ratios={hidden.producers[0]: 0.25})
    shapes = {k: tuple(v.shape) for k, v in small.params.items()}
    assert shapes["encoder.bert.embeddings.word_embeddings.weight"] == (50, 24)
    assert shapes["encoder.bert.embeddings.layer_norm.weight"] == (24,)
    assert shapes["encoder.bert.encoder.layers.0.linear1.weight"] == (24, 64)
    assert shapes["head.weight"] == (24, 3)
    ids = np.random.default_rng(0).integers(1, 50, (2, 8)).astype("int32")
    assert np.isfinite(np.asarray(small(ids))).all() and np.asarray(small(ids)).shape == (2, 3)
