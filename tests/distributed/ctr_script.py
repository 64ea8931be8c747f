"""DeepFM with its tables split by rows over every device of every process.

    python ctr_script.py OUT.npz                                               # one process, 8 devices
    paddlejax launch --nproc 2 --devices-per-proc 4 ctr_script.py OUT.npz

Each process feeds its own rows of every global batch of 64; process 0 writes the final tables and
the held-out AUC (evaluated over every process's rows) to OUT.npz.
"""
import os
import sys

import jax

from paddlejax.distributed import Strategy, env, fleet

if env.COORDINATOR not in os.environ:
    jax.config.update("jax_num_cpu_devices", 8)
fleet.init(Strategy(shard_embeddings=True))

import numpy as np  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax.data import SyntheticCriteo  # noqa: E402
from paddlejax.optimizer import lazy_adam  # noqa: E402
from paddlejax.train.metrics import Auc  # noqa: E402
from paddlejax.train.placement import host_copy  # noqa: E402

BATCH, STEPS = 64, 4


def mine(arrays):
    share = BATCH // jax.process_count()
    rows = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[jax.process_index() * share:][:share]
                           for s in range(len(arrays[0]) // BATCH)])
    return [a[rows] for a in arrays], share


if __name__ == "__main__":
    pj.nn.seed(0)
    model = pj.models.DeepFM(sparse_feature_number=4096, sparse_feature_dim=4, layer_sizes=(16,))
    trainer = pj.Trainer(model, lazy_adam(0.01), loss="bce_with_logits", metrics=[Auc(from_logits=True)],
                         progress=False, strategy=fleet.strategy())
    (dense, sparse, labels), share = mine(SyntheticCriteo(BATCH * STEPS, max_cardinality=2000).arrays())
    for i in range(STEPS):
        trainer.train_batch([dense[i * share:(i + 1) * share], sparse[i * share:(i + 1) * share]],
                            labels[i * share:(i + 1) * share])
    test, share = mine(SyntheticCriteo(BATCH * 2, split="test", max_cardinality=2000).arrays())
    auc = trainer.evaluate(tuple(test), batch_size=share)["auc"]
    tables = {n: np.asarray(host_copy(trainer.state.params[n])) for n in ("embedding.weight", "first.weight")}
    if jax.process_index() == 0:
        np.savez(sys.argv[1], auc=auc, rows_per_device=trainer.state.params["embedding.weight"].addressable_shards[0]
                 .data.shape[0], **tables)
