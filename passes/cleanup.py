"""Cleanup passes: dead-code elimination, common-subexpression elimination, constant folding
and identity elimination.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: (x + 0.0) * (x + 0.0), jnp.ones(3))
>>> out = pj.passes.run(prog, "eliminate_identity,cse,dce")
>>> [op.type for op in out.walk()]
['lax.mul', 'return']
"""
from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np

from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Op, Program, walk_blocks
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.rewrite import PatternPass, RewritePattern


@register_pass
@dataclasses.dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Erase ops whose results nobody reads (parameters and constants included)."""

    name = "dce"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        rewriter = Rewriter(program)
        erased = 0
        for block in list(walk_blocks(program.body)):
            for op in reversed(list(block.ops)):
                if op.has_trait("pure") and not any(r.uses for r in op.results):
                    rewriter.erase_op(op)
                    erased += 1
        return PassResult(erased > 0, {"erased": erased})


def _key(op: Op):
    try:
        attrs = json.dumps({k: attrs_lib.encode(v) for k, v in op.attrs.items()}, sort_keys=True)
    except attrs_lib.AttrError:
        return None
    operands = tuple(id(v) for v in op.operands)
    if op.has_trait("commutative"):  # a + b and b + a compute the same value
        operands = tuple(sorted(operands))
    return (op.type, operands, attrs, tuple(r.type for r in op.results))


@register_pass
@dataclasses.dataclass(frozen=True)
class CommonSubexpressionElimination(Pass):
    """Merge ops that compute the same thing from the same operands (per block)."""

    name = "cse"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        rewriter = Rewriter(program)
        merged = 0
        for block in list(walk_blocks(program.body)):
            seen: dict = {}
            for op in list(block.ops):
                if op.blocks or not op.has_trait("pure"):
                    continue
                key = _key(op)
                if key is None:
                    continue
                if key in seen:
                    rewriter.replace_op(op, seen[key].results)
                    merged += 1
                else:
                    seen[key] = op
        return PassResult(merged > 0, {"merged": merged})


@register_pass
@dataclasses.dataclass(frozen=True)
class FoldConstants(Pass):
    """Evaluate ops whose operands are all constants, at compile time.

    ``max_elements`` bounds the size of a folded result (bigger ones would bloat the saved
    program more than they save).
    """

    name = "fold_constants"
    max_elements: int = 1 << 16

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        from paddlejax.lowering import lower_op

        rewriter = Rewriter(program)
        folded = 0
        for block in list(walk_blocks(program.body)):
            for op in list(block.ops):
                if op.type in ("constant", "param") or not op.has_trait("pure") or op.blocks:
                    continue
                producers = [v.producer for v in op.operands]
                if not op.operands or any(p is None or p.type != "constant" for p in producers):
                    continue
                if any(not r.type.is_static or r.type.size > self.max_elements for r in op.results):
                    continue
                args = [_constant_value(program, p) for p in producers]
                with jax.default_device(jax.devices("cpu")[0]):
                    values = lower_op(op, args, _NoContext())
                new = [rewriter.constant(op, np.asarray(v), r.type) for v, r in zip(values, op.results)]
                rewriter.replace_op(op, new)
                folded += 1
        return PassResult(folded > 0, {"folded": folded})


class _NoContext:
    """Lowering context for folding: no parameters, no symbolic sizes."""

    params: dict = {}
    constants: dict = {}
    dims: dict = {}


def _constant_value(program: Program, op: Op):
    if "name" in op.attrs:
        return program.constants[op.attrs["name"]]
    return np.asarray(op.attrs["value"], jax.numpy.dtype(op.result.type.dtype))


def _inline_scalar(v) -> float | None:
    op = v.producer
    if op is not None and op.type == "constant" and "value" in op.attrs:
        return op.attrs["value"]
    return None


class _Forward(RewritePattern):
    """An op that returns one of its operands unchanged is replaced by that operand: one whose
    traits say it does so for its attributes (``identity_if``), or a binary op with its
    ``unit`` on the other side (``x + 0``, ``x * 1``; ``0 + x`` too when commutative)."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        source = self.source(op)
        if source is None or len(op.results) != 1 or source.type != op.result.type:
            return False
        rewriter.replace_op(op, [source])
        return True

    @property
    def label(self) -> str:
        return "identities"

    def source(self, op: Op):
        traits = op.traits
        if not op.operands or op.attrs.get("act") is not None:  # a fused activation makes even x + 0 change x
            return None
        if traits.identity_if is not None and traits.identity_if(op.attrs):
            return op.operands[0]
        if traits.unit is None or len(op.operands) != 2:
            return None
        if _inline_scalar(op.operands[1]) == traits.unit:
            return op.operands[0]
        if traits.commutative and _inline_scalar(op.operands[0]) == traits.unit:
            return op.operands[1]
        return None


@register_pass
@dataclasses.dataclass(frozen=True)
class EliminateIdentity(PatternPass):
    """Remove ops that give back their input: no-op reshapes, transposes, casts and pads,
    ``x + 0``, ``x * 1``, inference-mode dropout.

    Ops are only removed when the result has exactly the input's type, so a broadcasting
    ``x + 0`` stays.
    """

    name = "eliminate_identity"

    def patterns(self) -> list[RewritePattern]:
        return [_Forward()]

