"""Loss ops: softmax cross_entropy (Paddle's ``F.cross_entropy``), nll_loss and
sigmoid_focal_loss.

Hard labels are integer class ids shaped like ``input`` without the class axis (or, for
cross_entropy, with it kept as size 1, like Paddle's ``[N, 1]``); entries equal to
``ignore_index`` contribute nothing. ``label_smoothing`` mixes the one-hot target with the
uniform distribution (ignored entries stay ignored). Soft labels are distributions shaped like
``input``. ``use_softmax=False`` takes ``input`` as probabilities instead of logits.

A class ``weight`` ``[C]`` scales each entry's loss by the weight of its target (for soft or
smoothed targets, the target-weighted sum of the class weights), and ``reduction="mean"``
divides by the sum of those weights over the counted entries, as Paddle does; without a weight
it averages over the counted entries.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.loss import cross_entropy, nll_loss
>>> round(float(cross_entropy(jnp.zeros((2, 4)), jnp.array([1, 3]))), 4)  # log(4)
1.3863
>>> float(nll_loss(jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]])), jnp.array([0, 1]),
...                jnp.array([1.0, 3.0])))  # (1 * log 2 + 3 * log(4/3)) / (1 + 3)
0.3890...

``sigmoid_focal_loss`` sums by default, as Paddle's does:

>>> from paddlejax.ops.loss import sigmoid_focal_loss
>>> float(sigmoid_focal_loss(jnp.zeros(2), jnp.array([1.0, 0.0])))  # (0.25 + 0.75) * 0.5 ** 2 * log 2
0.1732...
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import attr_error, input_error, norm_axis


def _hard_label(op, input, label, axis, ignore_index, keep_axis_ok):
    """``(label with the class axis as size 1, mask of counted entries, label safe to gather)``."""
    if not jnp.issubdtype(label.dtype, jnp.integer):
        raise input_error(op, "label", "an int array" + (" (or soft_label=True)" if keep_axis_ok else ""), label.dtype)
    rest = input.shape[:axis] + input.shape[axis + 1:]
    if label.ndim == input.ndim - 1 and label.shape == rest:
        label = jnp.expand_dims(label, axis)
    elif not (keep_axis_ok and label.shape == rest[:axis] + (1,) + rest[axis:]):
        also = " (or with it as 1)" if keep_axis_ok else ""
        raise input_error(op, "label", f"input's shape {tuple(input.shape)} without axis {axis}{also}",
                          tuple(label.shape))
    keep = label != ignore_index
    return label, keep, jnp.where(keep, label, 0)  # ignored ids may be out of range: never gather them


def _class_weight(op, weight, classes, dtype):
    if weight is not None and weight.shape != (classes,):
        raise input_error(op, "weight", f"shape ({classes},) (one weight per class)", tuple(weight.shape))
    return None if weight is None else weight.astype(dtype)


def _reduce(loss, total, reduction):
    """``loss`` summed, averaged over ``total`` (a weight sum; 0 counts as 1) or kept."""
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        return jnp.sum(loss) / jnp.where(total == 0, 1, total)
    return loss


def _cross_entropy(input, label, weight=None, *, soft_label, ignore_index, label_smoothing, axis, use_softmax,
                   reduction):
    """Cross entropy between logits (or probabilities, without ``use_softmax``) ``input`` and
    hard or soft ``label``, with an optional class ``weight``."""
    op = "cross_entropy"
    ax = norm_axis(op, "axis", axis, input.ndim)
    if label_smoothing > 1:
        raise attr_error(op, "label_smoothing", "a value in [0, 1]", label_smoothing)
    x = input.astype(jnp.promote_types(input.dtype, jnp.float32))
    logp = jax.nn.log_softmax(x, axis=ax) if use_softmax else jnp.log(x)
    classes = input.shape[ax]
    w = _class_weight(op, weight, classes, x.dtype)
    w_along = None if w is None else w.reshape([classes if i == ax else 1 for i in range(input.ndim)])
    if soft_label:
        if label.shape != input.shape or not jnp.issubdtype(label.dtype, jnp.inexact):
            raise input_error(op, "label", f"a float array of shape {input.shape} (soft_label)",
                              f"{label.dtype}{list(label.shape)}")
        target = label.astype(x.dtype)
        if label_smoothing:
            target = (1 - label_smoothing) * target + label_smoothing / classes
        loss = -jnp.sum(target * logp, axis=ax, keepdims=True)
        if w is None:
            return _reduce(loss, loss.size, reduction).astype(input.dtype)
        entry_w = jnp.sum(target * w_along, axis=ax, keepdims=True)
        return _reduce(loss * entry_w, jnp.sum(entry_w), reduction).astype(input.dtype)
    squeeze = label.ndim == input.ndim - 1  # 'none' returns the label's shape
    label, keep, safe = _hard_label(op, input, label, ax, ignore_index, True)
    loss = -jnp.take_along_axis(logp, safe, axis=ax)
    entry_w = keep.astype(x.dtype)
    if w is not None:
        entry_w = entry_w * jnp.take(w, safe)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss + label_smoothing * -jnp.mean(logp, axis=ax, keepdims=True)
        if w is not None:  # the smoothed target's weight, as Paddle gathers it
            entry_w = jnp.where(keep, (1 - label_smoothing) * entry_w + label_smoothing * jnp.mean(w), 0)
    loss = jnp.where(keep, loss * (1 if w is None else entry_w), 0)
    if squeeze:
        loss = jnp.squeeze(loss, ax)
    return _reduce(loss, jnp.sum(entry_w), reduction).astype(input.dtype)


def _nll_loss(input, label, weight=None, *, ignore_index, reduction):
    """Negative log likelihood of log-probabilities ``input`` ``[N, C, *d]`` at class ids
    ``label`` ``[N, *d]``, with an optional class ``weight``."""
    x = input.astype(jnp.promote_types(input.dtype, jnp.float32))
    w = _class_weight("nll_loss", weight, input.shape[1], x.dtype)
    label, keep, safe = _hard_label("nll_loss", input, label, 1, ignore_index, False)
    entry_w = keep.astype(x.dtype) if w is None else jnp.where(keep, jnp.take(w, safe), 0)
    loss = jnp.where(keep, -jnp.take_along_axis(x, safe, axis=1) * entry_w, 0)
    return _reduce(jnp.squeeze(loss, 1), jnp.sum(entry_w), reduction).astype(input.dtype)


_REDUCTION = Attr("str", "mean", choices=("mean", "sum", "none"))

cross_entropy = define(
    "cross_entropy", _cross_entropy,
    inputs=[Input("input", rank=tuple(range(1, 9)), dtype="float"), Input("label"),
            Input("weight", rank=1, dtype="float", optional=True)],
    attrs={"soft_label": Attr("bool", False), "ignore_index": Attr("int", -100),
           "label_smoothing": Attr("float", 0.0, minimum=0.0), "axis": Attr("int", -1),
           "use_softmax": Attr("bool", True), "reduction": _REDUCTION},
    flops=lambda ins, outs, attrs: 4 * math.prod(ins[0]), traits=Traits(amp="black", reduction=True))
nll_loss = define(
    "nll_loss", _nll_loss,
    inputs=[Input("input", rank=tuple(range(2, 9)), dtype="float"), Input("label"),
            Input("weight", rank=1, dtype="float", optional=True)],
    attrs={"ignore_index": Attr("int", -100), "reduction": _REDUCTION},
    flops=lambda ins, outs, attrs: math.prod(ins[1]), traits=Traits(amp="black", reduction=True))


def _sigmoid_focal_loss(logit, label, normalizer=None, *, alpha, gamma, reduction):
    """Focal loss (Lin et al. 2017) of the binary ``logit`` against ``label`` (0 or 1, or soft,
    same shape): ``alpha_t * (1 - p_t) ** gamma * bce``, divided by ``normalizer`` (a scalar or
    ``[1]``, typically the count of positives), then reduced."""
    op = "sigmoid_focal_loss"
    if label.shape != logit.shape:
        raise input_error(op, "label", f"the shape of 'logit' {tuple(logit.shape)}", tuple(label.shape))
    if normalizer is not None and normalizer.size != 1:
        raise input_error(op, "normalizer", "a scalar or shape (1,)", tuple(normalizer.shape))
    x = logit.astype(jnp.promote_types(logit.dtype, jnp.float32))
    y = label.astype(x.dtype)
    bce = jnp.maximum(x, 0) - x * y + jnp.log1p(jnp.exp(-jnp.abs(x)))  # stable for large |x|
    p = jax.nn.sigmoid(x)
    p_t = p * y + (1 - p) * (1 - y)
    loss = (alpha * y + (1 - alpha) * (1 - y)) * (1 - p_t) ** gamma * bce
    if normalizer is not None:
        loss = loss / normalizer.reshape(()).astype(x.dtype)
    return _reduce(loss, loss.size, reduction).astype(logit.dtype)


sigmoid_focal_loss = define(
    "sigmoid_focal_loss", _sigmoid_focal_loss,
    inputs=[Input("logit", dtype="float"), Input("label", dtype="float"),
            Input("normalizer", rank=(0, 1), dtype="float", optional=True)],
    attrs={"alpha": Attr("float", 0.25), "gamma": Attr("float", 2.0, minimum=0.0),
           "reduction": Attr("str", "sum", choices=("mean", "sum", "none"))},
    flops=lambda ins, outs, attrs: 12 * math.prod(ins[0]), traits=Traits(amp="black", reduction=True))
