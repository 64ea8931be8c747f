"""A program as a layer whose parameters train: Paddle's ``TranslatedLayer`` (``paddle.jit.load``).

A saved or imported program (an inference graph: no dropout, batch norm in eval mode) becomes
an ``nnx.Module`` whose ``nnx.Param`` s are the program's parameters, so it fine-tunes under
the Trainer, under a new head, like any layer; tracing it gives its ops back.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
>>> layer = ProgramLayer(prog)
>>> layer(jnp.ones((1, 2))).tolist(), sorted(layer.params)
([[1.0, 1.0]], ['w'])

Parameters the op library marks as state (batch norm's running mean and variance) become
``nnx.BatchStat`` s: they ride along and are saved, but no optimizer moves them.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from paddlejax.ir.core import Program
from paddlejax.lowering import run_program


class _Static:
    """Holds the program as static data of the layer: hashed and compared by identity, so nnx
    and jit treat every layer over one program alike without hashing the graph."""

    def __init__(self, program: Program):
        self.program = program


class ProgramLayer(nnx.Module):
    """``program`` as a layer; ``trainable=False`` keeps its parameters as constants
    (``nnx.Variable`` s the optimizer does not update), for a frozen backbone, and ``frozen``
    names the parameters kept so when the others train (a distillation teacher's)."""

    def __init__(self, program: Program, trainable: bool = True, frozen=()):
        if not isinstance(program, Program):
            raise TypeError(f"ProgramLayer: expected a Program, got {type(program).__name__}")
        unknown = sorted(set(frozen) - set(program.params))
        if unknown:
            raise ValueError(f"ProgramLayer: frozen names {unknown[:3]}, which are not parameters of the program")
        state, frozen = _state_params(program), set(frozen)

        def kind(name):
            if name in state:
                return nnx.BatchStat
            return nnx.Param if trainable and name not in frozen else nnx.Variable

        self.source = _Static(program)
        self.params = nnx.Dict({name: kind(name)(jnp.asarray(value)) for name, value in program.params.items()})

    @property
    def program(self) -> Program:
        return self.source.program

    def __call__(self, *inputs):
        return run_program(self.program, {name: p[...] for name, p in self.params.items()}, inputs)


def _state_params(program: Program) -> set[str]:
    """The parameters that ops read through inputs declared as state (running statistics)."""
    from paddlejax.ops import registry
    from paddlejax.passes.query import param_name

    names = set()
    for op in program.walk():
        opdef = registry.lookup(op.type)
        if opdef is None:
            continue
        for spec in opdef.inputs:
            value = op.input(spec.name) if spec.state else None
            if value is not None and not isinstance(value, list) and param_name(value) is not None:
                names.add(param_name(value))
    return names
