"""Pattern rewriting: ``RewritePattern`` classes driven to a fixpoint, and ``replace_pattern``.

A ``RewritePattern`` looks at one op and, if it matches, changes the program through the
rewriter and returns True. ``apply_patterns`` keeps a worklist: every op a rewrite touches
is looked at again, until nothing matches.

``replace_pattern`` is the quick way (as in torch.fx): write the pattern and its replacement
as Python functions over ops; every match of the first in the program becomes the second.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(pj.ops.relu(x)), jnp.ones(3))
>>> replace_pattern(prog, lambda a: pj.ops.relu(pj.ops.relu(a)), lambda a: pj.ops.relu(a))
1
>>> [op.type for op in prog.walk()]
['relu', 'return']
"""
from __future__ import annotations

import collections
import dataclasses
import inspect
from typing import Callable, Sequence

from paddlejax.ir.core import Op, Program, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import Pass, PassContext, PassResult


class RewritePattern:
    """Override ``match_and_rewrite``; return True when the program was changed."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        raise NotImplementedError

    @property
    def label(self) -> str:
        return type(self).__name__


def apply_patterns(program: Program, patterns: Sequence[RewritePattern],
                   max_rewrites: int = 1_000_000) -> collections.Counter:
    """Apply ``patterns`` until none matches; returns rewrite counts by pattern label."""
    rewriter = Rewriter(program)
    counts: collections.Counter = collections.Counter()
    worklist = collections.deque(program.walk())
    queued = {id(op) for op in worklist}
    while worklist:
        op = worklist.popleft()
        queued.discard(id(op))
        if op.parent is None or op.type == "return":
            continue
        for pattern in patterns:
            rewriter.touched = []
            if pattern.match_and_rewrite(op, rewriter):
                counts[pattern.label] += 1
                if sum(counts.values()) > max_rewrites:
                    raise RuntimeError(f"patterns did not converge after {max_rewrites} rewrites")
                for t in rewriter.touched + [u for t in rewriter.touched for u in t.users]:
                    if id(t) not in queued and t.parent is not None:
                        worklist.append(t)
                        queued.add(id(t))
                break
    return counts


@dataclasses.dataclass(frozen=True)
class PatternPass(Pass):
    """A pass made of rewrite patterns: subclasses implement ``patterns()``."""

    def patterns(self) -> list[RewritePattern]:
        raise NotImplementedError

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        counts = apply_patterns(program, self.patterns())
        return PassResult(bool(counts), dict(counts))


# ---------------------------------------------------------------------------------------
# replace_pattern

def _trace_function(fn: Callable, example_inputs) -> Program:
    from paddlejax.capture import trace

    if example_inputs is None:
        import jax
        import jax.numpy as jnp

        n = len(inspect.signature(fn).parameters)
        example_inputs = [jax.ShapeDtypeStruct((), jnp.float32)] * n
    return trace(fn, *example_inputs)


def _same_attrs(p: Op, t: Op) -> bool:
    if p.type == "constant":
        return ("value" in p.attrs and "value" in t.attrs and p.attrs["value"] == t.attrs["value"]
                and p.result.type.dtype == t.result.type.dtype)
    return p.attrs == t.attrs


class _Matcher:
    """Structural match of a traced pattern's ops against the program, rooted at one op."""

    def __init__(self, pattern: Program):
        self.pattern = pattern
        self.root = pattern.outputs[0].producer

    def match(self, target: Op) -> tuple[dict[Value, Value], list[Op]] | None:
        if self.root is None:
            return None
        binding: dict[Value, Value] = {}
        matched: dict[int, Op] = {}
        if not self._op(self.root, target, binding, matched):
            return None
        inner = [op for op in matched.values() if op is not target]
        ids = {id(op) for op in matched.values()}
        for op in inner:  # intermediate results may not escape the matched region
            if any(id(u) not in ids for u in op.users):
                return None
        return binding, inner

    def _op(self, p: Op, t: Op, binding, matched) -> bool:
        if id(p) in matched:
            return matched[id(p)] is t
        if p.type != t.type or len(p.operands) != len(t.operands) or p.blocks or t.blocks \
                or not _same_attrs(p, t):
            return False
        matched[id(p)] = t
        for pv, tv in zip(p.operands, t.operands):
            if pv.producer is None:  # a pattern input: binds to any value, consistently
                if binding.setdefault(pv, tv) is not tv:
                    return False
            elif tv.producer is None or pv.index != tv.index or \
                    not self._op(pv.producer, tv.producer, binding, matched):
                return False
        return True


def _splice(program: Program, rewriter: Rewriter, replacement: Program, anchor: Op,
            args: list[Value]) -> list[Value]:
    """Copy ``replacement``'s ops before ``anchor``, reading ``args``; returns its outputs."""
    mapping = dict(zip(replacement.inputs, args))
    for op in replacement.body.ops[:-1]:
        attrs = dict(op.attrs)
        if op.type == "constant" and "name" in attrs:
            name = f"replaced{len(program.constants)}"
            program.constants[name] = replacement.constants[attrs["name"]]
            attrs["name"] = name
        copy = Op(op.type, [mapping[v] for v in op.operands], [r.type for r in op.results], attrs,
                  loc=anchor.loc)
        rewriter.insert_before(anchor, copy)
        mapping.update(zip(op.results, copy.results))
    return [mapping[v] for v in replacement.outputs]


def replace_pattern(program: Program, pattern: Callable, replacement: Callable,
                    example_inputs=None) -> int:
    """Replace every match of ``pattern`` in ``program`` by ``replacement``; returns the count.

    Both are functions of the same arguments. The pattern is traced on ``example_inputs``
    (scalars by default); ops and attributes must match exactly, shapes are not compared.
    The replacement is traced again for each match, on the matched values' types.
    """
    from paddlejax.ir.verifier import Shapes

    matcher = _Matcher(_trace_function(pattern, example_inputs))
    pattern_args = matcher.pattern.inputs
    rewriter = Rewriter(program)
    shapes = Shapes(program)
    count = 0
    for op in list(program.walk()):
        if op.parent is None:
            continue
        found = matcher.match(op)
        if found is None:
            continue
        binding, inner = found
        if any(a not in binding for a in pattern_args):
            continue
        args = [binding[a] for a in pattern_args]
        new = _trace_function(replacement, [shapes.struct(v.type) for v in args])
        outs = _splice(program, rewriter, new, op, args)
        if [v.type for v in outs] != [r.type for r in op.results]:
            raise TypeError(f"replacement gives {[str(v.type) for v in outs]} for "
                            f"{[str(r.type) for r in op.results]}")
        rewriter.replace_op(op, outs)
        pending = list(inner)
        while pending:  # erase the matched region, readers before producers
            dead = next(d for d in pending if not any(r.uses for r in d.results))
            rewriter.erase_op(dead)
            pending.remove(dead)
        count += 1
    return count

