"""Helpers the op modules share: Paddle-style error messages, axis normalisation, the
``int or ints`` attribute kind and channel-layout handling.

>>> channel_axis("NCHW", 4), channel_axis("NHWC", 4)
(1, 3)
"""
from __future__ import annotations

import jax.numpy as jnp

from paddlejax.ops.registry import Attr, _is_int

def attr_error(op: str, name: str, expected: str, got) -> ValueError:
    """The registry's message format: ``op: attribute 'name' expects ..., got ...``."""
    return ValueError(f"{op}: attribute '{name}' expects {expected}, got {got!r}")


def input_error(op: str, name: str, expected: str, got) -> ValueError:
    return ValueError(f"{op}: input '{name}' expects {expected}, got {got!r}")


def norm_axis(op: str, name: str, axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)``; negative axes count from the end, as in Paddle."""
    if not -ndim <= axis < max(ndim, 1):
        raise attr_error(op, name, f"an axis in [{-ndim}, {ndim})", axis)
    return axis % max(ndim, 1)


def norm_axes(op: str, name: str, axes, ndim: int) -> tuple[int, ...]:
    out = tuple(norm_axis(op, name, a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise attr_error(op, name, "distinct axes", axes)
    return out


class IntOrInts(Attr):
    """An ``ints`` attribute that also takes a bare int as a 1-tuple (Paddle's
    ``axis=1`` / ``num_or_sections=3``)."""

    def _normalise(self, op, what, value):
        return super()._normalise(op, what, (value,) if _is_int(value) else value)


LAYOUTS = ("NCHW", "NHWC")


def channel_axis(data_format: str, ndim: int) -> int:
    """Channel axis of a Paddle layout string: ``N C ...`` is 1, ``N ... C`` is last."""
    return 1 if data_format[1] == "C" else ndim - 1


def to_channels_last(x, data_format: str):
    """``x`` with channels last, whatever ``data_format`` it came in."""
    return jnp.moveaxis(x, 1, -1) if channel_axis(data_format, x.ndim) == 1 else x


def from_channels_last(x, data_format: str):
    """Inverse of :func:`to_channels_last`."""
    return jnp.moveaxis(x, -1, 1) if channel_axis(data_format, x.ndim) == 1 else x
