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

**Remat** (pass ``remat{budget=BYTES}``, or ``remat`` for the plan that keeps the least): marks
segments of consecutive ops with ``remat_segment=k``; lowering runs each segment in one
``jax.checkpoint``. See :class:`Remat` for the memory model it plans with.

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
from paddlejax.ir.attrs import resolve
from paddlejax.ir.core import Op, Program, TensorType, Value
from paddlejax.ir.printer import op_lines
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.options import parse_sizes

REMAT_ATTR = "remat_segment"
OFFLOAD_ATTR = "remat_offload"
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
    """This module's estimate beside XLA's ``compiled.memory_analysis()`` for one program.

    Ours: ``param_bytes`` and ``constant_bytes`` (always live), ``peak_activation_bytes`` (the
    liveness peak; the program's inputs count while they are live) and ``layout_copy_bytes``
    (the weight copies XLA makes for convolutions, live at the combined peak; see
    :func:`compare_with_xla`). XLA's: ``xla_argument_bytes`` (parameters and inputs, live
    throughout), ``xla_output_bytes`` and ``xla_temp_bytes`` (every other buffer, including the
    weight copies); ``xla_bytes`` is their sum.
    """

    param_bytes: int
    constant_bytes: int
    peak_activation_bytes: int
    layout_copy_bytes: int
    xla_argument_bytes: int
    xla_output_bytes: int
    xla_temp_bytes: int

    @property
    def estimate_bytes(self) -> int:
        return self.param_bytes + self.constant_bytes + self.peak_activation_bytes + self.layout_copy_bytes

    @property
    def xla_bytes(self) -> int:
        return self.xla_argument_bytes + self.xla_output_bytes + self.xla_temp_bytes


def _weight_copies(live: Liveness, env: dict) -> tuple[int, int]:
    """(activation peak, weight copies live there) when each conv's parameter weight is copied
    at the start of the program and held until the conv runs."""
    ops = live.program.body.ops
    copies = [0] * (len(ops) + 1)
    for i, op in enumerate(ops):
        weight = op.input("weight") if op.type == "conv2d" else None
        if weight is not None and weight.producer is not None and weight.producer.type == "param":
            copies[i] += nbytes(weight.type, env)
    for i in range(len(ops) - 1, -1, -1):
        copies[i] += copies[i + 1]
    timeline = live.timeline
    peak = max(range(len(ops)), key=lambda i: timeline[i] + copies[i])
    return timeline[peak], copies[peak]


def compare_with_xla(program: Program, sizes: dict | None = None) -> MemoryComparison:
    """Compile ``program`` (parameters as arguments) for ``sizes`` and set the estimate beside XLA's.

    XLA's CPU backend runs convolutions on weights in HWIO layout: with the parameters as
    arguments it copies every conv weight (OIHW) into a temporary, and schedules these copies,
    which depend on parameters alone, before the first op; the estimate counts each copy from the
    start until its conv (``layout_copy_bytes``, at the peak of activations plus copies). With
    frozen weights the copies are folded at compile time, so they are left to the arguments case.
    XLA fuses small networks (SmallCNN) into one kernel that never materialises the activations
    the liveness counts: there the estimate is an upper bound, several times XLA's figure.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 256)))
    >>> c = compare_with_xla(prog)
    >>> c.peak_activation_bytes, c.layout_copy_bytes, c.xla_argument_bytes, c.xla_output_bytes
    (8192, 0, 4096, 4096)
    """
    env = size_env(program, sizes)
    live = liveness(program, sizes)
    peak, copies = _weight_copies(live, env)
    specs = [jax.ShapeDtypeStruct(concrete_shape(v.type, env),
                                  jax.numpy.dtype(v.type.dtype)) for v in program.inputs]
    inputs = jax.tree_util.tree_unflatten(program.in_tree, specs)
    stats = jax.jit(program.apply).lower(program.used_params(), *inputs).compile().memory_analysis()
    return MemoryComparison(live.param_bytes, live.constant_bytes, peak, copies,
                            int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
                            int(stats.temp_size_in_bytes))


# An op whose traits do not say what its gradient reads is assumed to keep its operands and result.
_DEFAULT_SAVED = ("operands", "result")


def stored_bytes(program: Program, sizes: dict | None = None, segments: dict[Op, int] | None = None,
                 offload: bool | None = None) -> int:
    """Activation bytes training keeps on the device for the backward pass under the :class:`Remat` model.

    ``segments`` maps ops, nested ones included, to segment numbers (default: the program's
    ``remat_segment`` marks). With ``offload`` (default: the program's ``remat_offload`` marks)
    the segments' inputs wait in host memory and count here only where an op outside a segment
    keeps them too; :func:`offloaded_bytes` counts them.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.tanh(x * x) + 1.0, pj.InputSpec((None, 256)))
    >>> stored_bytes(prog, {"b": 4})  # mul: x (the caller's); tanh: its result and 1 - result
    8192
    """
    device, host = _stored(program, sizes, segments, offload)
    return device


def offloaded_bytes(program: Program, sizes: dict | None = None, segments: dict[Op, int] | None = None) -> int:
    """Activation bytes that wait in host memory between the forward and the backward pass: the
    inputs of the segments marked ``remat_offload`` (by ``remat{offload=true}``); 0 without marks.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.tanh(jnp.tanh(jnp.tanh(x * 2.0))), pj.InputSpec((None, 256)))
    >>> out = pj.passes.run(prog, "remat{offload=true,sizes=b=4}")
    >>> offloaded_bytes(out, {"b": 4}), stored_bytes(out, {"b": 4}), stored_bytes(prog, {"b": 4})
    (4096, 16384, 24576)
    """
    return _stored(program, sizes, segments, None)[1]


def _stored(program, sizes, segments, offload) -> tuple[int, int]:
    """(bytes kept on the device, bytes kept in host memory) for the backward pass."""
    if segments is None:
        segments = {op: op.attrs[REMAT_ATTR] for op in program.walk() if REMAT_ATTR in op.attrs}
    if offload is None:
        offload = any(op.attrs.get(OFFLOAD_ATTR) for op in program.walk())
    env = size_env(program, sizes)
    kept, entries, extra, recompute = _residuals(program.body, env, segments)
    free = set(program.inputs)
    size = lambda values: sum(nbytes(v.type, env) for v in values if _is_activation(v) and v not in free)  # noqa: E731
    if not offload:
        return size(kept | entries) + extra + recompute, 0
    return size(kept) + extra + recompute, size(entries - kept)


def _is_activation(v: Value) -> bool:
    return not (isinstance(v.owner, Op) and v.owner.type in _PERSISTENT)


def _is_constant(v: Value) -> bool:
    return isinstance(v.owner, Op) and v.owner.type == "constant"


def _saved_by(op: Op, env: dict) -> tuple[list[Value], int]:
    """The values ``op``'s backward pass reads, and the bytes of new buffers it keeps."""
    values, extra = [], 0
    saved = op.traits.saved_for_backward
    for item in _DEFAULT_SAVED if saved is None else saved:
        if item == "operands":
            # an operand's gradient reads the other operands; a constant needs no gradient
            needs_grad = [not _is_constant(v) for v in op.operands]
            values += [v for i, v in enumerate(op.operands) if any(needs_grad[:i] + needs_grad[i + 1:])]
        elif item == "result":
            values += op.results
        else:
            extra += sum(nbytes(r.type, env) if item == "new" else math.prod(concrete_shape(r.type, env))
                         for r in op.results)
    return values, extra


def _residuals(block, env: dict, segments: dict[Op, int]) -> tuple[set[Value], set[Value], int, int]:
    """(values of ``block`` ops outside segments keep for the backward pass, the segments' inputs,
    bytes of new buffers kept, the largest recompute at once). A segment keeps its inputs; its
    ops' own residuals exist only while it is recomputed. A scan keeps its body's residuals once
    per iteration (on the device: only the top-level block's segments are offloaded); residuals
    that are the body's loop-invariant or ``xs`` arguments are the scan's operands, kept once."""
    kept, entries, extra, recompute = set(), set(), 0, 0
    inner: dict[int, tuple[set[Value], list[int]]] = {}
    for op in block.ops:
        if op.type in _PERSISTENT or op.type == "return":
            continue
        if op.type == "scan":
            body = op.blocks[0]
            body_kept, body_entries, body_extra, body_recompute = _residuals(body, env, segments)
            body_kept |= body_entries
            carries = range(op.attrs["num_consts"], op.attrs["num_consts"] + op.attrs["num_carry"])
            outer = {a: op.operands[i] for i, a in enumerate(body.args) if i not in carries}
            kept.update(outer[v] for v in body_kept if v in outer)
            per_iteration = body_extra + sum(nbytes(v.type, env) for v in body_kept
                                             if v not in outer and _is_activation(v))
            extra += int(resolve(op.attrs["length"], env)) * per_iteration
            recompute = max(recompute, body_recompute)
            continue
        values, new = _saved_by(op, env)
        k = segments.get(op)
        if k is None:
            kept.update(values)
            extra += new
        else:
            held, held_extra = inner.setdefault(k, (set(), [0]))
            held.update(values)
            held_extra[0] += new
            entries.update(v for v in op.operands if not (isinstance(v.owner, Op) and segments.get(v.owner) == k))
    for held, held_extra in inner.values():
        recompute = max(recompute, held_extra[0] + sum(nbytes(v.type, env) for v in held - kept - entries
                                                       if _is_activation(v) and isinstance(v.owner, Op)))
    return kept, entries, extra, recompute


def _runs(block) -> list[list[Op]]:
    """Maximal runs of consecutive ops a segment may hold, in ``block`` and in the scan bodies
    nested in it; parameters and constants inside a run stay in it (a segment takes them along)."""
    runs, current, nested = [], [], []

    def close():
        while current and current[-1].type in _PERSISTENT:
            current.pop()
        if current:
            runs.append(list(current))
        current.clear()

    for op in block.ops:
        if op.type == "return" or op.blocks:
            close()
            if op.type == "scan":
                nested += _runs(op.blocks[0])
        elif current or op.type not in _PERSISTENT:
            current.append(op)
    close()
    return runs + nested


def _chunked(runs: list[list[Op]], length: int) -> dict[Op, int]:
    """Each run cut into segments of ``length`` computing ops (parameters and constants between
    them go along uncounted); a last piece of one op is left unmarked."""
    segments, k = {}, 0
    for run in runs:
        chunk, count = [], 0
        for i, op in enumerate(run):
            chunk.append(op)
            count += op.type not in _PERSISTENT
            if count == length or i == len(run) - 1:
                if count > 1:  # a one-op segment recomputes nothing
                    segments.update((o, k) for o in chunk)
                    k += 1
                chunk, count = [], 0
    return segments


@register_pass
@dataclasses.dataclass(frozen=True)
class Remat(Pass):
    """Mark remat segments so that the activations kept for the backward pass fit ``budget`` bytes.

    Model (:func:`stored_bytes`): an op outside a segment keeps what its backward pass reads,
    by its ``saved_for_backward`` trait (JAX's linearization rules: linear ops such as add,
    reshape or broadcast keep nothing; a matmul, conv or mul keeps its operands; tanh its result
    and ``1 - result``; relu a boolean mask); an op type that declares nothing keeps its operands
    and results, the conservative choice. A value several ops keep is counted once; program inputs,
    parameters and constants are not counted (they are held anyway). A segment keeps only its
    inputs; the residuals of its ops are recomputed in the backward pass, one segment at a time,
    so the largest segment's own residuals are added once. A ``scan`` keeps its body's residuals
    once per iteration (``length`` times); its recompute is one segment of one iteration's.
    The planner cuts the runs of consecutive ops -- those of the top-level block and of every
    scan body, where the marks are honoured per iteration -- into segments of ``L`` ops (Chen et
    al.'s sqrt(n) checkpointing) and takes the smallest ``L`` whose stored size fits; if the
    program (with the marks it has) already fits, nothing changes. A budget no segment length
    meets is an error that gives the smallest size found. Without a budget (``budget=0``, the
    default, what ``Strategy(recompute=True)`` runs) it takes the ``L`` that stores the least.
    ``sizes`` gives symbolic sizes as in ``inplace``. Recomputation does not change values: the
    tolerance is 0. XLA adds the backward pass's own temporaries to the kept bytes, so its temp
    figure is somewhat above the estimate.

    ``offload=true`` (Paddle's recompute ``enable_offload``) also keeps the inputs of the
    top-level segments in host memory (the ``pinned_host`` memory kind) from the forward pass to
    the backward pass (marked ``remat_offload``; lowering names them for
    ``jax.checkpoint_policies.save_and_offload_only_these_names``): the budget and
    ``stored_bytes`` count device bytes, ``offloaded_bytes`` the host bytes. Where XLA's backend
    keeps host and device memory apart (GPU, TPU) this frees device memory for the price of
    two copies per segment; on CPU the two memories are one and the copies vanish.
    """

    name = "remat"
    budget: int = 0
    sizes: str = ""
    offload: bool = False

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.budget < 0:
            raise ValueError(f"remat: budget expects a number of bytes >= 0 (0: keep the least), got {self.budget}")
        sizes = parse_sizes(self.sizes)
        before = stored_bytes(program, sizes, offload=self.offload)
        if before <= self.budget:
            return PassResult(False, {"segments": 0, "stored_bytes": before})
        runs = _runs(program.body)
        longest = max((sum(op.type not in _PERSISTENT for op in r) for r in runs), default=0)
        best, best_segments = before, None
        for length in range(2, longest + 1):
            segments = _chunked(runs, length)
            stored = stored_bytes(program, sizes, segments, self.offload)
            if stored < best:
                best, best_segments = stored, segments
            if self.budget and stored <= self.budget:
                return self._mark(program, sizes, segments, stored)
        if not self.budget:
            return self._mark(program, sizes, best_segments, best) if best_segments else \
                PassResult(False, {"segments": 0, "stored_bytes": before})
        raise ValueError(f"remat: budget {self.budget} B cannot be met; the smallest stored size "
                         f"found is {best} B (without remat: {before} B)")

    def _mark(self, program: Program, sizes: dict, segments: dict[Op, int], stored: int) -> PassResult:
        rewriter = Rewriter(program)
        for op in program.walk():
            if op in segments:
                rewriter.set_attr(op, REMAT_ATTR, segments[op])
            else:
                rewriter.remove_attr(op, REMAT_ATTR)
            if self.offload and op in segments and op.parent is program.body:
                rewriter.set_attr(op, OFFLOAD_ATTR, True)
            else:
                rewriter.remove_attr(op, OFFLOAD_ATTR)
        stats = {"segments": len(set(segments.values())), "stored_bytes": stored}
        if self.offload:
            stats["offloaded_bytes"] = offloaded_bytes(program, sizes)
        return PassResult(True, stats)
