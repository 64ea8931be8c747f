"""``canonicalize``: one vocabulary for the passes that follow.

A captured program mixes the registry's ops (``elementwise_add``, ``transpose``, ``matmul``)
with the generic ``lax.*`` ops JAX code leaves between them (``lax.add``, ``lax.transpose``,
``lax.dot_general``). Each generic op whose traits name an exact registry twin
(:attr:`paddlejax.ops.traits.Traits.canonical`: same function, same result type) becomes that
twin, so patterns written against the registry's names match both. Uses without a twin stay
(``lax.div`` on integers, ``lax.reshape`` with a dimension of 0, a ``lax.dot_general`` that is
not a plain matrix product). Exact.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x, w: jnp.tanh(x @ w + 1.0).T, jnp.ones((2, 3)), jnp.ones((3, 4)))
>>> [op.type for op in prog.walk()]
['lax.dot_general', 'constant', 'lax.add', 'lax.tanh', 'lax.transpose', 'return']
>>> [op.type for op in pj.passes.run(prog, "canonicalize").walk()]
['matmul', 'constant', 'elementwise_add', 'tanh', 'transpose', 'return']
"""
from __future__ import annotations

import dataclasses

from paddlejax.ir.core import Op
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.passes.base import register_pass
from paddlejax.passes.rewrite import PatternPass, RewritePattern


class _Twin(RewritePattern):
    """A generic op with a registry twin becomes that twin, on the same operands."""

    label = "canonicalized"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        kind, attrs = op.canonical
        if kind == op.type:
            return False
        twin = Op(kind, op.operands, [r.type for r in op.results], registry.get(kind).check_attrs(attrs), loc=op.loc)
        rewriter.replace_op(op, rewriter.insert_before(op, twin).results)
        return True


@register_pass
@dataclasses.dataclass(frozen=True)
class Canonicalize(PatternPass):
    """Rewrite generic ops into their registry twins (see the module doc). Exact.

    Statistics: ``canonicalized`` ops.
    """

    name = "canonicalize"

    def patterns(self) -> list[RewritePattern]:
        return [_Twin()]
