"""The training step on one device: forward, loss, backward and the optimizer update, with the
parameters by name.

>>> import jax.numpy as jnp, optax
>>> from paddlejax.train.state import TrainState
>>> from paddlejax.train.steps.base import Objective
>>> class Scaling:  # stands for a captured Program
...     def apply(self, values, x): return x * values["w"], {}
>>> builder, tx = SingleDeviceStep(), optax.sgd(0.5)
>>> params, opt, _ = builder.init({"w": jnp.float32(1)}, {}, tx)
>>> state = TrainState.create(params, {}, opt)
>>> step = builder.train_step(Objective(Scaling(), lambda out, y: jnp.mean((out - y) ** 2)), tx, ema_decay=None)
>>> state, sums, loss, finite = step(state, {"loss": 0.0, "count": 0.0}, (jnp.ones(4),), jnp.zeros(4))
>>> float(loss), float(state.params["w"]), int(state.step)
(1.0, 0.0, 1)
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from paddlejax.train.loss_scale import all_finite
from paddlejax.train.state import TrainState
from paddlejax.train.steps.base import Objective, StepBuilder, Update


class SingleDeviceStep(StepBuilder):
    """A step on the default device; gradient accumulation is the optimizer's (``optax.MultiSteps``)."""

    def update(self, objective: Objective, tx: optax.GradientTransformation, state: TrainState, inputs,
               labels) -> Update:
        scale = state.loss_scale
        grads, (loss, outputs, updates) = objective.gradients(state.params, state.extra, scale, inputs, labels)
        grads = scale.unscale(grads)
        finite = all_finite(grads) & jnp.isfinite(loss)
        deltas, opt = tx.update(grads, state.opt, state.params)
        return Update(optax.apply_updates(state.params, deltas), opt, state.merge, updates, loss,
                      objective.sums(outputs, labels, loss), finite)
