"""A program's runs of identical layers (a Transformer's encoder and decoder layers), found and cut
out, so that a pipeline can stack each run's parameters and run one layer's program for all of
them.

:func:`find_layers` looks for parameters named ``<stack>.<i>.<rest>`` for ``i = 0 .. N-1`` with the
same ``rest`` names and shapes for every ``i``, and checks that the ops of layer ``i`` (from the
first op that reads one of its parameters to the first op of layer ``i + 1``; the last layer as
long as the others) are those of layer 0, op for op: the same types, attributes and types, each
reading its own layer's parameters, values of its own layer in the same places, values the
layer before computed (the *carry*: the hidden state) in the same places, and otherwise the same
values from before the run (*broadcast* values: an attention mask, a decoder's encoder output).
A layer's values that only the program's result reads (state updates: dropout keys) are its
*side* outputs. The program then reads as *parts*, in order: :class:`Segment` s of ordinary ops
and :class:`LayerStack` s.

>>> import jax.numpy as jnp, paddlejax as pj
>>> def net(p, x):
...     for i in range(4):
...         x = jnp.tanh(pj.ops.linear(x, p[f"blocks.{i}.w"])) + x
...     return pj.ops.linear(x, p["head"])
>>> params = {**{f"blocks.{i}.w": jnp.eye(3) for i in range(4)}, "head": jnp.ones((3, 2))}
>>> split = find_layers(pj.trace(net, pj.InputSpec((None, 3)), params=params))
>>> [type(part).__name__ for part in split.parts]
['LayerStack', 'Segment']
>>> stack = split.parts[0]
>>> stack.name, stack.count, [op.type for op in stack.layer.walk()][1:]
('blocks', 4, ['linear', 'lax.tanh', 'lax.add', 'return'])
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from paddlejax.ir.core import Op, Program, Value
from paddlejax.passes.pipeline import sub_program

_FREE = ("param", "constant")
_INDEX = re.compile(r"\.(\d+)\.")


@dataclasses.dataclass
class Segment:
    """Ordinary ops: ``program`` computes ``outputs`` from ``inputs`` (values of the whole program)."""

    program: Program
    inputs: list[Value]
    outputs: list[Value]


@dataclasses.dataclass
class LayerStack:
    """``count`` layers named ``<name>.<i>.<rest>``. ``layer`` is layer 0's program, ``(carry...,
    broadcast...) -> (carry..., side...)``; ``carry_in`` and ``broadcast`` are the values of the whole
    program it starts from, ``carry_out[i]`` and ``side[i]`` layer ``i``'s outputs there.
    ``params[i]`` names layer ``i``'s parameters in the order of ``rests`` (the names after the
    index), and ``layer`` reads layer 0's."""

    name: str
    count: int
    layer: Program
    rests: list[str]
    params: list[list[str]]
    carry_in: list[Value]
    broadcast: list[Value]
    carry_out: list[list[Value]]
    side: list[list[Value]]


@dataclasses.dataclass
class LayerSplit:
    """A program as its parts, in order: segments and layer stacks."""

    program: Program
    parts: list

    @property
    def stacks(self) -> list[LayerStack]:
        return [p for p in self.parts if isinstance(p, LayerStack)]


class NoLayers(ValueError):
    """The program holds no run of identical layers (or one that cannot be cut out)."""


def _candidates(names) -> dict[str, dict[int, dict[str, str]]]:
    """``{stack name: {index: {rest: parameter name}}}`` for every numbered component of the names."""
    out: dict = {}
    for name in names:
        for m in _INDEX.finditer(name):
            stack, rest = name[:m.start()], name[m.end():]
            out.setdefault(stack, {}).setdefault(int(m.group(1)), {})[rest] = name
    return out


def _complete(layers: dict, params: dict) -> bool:
    n = len(layers)
    if n < 2 or sorted(layers) != list(range(n)):
        return False
    first = layers[0]
    return all(layers[i].keys() == first.keys() and all(np.shape(params[layers[i][r]]) == np.shape(params[first[r]])
                                                        for r in first) for i in range(n))


class _Facts:
    """What every candidate stack asks of the program, found once: its params' and constants'
    ops by value, the main block's ops to cut (``work``), each op's position, every value's
    readers (positions), and where in ``work`` each parameter is first read."""

    def __init__(self, program: Program):
        ops = program.body.ops
        self.free = {r: op for op in ops if op.type in _FREE for r in op.results}
        self.work = [op for op in ops[:-1] if op.type not in _FREE]
        self.position = {op: k for k, op in enumerate(ops)}
        self.ret = len(ops) - 1
        self.users: dict[Value, list[int]] = {}
        for k, op in enumerate(ops):
            for v in op.operands:
                self.users.setdefault(v, []).append(k)
        self.first_read: dict[str, int] = {}
        for k, op in enumerate(self.work):
            for v in op.operands:
                if v in self.free and self.free[v].type == "param":
                    self.first_read.setdefault(self.free[v].attrs["name"], k)


class _Roles:
    """Where each operand of a layer's ops comes from, for comparing layers op for op."""

    def __init__(self, program: Program, facts: _Facts, stack: str, index: int, ops: list[Op],
                 previous: list[Op] | None):
        self.program, self.stack, self.index, self.free = program, stack, index, facts.free
        self.own = {r: (k, j) for k, op in enumerate(ops) for j, r in enumerate(op.results)}
        self.prev = {r: (k, j) for k, op in enumerate(previous) for j, r in enumerate(op.results)} if previous else {}

    def of(self, v: Value):
        if v in self.own:
            return ("own", self.own[v])
        if v in self.free:
            op = self.free[v]
            if op.type == "constant":
                value = op.attrs.get("value")
                if value is None:
                    array = np.asarray(self.program.constants[op.attrs["name"]])
                    value = (array.dtype.str, array.shape, array.tobytes())
                return ("constant", str(v.type), value)
            name = op.attrs["name"]
            mine = f"{self.stack}.{self.index}."
            return ("param", name[len(mine):]) if name.startswith(mine) else ("shared", name)
        if v in self.prev:
            return ("carry", self.prev[v])
        return ("outer", id(v))

    def signature(self, op: Op) -> tuple:
        blocks = tuple(str(b) for b in op.blocks)
        return (op.type, repr(sorted(op.attrs.items())), tuple(str(r.type) for r in op.results), blocks,
                tuple(self.of(v) for v in op.operands))


def _stack(program: Program, facts: _Facts, name: str, layers: dict) -> tuple[int, int, LayerStack] | None:
    """The stack ``name`` cut out of ``facts.work`` (the main block's ops less params and
    constants): ``(start, end, stack)`` in ``work`` positions, or None when its layers' ops differ."""
    n, work, reads = len(layers), facts.work, facts.first_read
    starts = [min((reads[p] for p in layers[i].values() if p in reads), default=None) for i in range(n)]
    if None in starts or starts != sorted(set(starts)):
        return None
    length = starts[1] - starts[0]
    if any(b - a != length for a, b in zip(starts, starts[1:])) or starts[-1] + length > len(work):
        return None
    ranges = [work[s:s + length] for s in starts]
    signatures = [[_Roles(program, facts, name, i, ranges[i], ranges[i - 1] if i else None).signature(op)
                   for op in ranges[i]] for i in range(n)]
    if any(sig != signatures[1] for sig in signatures[2:]):
        return None
    # the carry: layer 0's values that layer 1 reads; layer 0 reads its start from before the run
    slots = sorted({role[1] for sig in signatures[1] for role in sig[4] if role[0] == "carry"})
    carry_in: dict = {}
    for sig0, sig1, op0 in zip(signatures[0], signatures[1], ranges[0]):
        if sig0[:4] != sig1[:4]:
            return None
        for role0, role1, v in zip(sig0[4], sig1[4], op0.operands):
            if role1[0] == "carry":
                if role0[0] != "outer" or carry_in.setdefault(slots.index(role1[1]), v) is not v:
                    return None
            elif role0 != role1:
                return None
    if sorted(carry_in) != list(range(len(slots))):
        return None
    broadcast = list(dict.fromkeys(v for sig, op in zip(signatures[0], ranges[0]) for role, v in zip(sig[4], op.operands)
                                   if role[0] == "outer" and v not in carry_in.values()))
    users, position, ret = facts.users, facts.position, facts.ret
    side_slots = None
    for i, ops in enumerate(ranges):
        # a layer's values are read by the next layer (its carry) or, from the last, by what follows
        horizon = position[ranges[i + 1][-1]] if i < n - 1 else position[ops[-1]]
        read_later = {(k, j) for k, op in enumerate(ops) for j, r in enumerate(op.results)
                      if any(horizon < u < ret for u in users.get(r, ()))}
        if read_later - (set(slots) if i == n - 1 else set()):
            return None
        returned = {(k, j) for k, op in enumerate(ops) for j, r in enumerate(op.results) if ret in users.get(r, ())}
        if i < n - 1 and returned & set(slots):  # a hidden state of every layer returned: not a chain
            return None
        sides = sorted(returned - set(slots))  # the last layer's carry reaches the result as it is
        if side_slots is not None and sides != side_slots:
            return None
        side_slots = sides
    value = lambda ops, slot: ops[slot[0]].results[slot[1]]  # noqa: E731
    carry_out = [[value(ops, s) for s in slots] for ops in ranges]
    side = [[value(ops, s) for s in side_slots] for ops in ranges]
    inputs = [carry_in[j] for j in range(len(slots))] + broadcast
    layer = sub_program(program, ranges[0], inputs, carry_out[0] + side[0], f"{name}.layer")
    rests = sorted(layers[0])
    stack = LayerStack(name, n, layer, rests, [[layers[i][r] for r in rests] for i in range(n)], inputs[:len(slots)],
                       broadcast, carry_out, side)
    return starts[0], starts[-1] + length, stack


def find_layers(program: Program) -> LayerSplit:
    """``program`` cut into segments and runs of identical layers (see the module doc); raises
    :class:`NoLayers` when it has no such run."""
    facts = _Facts(program)
    work = facts.work
    candidates = _candidates(op.attrs["name"] for op in program.param_ops())
    found = []
    for name in sorted(candidates, key=len):  # outer stacks first: a layer's own numbered parts are not stacks
        if any(name.startswith(f"{other.name}.") for _, _, other in found) or not _complete(candidates[name],
                                                                                            program.params):
            continue
        cut = _stack(program, facts, name, candidates[name])
        if cut is not None and not any(a < cut[1] and cut[0] < b for a, b, _ in found):
            found.append(cut)
    if not found:
        raise NoLayers(f"program '{program.name}' holds no run of identical layers (parameters named "
                       "<stack>.<i>.<name> for i = 0, 1, ..., whose ops repeat op for op)")
    found.sort(key=lambda cut: cut[0])
    parts, at = [], 0
    for start, end, stack in found:
        if start > at:
            parts.append(_segment(program, facts, work[at:start], f"segment{len(parts)}"))
        parts.append(stack)
        at = end
    if at < len(work):
        parts.append(_segment(program, facts, work[at:], f"segment{len(parts)}"))
    return LayerSplit(program, parts)


def _segment(program: Program, facts: _Facts, ops: list[Op], name: str) -> Segment:
    """The segment of ``ops``: it reads what earlier ops computed and hands on what later ones
    (or the program's result) read."""
    defined = {r for op in ops for r in op.results}
    inputs = list(dict.fromkeys(v for op in ops for v in op.operands if v not in defined and v not in facts.free))
    last = facts.position[ops[-1]]
    outputs = [r for op in ops for r in op.results if any(u > last for u in facts.users.get(r, ()))]
    return Segment(sub_program(program, ops, inputs, outputs, name), inputs, outputs)
