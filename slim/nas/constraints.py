"""Constraints on a searched network: its FLOPs (counted on the traced program) or its latency
on this device (predicted by a :class:`~paddlejax.slim.nas.latency.LatencyTable`), at most a
limit. A constraint measures tokens once and remembers the value.

>>> from paddlejax.slim.nas import search_space
>>> space = search_space(("ResNetSpace", {"input_size": 8, "output_size": 1, "block_num": 1,
...                                       "input_channels": 1, "class_dim": 10}))
>>> small = Constraint.flops(space, 100_000)
>>> small.measure([0, 0]), small([0, 0]), small([2, 2]), round(small.excess([2, 2]), 2)
(45984, True, False, 9.33)
"""
from __future__ import annotations

from collections.abc import Callable

from paddlejax import analysis
from paddlejax.slim.nas.latency import LatencyTable
from paddlejax.slim.nas.search_space import CombinedSearchSpace
from paddlejax.static import to_static


def network_flops(space: CombinedSearchSpace, tokens) -> int:
    """FLOPs of one image through the networks of ``tokens``: each traced (in eval mode) and
    counted by :func:`paddlejax.analysis.flops`.

    >>> from paddlejax.slim.nas import search_space
    >>> space = search_space(("MobileNetV2Space", {"input_size": 8, "output_size": 1, "block_num": 1,
    ...                                            "input_channels": 1, "class_dim": 10}))
    >>> network_flops(space, [0])
    116352
    """
    return sum(analysis.flops(to_static(model, part.input_spec()))
               for part, model in zip(space.spaces, space.token2arch(tokens)))


class Constraint:
    """``measure(tokens) <= limit``, with ``name`` the measured quantity (``"flops"``,
    ``"latency_ms"``); values are remembered per tokens."""

    def __init__(self, name: str, limit: float, measure: Callable[[list[int]], float]):
        if not limit > 0:
            raise ValueError(f"the {name} limit must be positive, got {limit!r}")
        self.name, self.limit, self._measure = name, limit, measure
        self._values: dict[tuple, float] = {}

    @classmethod
    def flops(cls, space: CombinedSearchSpace, limit: float) -> Constraint:
        """At most ``limit`` FLOPs per image (:func:`network_flops`)."""
        return cls("flops", limit, lambda tokens: network_flops(space, tokens))

    @classmethod
    def latency(cls, space: CombinedSearchSpace, limit_ms: float, table: LatencyTable) -> Constraint:
        """At most ``limit_ms`` milliseconds per batch, as ``table`` predicts from the blocks."""
        return cls("latency_ms", limit_ms, lambda tokens: table.predict(space.blocks(tokens)))

    def measure(self, tokens) -> float:
        """The measured quantity of ``tokens`` (remembered)."""
        key = tuple(tokens)
        if key not in self._values:
            self._values[key] = self._measure(list(tokens))
        return self._values[key]

    def __call__(self, tokens) -> bool:
        """Whether ``tokens`` are within the limit."""
        return self.measure(tokens) <= self.limit

    def excess(self, tokens) -> float:
        """How far over the limit, as a fraction of it (0 when within)."""
        return max(0.0, self.measure(tokens) / self.limit - 1)

    def __repr__(self) -> str:
        return f"{self.name} <= {self.limit:g}"
