"""``canonicalize``: one vocabulary for the passes that follow.

A captured program mixes the registry's ops (``elementwise_add``, ``transpose``, ``matmul``)
with the generic ``lax.*`` ops JAX code leaves between them (``lax.add``, ``lax.transpose``,
``lax.dot_general``). Each generic op whose traits name an exact registry twin
(:attr:`paddlejax.ops.traits.Traits.canonical`: same function, same result type) becomes that
twin, so patterns written against the registry's names match both. Uses without a twin stay
(``lax.div`` on integers, ``lax.reshape`` with a dimension of 0, a ``lax.dot_general`` that is
not a plain matrix product). Exact.

Activations that exporters write out in pieces become the op again, so that they fuse into the
op before them: ``x * relu6(x + 3) / 6`` (or ``* (1/6)``) is ``hard_swish(x)``.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x, w: jnp.tanh(x @ w + 1.0).T, jnp.ones((2, 3)), jnp.ones((3, 4)))
>>> [op.type for op in prog.walk()]
['lax.dot_general', 'constant', 'lax.add', 'lax.tanh', 'lax.transpose', 'return']
>>> [op.type for op in pj.passes.run(prog, "canonicalize").walk()]
['matmul', 'constant', 'elementwise_add', 'tanh', 'transpose', 'return']
"""
from __future__ import annotations

import dataclasses

from paddlejax.ir.core import Op, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.passes.base import register_pass
from paddlejax.passes.query import only_reader, scalar_constant
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


def _is(program, v, number: float) -> bool:
    value = scalar_constant(program, v)
    return value is not None and abs(value - number) <= 1e-6 * max(1.0, abs(number))


class _HardSwish(RewritePattern):
    """``x * relu6(x + 3) / 6``, ``x * relu6(x + 3) * (1/6)`` or ``x * (relu6(x + 3) / 6)``
    (intermediates read once) -> ``hard_swish(x)``."""

    label = "hard_swish"

    def _relu6_of_x_plus_3(self, program, v: Value, reader: Op) -> Value | None:
        """The ``x`` of ``v = relu6(x + 3)``, if ``reader`` alone reads ``v`` and its sum."""
        relu6 = v.producer
        if relu6 is None or relu6.canonical[0] != "relu6" or not only_reader(v, reader):
            return None
        add = relu6.operands[0].producer
        if add is None or add.canonical[0] != "elementwise_add" or add.attrs.get("act") is not None \
                or not only_reader(relu6.operands[0], relu6):
            return None
        for i in (0, 1):
            if _is(program, add.operands[1 - i], 3.0):
                return add.operands[i]
        return None

    def _sixth(self, program, op: Op) -> Value | None:
        """The other operand of ``op`` if ``op`` divides it by 6 or multiplies it by 1/6."""
        kind = op.canonical[0]
        if kind == "elementwise_div" and _is(program, op.operands[1], 6.0):
            return op.operands[0]
        if kind == "elementwise_mul":
            for i in (0, 1):
                if _is(program, op.operands[1 - i], 1.0 / 6.0):
                    return op.operands[i]
        return None

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        program = rewriter.program
        if op.canonical[0] not in ("elementwise_div", "elementwise_mul") or op.attrs.get("act") is not None:
            return False
        x = None
        inner = self._sixth(program, op)
        if inner is not None and inner.producer is not None and inner.producer.canonical[0] == "elementwise_mul" \
                and only_reader(inner, op) and inner.producer.attrs.get("act") is None:
            product = inner.producer
            for i in (0, 1):  # (x * relu6(x + 3)) / 6
                candidate = self._relu6_of_x_plus_3(program, product.operands[1 - i], product)
                if candidate is not None and candidate is product.operands[i]:
                    x = candidate
        elif op.canonical[0] == "elementwise_mul":
            for i in (0, 1):  # x * (relu6(x + 3) / 6)
                scaled = op.operands[1 - i].producer
                if scaled is None or not only_reader(op.operands[1 - i], op):
                    continue
                relu6 = self._sixth(program, scaled)
                candidate = self._relu6_of_x_plus_3(program, relu6, scaled) if relu6 is not None else None
                if candidate is not None and candidate is op.operands[i]:
                    x = candidate
        if x is None or x.type != op.result.type:
            return False
        swish = rewriter.insert_before(op, Op("hard_swish", [x], [x.type], {}, loc=op.loc))
        pieces = [v.producer for v in op.operands if v.producer is not None]
        rewriter.replace_op(op, swish.results)
        while pieces:  # the pieces read x too: left in place, they would keep x from fusing
            piece = pieces.pop()
            if piece.parent is not None and piece.type != "constant" and not any(r.uses for r in piece.results):
                pieces.extend(v.producer for v in piece.operands if v.producer is not None)
                rewriter.erase_op(piece)
        return True


@register_pass
@dataclasses.dataclass(frozen=True)
class Canonicalize(PatternPass):
    """Rewrite generic ops into their registry twins (see the module doc). Exact.

    Statistics: ``canonicalized`` ops, ``hard_swish`` activations put back together.
    """

    name = "canonicalize"

    def patterns(self) -> list[RewritePattern]:
        return [_Twin(), _HardSwish()]
