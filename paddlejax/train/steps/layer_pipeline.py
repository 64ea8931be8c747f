"""The training step of 3-D parallelism (pipeline x data x tensor), partitioned by XLA: a
program's runs of identical layers pipelined over the mesh axis ``"pp"``
(:class:`~paddlejax.distributed.layer_pipeline.LayerPipeline`), their matrices split over ``"mp"``
as their param ops say, the batch over ``"dp"``.

Between steps each run's parameters are stacked, ``[layers, ...]``, and split by layers over
``"pp"`` (and by their own marks over ``"mp"``): each device holds its stage's layers' share; the
optimizer state takes the same layout. The other parameters (embeddings, heads) are split over
``"mp"`` as marked and kept whole on every stage. Evaluation runs the program unpipelined on the
same parameters.

>>> from paddlejax.distributed import Strategy
>>> builder = LayerPipelineStep(Strategy(pp_degree=2, tensor_parallel_degree=2, pipeline={"micro_batches": 2}))
>>> dict(builder.mesh.shape)
{'pp': 2, 'dp': 2, 'mp': 2}
"""
from __future__ import annotations

import dataclasses

import jax
import optax
from jax.sharding import PartitionSpec as P

from paddlejax.distributed.layer_pipeline import PP, LayerPipeline
from paddlejax.distributed.mesh import dp_axes
from paddlejax.distributed.strategy import Strategy
from paddlejax.ir.core import Program
from paddlejax.train.placement import place_like
from paddlejax.train.state import TrainState
from paddlejax.train.steps.sharded import ShardedStep


class LayerPipelineStep(ShardedStep):
    """A step over ``strategy``'s ``pp x dp x mp`` mesh: the layer runs pipelined with
    ``pipeline.micro_batches`` (a GPipe schedule), the rest partitioned as :class:`ShardedStep`
    partitions it."""

    def __init__(self, strategy: Strategy):
        super().__init__(strategy)
        self.stages, self.micro_batches = strategy.pp_size, strategy.pipeline.micro_batches
        self.recompute = strategy.recompute
        self.pipeline: LayerPipeline | None = None

    def prepare(self, program: Program) -> None:
        """Find the program's layer runs (``ValueError`` naming what is missing when it has none
        the stages divide) and the layout of every parameter."""
        from paddlejax.passes.layer_stack import NoLayers, find_layers

        super().prepare(program)
        try:
            split = find_layers(program)
        except NoLayers as e:
            raise ValueError(f"Strategy: a pipeline with tensor parallelism pipelines a program's runs of identical "
                             f"layers; {e}") from None
        self.pipeline = LayerPipeline(split, self.stages, self.micro_batches, dp_axes(self.mesh),
                                      recompute=self.recompute)
        for stacked, first in self.pipeline.stacked_names().items():
            self.specs[stacked] = P(PP, *self.specs.get(first, ()))

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> tuple:
        return super().init(self.pipeline.stack(params), values, tx)

    def params(self, stored) -> dict:
        return self.pipeline.unstack(stored)

    def _is_stacked(self, tree) -> bool:
        return isinstance(tree, dict) and any(n in tree for n in self.pipeline.stacked_names())

    def portable(self, state: TrainState) -> TrainState:
        """The stacked parameters, their EMA and optimizer state by layer name."""
        by_name = lambda tree: self.pipeline.unstack(tree) if self._is_stacked(tree) else tree  # noqa: E731
        return jax.tree.map(by_name, state, is_leaf=self._is_stacked)

    def from_portable(self, portable: TrainState, like: TrainState) -> TrainState:
        def back(old, new):
            if not self._is_stacked(old):
                return place_like(new, old)
            return {n: place_like(v, old[n]) for n, v in self.pipeline.stack(new).items()}

        return jax.tree.map(back, like, portable, is_leaf=self._is_stacked)

    def place(self, inputs: tuple, labels) -> tuple:
        """The batch split over ``"dp"``; ``ValueError`` unless each micro-batch splits evenly."""
        rows = jax.tree.leaves((inputs, labels))[0].shape[0] * jax.process_count()
        if rows % (self.micro_batches * self.dp.size):
            raise ValueError(f"Trainer: batch size {rows} is not divisible by strategy.pipeline.micro_batches="
                             f"{self.micro_batches} x the data-parallel size {self.dp.size}")
        return super().place(inputs, labels)

    def train_step(self, objective, tx, ema_decay, donate=True, report_finite=True):
        # the same objective, its program run with the layer runs pipelined
        return super().train_step(dataclasses.replace(objective, program=self.pipeline), tx, ema_decay, donate,
                                  report_finite)
