"""Tensor (Megatron) parallel over 8 CPU devices: column/row-parallel linears, a vocabulary-parallel
embedding and a parallel cross-entropy train to the same parameters as one device, each device
holds its slice of the split weights (and their optimizer moments), XLA places the all-reduces,
and the program records every parameter's split."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.distributed import (ColumnParallelLinear, ParallelCrossEntropy, RowParallelLinear, Strategy,
                                   VocabParallelEmbedding, collective_stats)
from paddlejax.distributed.tensor_parallel import megatron_plan, parallelize
from paddlejax.ir import VerificationError, verify

VOCAB, HIDDEN = 32, 16


class TinyLM(nn.Layer):
    """Embedding -> column -> gelu -> row -> column (vocabulary logits, left split)."""

    def __init__(self):
        self.embed = VocabParallelEmbedding(VOCAB, HIDDEN)
        self.up = ColumnParallelLinear(HIDDEN, 4 * HIDDEN, gather_output=False)
        self.down = RowParallelLinear(4 * HIDDEN, HIDDEN, input_is_parallel=True)
        self.head = ColumnParallelLinear(HIDDEN, VOCAB, gather_output=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(nn.functional.gelu(self.up(h)))
        return self.head(h)


def parallel_ce(logits, labels):
    return jnp.mean(ParallelCrossEntropy()(logits, labels))


def batches(n=3, rows=8, seq=4):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, VOCAB, (rows, seq)).astype(np.int32), rng.integers(0, VOCAB, (rows, seq)).astype(np.int32))
            for _ in range(n)]


def train(strategy, tx=None, data=None):
    nn.seed(0)
    trainer = pj.Trainer(TinyLM(), tx or optax.adam(1e-2), loss=parallel_ce, progress=False, strategy=strategy)
    losses = [trainer.train_batch([x], y) for x, y in (data or batches())]
    return trainer, losses


def assert_close(got: dict, want: dict, tol=2e-5):
    assert sorted(got) == sorted(want)
    for name in want:
        a, b = np.asarray(got[name]), np.asarray(want[name])
        assert np.max(np.abs(a - b)) <= tol * max(1.0, np.max(np.abs(b))), name


@pytest.fixture(scope="module")
def one_device():
    return train(None)


@pytest.mark.parametrize("mp", [2, 4, 8])
def test_training_equals_one_device_for_every_split(one_device, mp):
    want, want_losses = one_device
    trainer, losses = train(Strategy(tensor_parallel_degree=mp))
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5)
    assert_close(trainer.step_builder.params(trainer.state.params), want.state.params)


def test_each_device_holds_its_slice_of_the_split_weights_and_their_moments():
    trainer, _ = train(Strategy(tensor_parallel_degree=4), data=batches(1))
    params, mu = trainer.state.params, trainer.state.opt[0].mu
    shard = lambda x: x.addressable_shards[0].data.shape  # noqa: E731
    assert shard(params["up.weight"]) == (HIDDEN, HIDDEN) and shard(mu["up.weight"]) == (HIDDEN, HIDDEN)
    assert shard(params["up.bias"]) == (HIDDEN,)
    assert shard(params["down.weight"]) == (HIDDEN, HIDDEN) and shard(mu["down.weight"]) == (HIDDEN, HIDDEN)
    assert shard(params["down.bias"]) == (HIDDEN,)  # added after the all-reduce: whole everywhere
    assert shard(params["embed.weight"]) == (VOCAB // 4, HIDDEN)
    assert dict(trainer.step_builder.mesh.shape) == {"dp": 2, "mp": 4}


def test_the_compiled_step_all_reduces_over_the_tensor_parallel_groups():
    trainer, _ = train(Strategy(tensor_parallel_degree=2), data=batches(1))
    x, y = batches(1)[0]
    placed = trainer.step_builder.place((jnp.asarray(x),), jnp.asarray(y))
    hlo = trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed), *placed).compile().as_text()
    stats = collective_stats(hlo)
    assert stats["all-reduce"] >= 2
    # Megatron's all-reduces run within pairs of neighbouring devices
    assert "replica_groups={{0,1},{2,3},{4,5},{6,7}}" in hlo or "replica_groups=[4,2]<=[8]" in hlo


def test_the_program_records_each_split_and_reads_it_back(tmp_path):
    nn.seed(0)
    model = TinyLM()
    program = pj.to_static(model, pj.InputSpec((None, 4), "int32"))
    text = str(program)
    assert 'param @up.weight {sharding=(None, "mp")}' in text
    assert 'param @embed.weight {sharding=("mp", None)}' in text
    assert "param @down.bias :" in text  # replicated: no attribute
    assert str(pj.parse(text, params=program.params)) == text
    pj.save(program, tmp_path / "lm")
    assert str(pj.load(tmp_path / "lm")) == text
    assert "sharding_constraint" in {op.type for op in program.walk()}


def test_without_a_tensor_parallel_mesh_the_layers_are_the_plain_ones():
    nn.seed(0)
    model = TinyLM()
    ids = jnp.asarray(batches(1)[0][0])
    plain = model.head(model.embed(ids) + model.down(nn.functional.gelu(model.up(model.embed(ids)))))
    h = jnp.take(model.embed.weight[...], ids, axis=0)
    h = h + nn.functional.gelu(h @ model.up.weight[...] + model.up.bias[...]) @ model.down.weight[...] \
        + model.down.bias[...]
    np.testing.assert_allclose(plain, h @ model.head.weight[...] + model.head.bias[...], rtol=1e-5, atol=1e-6)


def test_parallel_cross_entropy_is_paddles_per_example_loss_and_ignores_the_ignore_index():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 8)), jnp.float32)
    loss = ParallelCrossEntropy(ignore_index=-1)(logits, jnp.array([[2], [-1], [7]]))
    assert loss.shape == (3, 1)
    want = -jax.nn.log_softmax(logits)[jnp.arange(3), jnp.array([2, 0, 7])]
    np.testing.assert_allclose(loss[:, 0], want.at[1].set(0.0), rtol=1e-6)


def test_a_split_the_mesh_does_not_divide_is_refused_by_parameter_name():
    class Odd(nn.Layer):
        def __init__(self):
            self.fc = ColumnParallelLinear(4, 6, has_bias=False)

        def forward(self, x):
            return self.fc(x)

    nn.seed(0)
    trainer = pj.Trainer(Odd(), optax.sgd(0.1), loss="mse", progress=False,
                         strategy=Strategy(tensor_parallel_degree=4))
    with pytest.raises(ValueError, match=r"parameter 'fc.weight' \[4, 6\] is split 4 ways .* does not divide its "
                                         r"size 6"):
        trainer.train_batch([jnp.ones((8, 4))], jnp.ones((8, 6)))


def test_tensor_parallel_with_a_pipeline_takes_the_gpipe_schedule_and_zero_is_refused():
    # 3-D runs its layer runs as one GPipe loop (tests/distributed/test_layer_pipeline.py); 1F1B is the
    # stage pipeline's, whose per-stage branches cannot hold tensor-parallel collectives
    assert Strategy(pp_degree=2, tensor_parallel_degree=2).pipeline.schedule == "gpipe"
    with pytest.raises(ValueError, match="tensor_parallel_degree: 2 does not combine with the 1f1b pipeline schedule"):
        Strategy(pp_degree=2, tensor_parallel_degree=2, pipeline={"schedule": "1f1b"})
    with pytest.raises(ValueError, match="tensor_parallel_degree: 2 does not combine with sharding.stage=1"):
        Strategy(tensor_parallel_degree=2, sharding={"stage": 1})


@pytest.mark.parametrize("sharding, message", [
    (("mp",), "has 1 entries for a rank-2 value"),
    (("mp", "mp"), "names a mesh axis twice"),
    (("mp", 3), "entries must be mesh axis names"),
])
def test_the_verifier_refuses_a_malformed_split(sharding, message):
    program = pj.trace(lambda p, x: x @ p["w"], jnp.ones((2, 4)), params={"w": jnp.ones((4, 4))})
    program.param_ops()[0].attrs["sharding"] = sharding
    with pytest.raises(VerificationError, match=message):
        verify(program)
    program.param_ops()[0].attrs.pop("sharding")


def test_parse_refuses_a_name_attribute_on_a_param():
    program = pj.trace(lambda p, x: x @ p["w"], jnp.ones((2, 4)), params={"w": jnp.ones((4, 4))})
    text = str(program).replace("param @w", 'param @w {name="v"}')
    with pytest.raises(pj.ParseError, match="a param's name is its @symbol"):
        pj.parse(text, params=program.params)


def test_megatron_plan_makes_the_zoo_bert_tensor_parallel_and_it_trains_as_on_one_device():
    from paddlejax.models.bert import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(0)
    data = [(rng.integers(1, 64, (8, 6)).astype(np.int32), rng.integers(0, 2, 8).astype(np.int32)) for _ in range(2)]

    def run(strategy):
        nn.seed(0)
        model = BertForSequenceClassification(config)
        if strategy is not None:
            plan = megatron_plan(model)
            assert plan["bert.embeddings.word_embeddings"] == "vocab"
            assert plan["bert.encoder.layers.0.self_attn.q_proj"] == "column"
            parallelize(model, plan)
        trainer = pj.Trainer(model, optax.sgd(0.1), loss="cross_entropy", progress=False, strategy=strategy)
        losses = [trainer.train_batch([x], y) for x, y in data]
        return trainer, losses

    one, one_losses = run(None)
    tp, tp_losses = run(Strategy(tensor_parallel_degree=4))
    np.testing.assert_allclose(tp_losses, one_losses, rtol=2e-5)
    assert_close(tp.state.params, one.state.params, tol=5e-5)
    q = tp.state.params["bert.encoder.layers.0.self_attn.q_proj.weight"]
    assert q.addressable_shards[0].data.shape == (16, 4)


def test_megatron_plan_makes_the_zoo_transformer_tensor_parallel_and_it_trains_as_on_one_device():
    from paddlejax.models.transformer import Transformer

    rng = np.random.default_rng(0)
    data = [tuple(rng.integers(2, 16, (8, 6)).astype(np.int32) for _ in range(3)) for _ in range(2)]

    def loss(logits, labels):
        return jnp.mean(nn.functional.cross_entropy(logits, labels, reduction="none"))

    def run(strategy):
        nn.seed(0)
        model = Transformer(src_vocab_size=16, trg_vocab_size=16, max_length=8, num_encoder_layers=1,
                            num_decoder_layers=1, n_head=4, d_model=16, d_inner_hid=32, dropout=0.0)
        if strategy is not None:
            plan = megatron_plan(model)
            assert plan["decoder.layers.0.cross_attn.v_proj"] == "column" and plan["src_word_embedding"] == "vocab"
            parallelize(model, plan)
        # sgd: a key projection's bias has a gradient of zero up to rounding, which Adam would scale up to
        # full steps of either sign
        trainer = pj.Trainer(model, optax.sgd(0.1), loss=loss, progress=False, strategy=strategy)
        return trainer, [trainer.train_batch([src, trg], label) for src, trg, label in data]

    one, one_losses = run(None)
    tp, tp_losses = run(Strategy(tensor_parallel_degree=2))
    np.testing.assert_allclose(tp_losses, one_losses, rtol=2e-5)
    assert_close(tp.state.params, one.state.params, tol=5e-5)


def test_parallelize_refuses_patterns_that_match_nothing_and_styles_that_do_not_fit():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"no layer of Sequential matches \['9'\]"):
        parallelize(mlp, {"9": "column"})
    with pytest.raises(ValueError, match="'1' is a ReLU; style 'row' splits a Linear"):
        parallelize(mlp, {"1": "row"})
    with pytest.raises(ValueError, match="unknown style"):
        parallelize(mlp, {"0": "diagonal"})


class FlaxMLP(nnx.Module):
    """A plain Flax model annotated with logical axis names (placed when the Trainer places it)."""

    def __init__(self):
        rngs = nnx.Rngs(0)
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(8, 32, kernel_init=nnx.with_partitioning(init, ("embed", "mlp"), eager_sharding=False),
                            rngs=rngs)
        self.down = nnx.Linear(32, 4, kernel_init=nnx.with_partitioning(init, ("mlp", "embed"), eager_sharding=False),
                              rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def test_a_flax_models_logical_axis_names_map_to_the_mesh_by_the_strategys_rules():
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32))
               for _ in range(3)]

    def run(strategy):
        trainer = pj.Trainer(FlaxMLP(), optax.sgd(0.1), loss="mse", progress=False, strategy=strategy)
        return trainer, [trainer.train_batch([x], y) for x, y in batches]

    want, want_losses = run(None)
    rules = (("embed", None), ("mlp", "mp"))
    got, losses = run(Strategy(tensor_parallel_degree=4, logical_axis_rules=rules))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert 'param @up.kernel {sharding=(None, "mp")}' in str(got.train_program)
    assert got.state.params["up.kernel"].addressable_shards[0].data.shape == (8, 8)  # a quarter of the columns
    for name, value in want.state.params.items():
        np.testing.assert_allclose(np.asarray(got.state.params[name]), np.asarray(value), rtol=1e-4, atol=1e-6)
    with nnx.logical_axis_rules(rules):  # the same rules around a capture of your own
        assert 'param @down.kernel {sharding=("mp", None)}' in str(pj.to_static(FlaxMLP(), pj.InputSpec((None, 8))))


def test_bad_logical_axis_rules_are_refused():
    with pytest.raises(ValueError, match="logical_axis_rules: expected pairs"):
        Strategy(logical_axis_rules=(("embed",),))
