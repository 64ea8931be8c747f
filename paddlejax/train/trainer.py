"""The Trainer: Paddle's ``Model.fit`` habits on Flax NNX, Optax and Orbax.

The model is captured as a static program (:func:`paddlejax.to_static`) on the first batch;
passes decide mixed precision on that program, and one jitted step runs forward, loss,
backward, optimizer update, EMA and metric sums. Parameters stay float32 (master weights).

The Trainer puts together pieces that live on their own: the state it carries from step to
step is a :class:`~paddlejax.train.state.TrainState`; the step comes from the step builder of
its strategy (:mod:`paddlejax.train.steps`: one device, data parallel, pipeline parallel);
logs, the progress bar and checkpoints are callbacks it installs from its arguments
(:mod:`~paddlejax.train.history`, :mod:`~paddlejax.train.progress`,
:mod:`~paddlejax.train.checkpointing`).

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

import contextlib
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paddlejax.capture import InputSpec
from paddlejax.ir.core import Program
from paddlejax.lowering import bind_inputs
from paddlejax.static import ModelState, to_static
from paddlejax.train import checkpointing, losses
from paddlejax.train import metrics as metrics_lib
from paddlejax.train.callbacks import Callback
from paddlejax.train.history import History, TensorBoard
from paddlejax.train.loop import FitLoop
from paddlejax.train.loss_scale import LossScale
from paddlejax.train.placement import require_pinned_host
from paddlejax.train.state import TrainState
from paddlejax.train.steps import Objective, step_builder

AMP_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def _spec(x) -> InputSpec:
    """The input spec of one batch array with a symbolic batch size (a spec stays as it is)."""
    if isinstance(x, InputSpec):
        return x
    x = np.asarray(x) if not hasattr(x, "shape") else x
    return InputSpec((None, *x.shape[1:]), jnp.result_type(x).name)


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
        passes: a pass pipeline (``"quant_aware"``; ``"autotune"``, which picks each convolution's
            kernel for training, timed forward and backward at the first batch's size; or a list
            of passes) run on the captured training and inference programs, before ``amp``;
            state the passes add (e.g. quantization scales) is trained and checkpointed with
            the model's, and :meth:`inference_program` keeps it.
        strategy: a :class:`paddlejax.distributed.Strategy`, a dict of its fields, or an optimizer
            from ``fleet.distributed_optimizer``, which carries one. The step then runs data
            parallel over every device (ZeRO sharding, fused or hierarchical all-reduce, gradient
            merge, amp and recompute as the strategy says: see
            :class:`~paddlejax.train.steps.data_parallel.DataParallelStep` for batch norm,
            evaluation and several processes), or with ``pp_degree`` / ``pipeline.stages`` > 1
            pipeline parallel (:class:`~paddlejax.train.steps.pipeline_parallel.PipelineParallelStep`:
            stages, micro-batches, schedules, ZeRO-1); loss and metrics are those of the whole batch.

    Once built: ``state`` (a :class:`~paddlejax.train.state.TrainState`), ``step_builder`` (the
    strategy's :class:`~paddlejax.train.steps.StepBuilder`), ``train_program`` / ``eval_program``,
    ``history`` and ``checkpoints`` (the ``checkpoint_dir``'s manager, or None).
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
        merge_avg = True
        if strategy is not None:
            from paddlejax.distributed import as_strategy

            strategy = as_strategy(strategy, "Trainer")
            amp, accumulate, merge_avg = self._from_strategy(strategy, amp, accumulate)
        if amp is not None and amp not in AMP_DTYPES:
            raise ValueError(f"Trainer: amp expects one of {sorted(AMP_DTYPES)} or None, got {amp!r}")
        if accumulate < 1:
            raise ValueError(f"Trainer: accumulate expects an int >= 1, got {accumulate!r}")
        if ema is not None and not 0 < ema < 1:
            raise ValueError(f"Trainer: ema expects a decay in (0, 1), got {ema!r}")
        if progress not in (True, False, "epoch"):
            raise ValueError(f"Trainer: progress expects True, False or 'epoch', got {progress!r}")
        self.model = model
        self.model_state = ModelState(model)
        self.loss_fn = losses.get(loss)
        self.metrics = [metrics_lib.get(m) for m in metrics]
        self.amp = AMP_DTYPES.get(amp) if amp else None
        self.passes = self._passes(passes)
        self.strategy = strategy
        self.step_builder = step_builder(strategy, optimizer, accumulate, merge_avg)
        self.tx = self.step_builder.optimizer(optimizer or optax.sgd(0.01), grad_clip, weight_decay, accumulate,
                                              merge_avg)
        self.ema_decay = ema
        self.callbacks = list(callbacks)
        self.history = History()
        self.tensorboard = TensorBoard(log_dir) if log_dir else None
        self.log_every, self.progress = max(1, log_every), progress
        self.check = check_nan_inf
        self.checkpoints = None
        if checkpoint_dir is not None:
            from paddlejax.train.checkpoint import CheckpointManager

            self.checkpoints = CheckpointManager(checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints)
        self.resume = resume
        self.stop_training = False
        self.specs: tuple | None = None
        self._first_batch: tuple | None = None
        self.train_program: Program | None = None
        self.eval_program: Program | None = None
        self.state: TrainState | None = None
        self._zeros = None
        self.epoch = 0

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def _from_strategy(strategy, amp, accumulate):
        """(amp, accumulate, avg) merged from the Trainer's arguments and ``strategy``."""
        if amp is not None and strategy.amp is not None and AMP_DTYPES.get(amp) != AMP_DTYPES[strategy.amp]:
            raise ValueError(f"Trainer: amp={amp!r} contradicts strategy.amp={strategy.amp!r}")
        merge = strategy.gradient_merge
        if accumulate > 1 and merge.k_steps > 1 and accumulate != merge.k_steps:
            raise ValueError(f"Trainer: accumulate={accumulate} contradicts strategy.gradient_merge.k_steps="
                             f"{merge.k_steps}")
        return amp or strategy.amp, max(accumulate, merge.k_steps), merge.avg

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
        # passes that time the program (autotune) time it at the first batch's sizes
        self._first_batch = None if any(isinstance(x, InputSpec) for x in inputs) else tuple(
            jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in inputs)
        self.train_program = self._static(train=True)
        self.eval_program = self._static(train=False)
        self.step_builder.prepare(self.train_program)
        # state added by the passes (not a model variable) is carried like batch-norm statistics
        values = {**self.train_program.params, **self.model_state.values}
        trainable = sorted(self.model_state.trainable)
        params, opt, merge = self.step_builder.init({n: values[n] for n in trainable}, values, self.tx)
        opt = self.step_builder.place_optimizer(opt)
        extra = {n: v for n, v in values.items() if n not in trainable}
        self.state = self.step_builder.place_state(TrainState.create(
            params, extra, opt, merge, ema=bool(self.ema_decay),
            loss_scale=LossScale.dynamic() if self.amp == "float16" else None))
        self._objective = Objective(self.train_program, self.loss_fn, tuple(self.metrics))
        self._train_step = self.step_builder.train_step(self._objective, self.tx, self.ema_decay,
                                                        donate=not self.check, report_finite=self.check)
        self._eval_step = jax.jit(self._evaluate_batch)
        self._predict_step = jax.jit(lambda s, inputs: self.eval_program.apply(self._weights(s), *inputs))

    def _axis_rules(self):
        """Flax's context for the strategy's logical axis rules (none without them)."""
        rules = self.strategy.logical_axis_rules if self.strategy is not None else ()
        if not rules:
            return contextlib.nullcontext()
        from flax import nnx

        return nnx.logical_axis_rules(rules)

    def _static(self, train: bool, model=None, amp: bool = True) -> Program:
        with self._axis_rules():  # logical axis names resolved while the parameters are read
            prog = to_static(self.model if model is None else model, *self.specs, train=train)
        passes = self.passes + ([f"amp{{dtype={self.amp}}}"] if self.amp and amp else [])
        # recompute in segments: one jax.checkpoint around the whole forward pass would hold
        # every activation again at once while it is recomputed, saving nothing at the peak
        # (pipeline stages recompute their own forward pass)
        recompute = self.strategy is not None and self.strategy.recompute and self.pipeline is None
        if train and recompute and self.strategy.recompute_offload:
            require_pinned_host("Strategy.recompute_offload")
            passes += ["remat{offload=true}"]
        elif train and recompute:
            passes += ["remat"]
        if not passes:
            return prog
        from paddlejax.passes import PassManager

        manager = PassManager(passes)
        sizes = bind_inputs(prog, self._first_batch)[1] if self._first_batch else None
        prog = manager.run(prog, training=train, sizes=sizes)
        idle = [r.name for r in manager.records[:len(self.passes)] if not r.changed]
        if idle:
            warnings.warn(f"Trainer: pass {', '.join(idle)} changed nothing in {prog.name} (no op it applies to?)",
                          stacklevel=3)
        return prog

    @property
    def step(self) -> int:
        """The number of steps trained so far."""
        return int(self.state.step) if self.state is not None else 0

    @property
    def dp(self):
        """The :class:`~paddlejax.distributed.DataParallel` of a data-parallel step, else None."""
        from paddlejax.train.steps.data_parallel import DataParallelStep

        return self.step_builder.dp if isinstance(self.step_builder, DataParallelStep) else None

    @property
    def pipeline(self):
        """The :class:`~paddlejax.train.steps.pipeline_parallel.PipelineParallelStep` of a
        pipeline-parallel step (its ``stages``, ``mesh`` and ``layout``), else None."""
        from paddlejax.train.steps.pipeline_parallel import PipelineParallelStep

        return self.step_builder if isinstance(self.step_builder, PipelineParallelStep) else None

    @property
    def batch_norm(self) -> str | None:
        """Under data parallelism, once the first batch is seen: ``"sync"`` (the whole batch's
        statistics), ``"local"`` (each device's rows) or None (no batch norm)."""
        return self.step_builder.batch_norm

    # -- the jitted functions --------------------------------------------------------------------
    def _weights(self, state: TrainState) -> dict:
        params = state.ema if self.ema_decay else state.params
        return {**self.step_builder.params(params), **state.extra}

    def _evaluate_batch(self, state, sums, inputs, labels):
        outputs = self.eval_program.apply(self._weights(state), *inputs)
        batch = metrics_lib.batch_sums(self.metrics, outputs, labels, self.loss_fn(outputs, labels))
        return jax.tree.map(jnp.add, sums, batch)

    def _zero_sums(self, inputs, labels) -> dict:
        """Zeros shaped like one batch's sums, made once (steps do not donate them, so they are reused)."""
        if self._zeros is None:
            def one_batch(state, inputs, labels):
                outputs = self.eval_program.apply(self._weights(state), *inputs)
                return metrics_lib.batch_sums(self.metrics, outputs, labels, jnp.float32(0))

            shapes = jax.eval_shape(one_batch, self.state, inputs, labels)
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

    def compiled_step(self, inputs: Sequence, labels):
        """The training step as XLA compiles it for batches shaped like ``inputs`` and
        ``labels`` (a ``jax.stages.Compiled``): read its ``memory_analysis()``,
        ``cost_analysis()`` or ``as_text()``. Trains nothing; builds the trainer if needed.

        >>> import optax, paddlejax as pj
        >>> from flax import nnx
        >>> trainer = pj.Trainer(nnx.Linear(4, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), progress=False)
        >>> step = trainer.compiled_step([np.ones((8, 4), "float32")], np.zeros(8, "int32"))
        >>> step.memory_analysis().temp_size_in_bytes >= 0, trainer.step
        (True, 0)
        """
        inputs = tuple(inputs)
        self._build(inputs)
        sums = self._zero_sums(inputs, labels)
        inputs, labels = self.step_builder.place(inputs, labels)
        return self._train_step.lower(self.state, sums, inputs, labels).compile()

    def _run_step(self, sums, inputs, labels):
        before = self.state
        inputs, labels = self.step_builder.place(inputs, labels)
        state, sums, loss, finite = self._train_step(self.state, sums, inputs, labels)
        if self.check and not bool(finite):
            params = self.step_builder.params(before.params)
            self._objective.explain_nonfinite(params, before.extra, inputs, labels, int(before.step))
        return state, sums, loss, finite

    def fit(self, train, eval=None, epochs: int = 1, batch_size: int = 32, shuffle: bool = True,
            seed: int = 0, eval_every: int | None = None, eval_freq: int = 1, save_freq: int = 1) -> History:
        """Train up to epoch ``epochs`` over ``train`` (a DataLoader, or arrays / a dataset that is
        wrapped in one with ``batch_size``, ``shuffle`` and ``seed``): the epochs count from the
        trainer's first (so a run resumed from a checkpoint ends where the whole run would, and a
        second call trains only past the first's epochs, with a warning when there is nothing to
        train), evaluating on ``eval`` after the
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
        FitLoop(self, loader, eval_loader, epochs, eval_every, eval_freq, save_freq).run()
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

    def evaluate(self, data, batch_size: int = 256) -> dict[str, float]:
        """Loss and metrics over ``data`` in eval mode (with the EMA weights when ``ema`` is set)."""
        loader = self._loader(data, batch_size, False, 0)
        sums = None
        for batch in loader:
            inputs, labels = self._split(batch)
            self._build(inputs)
            sums = self._zero_sums(inputs, labels) if sums is None else sums
            sums = self._eval_step(self.state, sums, *self.step_builder.spread((inputs, labels)))
        if sums is None:
            raise ValueError("Trainer.evaluate: the data gives no batch")
        return metrics_lib.results(self.metrics, sums)

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
            outs.append(jax.tree.map(self.step_builder.host_rows,
                                     self._predict_step(self.state, self.step_builder.spread(inputs))))
        return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)

    def inference_program(self) -> Program:
        """The model in eval mode as a program holding the current (EMA) weights, ready to save
        (in float32: without ``amp``, with the other ``passes`` and their trained state)."""
        if self.state is None:
            raise RuntimeError("Trainer.inference_program: train or evaluate on a batch first")
        weights = jax.device_get(self._weights(self.state))
        program = self._static(False, self.model_state.merge(weights), amp=False)
        program.params.update({n: v for n, v in weights.items() if n in program.params})
        return program

    def current_model(self):
        """A copy of the model holding the weights trained so far (the EMA weights with
        ``ema``), in eval mode; the model itself is only updated at the end of ``fit``. Trace
        it with other input specs than the training batches' (a symbolic sequence length).

        >>> import numpy as np, optax, paddlejax as pj
        >>> from flax import nnx
        >>> trainer = pj.Trainer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), optax.sgd(0.1), progress=False)
        >>> _ = trainer.fit((np.ones((4, 2), "float32"), np.zeros(4, "int32")), epochs=1, batch_size=4)
        >>> float(trainer.current_model().bias[...][0]) > 0
        True
        """
        if self.state is None:
            raise RuntimeError("Trainer.current_model: train or evaluate on a batch first")
        from paddlejax.static import set_mode

        model = self.model_state.merge(jax.device_get(self._weights(self.state)))
        set_mode(model, False)
        return model

    def sync_model(self) -> None:
        """Write the trained parameters and state back into ``model``."""
        if self.state is not None:
            self.model_state.write({**self.step_builder.params(self.state.params), **self.state.extra})

    def plot(self, path: str = "curves.png") -> str:
        """Training curves (loss and metrics, train and eval) as a PNG; returns the path."""
        return self.history.plot(path)

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write the whole training state (parameters, optimizer state, EMA, step, epoch) as a
        checkpoint in the directory ``path``, which :meth:`load` reads back (a step already
        saved there is kept as it is). :meth:`inference_program` with ``pj.save`` saves a model
        to deploy instead."""
        if self.state is None:
            raise RuntimeError("Trainer.save: train or evaluate on a batch first (there is no training state yet)")
        from paddlejax.train.checkpoint import CheckpointManager

        with CheckpointManager(path, keep=None, async_save=False) as manager:
            checkpointing.save(manager, self)

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
        checkpointing.load(self, path, step)
        return self.step
