"""3-D parallelism: a program's runs of identical layers found and pipelined over "pp", their
matrices split over "mp", the batch over "dp", all partitioned by XLA; the zoo's BERT and
Transformer train under it as on one device."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.distributed import Strategy, collective_stats
from paddlejax.distributed.layer_pipeline import LayerPipeline
from paddlejax.distributed.tensor_parallel import megatron_plan, parallelize
from paddlejax.models.bert import BertConfig, BertForSequenceClassification
from paddlejax.ops.sharding import partition_spec
from paddlejax.passes.layer_stack import LayerStack, NoLayers, Segment, find_layers

THREE_D = Strategy(pp_degree=2, tensor_parallel_degree=2, pipeline={"stages": 2, "micro_batches": 2})


def bert(dropout=0.0, layers=4, tensor_parallel=True):
    nn.seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    if tensor_parallel:
        parallelize(model, megatron_plan(model))
    return model


def batches(n=3):
    rng = np.random.default_rng(0)
    return [(rng.integers(1, 64, (8, 6)).astype(np.int32), rng.integers(0, 2, 8).astype(np.int32)) for _ in range(n)]


def test_bert_reads_as_embeddings_a_run_of_layers_and_a_head():
    split = find_layers(pj.to_static(bert(dropout=0.1), pj.InputSpec((None, 6), "int32"), train=True))
    assert [type(p).__name__ for p in split.parts] == ["Segment", "LayerStack", "Segment"]
    stack = split.parts[1]
    assert (stack.name, stack.count) == ("bert.encoder.layers", 4)
    # the hidden state flows from layer to layer, the attention mask goes to every layer, and each
    # layer's two dropout keys are state updates only the result reads
    assert len(stack.carry_in) == 1 and len(stack.broadcast) == 1 and len(stack.side[0]) == 2
    assert stack.params[2][stack.rests.index("linear1.weight")] == "bert.encoder.layers.2.linear1.weight"


def test_layers_that_differ_are_no_run():
    def net(p, x):
        for i in range(3):
            x = pj.ops.linear(x, p[f"blocks.{i}.w"])
            x = jnp.tanh(x) if i != 1 else jax.nn.relu(x)
        return x

    program = pj.trace(net, pj.InputSpec((None, 4)), params={f"blocks.{i}.w": jnp.eye(4) for i in range(3)})
    with pytest.raises(NoLayers, match="holds no run of identical layers"):
        find_layers(program)


def test_the_pipelined_program_computes_the_programs_loss_and_gradients_on_a_3d_mesh():
    program = pj.to_static(bert(), pj.InputSpec((None, 8), "int32"), train=True)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("pp", "dp", "mp"))
    pipeline = LayerPipeline(find_layers(program), stages=2, micro_batches=2, batch_axes=("dp",))
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (8, 8)), jnp.int32)
    labels = jnp.asarray(np.random.default_rng(1).integers(0, 2, 8), jnp.int32)

    def loss_of(apply):
        return lambda params: jnp.mean(pj.ops.cross_entropy(apply(params, ids)[0], labels))

    want_loss, want = jax.jit(jax.value_and_grad(loss_of(program.apply)))(program.params)
    specs = {op.attrs["name"]: partition_spec(op.attrs.get("sharding", ()), mesh.axis_names)
             for op in program.param_ops()}
    first = pipeline.stacked_names()
    with jax.set_mesh(mesh):
        placed = {n: jax.device_put(v, NamedSharding(mesh, P("pp", *specs[first[n]]) if n in first else specs[n]))
                  for n, v in pipeline.stack(program.params).items()}
        step = jax.jit(jax.value_and_grad(loss_of(pipeline.apply)))
        loss, grads = step(placed)
        stats = collective_stats(step.lower(placed).compile())
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    for name, g in pipeline.unstack(grads).items():
        np.testing.assert_allclose(np.asarray(g), np.asarray(want[name]), rtol=1e-5, atol=1e-7, err_msg=name)
    assert stats["collective-permute"] >= 2  # activations moving a stage on, and their gradients back


def train(model, strategy, loss="cross_entropy", data=None):
    trainer = pj.Trainer(model, optax.sgd(0.1), loss=loss, progress=False, strategy=strategy)
    return trainer, [trainer.train_batch(list(inputs), labels) for *inputs, labels in (data or batches())]


def test_bert_trains_3d_as_on_one_device():
    one, want = train(bert(tensor_parallel=False), None)
    three, losses = train(bert(), THREE_D)
    np.testing.assert_allclose(losses, want, rtol=2e-5)
    params = three.step_builder.params(three.state.params)
    for name, value in one.state.params.items():
        np.testing.assert_allclose(np.asarray(params[name]), np.asarray(value), rtol=1e-4, atol=2e-6, err_msg=name)
    # each device: its stage's 2 of the 4 layers, half of each split matrix
    q = three.state.params["bert.encoder.layers.*.self_attn.q_proj.weight"]
    assert q.shape == (4, 16, 16) and {s.data.shape for s in q.addressable_shards} == {(2, 16, 8)}
    x, y = batches(1)[0]
    assert three.evaluate((x, y))["loss"] == pytest.approx(one.evaluate((x, y))["loss"], rel=1e-5)


def test_the_zoos_transformer_pipelines_its_encoder_and_decoder_runs_3d_as_on_one_device():
    from paddlejax.models.transformer import Transformer

    rng = np.random.default_rng(0)
    data = [tuple(rng.integers(2, 16, (8, 6)).astype(np.int32) for _ in range(3)) for _ in range(2)]

    def loss(logits, labels):
        return jnp.mean(nn.functional.cross_entropy(logits, labels, reduction="none"))

    def transformer(tensor_parallel):
        nn.seed(0)
        model = Transformer(src_vocab_size=16, trg_vocab_size=16, max_length=8, num_encoder_layers=2,
                            num_decoder_layers=2, n_head=4, d_model=16, d_inner_hid=32, dropout=0.0)
        if tensor_parallel:
            parallelize(model, megatron_plan(model))
        return model

    one, want = train(transformer(False), None, loss, data)
    three, losses = train(transformer(True), THREE_D, loss, data)
    assert [p.name for p in three.step_builder.pipeline.split.stacks] == ["encoder.layers", "decoder.layers"]
    np.testing.assert_allclose(losses, want, rtol=2e-5)
    params = three.step_builder.params(three.state.params)
    for name, value in one.state.params.items():
        np.testing.assert_allclose(np.asarray(params[name]), np.asarray(value), rtol=1e-4, atol=2e-6, err_msg=name)


def test_dropout_keys_of_every_layer_advance_under_3d():
    three, losses = train(bert(dropout=0.1), THREE_D, data=batches(2))
    keys = {n: np.asarray(v) for n, v in three.state.extra.items()
            if n.startswith("bert.encoder.layers.") and n.endswith(("dropout1.key", "dropout2.key"))}
    assert len(keys) == 8 and np.all(np.isfinite(losses))  # the residual dropouts of 4 layers
    fresh = pj.Trainer(bert(dropout=0.1), optax.sgd(0.1), progress=False).model_state.values
    assert all(not np.array_equal(v, np.asarray(fresh[n])) for n, v in keys.items())


def test_a_3d_checkpoint_resumes_on_one_device_with_the_same_parameters(tmp_path):
    three, _ = train(bert(), THREE_D, data=batches(2))
    three.save(str(tmp_path / "ckpt"))
    one = pj.Trainer(bert(tensor_parallel=False), optax.sgd(0.1), progress=False)
    one.load(str(tmp_path / "ckpt"))
    for name, value in three.step_builder.params(three.state.params).items():
        np.testing.assert_array_equal(np.asarray(one.state.params[name]), np.asarray(value), err_msg=name)


def test_3d_requests_that_cannot_run_are_refused_by_name():
    with pytest.raises(ValueError, match="tensor_parallel_degree: 2 does not combine with the 1f1b pipeline"):
        Strategy(pp_degree=2, tensor_parallel_degree=2, pipeline={"stages": 2, "schedule": "1f1b"})
    with pytest.raises(ValueError, match="3 layers of 'bert.encoder.layers' do not split evenly into 2 stages"):
        train(bert(layers=3), THREE_D)
    with pytest.raises(ValueError, match="batch size 6 is not divisible by strategy.pipeline.micro_batches=2 x the"):
        trainer = pj.Trainer(bert(), optax.sgd(0.1), progress=False, strategy=THREE_D)
        trainer.train_batch([np.ones((6, 6), np.int32)], np.zeros(6, np.int32))
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match="pipelines a program's runs of identical layers; program"):
        pj.Trainer(mlp, optax.sgd(0.1), loss="mse", progress=False,
                   strategy=THREE_D).train_batch([np.ones((8, 4), np.float32)], np.zeros((8, 2), np.float32))


def test_find_layers_parts_read_each_value_once():
    split = find_layers(pj.to_static(bert(), pj.InputSpec((None, 6), "int32"), train=True))
    head, stack, tail = split.parts
    assert isinstance(head, Segment) and isinstance(stack, LayerStack) and isinstance(tail, Segment)
    assert stack.carry_in[0] in head.outputs and stack.carry_out[-1][0] in tail.inputs
