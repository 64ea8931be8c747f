"""Loss ops: softmax cross_entropy from logits (Paddle's ``F.cross_entropy``).

Hard labels are integer class ids shaped like ``input`` without the class axis (or with it
kept as size 1, like Paddle's ``[N, 1]``); entries equal to ``ignore_index`` contribute
nothing and ``reduction="mean"`` averages over the others. ``label_smoothing`` mixes the
one-hot target with the uniform distribution (ignored entries stay ignored). Soft labels
are distributions shaped like ``input``.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.loss import cross_entropy
>>> round(float(cross_entropy(jnp.zeros((2, 4)), jnp.array([1, 3]))), 4)  # log(4)
1.3863
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.common import attr_error, input_error, norm_axis


def _hard_targets(logits, label, axis, ignore_index, label_smoothing):
    """(per-entry loss with the class axis kept as size 1, mask of counted entries)."""
    if label.ndim == logits.ndim - 1:
        label = jnp.expand_dims(label, axis)
    if label.shape[:axis] + label.shape[axis + 1:] != logits.shape[:axis] + logits.shape[axis + 1:] \
            or label.shape[axis] != 1:
        raise input_error("cross_entropy", "label", f"input's shape {logits.shape} without axis {axis} "
                          "(or with it as 1)", label.shape)
    keep = label != ignore_index
    safe = jnp.where(keep, label, 0)  # ignored ids may be out of range: never gather them
    logp = jax.nn.log_softmax(logits, axis=axis)
    picked = jnp.take_along_axis(logp, safe, axis=axis)
    loss = -picked
    if label_smoothing:
        smooth = -jnp.mean(logp, axis=axis, keepdims=True)
        loss = (1 - label_smoothing) * loss + label_smoothing * smooth
    return jnp.where(keep, loss, 0), keep


def _cross_entropy(input, label, *, soft_label, ignore_index, label_smoothing, axis, reduction):
    """Softmax cross entropy between logits ``input`` and hard or soft ``label``."""
    ax = norm_axis("cross_entropy", "axis", axis, input.ndim)
    if label_smoothing > 1:
        raise attr_error("cross_entropy", "label_smoothing", "a value in [0, 1]", label_smoothing)
    logits = input.astype(jnp.promote_types(input.dtype, jnp.float32))
    if soft_label:
        if label.shape != input.shape or not jnp.issubdtype(label.dtype, jnp.inexact):
            raise input_error("cross_entropy", "label", f"a float array of shape {input.shape} (soft_label)",
                              f"{label.dtype}{list(label.shape)}")
        target = label.astype(logits.dtype)
        if label_smoothing:
            target = (1 - label_smoothing) * target + label_smoothing / input.shape[ax]
        loss = -jnp.sum(target * jax.nn.log_softmax(logits, axis=ax), axis=ax, keepdims=True)
        count = loss.size
    else:
        if not jnp.issubdtype(label.dtype, jnp.integer):
            raise input_error("cross_entropy", "label", "an int array (or soft_label=True)", label.dtype)
        loss, keep = _hard_targets(logits, label, ax, ignore_index, label_smoothing)
        count = jnp.maximum(jnp.sum(keep), 1)
        if label.ndim == input.ndim - 1:
            loss = jnp.squeeze(loss, ax)  # 'none' returns the label's shape
    if reduction == "sum":
        loss = jnp.sum(loss)
    elif reduction == "mean":
        loss = jnp.sum(loss) / count
    return loss.astype(input.dtype)


cross_entropy = define(
    "cross_entropy", _cross_entropy,
    inputs=[Input("input", rank=tuple(range(1, 9)), dtype="float"), Input("label")],
    attrs={"soft_label": Attr("bool", False), "ignore_index": Attr("int", -100),
           "label_smoothing": Attr("float", 0.0, minimum=0.0), "axis": Attr("int", -1),
           "reduction": Attr("str", "mean", choices=("mean", "sum", "none"))},
    flops=lambda ins, outs, attrs: 4 * math.prod(ins[0]))
