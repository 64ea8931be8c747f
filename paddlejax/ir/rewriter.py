"""The one API through which programs change.

Every edit keeps use lists exact, bumps the program's revision (so a compiled program is
rebuilt) and is logged in :attr:`Rewriter.touched`, which pattern drivers read to know which
ops to look at again.

>>> import jax.numpy as jnp, paddlejax as pj
>>> from paddlejax.ir import Rewriter
>>> prog = pj.trace(lambda x: pj.ops.relu(pj.ops.relu(x)), jnp.ones(3))
>>> outer = prog.body.ops[1]
>>> rw = Rewriter(prog)
>>> rw.replace_op(outer, [outer.operands[0]])   # relu(relu(x)) == relu(x)
>>> [op.type for op in prog.walk()]
['relu', 'return']
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from paddlejax.ir.core import Op, Program, TensorType, Value


class Rewriter:
    """Insert, erase and rewire ops of ``program``."""

    def __init__(self, program: Program):
        self.program = program
        self.touched: list[Op] = []
        self.changed = False

    def _note(self, *ops: Op) -> None:
        self.changed = True
        self.program.revision += 1
        self.touched.extend(ops)

    # -- creating -------------------------------------------------------------------------
    def insert_before(self, anchor: Op, op: Op) -> Op:
        """Put the new ``op`` right before ``anchor`` in its block."""
        block = anchor.parent
        block.ops.insert(block.ops.index(anchor), op)
        op.parent = block
        self._note(op)
        return op

    def insert_after(self, anchor: Op, op: Op) -> Op:
        block = anchor.parent
        block.ops.insert(block.ops.index(anchor) + 1, op)
        op.parent = block
        self._note(op)
        return op

    def constant(self, anchor: Op, value, type: TensorType | None = None) -> Value:
        """A constant op holding ``value`` inserted before ``anchor``; scalars stay inline."""
        arr = np.asarray(value)
        type = type or TensorType.of(arr)
        if arr.ndim == 0:
            attrs: dict[str, Any] = {"value": arr.item()}
        else:
            name = _fresh(self.program.constants, "folded")
            self.program.constants[name] = arr
            attrs = {"name": name}
        return self.insert_before(anchor, Op("constant", [], [type], attrs)).result

    def param(self, base: str, value) -> Value:
        """A new parameter holding ``value``, named ``base`` (``base_1``, ... if taken) and
        declared with the program's other parameters."""
        program = self.program
        name, k = base, 1
        while name in program.params:
            name, k = f"{base}_{k}", k + 1
        program.params[name] = jax.numpy.asarray(value)
        anchor = next(op for op in program.body.ops if op.type != "param")
        return self.insert_before(anchor, Op("param", [], [TensorType.of(program.params[name])], {"name": name})).result

    # -- rewiring -------------------------------------------------------------------------
    def set_operand(self, op: Op, index: int, value: Value) -> None:
        op._set_operand(index, value)
        self._note(op)

    def replace_all_uses_with(self, old: Value, new: Value) -> int:
        """Make every reader of ``old`` read ``new``; returns how many uses moved."""
        if old is new:
            return 0
        if old.type != new.type:
            raise TypeError(f"replace_all_uses_with: {old.type} replaced by {new.type}")
        uses = list(old.uses)
        for op, i in uses:
            op._set_operand(i, new)
        self._note(*(op for op, _ in uses))
        return len(uses)

    def set_result_type(self, value: Value, type: TensorType) -> None:
        """Give a result a new type (a pass that changes dtypes, such as mixed precision)."""
        value.type = type
        if value.producer is not None:
            self._note(value.producer)

    def set_attr(self, op: Op, key: str, value) -> None:
        op.attrs[key] = value
        self._note(op)

    def remove_attr(self, op: Op, key: str) -> None:
        """Drop attribute ``key`` of ``op`` (e.g. a pass annotation); a missing key is a no-op."""
        if key in op.attrs:
            del op.attrs[key]
            self._note(op)

    # -- removing -------------------------------------------------------------------------
    def erase_op(self, op: Op) -> None:
        """Remove ``op``; its results must be unused."""
        for r in op.results:
            if r.uses:
                raise ValueError(f"erase_op: {op.type} result still used by {r.users[0].type}")
        producers = [v.producer for v in op.operands if v.producer is not None]
        op._drop_operands()
        for b in op.blocks:
            for inner in reversed(list(b.walk())):
                inner._drop_operands()
        op.parent.ops.remove(op)
        op.parent = None
        self._note(*producers)

    def replace_op(self, op: Op, new_values: Sequence[Value]) -> None:
        """Make readers of ``op``'s results read ``new_values``, then erase ``op``."""
        if len(new_values) != len(op.results):
            raise ValueError(f"replace_op: {op.type} has {len(op.results)} results, got {len(new_values)}")
        for old, new in zip(op.results, new_values):
            self.replace_all_uses_with(old, new)
        self.erase_op(op)


def _fresh(names: dict, base: str) -> str:
    i = len(names)
    while f"{base}{i}" in names:
        i += 1
    return f"{base}{i}"
