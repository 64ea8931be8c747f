"""The pipeline-parallel training step: the training program split into stages over the mesh
axis ``"pp"``, loss and gradients from :class:`~paddlejax.distributed.pipeline.PipelineRunner`
over micro-batches, and the optimizer update (with ZeRO-1, on the optimizer state sharded over
every device).

The training program is split into ``S`` stages (at ``pj.ops.pipeline_stage`` marks, else
balanced by FLOPs), run over the mesh axis ``"pp"`` with ``pipeline.micro_batches`` and
``pipeline.schedule``; the mesh's other devices are data parallel (``pp_degree=4`` on 8 devices
runs 2 pipelines on halves of each micro-batch). Metrics take one more forward pass. The batch
must divide by ``micro_batches`` times the data-parallel size. State the forward pass updates
(batch-norm running statistics) becomes the mean of the micro-batches' updates, as data
parallelism takes the replicas' mean. The stages may span processes; every process then passes
the whole batch. Between steps each stage's parameters and their optimizer state stay on that
stage's devices (``TrainState.params`` packs them by stage, one row per stage). ZeRO stage 1
combines with a pipeline: the optimizer state is sharded over every device of the mesh.

>>> from paddlejax.distributed import Strategy
>>> builder = PipelineParallelStep(Strategy(pp_degree=4, pipeline={"micro_batches": 2}))
>>> dict(builder.mesh.shape), builder.micro_batches
({'pp': 4, 'dp': 2}, 2)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from paddlejax.ir.core import Program
from paddlejax.train.loss_scale import all_finite
from paddlejax.train.placement import place_like
from paddlejax.train.state import TrainState
from paddlejax.train.steps.base import Objective, StepBuilder, Update


class PipelineParallelStep(StepBuilder):
    """A step over the stages of ``strategy`` (``pp_degree`` / ``pipeline.stages`` > 1), with
    ``pipeline.micro_batches`` and ``pipeline.schedule``; ``optimizer`` is the user's, probed once
    for whether it updates the packed parameters as it updates them by name.

    The parameters stay packed by stage (:class:`~paddlejax.distributed.pipeline.StageParams`)
    and sharded over ``"pp"``: each stage's on its own devices, and the optimizer state with
    them. The packed buffers also hold slots for the state the forward pass updates, refilled
    from the Trainer's ``extra`` at every step."""

    def __init__(self, strategy, optimizer: optax.GradientTransformation | None = None):
        from paddlejax.distributed.mesh import make_mesh

        if strategy.sharding.stage > 1:
            raise ValueError(f"Trainer: strategy.sharding.stage={strategy.sharding.stage} (ZeRO) cannot be combined "
                             "with pipeline parallelism (pp_degree / pipeline.stages > 1); stage 1 can (the "
                             "optimizer state sharded over every device)")
        self.strategy, self.num_stages, self.user_optimizer = strategy, strategy.pp_size, optimizer
        self.micro_batches = strategy.pipeline.micro_batches
        self.mesh = make_mesh(strategy)
        self.stages = None
        self.layout = None  # the StageParams of every value the stages read
        self.names = self.trained = None  # the trainable parameters, and the mask of their slots
        self.zero = None  # the FlatLayout of the packed parameters, under ZeRO-1

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> tuple:
        """The packed parameters, and the optimizer state shaped like them or (ZeRO-1) of their
        flat vector, sharded over every device of the mesh; no merge buffer."""
        from paddlejax.distributed.pipeline import StageParams

        self.layout = StageParams(self.stages, values)
        self.names, self.trained = sorted(params), self.layout.mask(params)
        packed = jax.device_put(self.layout.pack(values), self._rows)
        if self.strategy.sharding.stage:
            from paddlejax.distributed.zero import FlatLayout

            self.zero = FlatLayout(packed, self.mesh.size)
        if self.user_optimizer is not None:
            self._check_optimizer(params, values)
        if self.zero is None:
            opt = _as_updated(tx, packed)
            rows = {v.shape for v in packed.values()}
            place = lambda leaf: self._rows if jnp.shape(leaf) in rows else self._whole  # noqa: E731
        else:
            opt = _as_updated(tx, self.zero.shard(packed))
            place = lambda leaf: self._sharded if jnp.shape(leaf) == (self.zero.length,) else self._whole  # noqa: E731
        return packed, jax.device_put(opt, jax.tree.map(place, opt)), {}

    def _check_optimizer(self, params: dict, values: dict) -> None:
        """Raise ``ValueError`` unless the user's optimizer updates the packed parameters (under
        ZeRO-1 their flat vector) as it updates them by name: probed once, with gradients large
        enough for any clip to act."""
        tx, rng = self.user_optimizer, np.random.default_rng(0)
        grads = {n: jnp.asarray(rng.normal(size=np.shape(p)) * 1e6, jnp.result_type(p)) for n, p in params.items()}
        want = tx.update(grads, tx.init(params), params)[0]
        packed = [self.layout.pack({**jax.tree.map(jnp.zeros_like, values), **tree}) for tree in (values, grads)]
        packed = [self.zero.shard(tree) for tree in packed] if self.zero is not None else packed
        message = ("Trainer: a pipeline runs the optimizer on the parameters packed by stage (one buffer per dtype"
                   f"{', flattened for ZeRO-1' if self.zero is not None else ''}), where this one updates them "
                   "otherwise than parameter by parameter (it reads names or shapes, or a norm across parameters "
                   "some stages share: optax.masked, adafactor, lamb, a clip in the chain); use an element-wise "
                   "optimizer (sgd, momentum, adam, adamw) with Trainer(grad_clip=..., weight_decay=...)")
        try:
            got = tx.update(packed[1], tx.init(packed[0]), packed[0])[0]
        except Exception as e:  # whatever it raises on the packed form, it cannot run there
            raise ValueError(message) from e
        got = self.params(self.zero.tree(got) if self.zero is not None else got)
        if any(np.max(np.abs(got[n] - want[n]) / (np.abs(want[n]) + 1e-30)) > 1e-4 for n in want):
            raise ValueError(message)

    def params(self, packed: dict) -> dict:
        """The trainable parameters by name, from their packed form."""
        values = self.layout.unpack(packed)
        return {n: values[n] for n in self.names}

    def _is_packed(self, tree) -> bool:
        """Whether ``tree`` is laid out as the packed parameters are (a dict of per-dtype rows)."""
        return isinstance(tree, dict) and tree.keys() == self.layout.capacity.keys() and all(
            getattr(tree[k], "shape", None) == (len(self.layout.names), n) for k, n in self.layout.capacity.items())

    def _is_flat(self, leaf) -> bool:
        return self.zero is not None and getattr(leaf, "shape", None) == (self.zero.length,)

    def portable(self, state: TrainState) -> TrainState:
        """The packed parameters, their EMA and optimizer state (under ZeRO-1 its flat vector) by
        parameter name: the layout of one device's step, so a pipeline's checkpoint resumes with
        other stages or none."""
        def named(tree):
            if self._is_flat(tree):
                tree = self.zero.tree(tree)
            return self.params(tree) if self._is_packed(tree) else tree

        opt = jax.tree.map(named, state.opt, is_leaf=lambda x: self._is_packed(x) or self._is_flat(x))
        return state.replace(params=named(state.params), opt=opt, ema=named(state.ema) if state.ema else state.ema)

    def from_portable(self, portable: TrainState, like: TrainState) -> TrainState:
        def packed(old, named):
            if not (self._is_packed(old) or self._is_flat(old)):
                return place_like(named, old)
            # every copy of a parameter set to it; the other slots (refilled each step) as they are
            pack = lambda current, values: self.layout.place(current, values)  # noqa: E731
            if self._is_flat(old):
                pack = lambda current, values: self.zero.shard(self.layout.place(self.zero.tree(current), values))  # noqa: E731
            return jax.jit(pack, out_shardings=old.sharding if self._is_flat(old) else
                           jax.tree.map(lambda x: x.sharding, old))(old, named)

        is_packed = lambda x: self._is_packed(x) or self._is_flat(x)  # noqa: E731
        rest = super().from_portable(portable.replace(params={}, opt=(), ema={}), like.replace(params={}, opt=(),
                                                                                                ema={}))
        return rest.replace(params=packed(like.params, portable.params),
                            opt=jax.tree.map(packed, like.opt, portable.opt, is_leaf=is_packed),
                            ema=packed(like.ema, portable.ema) if like.ema else like.ema)

    @property
    def _rows(self):
        return NamedSharding(self.mesh, P("pp"))

    def clip(self, max_norm: float) -> optax.GradientTransformation:
        """``optax.clip_by_global_norm`` of the packed gradients (or, under ZeRO-1, their flat
        vector) that counts a parameter several stages share once, not once per copy."""
        from paddlejax.distributed.data_parallel import clip_by_norm_of

        def squared_norm(updates):
            repeats = self.layout.mask(self.layout.shared, repeats=True)
            if self.zero is not None:
                repeats = self.zero.shard(repeats)
            return sum(jnp.sum(jnp.where(r, 0, jnp.square(g))) for g, r in
                       zip(jax.tree.leaves(updates), jax.tree.leaves(repeats)))

        return clip_by_norm_of(max_norm, squared_norm)

    @property
    def _sharded(self):
        return NamedSharding(self.mesh, P(self.mesh.axis_names))

    @property
    def _whole(self):
        return NamedSharding(self.mesh, P())

    def _apply(self, tx: optax.GradientTransformation, grads: dict, opt, params: dict):
        """``tx`` applied to ``grads``: ``(params, opt)``. Under ZeRO-1 the update runs on the
        flat vector, which XLA partitions like the optimizer state (each device its slice);
        the new parameters are then gathered back."""
        if self.zero is None:
            deltas, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, deltas), opt
        # by stage, then flattened and sharded: the sharding must not spread back into other uses of
        # the parameters (the stages' inputs, the metrics' forward pass), which XLA would then regather
        rows = lambda tree: lax.with_sharding_constraint(tree, self._rows)  # noqa: E731
        flat = lambda tree: lax.with_sharding_constraint(self.zero.shard(rows(tree)), self._sharded)  # noqa: E731
        flat_params = flat(params)
        deltas, opt = tx.update(flat(grads), opt, flat_params)
        new = lax.with_sharding_constraint(optax.apply_updates(flat_params, deltas), self._whole)
        return rows(self.zero.tree(new)), opt

    def prepare(self, program: Program) -> None:
        """Split the training program (``(outputs, updates)``) into the strategy's stages."""
        from paddlejax.passes.pipeline import split_stages

        self.stages = split_stages(program, self.num_stages)

    def place(self, inputs: tuple, labels) -> tuple:
        """The batch as it is; ``ValueError`` unless every micro-batch splits evenly over the
        data-parallel replicas."""
        from paddlejax.distributed.mesh import dp_size

        replicas = dp_size(self.mesh)
        for leaf in jax.tree.leaves((inputs, labels)):
            n = np.shape(leaf)[0] if np.ndim(leaf) else None
            if n is None or n % (self.micro_batches * replicas):
                times = f" x the data-parallel size {replicas}" if replicas > 1 else ""
                raise ValueError(f"Trainer: batch size {n} is not divisible by strategy.pipeline.micro_batches="
                                 f"{self.micro_batches}{times}")
        return inputs, labels

    def _value_and_grad(self, loss_fn, packed, extra, inputs, labels):
        """``((loss, updates), grads)`` of ``loss_fn(program outputs, labels) -> (loss, updates)``
        averaged over the micro-batches (the state updates' floating-point leaves too), for the
        ``packed`` parameters with ``extra`` in its slots; the gradients packed, zero outside the
        trainable parameters' slots."""
        from paddlejax.distributed.pipeline import PipelineRunner

        runner = PipelineRunner(self.stages, loss_fn, micro_batches=self.micro_batches,
                                schedule=self.strategy.pipeline.schedule, recompute=self.strategy.recompute,
                                mesh=self.mesh, has_aux=True)
        loss, grads, _ = runner.run_packed(self.layout, self.layout.place(packed, extra), tuple(inputs), labels)
        return loss, jax.tree.map(lambda g, trained: jnp.where(trained, g, 0), grads, self.trained)

    def update(self, objective: Objective, tx: optax.GradientTransformation, state: TrainState, inputs,
               labels) -> Update:
        """Loss and gradients from the pipelined stages, then the update; metrics (if any) from
        one more forward pass of the whole program."""
        scale, extra = state.loss_scale, state.extra

        def loss_fn(out, labels):
            outputs, updates = out
            return objective.loss_fn(outputs, labels).astype(jnp.float32) * scale.scale, updates

        (loss, updates), grads = self._value_and_grad(loss_fn, state.params, extra, inputs, labels)
        loss = loss / scale.scale
        grads = scale.unscale(grads)
        finite = all_finite(grads) & jnp.isfinite(loss)
        params, opt = self._apply(tx, grads, state.opt, state.params)
        outputs = None
        if objective.metrics:
            outputs = objective.program.apply(lax.stop_gradient({**self.params(state.params), **extra}), *inputs)[0]
        return Update(params, opt, state.merge, updates, loss, objective.sums(outputs, labels, loss), finite)


def _as_updated(tx: optax.GradientTransformation, params):
    """``tx.init(params)`` in the dtypes ``tx.update`` returns. The packed parameters hold an
    integer buffer where integer values ride (dropout's key): adam's moments of it start as
    integers and come back from the first update as floats, which would compile the step again.

    >>> import jax.numpy as jnp
    >>> _as_updated(optax.adam(0.1), {"uint32": jnp.zeros(2, jnp.uint32)})[0].mu["uint32"].dtype
    dtype('float32')
    """
    opt = tx.init(params)
    updated = jax.eval_shape(lambda: tx.update(jax.tree.map(jnp.zeros_like, params), opt, params)[1])
    return jax.tree.map(lambda x, like: jnp.asarray(x, like.dtype), opt, updated)
