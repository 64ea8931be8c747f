"""Distributed training: strategy, fleet, data, tensor, expert and pipeline parallel, sharded and
host-memory embedding tables, multi-process (elastic) launch.

>>> import paddlejax as pj
>>> pj.distributed.Strategy(sharding={"stage": 1}).sharding.stage
1
"""
from paddlejax.distributed import fleet  # noqa: F401
from paddlejax.distributed.collectives import all_reduce_mean, collective_stats  # noqa: F401
from paddlejax.distributed.data_parallel import DataParallel, merge_gradients  # noqa: F401
from paddlejax.distributed.host_table import HostEmbeddingTable  # noqa: F401
from paddlejax.distributed.moe import MoELayer  # noqa: F401
from paddlejax.distributed.mesh import check_batch, dp_axes, dp_size, make_mesh  # noqa: F401
from paddlejax.distributed.strategy import (DGC, GradientMerge, LocalSGD, Pipeline, Sharding, Strategy,  # noqa: F401
                                           as_strategy)
from paddlejax.distributed.sparse_embedding import SparseEmbedding  # noqa: F401
from paddlejax.distributed.tensor_parallel import (ColumnParallelLinear, ParallelCrossEntropy,  # noqa: F401
                                                   RowParallelLinear, VocabParallelEmbedding)
