"""Donation: let the executable write outputs into the buffers of inputs that die in it.

The ``donate`` pass pairs each program output with an input of the same type (shape, symbolic
sizes included, and dtype) that is not itself an output, and records the paired inputs' indices
(positions among the program's flattened inputs) as the ``donate`` annotation of the main
block's ``return``. :meth:`paddlejax.Program.compile` with ``donate=True`` passes them to
``jax.jit(donate_argnums=...)``: XLA then aliases each such input buffer to an output, so the
outputs need no memory of their own. The caller gives the donated arrays up: they are deleted
by the call. Inputs with no output to take their buffer are not donated (XLA could not use
them and would warn). Values are unchanged: the tolerance is 0.

>>> import paddlejax as pj
>>> prog = pj.trace(lambda x, y: (x + y, y.sum()), pj.InputSpec((None, 4)), pj.InputSpec((None, 4)))
>>> donated = pj.passes.run(prog, "donate")
>>> str(donated).splitlines()[-2]   # x's buffer can hold x + y; nothing can take y's
'  return %0, %1 {donate=(0,)}'
"""
from __future__ import annotations

import dataclasses

from paddlejax.ir.core import Program
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass

DONATE_ATTR = "donate"


def donatable_inputs(program: Program) -> tuple[int, ...]:
    """Indices of the inputs whose buffers outputs can take: each output takes at most one input
    of its type that is not returned itself, in input order."""
    returned, inputs = {id(v) for v in program.outputs}, {id(v) for v in program.inputs}
    free = [(i, v) for i, v in enumerate(program.inputs) if id(v) not in returned]
    chosen = []
    for out in program.outputs:
        if id(out) in inputs:
            continue
        match = next(((i, v) for i, v in free if v.type == out.type), None)
        if match is not None:
            free.remove(match)
            chosen.append(match[0])
    return tuple(sorted(chosen))


@register_pass
@dataclasses.dataclass(frozen=True)
class Donate(Pass):
    """Record which inputs the executable may consume (see the module doc).

    Statistics: ``donated`` inputs.
    """

    name = "donate"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        donated = donatable_inputs(program)
        rewriter = Rewriter(program)
        ret = program.body.terminator
        if donated:
            if ret.attrs.get(DONATE_ATTR) != donated:
                rewriter.set_attr(ret, DONATE_ATTR, donated)
        else:
            rewriter.remove_attr(ret, DONATE_ATTR)
        return PassResult(rewriter.changed, {"donated": len(donated)})
