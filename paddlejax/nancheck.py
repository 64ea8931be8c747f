"""The NaN/Inf checker: find the first op of a program that produced a non-finite value.

Paddle's ``FLAGS_check_nan_inf`` on programs: the program is run op by op, eagerly, and every
floating-point result is checked. The error names the op as ``print(program)`` shows it and
the source line that created it.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: jnp.log(x) * 2.0, jnp.ones(2))
>>> try:
...     pj.check_nan_inf(prog, prog.params, jnp.array([1.0, -1.0]))
... except pj.NonFiniteError as e:
...     print(e.line)
%0 = lax.log(%x) : f32[2]
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from paddlejax.ir.core import Op, Program
from paddlejax.ir.printer import op_lines
from paddlejax.lowering import Context, bind_inputs, lower_op


class NonFiniteError(FloatingPointError):
    """A NaN or Inf appeared; ``op``, ``line`` and ``loc`` say where (None for inputs)."""

    def __init__(self, message: str, op: Op | None = None, line: str | None = None, loc: str | None = None):
        super().__init__(message)
        self.op, self.line, self.loc = op, line, loc


def _bad(x) -> str | None:
    """``"NaN"``, ``"Inf"`` or None for a floating array."""
    x = np.asarray(jnp.asarray(x, jnp.float32)) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else None
    if x is None or np.isfinite(x).all():
        return None
    return "NaN" if np.isnan(x).any() else "Inf"


def check_nan_inf(program: Program, params: dict, *inputs) -> None:
    """Run ``program`` eagerly and raise :class:`NonFiniteError` at the first non-finite value.

    Inputs and parameters are checked first (a NaN fed in is not an op's fault).
    """
    leaves, dims = bind_inputs(program, inputs)
    for value, x in zip(program.inputs, leaves):
        if kind := _bad(x):
            raise NonFiniteError(f"{program.name}: input '{value.name}' contains {kind}")
    lines = op_lines(program)
    ctx = Context(params, program.constants, dims)
    env = dict(zip(program.body.args, leaves))
    for op in program.body.ops[:-1]:
        outs = lower_op(op, [env[v] for v in op.operands], ctx)
        for out in outs:
            if kind := _bad(out):
                where = f" (created at {op.loc})" if op.loc else ""
                what = "parameter" if op.type == "param" else "op"
                raise NonFiniteError(f"{program.name}: {what} `{lines[op]}` produced {kind}{where}",
                                     op, lines[op], op.loc)
        env.update(zip(op.results, outs))


