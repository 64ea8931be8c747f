"""The losses a Trainer takes by name (``loss="cross_entropy"``, ``"bce_with_logits"`` or ``"mse"``).

>>> import jax.numpy as jnp
>>> float(get("mse")(jnp.array([1.0, 3.0]), jnp.array([0.0, 1.0])))
2.5
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from paddlejax import ops


def cross_entropy(outputs, labels):
    """Softmax cross entropy of logits ``outputs`` and integer ``labels``, averaged."""
    return ops.cross_entropy(outputs, labels)


def mse(outputs, labels):
    """Mean squared error, in float32."""
    return jnp.mean(jnp.square(outputs.astype(jnp.float32) - labels))


def bce_with_logits(outputs, labels):
    """Binary cross entropy of logits ``outputs`` (``[N]`` or ``[N, 1]``) and 0/1 ``labels``,
    averaged, in float32 (Paddle's ``binary_cross_entropy_with_logits``: click-through models).

    >>> round(float(bce_with_logits(jnp.array([0.0, 0.0]), jnp.array([1, 0]))), 4)
    0.6931
    """
    logits = outputs.astype(jnp.float32).reshape(-1)
    labels = jnp.asarray(labels, jnp.float32).reshape(-1)
    return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits)


LOSSES = {"cross_entropy": cross_entropy, "bce_with_logits": bce_with_logits, "mse": mse}


def get(loss) -> Callable:
    """``loss`` itself when it is callable, else the loss of that name.

    >>> get("cross_entropy") is cross_entropy
    True
    """
    if callable(loss):
        return loss
    if loss in LOSSES:
        return LOSSES[loss]
    raise ValueError(f"Trainer: loss expects a callable or one of {sorted(LOSSES)}, got {loss!r}")
