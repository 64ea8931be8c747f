"""Training steps, one builder per strategy behind one interface (:class:`StepBuilder`):
:class:`SingleDeviceStep`, :class:`DataParallelStep` (with ZeRO), :class:`ShardedStep`
(tensor and expert parallel, partitioned by XLA), :class:`PipelineParallelStep` and
:class:`LayerPipelineStep` (3-D).
:func:`step_builder` picks one from a strategy.

>>> from paddlejax.distributed import Strategy
>>> type(step_builder(None)).__name__, type(step_builder(Strategy())).__name__
('SingleDeviceStep', 'DataParallelStep')
>>> type(step_builder(Strategy(pp_degree=2))).__name__
'PipelineParallelStep'
"""
from __future__ import annotations

import optax

from paddlejax.train.steps.base import Objective, StepBuilder, Update  # noqa: F401
from paddlejax.train.steps.single import SingleDeviceStep


def step_builder(strategy=None, optimizer: optax.GradientTransformation | None = None, accumulate: int = 1,
                 avg: bool = True) -> StepBuilder:
    """The step builder for ``strategy`` (a :class:`~paddlejax.distributed.Strategy` or None for
    one device): 3-D (layer runs pipelined, partitioned by XLA) with stages and tensor parallelism,
    pipeline parallel with stages alone, else sharded (XLA-partitioned)
    when ``tensor_parallel_degree`` or ``expert_parallel_degree`` is over 1 or ``shard_embeddings`` is on,
    else data parallel, merging
    ``accumulate`` micro-batches' gradients (their mean, or with ``avg=False`` their sum) before
    it communicates. ``optimizer`` is the user's, which a pipeline checks it can run."""
    if strategy is None:
        return SingleDeviceStep()
    if strategy.pp_size > 1 and strategy.tensor_parallel_degree > 1:
        from paddlejax.train.steps.layer_pipeline import LayerPipelineStep

        builder = LayerPipelineStep(strategy)
    elif strategy.pp_size > 1:
        from paddlejax.train.steps.pipeline_parallel import PipelineParallelStep

        builder = PipelineParallelStep(strategy, optimizer)
    elif strategy.partitioned:
        from paddlejax.train.steps.sharded import ShardedStep

        builder = ShardedStep(strategy)
    else:
        from paddlejax.train.steps.data_parallel import DataParallelStep

        builder = DataParallelStep(strategy.replace(gradient_merge={"k_steps": accumulate, "avg": avg}))
    builder.offload_optimizer = strategy.offload_optimizer
    return builder
