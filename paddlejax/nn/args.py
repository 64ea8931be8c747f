"""Constructor-argument checks shared by the layers, with one error format:
``Layer: argument 'name' expects ..., got ...``.

>>> pair("MaxPool2D", "kernel_size", 3)
(3, 3)
>>> choice("Conv2D", "data_format", "NWHC", ("NCHW", "NHWC"))
Traceback (most recent call last):
...
ValueError: Conv2D: argument 'data_format' expects one of ['NCHW', 'NHWC'], got 'NWHC'
"""
from __future__ import annotations

import numpy as np


def arg_error(layer: str, name: str, expected: str, got) -> ValueError:
    """The error for a bad constructor or call argument."""
    return ValueError(f"{layer}: argument '{name}' expects {expected}, got {got!r}")


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value) -> bool:
    """A real number (Python or numpy scalar), not a bool.

    >>> is_number(np.float32(0.1)), is_number(2), is_number(True)
    (True, True, False)
    """
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def is_bool(value) -> bool:
    """A Python or numpy bool."""
    return isinstance(value, (bool, np.bool_))


def positive_int(layer: str, name: str, value, minimum: int = 1) -> int:
    """``value`` as an int of at least ``minimum``."""
    if not is_int(value) or value < minimum:
        raise arg_error(layer, name, f"an int >= {minimum}", value)
    return int(value)


def ntuple(layer: str, name: str, value, n: int, minimum: int = 1) -> tuple[int, ...]:
    """An int or ``n`` ints (each at least ``minimum``) as an ``n``-tuple.

    >>> ntuple("Conv3D", "kernel_size", 3, 3)
    (3, 3, 3)
    """
    items = (value,) * n if is_int(value) else value
    if (not isinstance(items, (tuple, list)) or len(items) != n
            or not all(is_int(v) and v >= minimum for v in items)):
        raise arg_error(layer, name, f"an int or {n} ints >= {minimum}", value)
    return tuple(int(v) for v in items)


def pair(layer: str, name: str, value, minimum: int = 1) -> tuple[int, int]:
    """An int or two ints (each at least ``minimum``) as a 2-tuple."""
    return ntuple(layer, name, value, 2, minimum)


def choice(layer: str, name: str, value, choices):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise arg_error(layer, name, f"one of {list(choices)}", value)
    return value


def probability(layer: str, name: str, value) -> float:
    """A float in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not 0 <= value <= 1:
        raise arg_error(layer, name, "a probability in [0, 1]", value)
    return float(value)
