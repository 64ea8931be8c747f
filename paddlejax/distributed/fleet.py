"""Paddle's ``fleet`` API: make a single-device training script data parallel.

The three lines::

    fleet.init(strategy)                          # joins a `paddlejax launch` run, builds the mesh
    model = fleet.distributed_model(model)        # parameters replicated on the mesh
    optimizer = fleet.distributed_optimizer(opt)  # carries the strategy (gradient merge, ZeRO, ...)

after which ``pj.Trainer(model, optimizer, ...)`` trains over every device (as
``pj.Trainer(model, opt, strategy=strategy)`` does).

>>> import optax
>>> from paddlejax.distributed import Strategy, fleet
>>> fleet.init(Strategy(gradient_merge={"k_steps": 2}))
>>> fleet.worker_index(), fleet.worker_num(), dict(fleet.mesh().shape)
(0, 1, {'dp': 8})
>>> fleet.distributed_optimizer(optax.sgd(0.1)).strategy.gradient_merge.k_steps
2
"""
from __future__ import annotations

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from paddlejax.distributed import tensor_parallel as meta_parallel  # noqa: F401  (Paddle's fleet.meta_parallel)
from paddlejax.distributed.data_parallel import merge_gradients
from paddlejax.distributed.env import init_from_env
from paddlejax.distributed.mesh import make_mesh
from paddlejax.distributed.strategy import Strategy

_fleet: dict = {"strategy": None, "mesh": None}


def init(strategy: Strategy | None = None, is_collective: bool = True) -> None:
    """Start distributed training with ``strategy`` (default :class:`Strategy`): join the run when
    the process was started by ``paddlejax launch`` (so call this before any JAX work), then
    build the mesh over every device of every process."""
    if not is_collective:
        raise ValueError("fleet.init: is_collective=False (server processes holding the tables) is not supported; "
                         "parameter-server models train collectively here: split their tables over the devices "
                         "(distributed.SparseEmbedding with Strategy(shard_embeddings=True)) and keep the rest in "
                         "host memory (distributed.HostEmbeddingTable)")
    if strategy is not None and not isinstance(strategy, Strategy):
        raise ValueError(f"fleet.init: strategy expects a Strategy, got {type(strategy).__name__}")
    init_from_env()
    strategy = strategy or Strategy()
    _fleet.update(strategy=strategy, mesh=make_mesh(strategy))


def _initialized(caller: str) -> None:
    if _fleet["strategy"] is None:
        raise RuntimeError(f"fleet.{caller}: call fleet.init() first")


def strategy() -> Strategy:
    """The strategy given to :func:`init`."""
    _initialized("strategy")
    return _fleet["strategy"]


def mesh() -> Mesh:
    """The device mesh :func:`init` built."""
    _initialized("mesh")
    return _fleet["mesh"]


def worker_index() -> int:
    """This process's rank (0 unless started by ``paddlejax launch``)."""
    return jax.process_index()


def worker_num() -> int:
    """The number of processes (each may drive several devices)."""
    return jax.process_count()


def distributed_model(model):
    """``model`` with its variables replicated on every device of the mesh (updated in place;
    returned for Paddle's ``model = fleet.distributed_model(model)``)."""
    from flax import nnx

    _initialized("distributed_model")
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, NamedSharding(_fleet["mesh"], P())))
    return model


class DistributedOptimizer(optax.GradientTransformation):
    """An optax transformation that carries its :class:`Strategy`: as an optimizer it is
    ``optimizer`` with the strategy's gradient merge; the Trainer reads ``strategy`` and
    ``inner`` (the optimizer as given) to run the distributed step."""

    def __new__(cls, optimizer: optax.GradientTransformation, strategy: Strategy):
        merged = merge_gradients(optimizer, strategy.gradient_merge.k_steps, strategy.gradient_merge.avg)
        self = super().__new__(cls, merged.init, merged.update)
        self.inner, self.strategy = optimizer, strategy
        return self


def distributed_optimizer(optimizer: optax.GradientTransformation,
                          strategy: Strategy | None = None) -> DistributedOptimizer:
    """``optimizer`` marked for distributed training with ``strategy`` (default: :func:`init`'s)."""
    if strategy is None:
        _initialized("distributed_optimizer")
        strategy = _fleet["strategy"]
    return DistributedOptimizer(optimizer, strategy)
