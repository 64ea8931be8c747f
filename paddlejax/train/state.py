"""The training state a Trainer's step carries from one batch to the next, as one pytree.

:class:`TrainState` holds the trainable parameters, the model's other variables (batch-norm
statistics, state that passes add), the optimizer state, the gradient-merge buffer, the EMA of
the parameters, the loss scale and the step count. It is a flax struct: ``jax.jit`` takes and
returns it whole, ``jax.tree.map`` walks its arrays, and ``replace`` gives a changed copy.

>>> import jax, jax.numpy as jnp, optax
>>> tx = optax.sgd(0.1)
>>> state = TrainState.create({"w": jnp.ones(2)}, {"bn.mean": jnp.zeros(2)}, tx.init({"w": jnp.ones(2)}))
>>> state = jax.jit(lambda s: s.replace(step=s.step + 1))(state)
>>> int(state.step), sorted(state.as_dict())
(1, ['ema', 'extra', 'loss_scale', 'merge', 'opt', 'params', 'step'])
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from paddlejax.train.loss_scale import LossScale


@struct.dataclass
class TrainState:
    """Everything a training step reads and writes.

    ``params`` are the trainable parameters as the step's strategy lays them out (by name on
    one device; a flat sharded vector under ZeRO-3; packed by stage in a pipeline), ``extra``
    the model's other variables by name, ``opt`` the optimizer state, ``merge`` the
    data-parallel gradient-merge buffer (``{}`` without one), ``ema`` the averaged parameters
    (``{}`` without EMA), ``loss_scale`` the fp16 loss scale and ``step`` the count of steps.
    """

    params: Any
    extra: dict
    opt: Any
    merge: Any
    ema: Any
    loss_scale: LossScale
    step: jax.Array

    @classmethod
    def create(cls, params, extra: dict, opt, merge=None, ema: bool = False,
               loss_scale: LossScale | None = None) -> TrainState:
        """A state at step 0, in fresh buffers (a step donates its state, which must not free
        the arrays it was made from); with ``ema`` the average starts at ``params``.

        >>> import jax.numpy as jnp
        >>> s = TrainState.create({"w": jnp.ones(2)}, {}, (), ema=True)
        >>> s.ema["w"].tolist(), float(s.loss_scale.scale)
        ([1.0, 1.0], 1.0)
        """
        state = cls(params=params, extra=dict(extra), opt=opt, merge={} if merge is None else merge,
                    ema=params if ema else {}, loss_scale=loss_scale or LossScale.none(), step=jnp.int32(0))
        return jax.tree.map(lambda x: jnp.array(x, copy=True), state)

    def as_dict(self) -> dict:
        """The fields by name: the layout checkpoints store (the state was a dict of these
        entries before it was typed, so ``jax.tree`` orders its leaves as it did then).

        >>> import jax.numpy as jnp
        >>> TrainState.create({"w": jnp.ones(1)}, {}, ()).as_dict()["params"]["w"].tolist()
        [1.0]
        """
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def advance(self, params, opt, merge, updates: dict, finite: jax.Array, ema_decay: float | None) -> TrainState:
        """The state after one step: the new ``params``/``opt``/``merge``, the forward pass's
        ``updates`` to ``extra``, the EMA moved (Paddle's ``min(decay, (1 + t) / (10 + t))``
        warm-up) and the loss scale adjusted; a non-finite fp16 step keeps all but the scale.

        >>> import jax.numpy as jnp
        >>> s = TrainState.create({"w": jnp.zeros(1)}, {"n": jnp.zeros(1)}, (), ema=True)
        >>> s = s.advance({"w": jnp.ones(1)}, (), {}, {"n": jnp.ones(1)}, jnp.array(True), ema_decay=0.9)
        >>> int(s.step), s.extra["n"].tolist(), [round(v, 3) for v in s.ema["w"].tolist()]
        (1, [1.0], [0.9])
        """
        new_scale, apply = self.loss_scale.adjust(finite)
        trained, extra = (params, opt, merge), {**self.extra, **updates}
        if self.loss_scale.is_dynamic:
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)  # noqa: E731
            trained, extra = keep(trained, (self.params, self.opt, self.merge)), keep(extra, self.extra)
        params, opt, merge = trained
        ema = moving_average(self.ema, params, ema_decay, self.step) if ema_decay else self.ema
        return self.replace(params=params, extra=extra, opt=opt, merge=merge, ema=ema, loss_scale=new_scale,
                            step=self.step + 1)


def moving_average(average, params, decay: float, step: jax.Array):
    """``average`` moved toward ``params`` after step ``step`` (counted from 0) by Paddle's
    ``ExponentialMovingAverage`` rule, with its warm-up: ``d = min(decay, (1 + t) / (10 + t))``,
    then ``d * average + (1 - d) * params``, leaf by leaf.

    >>> import jax.numpy as jnp
    >>> moving_average({"w": jnp.zeros(1)}, {"w": jnp.ones(1)}, 0.99, jnp.int32(0))["w"].tolist()  # d = 0.1
    [0.8999999761581421]
    """
    t = jnp.asarray(step).astype(jnp.float32)
    d = jnp.minimum(decay, (1 + t) / (10 + t))
    return jax.tree.map(lambda e, p: d * e + (1 - d) * p, average, params)


def learning_rate(opt) -> float | None:
    """The learning rate in an optimizer state, when the optimizer keeps it
    (``optax.inject_hyperparams``); else None.

    >>> import jax.numpy as jnp, optax
    >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    >>> learning_rate(tx.init({"w": jnp.ones(1)})), learning_rate(optax.sgd(0.5).init({"w": jnp.ones(1)}))
    (0.5, None)
    """
    found = optax.tree_utils.tree_get_all_with_path(opt, "learning_rate")
    values = [v for _, v in found if isinstance(v, jax.Array) and v.ndim == 0]
    return float(values[0]) if values else None
