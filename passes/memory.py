"""Memory analyses and passes: liveness, peak estimate, in-place reuse plan, remat under a budget.

**Liveness** runs over the program's top-level block; an op holding sub-blocks (cond, while,
scan) counts as one op that holds its operands. Parameters and constants are counted apart
(they are always live); activations are the program's inputs and the other ops' results. An
input is freed after its last use and a result after its last use (right after its op when
nobody reads it); the program's outputs live to the end. ``timeline[i]`` is the activation
bytes live *during* op ``i``: operands still needed, plus the op's results.

**In-place reuse** (:func:`plan_inplace`, pass ``inplace``): an op's result may take the buffer
of an operand read for the last time by that op, with the same dtype and element count, that
is neither a parameter, a constant nor a program input (the caller keeps those) nor an output.
The plan is an analysis result, not op attributes: XLA assigns buffers itself, so recording it
on the ops would change the printed program and every saved file without changing what runs.
The pass reports the plan in its statistics and leaves it in ``ctx.cache["inplace_plan"]``.

**Remat** (pass ``remat{budget=BYTES}``): marks segments of consecutive ops with
``remat_segment=k``; lowering runs each segment in one ``jax.checkpoint``. See :class:`Remat`
for the memory model it plans with.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: jnp.tanh(jnp.concatenate([x, x])) * 2.0, pj.InputSpec((None, 256)))
>>> live = liveness(prog, sizes={"b": 4})
>>> live.timeline
[12288, 16384, 8192, 16384, 8192]
>>> live.peak_bytes, prog.body.ops[live.peak_op].type
(16384, 'lax.tanh')
>>> plan = plan_inplace(prog, sizes={"b": 4})
>>> len(plan.reuses), plan.peak_bytes_reused, plan.saved_bytes
(2, 12288, 4096)
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from paddlejax.analysis import concrete_shape, size_env
from paddlejax.ir.core import Op, Program, TensorType, Value
from paddlejax.ir.printer import op_lines
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass

REMAT_ATTR = "remat_segment"
_PERSISTENT = ("param", "constant")


def nbytes(t: TensorType, env: dict) -> int:
    """Bytes of a value of type ``t`` with symbolic sizes from ``env``."""
    return math.prod(concrete_shape(t, env)) * np.dtype(jax.numpy.dtype(t.dtype)).itemsize


@dataclasses.dataclass
class Liveness:
    """Live activation bytes per op of ``program.body`` (see the module doc for the model).

    ``defined[v]`` / ``last_use[v]`` are op indices (-1: a program input, live from the start;
    ``len(ops)``: an output, live past the end). ``reuse`` maps a result to the value whose
    buffer it takes (from :func:`plan_inplace`); such values share bytes.
    """

    program: Program
    nbytes: dict[Value, int]
    defined: dict[Value, int]
    last_use: dict[Value, int]
    param_bytes: int
    constant_bytes: int
    reuse: dict[Value, Value] = dataclasses.field(default_factory=dict)

    def live_during(self, i: int) -> list[Value]:
        """Activations live while op ``i`` runs (its operands still held, and its results)."""
        return [v for v in self.nbytes if self.defined[v] <= i <= self.last_use[v]]

    def live_after(self, i: int) -> list[Value]:
        """Activations still live once op ``i`` has run."""
        return [v for v in self.nbytes if self.defined[v] <= i < self.last_use[v]]

    def _buffer(self, v: Value) -> Value:
        while v in self.reuse:
            v = self.reuse[v]
        return v

    def bytes_during(self, i: int) -> int:
        return sum(self.nbytes[b] for b in {self._buffer(v) for v in self.live_during(i)})

    @property
    def timeline(self) -> list[int]:
        """Live activation bytes during each op of the top-level block."""
        return [self.bytes_during(i) for i in range(len(self.program.body.ops))]

    @property
    def peak_op(self) -> int:
        """Index (in ``program.body.ops``) of the first op where live bytes peak."""
        timeline = self.timeline
        return timeline.index(max(timeline))

    @property
    def peak_bytes(self) -> int:
        return max(self.timeline)

    def top_live(self, i: int, k: int = 5) -> list[tuple[Value, int]]:
        """The ``k`` largest activations live during op ``i``, largest first."""
        return sorted(((v, self.nbytes[v]) for v in self.live_during(i)), key=lambda p: -p[1])[:k]

    def with_reuse(self, reuse: dict[Value, Value]) -> "Liveness":
        return dataclasses.replace(self, reuse=dict(reuse))


def liveness(program: Program, sizes: dict | None = None) -> Liveness:
    """Liveness of ``program``'s top-level block, symbolic sizes from ``sizes`` (others 1)."""
    env = size_env(program, sizes)
    ops = program.body.ops
    defined = {v: -1 for v in program.inputs}
    last_use = {v: -1 for v in program.inputs}
    persistent = {"param": 0, "constant": 0}
    for i, op in enumerate(ops):
        if op.type in _PERSISTENT:
            persistent[op.type] += sum(nbytes(r.type, env) for r in op.results)
            continue
        for v in op.operands:
            if v in defined:
                last_use[v] = i
        for r in op.results:
            defined[r] = last_use[r] = i
    for v in program.outputs:
        if v in last_use:
            last_use[v] = len(ops)
    sizes_of = {v: nbytes(v.type, env) for v in defined}
    return Liveness(program, sizes_of, defined, last_use, persistent["param"], persistent["constant"])


def value_names(program: Program) -> dict[Value, str]:
    """Each top-level value's name as ``print(program)`` shows it (``%x``, ``%5``)."""
    names = {v: f"%{v.name}" for v in program.inputs}
    for op, line in op_lines(program).items():
        if op.results:
            names.update(zip(op.results, line.split(" = ")[0].split(", ")))
    return names


@dataclasses.dataclass(frozen=True)
class Reuse:
    """Result ``result`` of op ``op_index`` takes the buffer of its operand ``operand``."""

    op_index: int
    result: int
    operand: int
    nbytes: int


@dataclasses.dataclass
class InplacePlan:
    """The reuses found, and the estimated activation peak without and with them."""

    reuses: list[Reuse]
    peak_bytes: int
    peak_bytes_reused: int

    @property
    def saved_bytes(self) -> int:
        return self.peak_bytes - self.peak_bytes_reused


def _reuse_map(program: Program, live: Liveness) -> tuple[list[Reuse], dict[Value, Value]]:
    reuses, donors = [], {}
    taken: set[Value] = set()
    for i, op in enumerate(program.body.ops):
        if op.type in _PERSISTENT or op.type == "return" or op.blocks:
            continue
        for ri, r in enumerate(op.results):
            for oi, v in enumerate(op.operands):
                if (v in taken or v not in live.defined or live.defined[v] < 0 or live.last_use[v] != i
                        or v.type.dtype != r.type.dtype or live.nbytes[v] != live.nbytes[r]):
                    continue
                taken.add(v)
                donors[r] = v
                reuses.append(Reuse(i, ri, oi, live.nbytes[r]))
                break
    return reuses, donors


def plan_inplace(program: Program, sizes: dict | None = None) -> InplacePlan:
    """The in-place reuse plan of ``program`` (see the module doc for the rules)."""
    live = liveness(program, sizes)
    reuses, donors = _reuse_map(program, live)
    return InplacePlan(reuses, live.peak_bytes, live.with_reuse(donors).peak_bytes)


def parse_sizes(text: str) -> dict[str, int]:
    """A pass's ``sizes`` option (``"b=32"``, several joined by ``:`` as commas separate
    options on a command line) as a dict.

    >>> parse_sizes("b=32:s=128")
    {'b': 32, 's': 128}
    """
    sizes = {}
    for item in filter(None, text.replace(":", ",").split(",")):
        name, eq, value = item.partition("=")
        if not eq or not value.strip().isdigit():
            raise ValueError(f"sizes expects NAME=N items separated by ':', got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes


@register_pass
@dataclasses.dataclass(frozen=True)
class InplaceReuse(Pass):
    """Plan in-place buffer reuse (an analysis: the program is left as it is).

    ``sizes`` gives symbolic sizes (``inplace{sizes=b=32}``; several as ``b=32:t=8``).
    Statistics: ``reuses`` and ``bytes_saved`` (on the estimated activation peak).
    """

    name = "inplace"
    sizes: str = ""

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        plan = plan_inplace(program, parse_sizes(self.sizes))
        if ctx is not None:
            ctx.cache["inplace_plan"] = plan
        return PassResult(False, {"reuses": len(plan.reuses), "bytes_saved": plan.saved_bytes})


@dataclasses.dataclass
class MemoryComparison:
    """This module's estimate beside XLA's ``compiled.memory_analysis()`` for one program."""

    param_bytes: int
    constant_bytes: int
    peak_activation_bytes: int
    xla_argument_bytes: int
    xla_output_bytes: int
    xla_temp_bytes: int

    @property
    def estimate_bytes(self) -> int:
        return self.param_bytes + self.constant_bytes + self.peak_activation_bytes

    @property
    def xla_bytes(self) -> int:
        return self.xla_argument_bytes + self.xla_output_bytes + self.xla_temp_bytes


def compare_with_xla(program: Program, sizes: dict | None = None) -> MemoryComparison:
    """Compile ``program`` (parameters as arguments) for ``sizes`` and set the estimate beside XLA's.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 256)))
    >>> c = compare_with_xla(prog)
    >>> c.peak_activation_bytes, c.xla_argument_bytes, c.xla_output_bytes
    (8192, 4096, 4096)
    """
    env = size_env(program, sizes)
    live = liveness(program, sizes)
    specs = [jax.ShapeDtypeStruct(concrete_shape(v.type, env),
                                  jax.numpy.dtype(v.type.dtype)) for v in program.inputs]
    inputs = jax.tree_util.tree_unflatten(program.in_tree, specs)
    stats = jax.jit(program.apply).lower(program.used_params(), *inputs).compile().memory_analysis()
    return MemoryComparison(live.param_bytes, live.constant_bytes, live.peak_bytes,
                            int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
                            int(stats.temp_size_in_bytes))


def stored_bytes(program: Program, sizes: dict | None = None, segments: dict[Op, int] | None = None) -> int:
    """Activation bytes training keeps for the backward pass under the :class:`Remat` model.

    ``segments`` maps ops to segment numbers (default: the program's ``remat_segment`` marks).
    """
    if segments is None:
        segments = {op: op.attrs[REMAT_ATTR] for op in program.body.ops if REMAT_ATTR in op.attrs}
    live = liveness(program, sizes)
    outputs = set(program.outputs)
    kept, internal = 0, {}
    for op in program.body.ops:
        if op.type in _PERSISTENT or op.type == "return":
            continue
        k = segments.get(op)
        for r in op.results:
            inside = k is not None and r not in outputs and all(segments.get(u) == k for u in r.users)
            if inside:
                internal[k] = internal.get(k, 0) + live.nbytes[r]
            else:
                kept += live.nbytes[r]
    return kept + max(internal.values(), default=0)


def _runs(program: Program) -> list[list[Op]]:
    """Maximal runs of consecutive ops a segment may hold (not params, constants or return)."""
    runs, current = [], []
    for op in program.body.ops:
        if op.type in _PERSISTENT or op.type == "return":
            if current:
                runs.append(current)
            current = []
        else:
            current.append(op)
    return runs + ([current] if current else [])


def _chunked(runs: list[list[Op]], length: int) -> dict[Op, int]:
    segments, k = {}, 0
    for run in runs:
        for start in range(0, len(run), length):
            chunk = run[start:start + length]
            if len(chunk) > 1:  # a one-op segment recomputes nothing
                segments.update((op, k) for op in chunk)
                k += 1
    return segments


@register_pass
@dataclasses.dataclass(frozen=True)
class Remat(Pass):
    """Mark remat segments so that the activations kept for the backward pass fit ``budget`` bytes.

    Model: without remat, training keeps every activation an op produces (results of all ops
    but parameters and constants). Inside a segment only the values that leave it (read by a
    later op, or outputs) are kept; the others are recomputed in the backward pass, one segment
    at a time, so the stored size is the kept bytes plus the largest segment's internal bytes
    (:func:`stored_bytes`). The planner cuts the runs of consecutive ops into segments of
    ``L`` ops (Chen et al.'s sqrt(n) checkpointing) and takes the smallest ``L`` whose stored
    size fits; if the program (with the marks it has) already fits, nothing changes. A budget
    no segment length meets is an error that gives the smallest size found. ``sizes`` gives
    symbolic sizes as in ``inplace``. Recomputation does not change values: the tolerance is 0.
    """

    name = "remat"
    budget: int = 0
    sizes: str = ""

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.budget <= 0:
            raise ValueError(f"remat: budget expects a positive number of bytes, got {self.budget}")
        sizes = parse_sizes(self.sizes)
        before = stored_bytes(program, sizes)
        if before <= self.budget:
            return PassResult(False, {"segments": 0, "stored_bytes": before})
        runs = _runs(program)
        longest = max((len(r) for r in runs), default=0)
        best = before
        for length in range(2, longest + 1):
            segments = _chunked(runs, length)
            stored = stored_bytes(program, sizes, segments)
            best = min(best, stored)
            if stored <= self.budget:
                rewriter = Rewriter(program)
                for op in program.body.ops:
                    if op in segments:
                        rewriter.set_attr(op, REMAT_ATTR, segments[op])
                    elif REMAT_ATTR in op.attrs:
                        rewriter.set_attr(op, REMAT_ATTR, None)
                return PassResult(True, {"segments": len(set(segments.values())), "stored_bytes": stored})
        raise ValueError(f"remat: budget {self.budget} B cannot be met; the smallest stored size "
                         f"found is {best} B (without remat: {before} B)")
