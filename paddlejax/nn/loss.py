"""Loss layers with Paddle's arguments and reductions, each calling
:mod:`paddlejax.nn.functional`: CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, SmoothL1Loss,
KLDivLoss, BCELoss, BCEWithLogitsLoss. Call as ``loss(input, label)``.

A fixed class ``weight`` (or ``pos_weight``) is held as a :class:`LossWeight` variable: not a
parameter (optimisers leave it alone), but traced and saved with the program.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> loss = nn.CrossEntropyLoss(weight=jnp.array([1.0, 3.0]))
>>> round(float(loss(jnp.zeros((2, 2)), jnp.array([0, 1]))), 4)  # (1 + 3) * log 2 / (1 + 3)
0.6931
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from paddlejax.nn import functional as F
from paddlejax.nn.args import arg_error, choice, is_bool, is_int, is_number
from paddlejax.nn.layer import Layer


class LossWeight(nnx.Variable):
    """A fixed array a loss layer holds (a class weight): not trained, traced as a program value."""


def _weight(layer, name, value):
    if value is None:
        return None
    array = jnp.asarray(value)
    if not jnp.issubdtype(array.dtype, jnp.floating) or array.ndim == 0:
        raise arg_error(layer, name, "None or a float array (one weight per class)", value)
    return LossWeight(array)


def _value(variable):
    return None if variable is None else variable[...]


class _Loss(Layer):
    _reductions = F.REDUCTIONS

    def __init__(self, reduction="mean"):
        self._reduction = choice(type(self).__name__, "reduction", reduction, self._reductions)


class CrossEntropyLoss(_Loss):
    """Softmax cross entropy, Paddle's ``CrossEntropyLoss``: hard class ids or ``soft_label``
    distributions along ``axis``, a class ``weight`` (weighted mean over the counted entries),
    ``ignore_index``, ``label_smoothing``, and ``use_softmax=False`` for probabilities.

    >>> import jax.numpy as jnp
    >>> CrossEntropyLoss(reduction="none")(jnp.zeros((2, 4)), jnp.array([[1], [3]])).shape
    (2, 1)
    """

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", soft_label=False, axis=-1, use_softmax=True,
                 label_smoothing=0.0):
        super().__init__(reduction)
        if not is_int(ignore_index):
            raise arg_error("CrossEntropyLoss", "ignore_index", "an int", ignore_index)
        if not is_int(axis):
            raise arg_error("CrossEntropyLoss", "axis", "an int", axis)
        for name, flag in (("soft_label", soft_label), ("use_softmax", use_softmax)):
            if not is_bool(flag):
                raise arg_error("CrossEntropyLoss", name, "a bool", flag)
        if not is_number(label_smoothing) or not 0 <= label_smoothing <= 1:
            raise arg_error("CrossEntropyLoss", "label_smoothing", "a number in [0, 1]", label_smoothing)
        self.weight = _weight("CrossEntropyLoss", "weight", weight)
        self._args = dict(ignore_index=int(ignore_index), soft_label=bool(soft_label), axis=int(axis),
                          use_softmax=bool(use_softmax), label_smoothing=float(label_smoothing))

    def forward(self, input, label):
        return F.cross_entropy(input, label, _value(self.weight), reduction=self._reduction, **self._args)


class NLLLoss(_Loss):
    """Negative log likelihood of log-probabilities ``[N, C, *d]`` at class ids ``[N, *d]``,
    with a class ``weight`` and ``ignore_index`` (Paddle's ``NLLLoss``).

    >>> import jax.numpy as jnp
    >>> round(float(NLLLoss()(jnp.log(jnp.array([[0.25, 0.75]])), jnp.array([1]))), 4)
    0.2877
    """

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        if not is_int(ignore_index):
            raise arg_error("NLLLoss", "ignore_index", "an int", ignore_index)
        self.weight = _weight("NLLLoss", "weight", weight)
        self._ignore_index = int(ignore_index)

    def forward(self, input, label):
        return F.nll_loss(input, label, _value(self.weight), self._ignore_index, self._reduction)


class MSELoss(_Loss):
    """``(input - label) ** 2``, reduced.

    >>> import jax.numpy as jnp
    >>> float(MSELoss(reduction="sum")(jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0])))
    5.0
    """

    def forward(self, input, label):
        return F.mse_loss(input, label, self._reduction)


class L1Loss(_Loss):
    """``|input - label|``, reduced.

    >>> import jax.numpy as jnp
    >>> float(L1Loss()(jnp.array([1.0, -3.0]), jnp.array([0.0, 0.0])))
    2.0
    """

    def forward(self, input, label):
        return F.l1_loss(input, label, self._reduction)


class SmoothL1Loss(_Loss):
    """Paddle's smooth L1 (Huber) loss: ``0.5 d^2`` where ``|d| < delta``, else
    ``delta * (|d| - 0.5 * delta)``.

    >>> import jax.numpy as jnp
    >>> SmoothL1Loss(reduction="none", delta=2.0)(jnp.array([1.0, 4.0]), jnp.zeros(2)).tolist()
    [0.5, 6.0]
    """

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        if not is_number(delta) or delta <= 0:
            raise arg_error("SmoothL1Loss", "delta", "a positive number", delta)
        self._delta = float(delta)

    def forward(self, input, label):
        return F.smooth_l1_loss(input, label, self._reduction, self._delta)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence of log-probabilities ``input`` from ``label`` (or from
    ``exp(label)`` with ``log_target``); ``reduction`` also takes ``"batchmean"``.

    >>> import jax.numpy as jnp
    >>> float(KLDivLoss("batchmean")(jnp.log(jnp.full((2, 2), 0.5)), jnp.full((2, 2), 0.5)))
    0.0
    """

    _reductions = (*F.REDUCTIONS, "batchmean")

    def __init__(self, reduction="mean", log_target=False):
        super().__init__(reduction)
        if not is_bool(log_target):
            raise arg_error("KLDivLoss", "log_target", "a bool", log_target)
        self._log_target = bool(log_target)

    def forward(self, input, label):
        return F.kl_div(input, label, self._reduction, self._log_target)


class BCELoss(_Loss):
    """Binary cross entropy of probabilities ``input`` (logs clipped at -100, as in Paddle),
    times an optional ``weight`` broadcast against the loss.

    >>> import jax.numpy as jnp
    >>> round(float(BCELoss()(jnp.array([0.5, 0.5]), jnp.array([0.0, 1.0]))), 4)
    0.6931
    """

    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.weight = _weight("BCELoss", "weight", weight)

    def forward(self, input, label):
        return F.binary_cross_entropy(input, label, _value(self.weight), self._reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid binary cross entropy from logits, computed stably, with an optional ``weight``
    (broadcast against the loss) and ``pos_weight`` (per class, weighing positive targets).

    >>> import jax.numpy as jnp
    >>> loss = BCEWithLogitsLoss(pos_weight=jnp.array([3.0]))
    >>> round(float(loss(jnp.zeros((2, 1)), jnp.array([[0.0], [1.0]]))), 4)  # (1 + 3) * log 2 / 2
    1.3863
    """

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self.weight = _weight("BCEWithLogitsLoss", "weight", weight)
        self.pos_weight = _weight("BCEWithLogitsLoss", "pos_weight", pos_weight)

    def forward(self, logit, label):
        return F.binary_cross_entropy_with_logits(logit, label, _value(self.weight), self._reduction,
                                                  _value(self.pos_weight))
