"""The Trainer: Paddle's ``Model.fit`` habits on Flax NNX, Optax and Orbax.

The model is captured as a static program (:func:`paddlejax.to_static`) on the first batch;
passes decide mixed precision on that program, and one jitted step runs forward, loss,
backward, optimizer update, EMA and metric sums. Parameters stay float32 (master weights).

>>> import numpy as np, optax, paddlejax as pj
>>> from flax import nnx
>>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
>>> y = (x[:, 0] > 0).astype("int32")
>>> trainer = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.5), metrics=["accuracy"],
...                      progress=False)
>>> history = trainer.fit((x, y), epochs=20, batch_size=16)
>>> trainer.evaluate((x, y))["acc"] > 0.9
True
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from paddlejax import ops
from paddlejax.adapter import varying_axes
from paddlejax.capture import InputSpec
from paddlejax.ir.core import Program
from paddlejax.static import ModelState, to_static
from paddlejax.train import metrics as metrics_lib
from paddlejax.train.callbacks import Callback
from paddlejax.train.history import History, TensorBoard
from paddlejax.train.loss_scale import LossScale, all_finite

AMP_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def _cross_entropy(outputs, labels):
    return ops.cross_entropy(outputs, labels)


def _mse(outputs, labels):
    return jnp.mean(jnp.square(outputs.astype(jnp.float32) - labels))


LOSSES = {"cross_entropy": _cross_entropy, "mse": _mse}


def _loss_fn(loss) -> Callable:
    if callable(loss):
        return loss
    if loss in LOSSES:
        return LOSSES[loss]
    raise ValueError(f"Trainer: loss expects a callable or one of {sorted(LOSSES)}, got {loss!r}")


def _spec(x) -> InputSpec:
    """The input spec of one batch array with a symbolic batch size (a spec stays as it is)."""
    if isinstance(x, InputSpec):
        return x
    x = np.asarray(x) if not hasattr(x, "shape") else x
    return InputSpec((None, *x.shape[1:]), jnp.result_type(x).name)


def _shown(logs: dict) -> dict[str, str]:
    """Logged numbers as a progress bar or an epoch line shows them."""
    return {k: f"{v:.4g}" for k, v in logs.items()}


def _listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _state_difference(stored: dict, current: dict) -> str:
    """How two training states (``{entry name: shape}``) differ, in one line: entries only in
    one of them, grouped over the model's variables (``opt/0/mu/* (4)``), and variables whose
    shapes differ."""
    variables = {n.split("/", 1)[1] for n in (*stored, *current) if n.startswith(("params/", "extra/"))}

    def groups(names) -> str:
        counts: dict[str, int] = {}
        for name in names:
            head, _, last = name.rpartition("/")
            key = f"{head}/*" if head and last in variables else name
            counts[key] = counts.get(key, 0) + 1
        return _listed([f"{k} ({n})" if n > 1 else k for k, n in counts.items()])

    parts = []
    if only := [n for n in stored if n not in current]:
        parts.append(f"only in the checkpoint: {groups(only)}")
    if only := [n for n in current if n not in stored]:
        parts.append(f"only in this run: {groups(only)}")
    reshaped = {}
    for name in stored:
        if name in current and stored[name] != current[name]:
            reshaped.setdefault(name.rpartition("/")[2], (stored[name], current[name]))
    if reshaped:
        parts.append("other shapes: " + _listed([f"{n} {tuple(a)} -> {tuple(b)}" for n, (a, b) in reshaped.items()]))
    return "; ".join(parts) or "the same entries in another order"


def _local_rows(out: jax.Array) -> np.ndarray:
    """The rows of a batch-sharded result that live on this process, in order (all of them in a
    single process)."""
    if out.is_fully_addressable:
        return np.asarray(out)
    pieces = {shard.index[0].start or 0: shard.data for shard in out.addressable_shards}
    return np.concatenate([np.asarray(pieces[start]) for start in sorted(pieces)])


class _PipelineStep:
    """The pipeline-parallel part of a Trainer's step: the training program split into stages,
    loss and gradients from :class:`~paddlejax.distributed.pipeline.PipelineRunner`, and the
    optimizer update (with ZeRO-1, on the optimizer state sharded over every device).

    The parameters stay packed by stage (:class:`~paddlejax.distributed.pipeline.StageParams`)
    and sharded over ``"pp"``: each stage's on its own devices, and the optimizer state with
    them. The packed buffers also hold slots for the state the forward pass updates, refilled
    from the Trainer's ``extra`` at every step."""

    def __init__(self, strategy, optimizer: optax.GradientTransformation | None = None):
        from paddlejax.distributed.mesh import make_mesh

        self.strategy, self.num_stages, self.optimizer = strategy, strategy.pp_size, optimizer
        self.micro_batches = strategy.pipeline.micro_batches
        self.mesh = make_mesh(strategy)
        self.stages = None
        self.layout = None  # the StageParams of every value the stages read
        self.names = self.trained = None  # the trainable parameters, and the mask of their slots
        self.zero = None  # the FlatLayout of the packed parameters, under ZeRO-1

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> dict:
        """The state ``{"params", "opt", "merge"}`` for the trainable ``params`` among ``values``
        (every value of the program): the packed parameters, and the optimizer state shaped like
        them or (ZeRO-1) of their flat vector, sharded over every device of the mesh."""
        from paddlejax.distributed.pipeline import StageParams

        self.layout = StageParams(self.stages, values)
        self.names, self.trained = sorted(params), self.layout.mask(params)
        packed = jax.device_put(self.layout.pack(values), self._rows)
        if self.strategy.sharding.stage:
            from paddlejax.distributed.zero import FlatLayout

            self.zero = FlatLayout(packed, self.mesh.size)
        if self.optimizer is not None:
            self._check_optimizer(params, values)
        if self.zero is None:
            opt = tx.init(packed)
            rows = {v.shape for v in packed.values()}
            place = lambda leaf: self._rows if jnp.shape(leaf) in rows else self._whole  # noqa: E731
        else:
            opt = tx.init(self.zero.shard(packed))
            place = lambda leaf: self._sharded if jnp.shape(leaf) == (self.zero.length,) else self._whole  # noqa: E731
        return {"params": packed, "opt": jax.device_put(opt, jax.tree.map(place, opt)), "merge": {}}

    def _check_optimizer(self, params: dict, values: dict) -> None:
        """Raise ``ValueError`` unless the user's optimizer updates the packed parameters (under
        ZeRO-1 their flat vector) as it updates them by name: probed once, with gradients large
        enough for any clip to act."""
        tx, rng = self.optimizer, np.random.default_rng(0)
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
        """The trainable parameters by name from their packed form."""
        values = self.layout.unpack(packed)
        return {n: values[n] for n in self.names}

    @property
    def _rows(self):
        return NamedSharding(self.mesh, P("pp"))

    def clip_by_global_norm(self, max_norm: float) -> optax.GradientTransformation:
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

    def update(self, tx: optax.GradientTransformation, grads: dict, opt, params: dict):
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

    def split(self, program: Program) -> None:
        """Split the training program (``(outputs, updates)``) into the strategy's stages."""
        from paddlejax.passes.pipeline import split_stages

        self.stages = split_stages(program, self.num_stages)

    def check_batch(self, batch) -> None:
        """Raise ``ValueError`` unless every micro-batch splits evenly over the data-parallel replicas."""
        from paddlejax.distributed.mesh import dp_size

        replicas = dp_size(self.mesh)
        for leaf in jax.tree.leaves(batch):
            n = np.shape(leaf)[0] if np.ndim(leaf) else None
            if n is None or n % (self.micro_batches * replicas):
                times = f" x the data-parallel size {replicas}" if replicas > 1 else ""
                raise ValueError(f"Trainer: batch size {n} is not divisible by strategy.pipeline.micro_batches="
                                 f"{self.micro_batches}{times}")

    def value_and_grad(self, loss_fn, packed, extra, inputs, labels):
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


class Trainer:
    """Train, evaluate and run an NNX model (a ``paddlejax.nn`` layer or any ``nnx.Module``).

    Args:
        model: the model; its variables are updated in place at the end of ``fit``.
        optimizer: an optax transformation (``optax.inject_hyperparams(optax.sgd)(learning_rate=
            schedule)`` also logs the learning rate).
        loss: ``"cross_entropy"``, ``"mse"`` or ``fn(outputs, labels) -> scalar``.
        metrics: :class:`~paddlejax.train.metrics.Metric` instances or names (``"accuracy"``).
        amp: ``"bf16"`` or ``"fp16"`` (Paddle's AMP lists as the ``amp`` pass on the program;
            fp16 adds dynamic loss scaling), or None.
        grad_clip: clip gradients to this global norm. ``weight_decay``: L2 decay added to the
            gradients (Paddle's ``L2Decay``). ``accumulate``: gradient accumulation steps.
        ema: decay of an exponential moving average of the parameters (Paddle's
            ``ExponentialMovingAverage``, with its ``min(decay, (1 + t) / (10 + t))`` warm-up);
            evaluation, prediction and saved models then use the averaged weights.
        callbacks, log_dir (TensorBoard event files), log_every (steps between progress updates).
        progress: True shows a progress bar per epoch (loss, metrics and the latest evaluation's
            in its postfix) and prints a line per epoch (``epoch 1/5: loss=0.41 acc=0.88
            eval_loss=0.37 eval_acc=0.9 (1.2 s)``), as Paddle's ``Model.fit`` does; ``"epoch"``
            prints the lines only; False shows nothing.
        checkpoint_dir, checkpoint_every, keep_checkpoints, resume: Orbax checkpoints of the
            whole training state; ``fit`` resumes from the latest good one.
        check_nan_inf: on a non-finite loss or gradient, name the first op that produced it.
        passes: a pipeline (``"quant_aware"``, or a list of passes) run on the captured
            training and inference programs, before ``amp``; state the passes add (e.g.
            quantization scales) is trained and checkpointed with the model's, and
            :meth:`inference_program` keeps it.
        strategy: a :class:`paddlejax.distributed.Strategy`, a dict of its fields, or an optimizer
            from ``fleet.distributed_optimizer``, which carries one: the step runs data parallel over
            every device (the batch split over them, gradients averaged; ZeRO sharding, fused or
            hierarchical all-reduce, gradient merge, amp and recompute as the strategy says); loss
            and metrics are those of the whole batch. Batch norm takes the statistics of each
            device's rows (``BatchNorm1D`` / ``2D``, with a warning) or, with ``nn.SyncBatchNorm``,
            of the whole batch, as on one device; ``batch_norm`` says which (``"local"`` or
            ``"sync"``; None without batch norm) once the first batch is seen. Evaluation and prediction split their
            batches over the devices too (a last batch they do not divide runs whole); in a run
            of several processes each passes its own rows, ``evaluate`` gives the metrics of all
            of them and ``predict`` the outputs of this process's rows.
            With ``pp_degree`` / ``pipeline.stages`` ``S > 1`` the step is pipeline parallel
            instead: the training program is split into ``S`` stages (at ``pj.ops.pipeline_stage``
            marks, else balanced by FLOPs), run by
            :class:`~paddlejax.distributed.pipeline.PipelineRunner` over the mesh axis ``"pp"``
            with ``pipeline.micro_batches`` and ``pipeline.schedule`` (the mesh's other devices
            data parallel: ``pp_degree=4`` on 8 devices runs 2 pipelines on halves of each
            micro-batch); metrics take one more forward pass. The batch must divide by
            ``micro_batches`` times the data-parallel size. State the forward pass updates
            (batch-norm running statistics) becomes the mean of the micro-batches' updates, as
            data parallelism takes the replicas' mean. The stages may span processes; every
            process then passes the whole batch. Between steps each stage's parameters and their
            optimizer state stay on that stage's devices (``state["params"]`` packs them by stage,
            one row per stage). ZeRO stage 1 combines with a pipeline: the optimizer state is
            sharded over every device of the mesh.
    """

    def __init__(self, model, optimizer: optax.GradientTransformation | None = None, loss="cross_entropy",
                 metrics: Sequence = (), *, amp: str | None = None, grad_clip: float | None = None,
                 weight_decay: float | None = None, accumulate: int = 1, ema: float | None = None,
                 callbacks: Sequence[Callback] = (), log_dir: str | None = None, log_every: int = 10,
                 progress: bool = True, checkpoint_dir: str | None = None, checkpoint_every: int = 100,
                 keep_checkpoints: int = 3, resume: bool = True, check_nan_inf: bool = False,
                 passes: str | Sequence = (), strategy=None):
        strategy = strategy if strategy is not None else getattr(optimizer, "strategy", None)
        optimizer = getattr(optimizer, "inner", optimizer)
        if strategy is not None:
            from paddlejax.distributed import as_strategy

            strategy = as_strategy(strategy, "Trainer")
            amp, accumulate, merge_avg = self._from_strategy(strategy, amp, accumulate)
        else:
            merge_avg = True
        if amp is not None and amp not in AMP_DTYPES:
            raise ValueError(f"Trainer: amp expects one of {sorted(AMP_DTYPES)} or None, got {amp!r}")
        if accumulate < 1:
            raise ValueError(f"Trainer: accumulate expects an int >= 1, got {accumulate!r}")
        if ema is not None and not 0 < ema < 1:
            raise ValueError(f"Trainer: ema expects a decay in (0, 1), got {ema!r}")
        self.model = model
        self.model_state = ModelState(model)
        self.loss_fn = _loss_fn(loss)
        self.metrics = [metrics_lib.get(m) for m in metrics]
        self.amp = AMP_DTYPES.get(amp) if amp else None
        self.passes = self._passes(passes)
        self.strategy = strategy
        self.dp = self.pipeline = None
        self.batch_norm = None  # under data parallelism: "sync", "local" (per device) or None (no batch norm)
        clip = optax.clip_by_global_norm
        if strategy is not None and strategy.pp_size > 1:
            self.pipeline = _PipelineStep(strategy, optimizer)
            clip = self.pipeline.clip_by_global_norm
        elif strategy is not None:
            from paddlejax.distributed import DataParallel

            # the data-parallel step merges gradients itself, so that it communicates once per update
            self.dp = DataParallel(strategy.replace(gradient_merge={"k_steps": accumulate, "avg": merge_avg}))
            clip, accumulate = self.dp.clip_by_global_norm, 1
        self.tx = self._optimizer(optimizer or optax.sgd(0.01), grad_clip, weight_decay, accumulate, merge_avg, clip)
        self.ema_decay = ema
        self.callbacks = list(callbacks)
        self.history = History()
        self.tensorboard = TensorBoard(log_dir) if log_dir else None
        if progress not in (True, False, "epoch"):
            raise ValueError(f"Trainer: progress expects True, False or 'epoch', got {progress!r}")
        self.log_every, self.progress = max(1, log_every), progress
        self._eval_logs: dict = {}  # the latest evaluation's, shown with the training logs
        self.check = check_nan_inf
        self.checkpoints = None
        if checkpoint_dir is not None:
            from paddlejax.train.checkpoint import CheckpointManager

            self.checkpoints = CheckpointManager(checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints)
        self.resume = resume
        self.stop_training = False
        self.specs: tuple | None = None
        self.train_program: Program | None = None
        self.eval_program: Program | None = None
        self.state: dict | None = None
        self._zeros = None
        self.epoch = 0

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def _from_strategy(strategy, amp, accumulate):
        """(amp, accumulate, avg) merged from the Trainer's arguments and ``strategy``."""
        if strategy.pp_size > 1 and strategy.sharding.stage > 1:
            raise ValueError(f"Trainer: strategy.sharding.stage={strategy.sharding.stage} (ZeRO) cannot be combined "
                             "with pipeline parallelism (pp_degree / pipeline.stages > 1); stage 1 can (the "
                             "optimizer state sharded over every device)")
        if amp is not None and strategy.amp is not None and AMP_DTYPES.get(amp) != AMP_DTYPES[strategy.amp]:
            raise ValueError(f"Trainer: amp={amp!r} contradicts strategy.amp={strategy.amp!r}")
        merge = strategy.gradient_merge
        if accumulate > 1 and merge.k_steps > 1 and accumulate != merge.k_steps:
            raise ValueError(f"Trainer: accumulate={accumulate} contradicts strategy.gradient_merge.k_steps="
                             f"{merge.k_steps}")
        return amp or strategy.amp, max(accumulate, merge.k_steps), merge.avg

    @staticmethod
    def _optimizer(tx, grad_clip, weight_decay, accumulate, avg=True, clip=optax.clip_by_global_norm):
        from paddlejax.distributed.data_parallel import merge_gradients

        chain = []
        if grad_clip is not None:
            chain.append(clip(grad_clip))
        if weight_decay:
            chain.append(optax.add_decayed_weights(weight_decay))
        tx = optax.chain(*chain, tx) if chain else tx
        return merge_gradients(tx, accumulate, avg)

    @staticmethod
    def _passes(passes) -> list:
        if not passes:
            return []
        from paddlejax.passes import PassManager

        return PassManager(passes).passes  # parsed now, so a misspelt pass fails here

    def _build(self, inputs) -> None:
        """Capture the programs and initialise the training state on the first batch."""
        if self.train_program is not None:
            return
        self.specs = tuple(_spec(x) for x in inputs)
        self.train_program = self._static(train=True)
        self.eval_program = self._static(train=False)
        if self.pipeline is not None:
            self.pipeline.split(self.train_program)
        if self.dp is not None:
            self.batch_norm = self.dp.check_batch_norm(self.train_program)
        # state added by the passes (not a model variable) is carried like batch-norm statistics
        values = {**self.train_program.params, **self.model_state.values}
        params = {n: values[n] for n in sorted(self.model_state.trainable)}
        scale = LossScale.dynamic() if self.amp == "float16" else LossScale.none()
        if self.dp is not None:
            placed = self.dp.init(params, self.tx)
        elif self.pipeline is not None:
            placed = self.pipeline.init(params, values, self.tx)
        else:
            placed = {"params": params, "opt": self.tx.init(params), "merge": {}}
        self.state = {
            "params": placed["params"],
            "extra": {n: v for n, v in values.items() if n not in params},
            "opt": placed["opt"],
            "merge": placed["merge"],
            "ema": jax.tree.map(lambda p: p, placed["params"]) if self.ema_decay else {},
            "loss_scale": scale,
            "step": jnp.int32(0),
        }
        # fresh buffers: the step donates its state, which must not free the model's own arrays
        self.state = jax.tree.map(lambda x: jnp.array(x, copy=True), self.state)
        donate = () if self.check else (0,)
        self._train_step = jax.jit(self._step, donate_argnums=donate)
        self._eval_step = jax.jit(self._evaluate_batch)
        self._predict_step = jax.jit(lambda s, inputs: self.eval_program.apply(self._weights(s), *inputs))

    def _static(self, train: bool, model=None, amp: bool = True) -> Program:
        prog = to_static(self.model if model is None else model, *self.specs, train=train)
        pipeline = self.passes + ([f"amp{{dtype={self.amp}}}"] if self.amp and amp else [])
        if not pipeline:
            return prog
        from paddlejax.passes import PassManager

        manager = PassManager(pipeline)
        prog = manager.run(prog, training=train)
        idle = [r.name for r in manager.records[:len(self.passes)] if not r.changed]
        if idle:
            warnings.warn(f"Trainer: pass {', '.join(idle)} changed nothing in {prog.name} (no op it applies to?)",
                          stacklevel=3)
        return prog

    @property
    def step(self) -> int:
        return int(self.state["step"]) if self.state is not None else 0

    # -- the jitted functions --------------------------------------------------------------------
    def _batch_sums(self, outputs, labels, loss):
        n = jnp.asarray(labels).shape[0] if jnp.ndim(labels) else 1
        sums = {"loss": loss.astype(jnp.float32) * n, "count": jnp.asarray(n, jnp.float32)}
        for m in self.metrics:
            sums.update({f"{m.name}.{k}": v for k, v in m.update(outputs, labels).items()})
        return sums

    def _gradients(self, params, extra, scale, inputs, labels):
        """Gradients of the (scaled) loss, and (loss, outputs, state updates)."""
        apply = self.train_program.apply
        if self.strategy is not None and self.strategy.recompute:
            apply = jax.checkpoint(apply)

        def objective(params):
            outputs, updates = apply({**params, **extra}, *inputs)
            loss = self.loss_fn(outputs, labels).astype(jnp.float32)
            return loss * scale.scale, (loss, outputs, updates)

        return jax.grad(objective, has_aux=True)(params)

    def _step(self, state, sums, inputs, labels):
        if self.dp is not None:
            return self._commit(state, sums, *self._data_parallel_update(state, inputs, labels))
        if self.pipeline is not None:
            return self._commit(state, sums, *self._pipeline_update(state, inputs, labels))
        scale = state["loss_scale"]
        grads, (loss, outputs, updates) = self._gradients(state["params"], state["extra"], scale, inputs, labels)
        grads = scale.unscale(grads)
        finite = all_finite(grads) & jnp.isfinite(loss)
        deltas, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], deltas)
        return self._commit(state, sums, (params, opt, {}), updates, loss, self._batch_sums(outputs, labels, loss),
                            finite)

    def _data_parallel_update(self, state, inputs, labels):
        """The step's per-device part under ``shard_map``: local gradients, averaged (or merged);
        the update (of this device's ZeRO slice); loss, state updates and metric sums of the whole
        batch. Returns the new ``(params, opt, merge)`` and the rest as :meth:`_commit` takes it."""
        dp = self.dp
        mean = lambda v: lax.psum(v, dp.axes) / dp.size  # noqa: E731

        def per_device(params, extra, scale, opt, merge, inputs, labels):
            grads, (loss, outputs, updates) = self._gradients(dp.local_params(params), extra, scale, inputs, labels)
            grads = scale.unscale(grads)
            sums = jax.tree.map(lambda v: lax.psum(v, dp.axes), self._batch_sums(outputs, labels, loss))
            # batch-norm statistics differ per device: keep their mean (keys and counters agree already)
            updates = {n: mean(v) if varying_axes(v) and jnp.issubdtype(v.dtype, jnp.floating) else v
                       for n, v in updates.items()}
            loss = mean(loss)
            finite = dp.all_finite(grads) & jnp.isfinite(loss)
            params, opt, merge = dp.apply_gradients(grads, params, opt, merge, self.tx)
            return (params, opt, merge), updates, loss, sums, finite

        specs = dp.specs(state)
        out = dp.update_specs(state)
        sharded = jax.shard_map(per_device, mesh=dp.mesh,
                                in_specs=(specs["params"], P(), P(), specs["opt"], specs["merge"], dp.batch_spec,
                                          dp.batch_spec),
                                out_specs=((out["params"], out["opt"], out["merge"]), P(), P(), P(), P()))
        (params, opt, merge), updates, loss, batch, finite = sharded(
            state["params"], state["extra"], state["loss_scale"], state["opt"], state["merge"], inputs, labels)
        return (dp.gather(params), opt, merge), updates, loss, batch, finite

    def _pipeline_update(self, state, inputs, labels):
        """Loss and gradients from the pipelined stages, then the usual update; metrics (if any)
        from one more forward pass of the whole program."""
        scale, extra = state["loss_scale"], state["extra"]

        def loss_fn(out, labels):
            outputs, updates = out
            return self.loss_fn(outputs, labels).astype(jnp.float32) * scale.scale, updates

        (loss, updates), grads = self.pipeline.value_and_grad(loss_fn, state["params"], extra, inputs, labels)
        loss = loss / scale.scale
        grads = scale.unscale(grads)
        finite = all_finite(grads) & jnp.isfinite(loss)
        params, opt = self.pipeline.update(self.tx, grads, state["opt"], state["params"])
        outputs = None
        if self.metrics:
            outputs = self.train_program.apply(lax.stop_gradient({**self._params(state["params"]), **extra}),
                                               *inputs)[0]
        return (params, opt, {}), updates, loss, self._batch_sums(outputs, labels, loss), finite

    def _commit(self, state, sums, trained, updates, loss, batch, finite):
        """The new state after an update, ``trained = (params, opt, merge)`` (a non-finite fp16
        step keeps all but the loss scale)."""
        new_scale, apply = state["loss_scale"].adjust(finite)
        extra = {**state["extra"], **updates}
        if state["loss_scale"].is_dynamic:  # a skipped step keeps everything but the scale
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)  # noqa: E731
            trained, extra = keep(trained, (state["params"], state["opt"], state["merge"])), keep(extra, state["extra"])
        params, opt, merge = trained
        ema = state["ema"]
        if self.ema_decay:
            t = state["step"].astype(jnp.float32)
            decay = jnp.minimum(self.ema_decay, (1 + t) / (10 + t))
            ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        new_state = {"params": params, "extra": extra, "opt": opt, "merge": merge, "ema": ema,
                     "loss_scale": new_scale, "step": state["step"] + 1}
        return new_state, jax.tree.map(jnp.add, sums, batch), loss, finite

    def _params(self, params) -> dict:
        """Parameters as a dict (ZeRO-3 keeps them as a sharded flat vector, a pipeline packed by stage)."""
        if self.pipeline is not None:
            return self.pipeline.params(params)
        return self.dp.full_params(params) if self.dp is not None else params

    def _weights(self, state) -> dict:
        params = state["ema"] if self.ema_decay else state["params"]
        return {**self._params(params), **state["extra"]}

    def _evaluate_batch(self, state, sums, inputs, labels):
        outputs = self.eval_program.apply(self._weights(state), *inputs)
        batch = self._batch_sums(outputs, labels, self.loss_fn(outputs, labels))
        return jax.tree.map(jnp.add, sums, batch)

    def _zero_sums(self, inputs, labels) -> dict:
        """Zeros shaped like one batch's sums, made once (steps do not donate them, so they are reused)."""
        if self._zeros is None:
            shapes = jax.eval_shape(
                lambda s, i, y: self._batch_sums(self.eval_program.apply(self._weights(s), *i), y, jnp.float32(0)),
                self.state, inputs, labels)
            self._zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
        return self._zeros

    # -- public API ------------------------------------------------------------------------------
    def build(self, *inputs) -> None:
        """Capture the programs and set up the training state from input specs
        (:class:`~paddlejax.InputSpec`, batch size None) or example batch arrays, before any data
        arrives (otherwise the first batch does it); ``predict`` then takes ``len(inputs)`` inputs.

        >>> import optax, paddlejax as pj
        >>> from flax import nnx
        >>> trainer = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), progress=False)
        >>> trainer.build(pj.InputSpec((None, 4)))
        >>> trainer.step, trainer.predict(np.ones((3, 4), "float32")).shape
        (0, (3, 2))
        """
        self._build(inputs)

    def train_batch(self, inputs: Sequence, labels) -> float:
        """One optimisation step on a batch; returns its loss (Paddle's ``Model.train_batch``)."""
        inputs = tuple(inputs)
        self._build(inputs)
        self.state, _, loss, _ = self._run_step(self._zero_sums(inputs, labels), inputs, labels)
        return float(loss)

    def _run_step(self, sums, inputs, labels):
        before = self.state
        if self.dp is not None:
            inputs, labels = self.dp.shard_batch((inputs, labels))
        if self.pipeline is not None:
            self.pipeline.check_batch((inputs, labels))
        state, sums, loss, finite = self._train_step(self.state, sums, inputs, labels)
        if self.check and not bool(finite):
            self._report_nonfinite(before, inputs, labels)
        return state, sums, loss, finite

    def _report_nonfinite(self, state, inputs, labels):
        from paddlejax.nancheck import NonFiniteError, check_nan_inf

        params = self._params(state["params"])
        values = {**params, **state["extra"]}
        check_nan_inf(self.train_program, values, *inputs)
        outputs, _ = self.train_program.apply(values, *inputs)
        if not bool(all_finite(self.loss_fn(outputs, labels))):
            raise NonFiniteError(f"step {int(state['step'])}: the program's outputs are finite but the loss "
                                 "function produced a non-finite value")
        grads = jax.grad(lambda p: self.loss_fn(self.train_program.apply({**p, **state["extra"]}, *inputs)[0],
                                                labels))(params)
        bad = sorted(n for n, g in grads.items() if not bool(all_finite(g)))
        raise NonFiniteError(f"step {int(state['step'])}: the forward pass is finite but the gradients of "
                             f"{', '.join(bad) or 'no parameter'} are not (an op's derivative overflowed)")

    def fit(self, train, eval=None, epochs: int = 1, batch_size: int = 32, shuffle: bool = True,
            seed: int = 0, eval_every: int | None = None, eval_freq: int = 1, save_freq: int = 1) -> History:
        """Train for ``epochs`` over ``train`` (a DataLoader, or arrays / a dataset that is wrapped
        in one with ``batch_size``, ``shuffle`` and ``seed``), evaluating on ``eval`` after the
        first epoch and every ``eval_freq`` epochs from there (Paddle's rule; also every
        ``eval_every`` steps if set), and checkpointing (with ``checkpoint_dir``) after every
        ``save_freq`` epochs and the last. Returns the :class:`History`."""
        for name, freq in (("eval_freq", eval_freq), ("save_freq", save_freq)):
            if not isinstance(freq, int) or isinstance(freq, bool) or freq < 1:
                raise ValueError(f"Trainer.fit: {name} expects a number of epochs >= 1, got {freq!r}")
        loader = self._loader(train, batch_size, shuffle, seed)
        eval_loader = self._loader(eval, batch_size, False, seed) if eval is not None else None
        if len(loader) == 0:
            raise ValueError("Trainer.fit: the training data gives no batch (fewer samples than batch_size "
                             "with drop_last?)")
        self._maybe_resume(loader)
        self.stop_training = False
        self._call("on_train_begin")
        try:
            while self.epoch < epochs and not self.stop_training:
                self._train_epoch(loader, eval_loader, epochs, eval_every, eval_freq, save_freq)
        finally:
            if self.checkpoints is not None:
                self.checkpoints.wait()
            self.sync_model()
        self._call("on_train_end")
        return self.history

    def _loader(self, data, batch_size, shuffle, seed):
        from paddlejax.data import DataLoader

        if isinstance(data, DataLoader):
            return data
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle, seed=seed)

    def _split(self, batch):
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError("Trainer: batches must be (inputs..., labels) tuples; got "
                             f"{type(batch).__name__}")
        return tuple(batch[:-1]), batch[-1]

    def _train_epoch(self, loader, eval_loader, epochs, eval_every, eval_freq, save_freq):
        epoch = self.epoch
        self._call("on_epoch_begin", epoch)
        start = loader.state_dict().get("position", 0) if hasattr(loader, "state_dict") else 0
        bar = self._bar(len(loader), start, f"epoch {epoch + 1}/{epochs}")
        sums, logs, tic = None, {}, time.perf_counter()
        for i, batch in enumerate(loader, start=start):
            inputs, labels = self._split(batch)
            self._build(inputs)
            sums = self._zero_sums(inputs, labels) if sums is None else sums
            self.state, sums, loss, _ = self._run_step(sums, inputs, labels)
            step = self.step
            if (i + 1) % self.log_every == 0 or i + 1 == len(loader):
                logs = {"loss": float(loss), **self._results(sums)}
                logs.pop("loss_avg", None)
                self._log("train", step, {**logs, **self._lr()})
                if bar is not None:
                    bar.set_postfix(_shown({**logs, **self._eval_logs}), refresh=False)
                self._call("on_step_end", step, logs)
            if bar is not None:
                bar.update(1)
            if eval_loader is not None and eval_every and step % eval_every == 0:
                self._eval_and_log(eval_loader)
            if self.checkpoints is not None:
                self._save_checkpoint(loader, epoch, force=False)
            if self.stop_training:
                break
        else:
            self.epoch += 1
        epoch_logs = {**self._results(sums), "time": time.perf_counter() - tic} if sums is not None else {}
        if eval_loader is not None and self.epoch > epoch and epoch % eval_freq == 0:
            epoch_logs.update(self._eval_and_log(eval_loader))
        if bar is not None:
            bar.set_postfix(_shown({**logs, **self._eval_logs}), refresh=False)
            bar.close()
        if self.progress and epoch_logs:
            seconds = epoch_logs.get("time", 0.0)
            shown = " ".join(f"{k}={v}" for k, v in _shown(epoch_logs).items() if k != "time")
            print(f"epoch {epoch + 1}/{epochs}: {shown} ({seconds:.1f} s)", flush=True)
        self.history.log("epoch", epoch, epoch_logs)
        self._call("on_epoch_end", epoch, epoch_logs)
        epoch_done = self.epoch > epoch and ((epoch + 1) % save_freq == 0 or self.epoch == epochs)
        if self.checkpoints is not None and self.checkpoints.latest_step() != self.step and (
                epoch_done or self.stop_training):
            self._save_checkpoint(loader, self.epoch, force=True)

    def _results(self, sums) -> dict:
        totals = jax.device_get(sums)
        out = {"loss": float(totals["loss"]) / max(float(totals["count"]), 1.0)}
        for m in self.metrics:
            prefix = f"{m.name}."
            out.update(m.result({k[len(prefix):]: v for k, v in totals.items() if k.startswith(prefix)}))
        return out

    def _lr(self) -> dict:
        """The learning rate of the last step, when the optimizer exposes it (``inject_hyperparams``)."""
        found = optax.tree_utils.tree_get_all_with_path(self.state["opt"], "learning_rate")
        values = [v for _, v in found if isinstance(v, jax.Array) and v.ndim == 0]
        return {"lr": float(values[0])} if values else {}

    def _eval_and_log(self, eval_loader) -> dict:
        results = self.evaluate(eval_loader)
        logs = {f"eval_{k}": v for k, v in results.items()}
        self._eval_logs = logs
        self._log("eval", self.step, results)
        self._call("on_eval_end", logs)
        return logs

    def evaluate(self, data, batch_size: int = 256) -> dict[str, float]:
        """Loss and metrics over ``data`` in eval mode (with the EMA weights when ``ema`` is set)."""
        loader = self._loader(data, batch_size, False, 0)
        sums = None
        for batch in loader:
            inputs, labels = self._split(batch)
            self._build(inputs)
            sums = self._zero_sums(inputs, labels) if sums is None else sums
            sums = self._eval_step(self.state, sums, *self._spread((inputs, labels)))
        if sums is None:
            raise ValueError("Trainer.evaluate: the data gives no batch")
        return self._results(sums)

    def predict(self, data, batch_size: int = 256) -> Any:
        """The model's outputs over ``data`` (arrays of inputs, or batches of (inputs..., labels)),
        concatenated along the batch axis as numpy arrays."""
        if isinstance(data, np.ndarray) or hasattr(data, "shape"):
            data = (data,)
        loader = self._loader(data, batch_size, False, 0)
        outs = []
        for batch in loader:
            inputs = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
            inputs = inputs[:len(self.specs)] if self.specs else inputs
            self._build(inputs)
            outs.append(jax.tree.map(_local_rows, self._predict_step(self.state, self._spread(inputs))))
        return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)

    def _spread(self, batch):
        """``batch`` split over the data-parallel devices (XLA partitions the jitted evaluation
        along it), or as it is without data parallelism or when its size does not divide (in a
        single process: across processes every batch must)."""
        if self.dp is None:
            return batch
        rows = {np.shape(leaf)[0] for leaf in jax.tree.leaves(batch)}
        if jax.process_count() == 1 and any(n % self.dp.size for n in rows):
            return batch
        return self.dp.shard_batch(batch)

    def inference_program(self) -> Program:
        """The model in eval mode as a program holding the current (EMA) weights, ready to save
        (in float32: without ``amp``, with the other ``passes`` and their trained state)."""
        if self.state is None:
            raise RuntimeError("Trainer.inference_program: train or evaluate on a batch first")
        weights = jax.device_get(self._weights(self.state))
        program = self._static(False, self.model_state.merge(weights), amp=False)
        program.params.update({n: v for n, v in weights.items() if n in program.params})
        return program

    def sync_model(self) -> None:
        """Write the trained parameters and state back into ``model``."""
        if self.state is not None:
            self.model_state.write({**self._params(self.state["params"]), **self.state["extra"]})

    def plot(self, path: str = "curves.png") -> str:
        """Training curves (loss and metrics, train and eval) as a PNG; returns the path."""
        return self.history.plot(path)

    # -- checkpoints -----------------------------------------------------------------------------
    def _checkpoint_tree(self) -> dict:
        leaves = jax.tree.leaves(self.state)
        return {f"{i:05d}": leaf for i, leaf in enumerate(leaves)}

    def _state_shapes(self) -> dict[str, list[int]]:
        """The training state's entries by name (``opt/0/mu/l1.kernel``), in leaf order, with their shapes."""
        flat, _ = jax.tree_util.tree_flatten_with_path(self.state)
        return {jax.tree_util.keystr(p, simple=True, separator="/"): list(np.shape(v)) for p, v in flat}

    def _checkpoint_meta(self, loader, epoch) -> dict:
        # the input specs let load() build the state without data; the entry names let a
        # mismatch be told by name
        return {"epoch": epoch, "loader": loader.state_dict() if hasattr(loader, "state_dict") else None,
                "inputs": [[list(s.shape), jnp.dtype(s.dtype).name] for s in self.specs],
                "state": self._state_shapes()}

    def _save_checkpoint(self, loader, epoch, force):
        self.checkpoints.save(self.step, self._checkpoint_tree(), meta=self._checkpoint_meta(loader, epoch),
                              force=force)

    def _maybe_resume(self, loader) -> None:
        if self.checkpoints is None or not self.resume or self.checkpoints.latest_step() is None:
            return
        from paddlejax.data import DataLoader

        peek = DataLoader(loader.dataset, batch_size=loader.batch_size, device_prefetch=0)
        self._build(self._split(next(iter(peek)))[0])
        meta = self._restore(self.checkpoints)
        if meta is not None and meta.get("loader") is not None:
            loader.load_state_dict(meta["loader"])

    def _restore(self, manager, step: int | None = None) -> dict | None:
        """Load the newest intact checkpoint of ``manager`` (or ``step``) into the built state and
        the epoch; returns its meta, or None when there is no checkpoint."""
        from paddlejax.train.checkpoint import CheckpointError

        try:
            restored = manager.restore(like=self._checkpoint_tree(), step=step)
        except CheckpointError as e:
            stored = e.meta.get("state") if isinstance(e.meta, dict) else None
            if not isinstance(stored, dict):
                raise
            raise CheckpointError(f"Trainer: checkpoint step {e.step} in {manager.directory} does not fit this "
                                  f"run's training state ({_state_difference(stored, self._state_shapes())}); "
                                  "resume with the model and optimizer it was saved with, or start afresh with "
                                  "resume=False or another checkpoint_dir", step=e.step, meta=e.meta) from None
        if restored is None:
            return None
        leaves, treedef = jax.tree.flatten(self.state)
        placed = [self._placed_like(restored.state[k], old) for k, old in zip(sorted(restored.state), leaves)]
        self.state = jax.tree.unflatten(treedef, placed)
        self.epoch = restored.meta["epoch"]
        return restored.meta

    def save(self, path: str) -> None:
        """Write the whole training state (parameters, optimizer state, EMA, step, epoch) as a
        checkpoint in the directory ``path``, which :meth:`load` reads back (a step already
        saved there is kept as it is). :meth:`inference_program` with ``pj.save`` saves a model
        to deploy instead."""
        if self.state is None:
            raise RuntimeError("Trainer.save: train or evaluate on a batch first (there is no training state yet)")
        from paddlejax.train.checkpoint import CheckpointManager

        with CheckpointManager(path, keep=None, async_save=False) as manager:
            manager.save(self.step, self._checkpoint_tree(), meta=self._checkpoint_meta(None, self.epoch),
                         force=True)

    def load(self, path: str, step: int | None = None) -> int:
        """Load the training state from a checkpoint directory (a run's ``checkpoint_dir``, or
        :meth:`save`'s): its newest intact checkpoint, or ``step``. Needs no data: the input
        specs are in the checkpoint. Then ``evaluate``/``predict`` run on its weights and ``fit``
        continues from it. Returns the step loaded.

        >>> import tempfile, numpy as np, optax, paddlejax as pj
        >>> from flax import nnx
        >>> x, y = np.ones((8, 4), "float32"), np.zeros(8, "int32")
        >>> trained = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), progress=False)
        >>> _ = trained.fit((x, y), epochs=2, batch_size=4)
        >>> folder = tempfile.mkdtemp(); trained.save(folder)
        >>> fresh = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(1)), optax.sgd(0.1), progress=False)
        >>> fresh.load(folder), fresh.evaluate((x, y)) == trained.evaluate((x, y))
        (4, True)
        """
        from paddlejax.train.checkpoint import CheckpointError, CheckpointManager

        if not os.path.isdir(path):
            raise FileNotFoundError(f"Trainer.load: no checkpoint directory at {path}")
        with CheckpointManager(path) as manager:
            if self.state is None:
                meta = manager.read_meta(step)
                if not isinstance(meta, dict) or "inputs" not in meta:
                    raise CheckpointError(f"Trainer.load: {path} holds no checkpoint with input specs (none saved, "
                                          "or one from an older paddlejax); run one batch through the trainer "
                                          "first (train_batch or evaluate), then load")
                self._build(tuple(InputSpec(tuple(shape), dtype) for shape, dtype in meta["inputs"]))
            if self._restore(manager, step) is None:
                raise CheckpointError(f"Trainer.load: no checkpoint in {path}")
        self.sync_model()
        return self.step

    @staticmethod
    def _placed_like(restored, old):
        """``restored`` where ``old`` lives: sharded like it (a ZeRO state stays sharded), or, for
        an array on one device, uncommitted, so that jit may pair it with sharded ones."""
        if len(old.sharding.device_set) > 1:
            return jax.device_put(restored, old.sharding)
        return jnp.asarray(np.asarray(restored))

    # -- logging ---------------------------------------------------------------------------------
    def _bar(self, total, initial, desc):
        if self.progress is not True:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)

    def _log(self, phase, step, values):
        self.history.log(phase, step, values)
        if self.tensorboard is not None:
            self.tensorboard.log(phase, step, values)

    def _call(self, hook, *args):
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

