"""Channel dependency groups of a program, found from the op traits' channel rules (DepGraph's
idea, on our IR): which channels must be removed together, and which weight slices go with them.

Every output channel a ``consumed`` op makes (a conv's or linear's output channel) gets an id.
The ids flow through the program: ``identity`` ops keep them at the same axis (and tie their
per-channel parameters, e.g. batch norm's), elementwise ops with two full operands couple the
ids they meet position by position (a residual add prunes both branches together),
``grouped`` depthwise convolutions pass them on, ``concatenated`` ops lay them side by side,
``reshaped`` ops (a flatten before a linear) spread each over the positions it lands on, and a
``consumed`` op's weight takes them on its input-channel axis. An embedding lookup
(``produced``) makes ids from its table's columns, so word, position and type embeddings that
are added together prune as one hidden width. A reshape that splits channels into heads ties
each head's channels into one unit, attention (``heads``) ties the query, key and value heads
together, and the sizes written into reshapes follow what is cut; a reduction over other axes
(``reduced``, global pooling) keeps the channels. Ids that reach the program's outputs, an op
without a channel rule, or a control-flow block are frozen: they cannot be pruned.

>>> import jax.numpy as jnp, numpy as np, paddlejax as pj
>>> p = {"w1": jnp.ones((4, 2, 3, 3)), "w2": jnp.ones((3, 4, 3, 3))}
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["w1"])), p["w2"]),
...                 pj.InputSpec((None, 2, 8, 8)), params=p)
>>> [(g.producers, len(g.classes)) for g in ChannelGraph(prog).groups()]
[(('w1',), 4)]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paddlejax.ir.core import Op, Program, Value
from paddlejax.passes.query import param_name

UNTRACKED = -1


class _Sets:
    """Union-find over channel ids."""

    def __init__(self):
        self.parent: list[int] = []

    def fresh(self, n: int) -> np.ndarray:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return np.arange(start, start + n)

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


@dataclasses.dataclass(frozen=True)
class Group:
    """Coupled channels: ``classes`` are the pruning units (each a set of channel ids removed
    together), ``producers`` the weights whose output channels make them."""

    producers: tuple[str, ...]
    classes: tuple[tuple[int, ...], ...]


@dataclasses.dataclass
class Slice:
    """A parameter axis whose positions carry channel ids (``UNTRACKED`` where none)."""

    param: str
    axis: int
    origin: np.ndarray


class ChannelGraph:
    """The channel ids of ``program``'s main block: ``slices`` (what to cut in each parameter),
    ``producers`` (weight → its output-channel axis and ids), ``scales`` (batch-norm scale →
    ids), ``frozen`` ids, and :meth:`groups`."""

    def __init__(self, program: Program):
        self.program = program
        self.sets = _Sets()
        self.origin: dict[tuple[int, int], np.ndarray] = {}
        self.slices: list[Slice] = []
        self.producers: dict[str, tuple[int, np.ndarray]] = {}
        self.scales: dict[str, np.ndarray] = {}
        self.frozen: set[int] = set()
        self.regrouped: list[Op] = []  # grouped convolutions whose ``groups`` follows their channels
        self.resized: list[tuple[Op, int, np.ndarray]] = []  # reshapes whose written size at an axis follows ids
        self.dead = _dead(program)  # what no output reads (an unused pooler) neither freezes nor is cut
        for op in program.body.ops:
            if id(op) not in self.dead:
                self._visit(op)

    # -- ids on values -----------------------------------------------------------------------------
    def get(self, v: Value, axis: int) -> np.ndarray | None:
        return self.origin.get((id(v), axis % max(len(v.type.shape), 1)))

    def put(self, v: Value, axis: int, ids: np.ndarray) -> None:
        if np.any(ids != UNTRACKED):
            self.origin[(id(v), axis % len(v.type.shape))] = ids

    def tracked(self, v: Value) -> list[tuple[int, np.ndarray]]:
        return [(axis, self.origin[(id(v), axis)]) for axis in range(len(v.type.shape)) if (id(v), axis) in self.origin]

    def freeze(self, ids) -> None:
        self.frozen.update(int(i) for i in np.ravel(ids) if i != UNTRACKED)

    def freeze_value(self, v: Value) -> None:
        for _, ids in self.tracked(v):
            self.freeze(ids)

    def couple(self, a: np.ndarray, b: np.ndarray) -> None:
        for x, y in zip(a, b):
            if x != UNTRACKED and y != UNTRACKED:
                self.sets.union(int(x), int(y))
            elif x != y:  # a tracked channel meets an untracked one: neither can go
                self.freeze([x, y])

    def slice(self, v: Value | None, axis: int, ids: np.ndarray | None) -> bool:
        """Record that parameter ``v``'s ``axis`` carries ``ids``; False if ``v`` is computed."""
        if v is None or ids is None:
            return True
        name = param_name(v)
        if name is None:
            self.freeze(ids)
            return False
        axis %= len(v.type.shape)
        for s in self.slices:
            if s.param == name and s.axis == axis:
                if np.array_equal(s.origin, ids):
                    return True  # read again with the same channels: cut once
                # one weight read in two places with different channels: keep both as they are
                self.freeze(ids)
                self.freeze(s.origin)
        self.slices.append(Slice(name, axis, np.asarray(ids)))
        return True

    # -- the rules ---------------------------------------------------------------------------------
    def _visit(self, op: Op) -> None:
        if op.type in ("param", "constant"):
            return
        rule = op.traits.channel_rule(op.attrs) if not op.blocks else None
        handler = {"consumed": self._consumed, "identity": self._identity, "grouped": self._grouped,
                   "reshaped": self._reshaped, "concatenated": self._concatenated, "produced": self._produced,
                   "heads": self._heads, "reduced": self._reduced}.get(rule)
        if handler is None or not handler(op):
            for v in op.operands:
                self.freeze_value(v)

    def _consumed(self, op: Op) -> bool:
        t = op.traits
        if t.channel_axis is None or t.weight_in_axis is None or t.weight is None:
            return False
        x, w, b = op.operands[0], op.input(t.weight), op.input("bias") if "bias" in _inputs(op) else None
        if param_name(w) is None or (b is not None and param_name(b) is None):
            return False
        rank, w_rank = len(x.type.shape), len(w.type.shape)
        self.slice(w, t.weight_in_axis(op.attrs, w_rank), self.get(x, t.channel_axis(op.attrs, rank)))
        out_axis = t.weight_out_axis(op.attrs, w_rank)
        ids = self.sets.fresh(w.type.shape[out_axis])
        self.slice(w, out_axis, ids)
        self.slice(b, 0, ids)
        self.producers[param_name(w)] = (out_axis, ids)
        result = op.results[0]
        self.put(result, t.channel_axis(op.attrs, len(result.type.shape)), ids)
        return True

    def _produced(self, op: Op) -> bool:
        table, result = op.input("weight"), op.results[0]
        if op.traits.channel_axis is None or param_name(table) is None or len(table.type.shape) != 2:
            return False
        ids = self.sets.fresh(table.type.shape[1])
        self.slice(table, 1, ids)
        self.producers[param_name(table)] = (1, ids)
        self.put(result, op.traits.channel_axis(op.attrs, len(result.type.shape)), ids)
        return True

    def _heads(self, op: Op) -> bool:
        axis = op.traits.channel_axis(op.attrs, len(op.results[0].type.shape))
        qkv = [op.input(name) for name in ("query", "key", "value")]
        if any(a != axis for v in qkv for a, _ in self.tracked(v)) or (
                op.input("mask") is not None and self.tracked(op.input("mask"))):
            return False
        heads = [self.get(v, axis) for v in qkv]
        if all(h is None for h in heads):
            return True
        heads = [h if h is not None else np.full(v.type.shape[axis], UNTRACKED) for h, v in zip(heads, qkv)]
        for h in heads[1:]:
            self.couple(heads[0], h)
        self.put(op.results[0], axis, heads[2])
        return True

    def _reduced(self, op: Op) -> bool:
        x, rank = op.operands[0], len(op.operands[0].type.shape)
        axes = op.attrs.get("axes", op.attrs.get("axis"))
        axes = set(range(rank)) if axes is None else {a % max(rank, 1) for a in np.atleast_1d(axes)}
        for axis, ids in self.tracked(x):
            if axis in axes:  # channels summed together: none can go alone
                self.freeze(ids)
            else:
                self.put(op.results[0], axis if op.attrs.get("keepdim") else axis - sum(a < axis for a in axes), ids)
        return True

    def _identity(self, op: Op) -> bool:
        t = op.traits
        if t.channel_axis is not None:  # a norm: its per-channel inputs and outputs follow x's channels
            x = op.operands[0]
            axis = t.channel_axis(op.attrs, len(x.type.shape))
            ids = self.get(x, axis)
            for v in op.operands[1:]:
                if v.type.shape != (x.type.shape[axis],) or (ids is not None and not self.slice(v, 0, ids)):
                    return False  # per-channel parameters only (a layer norm's may span several axes)
            if ids is not None and op.input("weight") is not None:
                self.scales[param_name(op.input("weight"))] = ids
            for r in op.results:
                if r.type.shape == x.type.shape:
                    for a, got in self.tracked(x):
                        self.put(r, a, got)
                elif ids is not None and len(r.type.shape) == 1:
                    self.put(r, 0, ids)
            return True
        for r in op.results:
            for axis in range(len(r.type.shape)):
                # operands aligned with this result axis as numpy broadcasting aligns them
                aligned = [(v, a) for v in op.operands
                           if (a := axis + len(v.type.shape) - len(r.type.shape)) >= 0]
                carried = [self.get(v, a) for v, a in aligned if len(v.type.shape) >= len(r.type.shape)]
                carried = [ids for ids in carried if ids is not None]
                if not carried:
                    continue
                for ids in carried[1:]:
                    self.couple(carried[0], ids)
                self.put(r, axis, carried[0])
                for v, a in aligned:  # a per-channel parameter broadcast in
                    if self.get(v, a) is None and param_name(v) and v.type.shape[a] == r.type.shape[axis] != 1:
                        self.slice(v, a, carried[0])
        return True

    def _grouped(self, op: Op) -> bool:
        t = op.traits
        if t.channel_axis is None or t.weight is None:
            return False
        x, w = op.operands[0], op.input(t.weight)
        b = op.input("bias") if "bias" in _inputs(op) else None
        axis = t.channel_axis(op.attrs, len(x.type.shape))
        channels, groups = x.type.shape[axis], op.attrs.get("groups", x.type.shape[axis])
        if groups != channels or w.type.shape[0] != channels or param_name(w) is None:
            return False  # only depthwise with one filter per channel keeps channels one to one
        ids = self.get(x, axis)
        if ids is None:
            return True
        self.slice(w, 0, ids)
        self.slice(b, 0, ids)
        self.put(op.results[0], t.channel_axis(op.attrs, len(op.results[0].type.shape)), ids)
        if "groups" in op.attrs:
            self.regrouped.append(op)
        return True

    def _reshaped(self, op: Op) -> bool:
        x, r = op.operands[0], op.results[0]
        tracked = self.tracked(x)
        if not tracked:
            return True
        in_shape, out_shape = _concrete(x.type.shape, r.type.shape)
        # the batch may be symbolic; it has to stay the leading axis for the channels to be followed
        if (len(tracked) > 1 or in_shape is None or x.type.shape[:1] != r.type.shape[:1]
                or np.prod(in_shape[1:]) != np.prod(out_shape[1:])):
            return False
        axis, ids = tracked[0]
        # where each position of the result came from, by the input's channel position
        positions = np.arange(in_shape[axis]).reshape([-1 if a == axis else 1 for a in range(len(in_shape))])
        index = np.broadcast_to(positions, [1] + in_shape[1:]).reshape([1] + out_shape[1:])
        varying = []  # result axes along which the channel changes, but that do not alone say which
        for out_axis in range(1, len(out_shape)):
            if not np.any(np.diff(index, axis=out_axis)):
                continue  # this axis has nothing to do with the channels
            along = np.moveaxis(index, out_axis, 0).reshape(out_shape[out_axis], -1)
            if np.all(along == along[:, :1]):
                self.put(r, out_axis, ids[along[:, 0]])
                self.resized.append((op, out_axis, ids[along[:, 0]]))
            else:
                varying.append(out_axis)
        if not varying:
            return True
        if len(varying) == 2 and varying[1] == varying[0] + 1:  # channels split into (heads, head size)
            heads, size = out_shape[varying[0]], out_shape[varying[1]]
            split = np.moveaxis(index, varying, [0, 1]).reshape(heads * size, -1)
            if np.all(split == np.arange(heads * size)[:, None]):
                per_head = ids.reshape(heads, size)
                for row in per_head:  # a head goes whole or not at all
                    self.couple(np.repeat(row[:1], size), row)
                self.put(r, varying[0], per_head[:, 0])
                self.resized.append((op, varying[0], per_head[:, 0]))
                return True
        return False

    def _concatenated(self, op: Op) -> bool:
        r = op.results[0]
        axis = next((a for a in range(len(r.type.shape))
                     if any(v.type.shape[a] != r.type.shape[a] for v in op.operands)), None)
        if axis is None or any(len(v.type.shape) != len(r.type.shape) for v in op.operands):
            return False
        parts = [self.get(v, axis) if self.get(v, axis) is not None else np.full(v.type.shape[axis], UNTRACKED)
                 for v in op.operands]
        self.put(r, axis, np.concatenate(parts))
        for other in range(len(r.type.shape)):
            if other != axis:
                found = [self.get(v, other) for v in op.operands if self.get(v, other) is not None]
                for ids in found[1:]:
                    self.couple(found[0], ids)
                if found:
                    self.put(r, other, found[0])
        return True

    # -- groups ------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Freeze what reaches the program's outputs."""
        for v in self.program.body.terminator.operands:
            self.freeze_value(v)

    def groups(self) -> list[Group]:
        """The prunable groups, in program order of their first producer."""
        self.finish()
        frozen_roots = {self.sets.find(i) for i in self.frozen}
        classes: dict[int, list[int]] = {}
        owner: dict[int, str] = {}
        for name, (_, ids) in self.producers.items():
            for i in ids:
                classes.setdefault(self.sets.find(int(i)), []).append(int(i))
                owner[int(i)] = name
        by_producers: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
        for root, members in classes.items():
            if root in frozen_roots:
                continue
            key = tuple(dict.fromkeys(owner[i] for i in members))
            by_producers.setdefault(key, []).append(tuple(members))
        order = {name: i for i, name in enumerate(self.producers)}
        return [Group(key, tuple(sorted(members))) for key, members in
                sorted(by_producers.items(), key=lambda kv: min(order[n] for n in kv[0]))]


def _dead(program: Program) -> set[int]:
    """The ids of the main block's ops whose results reach no output."""
    live: set[int] = set()
    ops = program.body.ops
    for op in reversed(ops):
        if op is program.body.terminator or not op.traits.pure or any(id(u) in live for r in op.results
                                                                        for u in r.users):
            live.add(id(op))
    return {id(op) for op in ops} - live


def _concrete(in_shape: tuple, out_shape: tuple) -> tuple[list, list] | tuple[None, None]:
    """Both shapes with every size named in both (a symbolic batch or length, carried through)
    read as 1, or Nones if a symbolic size appears on one side only."""
    names = {d for d in in_shape + out_shape if isinstance(d, str)}
    if any((d in in_shape) != (d in out_shape) for d in names):
        return None, None
    return [1 if isinstance(d, str) else d for d in in_shape], [1 if isinstance(d, str) else d for d in out_shape]


def _inputs(op: Op) -> list[str]:
    from paddlejax.ops import registry

    opdef = registry.lookup(op.type)
    return [i.name for i in opdef.inputs] if opdef is not None else []
