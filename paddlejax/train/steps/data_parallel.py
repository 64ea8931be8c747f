"""The data-parallel training step (with ZeRO sharding, fused or hierarchical all-reduce and
gradient merge as the strategy says): every device differentiates its rows of the batch under
``shard_map``, and :class:`~paddlejax.distributed.DataParallel` averages and applies the
gradients. Loss and metrics are those of the whole batch.

State the forward pass writes and that differs per device is combined: floats (statistics) by
their mean, integers (counts, such as an MoE layer's dropped tokens) by their sum. Batch norm
takes the statistics of each device's rows (``BatchNorm1D`` / ``2D``, with a warning)
or, with ``nn.SyncBatchNorm``, of the whole batch, as on one device; ``batch_norm`` says which
(``"local"`` or ``"sync"``; None without batch norm) once the program is captured. Evaluation
and prediction split their batches over the devices too (a last batch they do not divide runs
whole); in a run of several processes each passes its own rows, ``evaluate`` gives the metrics
of all of them and ``predict`` the outputs of this process's rows.

>>> import jax, jax.numpy as jnp, optax
>>> from paddlejax.distributed import Strategy
>>> builder = DataParallelStep(Strategy(sharding={"stage": 1}))
>>> params, opt, merge = builder.init({"w": jnp.ones(16)}, {"w": jnp.ones(16)}, optax.adam(0.1))
>>> opt[0].mu.shape, opt[0].mu.sharding.spec == jax.sharding.PartitionSpec("dp")  # ZeRO-1: split over 8 devices
((16,), True)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from paddlejax.adapter import varying_axes
from paddlejax.distributed.data_parallel import DataParallel
from paddlejax.distributed.strategy import Strategy
from paddlejax.ir.core import Program
from paddlejax.train.placement import place_like
from paddlejax.train.state import TrainState
from paddlejax.train.steps.base import Objective, StepBuilder, Update


class DataParallelStep(StepBuilder):
    """A step split over the data-parallel devices of ``strategy``'s mesh; ``dp`` is its
    :class:`~paddlejax.distributed.DataParallel`, which also merges gradients (before
    communicating), so the optimizer itself does not accumulate."""

    def __init__(self, strategy: Strategy):
        self.dp = DataParallel(strategy)
        self.mesh = self.dp.mesh

    def optimizer(self, tx, grad_clip, weight_decay, accumulate, avg=True) -> optax.GradientTransformation:
        return super().optimizer(tx, grad_clip, weight_decay, 1, avg)

    def clip(self, max_norm: float) -> optax.GradientTransformation:
        return self.dp.clip_by_global_norm(max_norm)

    def prepare(self, program: Program) -> None:
        self.batch_norm = self.dp.check_batch_norm(program)
        axes = set(self.dp.mesh.axis_names)
        for op in program.param_ops():
            split = {a for entry in op.attrs.get("sharding", ()) if entry
                     for a in (entry if isinstance(entry, tuple) else (entry,))}
            if split & axes:
                raise ValueError(f"data parallel: parameter '{op.attrs['name']}' is split by rows over the "
                                 f"data-parallel devices (a SparseEmbedding table); train it with "
                                 f"Strategy(shard_embeddings=True)")

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> tuple:
        placed = self.dp.init(params, tx)
        return placed["params"], placed["opt"], placed["merge"]

    def params(self, stored) -> dict:
        return self.dp.full_params(stored)

    def _flat(self, leaf) -> bool:
        """Whether ``leaf`` is a ZeRO flat vector (the layout the device count decides)."""
        return bool(self.dp.stage) and isinstance(leaf, jax.Array) and leaf.shape == (self.dp.layout.length,)

    def portable(self, state: TrainState) -> TrainState:
        """ZeRO's flat vectors (optimizer state, ZeRO-3's parameters and EMA, ZeRO-2/3's merged
        gradients) as the parameters' trees; the per-device state of Local SGD, DGC and gradient
        merge keeps its device axis, so such a run resumes on as many devices as it was saved on."""
        if not self.dp.stage:
            return state
        whole = NamedSharding(self.dp.mesh, P())
        unflatten = jax.jit(self.dp.layout.tree, out_shardings=whole)
        return jax.tree.map(lambda leaf: unflatten(leaf) if self._flat(leaf) else leaf, state)

    def from_portable(self, portable: TrainState, like: TrainState) -> TrainState:
        def back(old, new):
            if self._flat(old):
                return jax.jit(self.dp.layout.shard, out_shardings=old.sharding)(new)
            return place_like(new, old)

        # ``like``'s leaves are prefixes of ``portable``'s: a flat vector there is a tree here
        return jax.tree.map(back, like, portable)

    def place(self, inputs: tuple, labels) -> tuple:
        return self.dp.shard_batch((inputs, labels))

    def spread(self, batch):
        """``batch`` split over the devices (XLA partitions the jitted evaluation along it), or
        as it is when its size does not divide (in a single process: across processes every
        batch must)."""
        rows = {np.shape(leaf)[0] for leaf in jax.tree.leaves(batch)}
        if jax.process_count() == 1 and any(n % self.dp.size for n in rows):
            return batch
        return self.dp.shard_batch(batch)

    def host_rows(self, out: jax.Array) -> np.ndarray:
        """This process's rows of a batch-sharded result, in order (all of them in a single process)."""
        if out.is_fully_addressable:
            return np.asarray(out)
        pieces = {shard.index[0].start or 0: shard.data for shard in out.addressable_shards}
        return np.concatenate([np.asarray(pieces[start]) for start in sorted(pieces)])

    def update(self, objective: Objective, tx: optax.GradientTransformation, state: TrainState, inputs,
               labels) -> Update:
        """Per device, under ``shard_map``: local gradients, averaged (or merged); the update (of
        this device's ZeRO slice); the loss, state updates and metric sums of the whole batch."""
        dp = self.dp
        mean = lambda v: lax.psum(v, dp.axes) / dp.size  # noqa: E731

        def per_device(params, extra, scale, opt, merge, inputs, labels):
            grads, (loss, outputs, updates) = objective.gradients(dp.local_params(params), extra, scale, inputs,
                                                                  labels)
            grads = scale.unscale(grads)
            sums = jax.tree.map(lambda v: lax.psum(v, dp.axes), objective.sums(outputs, labels, loss))
            # state that differs per device: statistics (floats, batch norm's) are averaged, counts
            # (integers, an MoE layer's dropped tokens) added up over the whole batch; keys and
            # counters that agree on every device stay as they are
            updates = {n: v if not varying_axes(v) else mean(v) if jnp.issubdtype(v.dtype, jnp.floating)
                       else lax.psum(v, dp.axes) for n, v in updates.items()}
            loss = mean(loss)
            finite = dp.all_finite(grads) & jnp.isfinite(loss)
            params, opt, merge = dp.apply_gradients(grads, params, opt, merge, tx)
            return (params, opt, merge), updates, loss, sums, finite

        trained = {"params": state.params, "opt": state.opt, "merge": state.merge}
        specs, out = dp.specs(trained), dp.update_specs(trained)
        sharded = jax.shard_map(per_device, mesh=dp.mesh,
                                in_specs=(specs["params"], P(), P(), specs["opt"], specs["merge"], dp.batch_spec,
                                          dp.batch_spec),
                                out_specs=((out["params"], out["opt"], out["merge"]), P(), P(), P(), P()))
        (params, opt, merge), updates, loss, sums, finite = sharded(
            state.params, state.extra, state.loss_scale, state.opt, state.merge, inputs, labels)
        return Update(dp.gather(params), opt, merge, updates, loss, sums, finite)
