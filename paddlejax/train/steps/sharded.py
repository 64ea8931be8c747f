"""The training step of tensor and expert parallelism, left to XLA's partitioner: the step is
the one-device step over the whole batch, jitted with every parameter placed as its program's
param op says (``sharding``: from the tensor-parallel layers of
:mod:`paddlejax.distributed.tensor_parallel`, split over ``"mp"``, and the experts of
:mod:`paddlejax.distributed.moe`, split over ``"ep"``) and the batch split over the
data-parallel axes (``"dp"``, and ``"ep"``: experts are split over devices that also split the
batch). XLA inserts the collectives: Megatron's all-reduces over ``"mp"``, the all-to-alls that
carry tokens to their experts' devices and back, and the gradient all-reduces. The optimizer
state takes its parameter's layout, so each device holds its share of the split weights and of
their moments.

Batch norm under this step normalises over the whole batch (``batch_norm == "sync"``): the
partitioner computes the statistics of the global batch, as one device would.

>>> import jax, jax.numpy as jnp, optax
>>> from paddlejax.distributed import Strategy
>>> builder = ShardedStep(Strategy(tensor_parallel_degree=2))
>>> dict(builder.dp.mesh.shape)
{'dp': 4, 'mp': 2}
"""
from __future__ import annotations

import math

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from paddlejax.distributed.strategy import Strategy
from paddlejax.ir.core import Program
from paddlejax.ops.sharding import partition_spec
from paddlejax.train.steps.base import StepBuilder
from paddlejax.train.steps.data_parallel import DataParallelStep
from paddlejax.train.steps.single import SingleDeviceStep


class ShardedStep(DataParallelStep):
    """A step over ``strategy``'s ``dp x ep x mp`` mesh, partitioned by XLA (GSPMD). Batches are
    placed and evaluation is spread as under data parallelism; gradient merge is the optimizer's
    (``optax.MultiSteps``), as on one device."""

    optimizer = StepBuilder.optimizer
    clip = StepBuilder.clip
    update = SingleDeviceStep.update  # the whole batch's step: the partitioner splits it

    def __init__(self, strategy: Strategy):
        super().__init__(strategy)
        self.specs: dict[str, P] = {}

    def prepare(self, program: Program) -> None:
        """Read each parameter's layout from its param op, checking that the mesh divides it."""
        axes = self.mesh.axis_names
        self.specs = {op.attrs["name"]: partition_spec(op.attrs["sharding"], axes)
                      for op in program.param_ops() if "sharding" in op.attrs}
        for name, spec in self.specs.items():
            shape = program.params[name].shape
            for size, entry in zip(shape, spec):
                parts = math.prod(self.mesh.shape[a] for a in (entry if isinstance(entry, tuple) else (entry,)) if a)
                if size % parts:
                    raise ValueError(f"tensor parallel: parameter '{name}' {list(shape)} is split {parts} ways by "
                                     f"{spec}, which does not divide its size {size}")
        self.batch_norm = "sync" if any(op.type in ("batch_norm", "sync_batch_norm") and op.attrs.get("training")
                                        for op in program.walk()) else None

    def sharding(self, name: str) -> NamedSharding:
        """Where parameter ``name`` lives on the mesh (replicated unless its param op says otherwise)."""
        return NamedSharding(self.mesh, self.specs.get(name, P()))

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> tuple:
        params = jax.device_put(params, {n: self.sharding(n) for n in params})
        # the moments are made on the devices, taking their parameter's layout
        with jax.set_mesh(self.mesh):
            opt = jax.jit(tx.init)(params)
        return params, opt, {}

    def params(self, stored) -> dict:
        return stored

    def train_step(self, objective, tx, ema_decay, donate=True, report_finite=True):
        jitted = super().train_step(objective, tx, ema_decay, donate, report_finite)

        def step(*args):
            with jax.set_mesh(self.mesh):  # the layers' sharding constraints name this mesh's axes
                return jitted(*args)

        def lower(*args):
            with jax.set_mesh(self.mesh):
                return jitted.lower(*args)

        step.lower = lower  # step.lower(...).compile().as_text(): the partitioned HLO
        return step
