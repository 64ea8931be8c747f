"""Passes: frozen dataclasses whose fields are their options, registered by name.

>>> import dataclasses
>>> @register_pass
... @dataclasses.dataclass(frozen=True)
... class CountOps(Pass):
...     name = "count_ops_example"
...     def apply(self, program, ctx):
...         return PassResult(False, {"ops": sum(1 for _ in program.walk())})
>>> get_pass("count_ops_example")
CountOps()
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, ClassVar

from paddlejax.ir.core import Program


@dataclasses.dataclass
class PassResult:
    """What a pass did: whether it changed the program, and counts by kind of change."""

    changed: bool
    stats: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PassContext:
    """Shared state for one pipeline run (passes may stash analyses in ``cache``).

    ``training`` says the program is a training-mode capture returning ``(outputs, updates)``
    (``to_static(model, train=True)``): passes that add state, such as the activation observers
    of ``quant_aware``, return its new value among the updates. ``sizes`` gives the symbolic
    sizes the program will run at (``{"b": 64}``, a Trainer's first batch), for passes that
    measure it.
    """

    cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    training: bool = False
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Pass:
    """Base class. Subclasses set ``name`` and implement ``apply(program, ctx)``; they edit
    ``program`` in place through :class:`paddlejax.ir.Rewriter` and return a PassResult."""

    name: ClassVar[str] = ""

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    def __str__(self) -> str:
        opts = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


_PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available by its ``name`` in pipeline strings."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _PASSES and _PASSES[cls.name] is not cls:
        raise ValueError(f"a pass named '{cls.name}' is already registered")
    _PASSES[cls.name] = cls
    return cls


def pass_class(name: str) -> type[Pass]:
    try:
        return _PASSES[name]
    except KeyError:
        close = difflib.get_close_matches(name, _PASSES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(_PASSES))}"
        raise KeyError(f"unknown pass '{name}'{hint}") from None


def get_pass(name: str, **options) -> Pass:
    """An instance of the pass called ``name`` with ``options``."""
    cls = pass_class(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(options) - fields
    if unknown:
        raise ValueError(f"pass '{name}' has no option(s) {sorted(unknown)}; options: {sorted(fields) or 'none'}")
    return cls(**options)


def registered_passes() -> dict[str, type[Pass]]:
    return dict(_PASSES)
