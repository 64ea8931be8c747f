"""What every training step shares, whatever runs it: the :class:`Objective` (program, loss,
metrics) and the :class:`StepBuilder` interface each strategy implements.

A Trainer holds one step builder, chosen once from its strategy
(:func:`paddlejax.train.steps.step_builder`), and asks it, in this order: ``optimizer`` for the
optax chain, ``prepare`` once the training program is captured, ``init`` for the parameters and
optimizer state laid out as it runs them, ``train_step`` for the jitted step, ``place`` for each
training batch, then ``params`` (the parameters by name) and ``spread`` (an evaluation batch).

>>> import jax.numpy as jnp, optax
>>> from paddlejax.train.steps.single import SingleDeviceStep
>>> builder = SingleDeviceStep()
>>> tx = builder.optimizer(optax.sgd(0.1), grad_clip=1.0, weight_decay=None, accumulate=1)
>>> params, opt, merge = builder.init({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, tx)
>>> builder.params(params)["w"].tolist(), merge
([1.0, 1.0], {})
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paddlejax.ir.core import Program
from paddlejax.train.loss_scale import LossScale
from paddlejax.train.metrics import batch_sums
from paddlejax.train.placement import place_like, require_pinned_host
from paddlejax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a training step optimises and measures: the captured training ``program``
    (``apply(values, *inputs) -> (outputs, state updates)``), ``loss_fn(outputs, labels)`` and
    the metrics. Recomputation is planned on the program (the ``remat`` pass marks segments).

    >>> import jax.numpy as jnp
    >>> class Doubling:  # stands for a Program
    ...     def apply(self, values, x): return x * values["w"], {}
    >>> goal = Objective(Doubling(), lambda out, y: jnp.mean((out - y) ** 2))
    >>> grads, (loss, _, _) = goal.gradients({"w": 2.0}, {}, LossScale.none(), (jnp.ones(2),), jnp.zeros(2))
    >>> float(loss), float(grads["w"])
    (4.0, 4.0)
    """

    program: Program
    loss_fn: Callable
    metrics: tuple = ()

    def gradients(self, params, extra, scale: LossScale, inputs, labels):
        """Gradients of the loss times ``scale`` for ``params``, and (loss, outputs, state updates)."""
        def objective(params):
            outputs, updates = self.program.apply({**params, **extra}, *inputs)
            loss = self.loss_fn(outputs, labels).astype(jnp.float32)
            return loss * scale.scale, (loss, outputs, updates)

        return jax.grad(objective, has_aux=True)(params)

    def sums(self, outputs, labels, loss) -> dict:
        """One batch's loss and metric sums (:func:`paddlejax.train.metrics.batch_sums`)."""
        return batch_sums(self.metrics, outputs, labels, loss)

    def explain_nonfinite(self, params: dict, extra: dict, inputs, labels, step: int):
        """Raise :class:`~paddlejax.NonFiniteError` naming where a non-finite step came from: the
        first op that produced it, else the loss function, else the parameters whose gradients
        overflowed."""
        from paddlejax.nancheck import NonFiniteError, check_nan_inf
        from paddlejax.train.loss_scale import all_finite

        values = {**params, **extra}
        check_nan_inf(self.program, values, *inputs)
        outputs, _ = self.program.apply(values, *inputs)
        if not bool(all_finite(self.loss_fn(outputs, labels))):
            raise NonFiniteError(f"step {step}: the program's outputs are finite but the loss function produced "
                                 "a non-finite value")
        grads = jax.grad(lambda p: self.loss_fn(self.program.apply({**p, **extra}, *inputs)[0], labels))(params)
        bad = sorted(n for n, g in grads.items() if not bool(all_finite(g)))
        raise NonFiniteError(f"step {step}: the forward pass is finite but the gradients of "
                             f"{', '.join(bad) or 'no parameter'} are not (an op's derivative overflowed)")


class Update(NamedTuple):
    """What a step builder's ``update`` gives back: the new ``params``, ``opt`` and ``merge``,
    the forward pass's state ``updates``, the (unscaled) ``loss``, the batch's metric ``sums``,
    and whether the loss and gradients were all ``finite``."""

    params: Any
    opt: Any
    merge: Any
    updates: dict
    loss: jax.Array
    sums: dict
    finite: jax.Array


class StepBuilder:
    """How a training step runs on the devices: one subclass per strategy (single device, data
    parallel with ZeRO, pipeline parallel), the same calls for each. Subclasses implement
    :meth:`update` and override the rest where their layout differs from one device's."""

    #: under data parallelism, the batch norm the program uses: "sync", "local" or None
    batch_norm: str | None = None
    #: keep the optimizer state in host memory between steps (``Strategy.offload_optimizer``)
    offload_optimizer: bool = False
    #: the device mesh the step runs on; None on one device
    mesh: jax.sharding.Mesh | None = None

    def optimizer(self, tx: optax.GradientTransformation, grad_clip: float | None, weight_decay: float | None,
                  accumulate: int, avg: bool = True) -> optax.GradientTransformation:
        """``tx`` after a clip to ``grad_clip`` (as :meth:`clip` computes the norm here) and L2
        ``weight_decay``, applied every ``accumulate`` steps to the mean (``avg``) or sum of the
        gradients in between."""
        from paddlejax.distributed.data_parallel import merge_gradients

        chain = []
        if grad_clip is not None:
            chain.append(self.clip(grad_clip))
        if weight_decay:
            chain.append(optax.add_decayed_weights(weight_decay))
        tx = optax.chain(*chain, tx) if chain else tx
        return merge_gradients(tx, accumulate, avg)

    def clip(self, max_norm: float) -> optax.GradientTransformation:
        """``optax.clip_by_global_norm`` of the gradients as this step lays them out."""
        return optax.clip_by_global_norm(max_norm)

    def prepare(self, program: Program) -> None:
        """Look at the captured training program once, before :meth:`init`."""

    def init(self, params: dict, values: dict, tx: optax.GradientTransformation) -> tuple:
        """``(params, opt, merge)`` for the trainable ``params`` among ``values`` (every value of
        the program), laid out and placed as this step runs them."""
        return params, tx.init(params), {}

    def place_state(self, state: TrainState) -> TrainState:
        """``state`` with every array :meth:`init` did not place on :attr:`mesh` (the step
        count, the loss scale, batch-norm statistics, random keys) replicated over it, as the
        step returns them: left on one device, they would make the second step compile again.

        >>> import jax.numpy as jnp
        >>> builder = StepBuilder()
        >>> builder.mesh = jax.make_mesh((1,), ("dp",))
        >>> step = builder.place_state(TrainState.create({"w": jnp.ones(2)}, {}, ())).step
        >>> step.sharding.mesh == builder.mesh, step.sharding.is_fully_replicated
        (True, True)
        """
        if self.mesh is None:
            return state
        whole = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def place(x):
            placed = isinstance(x, jax.Array) and getattr(x.sharding, "mesh", None) == self.mesh
            return x if placed else jax.device_put(x, whole)

        return jax.tree.map(place, state)

    def place_optimizer(self, opt):
        """The optimizer state where it waits between steps: in host memory when offloaded
        (``ValueError`` where the backend has none), else as it is."""
        if not self.offload_optimizer:
            return opt
        require_pinned_host("Strategy.offload_optimizer")
        return jax.device_put(opt, jax.memory.Space.Host)

    def params(self, stored) -> dict:
        """The trainable parameters by name, from the state's ``params`` (or ``ema``)."""
        return stored

    def portable(self, state: TrainState) -> TrainState:
        """``state`` in a layout that does not depend on how many devices run the step (what
        checkpoints store, so a run resumes on another number of devices and processes): here
        the state itself; ZeRO's flat vectors become the parameters' trees, a pipeline's packed
        stages the parameters by name."""
        return state

    def from_portable(self, portable: TrainState, like: TrainState) -> TrainState:
        """:meth:`portable`'s form (whole arrays, on the host or one device) in this step's
        layout, every array placed as ``like``'s (the state the step runs now)."""
        return jax.tree.map(lambda old, new: place_like(new, old), like, portable)

    def place(self, inputs: tuple, labels) -> tuple:
        """A training batch ``(inputs, labels)`` checked and placed for the step."""
        return inputs, labels

    def spread(self, batch):
        """An evaluation or prediction batch, placed for the jitted forward pass."""
        return batch

    def host_rows(self, out: jax.Array) -> np.ndarray:
        """The rows of a prediction (the forward pass of a :meth:`spread` batch) that this
        process holds, as a NumPy array."""
        return np.asarray(out)

    def update(self, objective: Objective, tx: optax.GradientTransformation, state: TrainState, inputs,
               labels) -> Update:
        """One step's loss, gradients and optimizer update (traced inside ``jax.jit``)."""
        raise NotImplementedError

    def train_step(self, objective: Objective, tx: optax.GradientTransformation, ema_decay: float | None,
                   donate: bool = True, report_finite: bool = True) -> Callable:
        """The jitted ``step(state, sums, inputs, labels) -> (state, sums, loss, finite)``: one
        :meth:`update`, the new :class:`TrainState` and the running metric ``sums``. With
        ``donate`` XLA updates the state in place (the state passed in is consumed). Without
        ``report_finite``, ``finite`` is None, and unless dynamic loss scaling needs it the
        check of every gradient is left out of the step (a pass over them all: 1 % of a
        ResNet-18 step on a CPU)."""
        def step(state: TrainState, sums, inputs, labels):
            if self.offload_optimizer:  # host -> device for the update, and back after it
                state = state.replace(opt=jax.device_put(state.opt, jax.memory.Space.Device))
            new = self.update(objective, tx, state, inputs, labels)
            state = state.advance(new.params, new.opt, new.merge, new.updates, new.finite, ema_decay)
            if self.offload_optimizer:
                state = state.replace(opt=jax.device_put(state.opt, jax.memory.Space.Host))
            return state, jax.tree.map(jnp.add, sums, new.sums), new.loss, new.finite if report_finite else None

        return jax.jit(step, donate_argnums=(0,) if donate else ())
