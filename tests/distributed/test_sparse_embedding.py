"""Sharded embedding tables (the parameter-server use): a CTR model trained with its tables split by
rows over 8 CPU devices (in one process or two) equals one device's training, each device holds
its share of the table and of the optimizer state, and plain data parallelism refuses such a table
by name."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.data import SyntheticCriteo
from paddlejax.distributed import Strategy, collective_stats
from paddlejax.distributed.sparse_embedding import SparseEmbedding
from paddlejax.optimizer import lazy_adagrad, lazy_adam
from paddlejax.train.metrics import Auc

ROWS = 4096


def train(strategy, optimizer, model="DeepFM", steps=3):
    pj.nn.seed(0)
    model = getattr(pj.models, model)(sparse_feature_number=ROWS, sparse_feature_dim=4, layer_sizes=(16,))
    trainer = pj.Trainer(model, optimizer, loss="bce_with_logits", metrics=[Auc(from_logits=True)], progress=False,
                         strategy=strategy)
    dense, sparse, labels = SyntheticCriteo(64 * steps, max_cardinality=2000).arrays()
    losses = [trainer.train_batch([dense[i:i + 64], sparse[i:i + 64]], labels[i:i + 64])
              for i in range(0, 64 * steps, 64)]
    return trainer, losses


@pytest.mark.parametrize("model, optimizer", [("DeepFM", lazy_adam(0.01)), ("WideDeep", lazy_adagrad(0.05))])
def test_sharded_tables_train_as_one_device(model, optimizer):
    want, want_losses = train(None, optimizer, model)
    got, losses = train(Strategy(shard_embeddings=True), optimizer, model)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for name, value in want.state.params.items():
        np.testing.assert_allclose(np.asarray(got.state.params[name]), np.asarray(value), rtol=2e-4, atol=2e-6,
                                   err_msg=name)
    table = got.state.params["embedding.weight"]
    assert table.addressable_shards[0].data.shape == (ROWS // 8, 4)  # its share of the rows
    field = "mu" if model == "DeepFM" else "moment"
    moments = next(getattr(s, field) for s in jax.tree.leaves(got.state.opt, is_leaf=lambda s: hasattr(s, field))
                   if hasattr(s, field))["embedding.weight"]
    assert moments.addressable_shards[0].data.shape == (ROWS // 8, 4)


def test_rows_no_sample_looked_up_keep_their_initial_values():
    before, _ = train(None, lazy_adam(0.01), steps=0 + 1)
    pj.nn.seed(0)
    initial = pj.models.DeepFM(sparse_feature_number=ROWS, sparse_feature_dim=4, layer_sizes=(16,)).embedding.weight
    dense, sparse, labels = SyntheticCriteo(64, max_cardinality=2000).arrays()
    looked_up = np.unique(np.asarray(pj.ops.hash_bucket(jnp.asarray(sparse), buckets=ROWS)))
    untouched = np.setdiff1d(np.arange(ROWS), looked_up)
    after = np.asarray(before.state.params["embedding.weight"])
    np.testing.assert_array_equal(after[untouched], np.asarray(initial[...])[untouched])
    assert not np.allclose(after[looked_up], np.asarray(initial[...])[looked_up])


def test_the_step_exchanges_ids_and_rows_by_all_to_all():
    trainer, _ = train(Strategy(shard_embeddings=True), lazy_adam(0.01), steps=1)
    dense, sparse, labels = SyntheticCriteo(64, max_cardinality=2000).arrays()
    placed = trainer.step_builder.place((jnp.asarray(dense), jnp.asarray(sparse)), jnp.asarray(labels))
    stats = collective_stats(trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed), *placed).compile())
    # two tables of the same rows looked up by the same hashed ids: one exchange of ids serves both,
    # then each table's rows come back and their gradients go out
    assert stats["all-to-all"] == 5


def test_the_program_records_the_row_split():
    model = pj.models.WideDeep(sparse_feature_number=ROWS, sparse_feature_dim=4, layer_sizes=(16,))
    program = pj.to_static(model, pj.InputSpec((None, 13)), pj.InputSpec((None, 26), "int32"))
    assert 'param @embedding.weight {sharding=(("dp", "inter", "intra", "ep"), None)}' in str(program)
    assert [op.type for op in program.walk()].count("hash_bucket") == 2


def test_plain_data_parallelism_refuses_a_sharded_table_by_name():
    with pytest.raises(ValueError, match="'embedding.weight' is split by rows.*Strategy\\(shard_embeddings=True\\)"):
        train(Strategy(), lazy_adam(0.01), steps=1)


def test_shard_embeddings_does_not_combine_with_zero_or_local_sgd():
    with pytest.raises(ValueError, match="shard_embeddings: True does not combine with sharding.stage=1"):
        Strategy(shard_embeddings=True, sharding={"stage": 1})
    with pytest.raises(ValueError, match="localsgd.*sharded embeddings"):
        Strategy(shard_embeddings=True, localsgd={"k_steps": 2})


def test_hashed_ids_reach_rows_for_values_never_seen():
    emb = SparseEmbedding(128, 2, hash_ids=True, seed=3)
    out = emb(jnp.array([[2**31 - 1, 0, 123_456_789]]))
    assert np.isfinite(np.asarray(out)).all()
    with pytest.raises(ValueError, match="SparseEmbedding: argument 'hash_ids' expects a bool"):
        SparseEmbedding(8, 2, hash_ids=1)


def test_tables_split_over_two_processes_train_as_in_one(tmp_path):
    script = pathlib.Path(__file__).parent / "ctr_script.py"
    for args in (["-m", "paddlejax.cli.main", "launch", "--nproc", "2", "--devices-per-proc", "4", "--log-dir",
                  str(tmp_path / "log"), str(script), str(tmp_path / "two.npz")], [str(script), str(tmp_path / "one.npz")]):
        result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    two, one = np.load(tmp_path / "two.npz"), np.load(tmp_path / "one.npz")
    assert int(two["rows_per_device"]) == int(one["rows_per_device"]) == 4096 // 8
    for name in ("embedding.weight", "first.weight"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert float(two["auc"]) == pytest.approx(float(one["auc"]), abs=1e-6)
