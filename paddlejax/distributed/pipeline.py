"""Pipeline parallel training: GPipe and 1F1B schedules over a ``"pp"`` mesh axis.

A program split into ``S`` stages (:func:`paddlejax.passes.pipeline.split_stages`) runs with
stage ``s`` on device ``s`` of the mesh axis ``"pp"``, over ``M`` micro-batches, inside one
``jax.shard_map``. Time advances in *ticks*; in each tick every stage runs at most one unit of
work, a forward ``F(m)`` or a backward ``B(m)`` of micro-batch ``m``, and then ``lax.ppermute``
moves the activations it produced to the next stage and the input gradients to the previous
one. The schedule is a table fixed before tracing (:func:`make_schedule`):

- ``"gpipe"``: every stage runs all its forwards, then all its backwards;
- ``"1f1b"``: stage ``s`` runs ``S - 1 - s`` warm-up forwards, then alternates one forward and
  one backward, then cools down with the remaining backwards; at most ``S - s`` micro-batches
  are in flight on stage ``s`` (``M`` under GPipe), which is what bounds its stashed memory.

Design choices:

- *Heterogeneous stages*: each device picks its work with one ``lax.switch`` over ``2 S + 1``
  branches (idle, ``F`` of each stage, ``B`` of each stage) on its stage index. Values that
  cross stages, stashed residuals and parameters are packed into one flat buffer per dtype,
  sized for the largest stage (the padding is the price of one buffer shape for all).
- *Parameters* are packed per stage (:class:`StageParams`) and sharded over ``"pp"``: device
  ``s`` holds only stage ``s``'s parameters, and computes only their gradients (parameters shared
  by several stages get the sum of their stages' gradients). :meth:`PipelineRunner.run_packed`
  takes and returns them packed, so that a training loop keeps them so between steps.
- *Backward*: ``F`` keeps the stage's VJP residuals (parameters aside, they are on hand) in a
  stash slot; ``B`` applies the VJP to the incoming gradient. With ``recompute=True``, ``F``
  keeps only the stage's inputs and ``B`` re-runs the stage forward before its VJP (what
  ``jax.checkpoint`` around each stage does), trading compute for stash memory.
- *Loss*: ``loss_fn(outputs, *targets)`` is applied at the last stage to each micro-batch; the
  loss returned is the mean over micro-batches, so with a mean loss it is the full batch's
  loss, and the gradients are the sequential model's. Inputs and targets are replicated over
  ``"pp"``; only stage 0 reads the inputs and only the last stage the targets.
- *Auxiliary results* (``has_aux``: ``loss_fn`` returns ``(loss, aux)``, e.g. the batch-norm
  statistics a training program updates): not differentiated; floating-point leaves are
  averaged over the micro-batches (and data-parallel replicas), others are the last
  micro-batch's.
- *Bubble*: each executed branch also reports what it did; :func:`bubble` turns that per-tick
  work record into each stage's idle share, next to the theory ``(S - 1) / (M + S - 1)``.

>>> import jax, jax.numpy as jnp, paddlejax as pj
>>> from paddlejax.passes.pipeline import split_stages
>>> def mlp(p, x):
...     for i in range(4):
...         x = pj.ops.linear(x, p[f"w{i}"], act="tanh")
...     return x
>>> params = {f"w{i}": jnp.full((4, 4), 0.1 * (i + 1)) for i in range(4)}
>>> split = split_stages(pj.trace(mlp, pj.InputSpec((None, 4)), params=params), 4)
>>> runner = PipelineRunner(split, lambda out, y: jnp.mean((out - y) ** 2), micro_batches=8)
>>> x, y = jnp.ones((16, 4)), jnp.zeros((16, 4))
>>> loss, grads, work = jax.jit(runner.run)(params, x, y)
>>> ref = jax.value_and_grad(lambda p: jnp.mean((mlp(p, x) - y) ** 2))(params)
>>> bool(jnp.allclose(loss, ref[0])), bool(jnp.allclose(grads["w0"], ref[1]["w0"]))
(True, True)
>>> print(bubble(runner.schedule, work))
bubble theory 3/11 = 0.273; measured idle share per stage: 0.273 0.273 0.273 0.273
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from paddlejax.passes.pipeline import PipelineSplit

IDLE, FORWARD, BACKWARD = 0, 1, 2
SCHEDULES = ("gpipe", "1f1b")


# ---------------------------------------------------------------------------------------
# Schedules
@dataclasses.dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``kind[t, s]`` (IDLE, FORWARD or BACKWARD) and ``micro[t, s]``
    (the micro-batch) of stage ``s`` at tick ``t``."""

    name: str
    num_stages: int
    micro_batches: int
    kind: np.ndarray
    micro: np.ndarray

    @property
    def ticks(self) -> int:
        return self.kind.shape[0]

    def in_flight(self) -> list[int]:
        """Per stage, the most micro-batches forwarded but not yet backwarded at once: the
        stash slots that stage needs."""
        out = []
        for s in range(self.num_stages):
            live = np.cumsum((self.kind[:, s] == FORWARD).astype(int) - (self.kind[:, s] == BACKWARD))
            out.append(int(live.max()))
        return out

    def timeline(self, work: np.ndarray | None = None) -> str:
        """One line per stage, one cell per tick: ``F3`` / ``B3`` (forward / backward of
        micro-batch 3) or ``.`` (idle). ``work`` (``[S, T]`` kinds, e.g. an executed run's
        record) replaces the planned kinds.

        >>> print(make_schedule("1f1b", 2, 3).timeline())
        stage 0 | F0 F1 .  B0 F2 B1 .  B2
        stage 1 | .  F0 B0 F1 B1 F2 B2 .
        """
        kinds = self.kind.T if work is None else np.asarray(work)
        width = len(str(self.micro_batches - 1)) + 1
        lines = []
        for s in range(self.num_stages):
            cells = [("." if k == IDLE else f"{'F' if k == FORWARD else 'B'}{m}").ljust(width)
                     for k, m in zip(kinds[s], self.micro[:, s])]
            lines.append(f"stage {s} | {' '.join(cells).rstrip()}")
        return "\n".join(lines)


def make_schedule(name: str, num_stages: int, micro_batches: int) -> Schedule:
    """The ``"gpipe"`` or ``"1f1b"`` schedule of ``num_stages`` stages and ``micro_batches``.

    Every unit of work takes one tick and a stage's output is usable by its neighbour from the
    next tick on; each stage runs its own order of work as early as its inputs allow.

    >>> s = make_schedule("gpipe", 4, 8)
    >>> s.ticks, s.in_flight()
    (22, [8, 8, 8, 8])
    >>> make_schedule("1f1b", 4, 8).in_flight()
    [4, 3, 2, 1]
    """
    if name not in SCHEDULES:
        raise ValueError(f"pipeline schedule expects one of {list(SCHEDULES)}, got {name!r}")
    for label, v in (("num_stages", num_stages), ("micro_batches", micro_batches)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"pipeline schedule: {label} expects a positive int, got {v!r}")
    S, M = int(num_stages), int(micro_batches)
    orders = []
    for s in range(S):
        if name == "gpipe":
            order = [(FORWARD, m) for m in range(M)] + [(BACKWARD, m) for m in range(M)]
        else:
            warm = min(S - 1 - s, M)
            order = [(FORWARD, m) for m in range(warm)]
            for i in range(M - warm):
                order += [(FORWARD, warm + i), (BACKWARD, i)]
            order += [(BACKWARD, m) for m in range(M - warm, M)]
        orders.append(order)
    done: dict[tuple[int, int, int], int] = {}  # (kind, stage, micro) -> tick it ran
    nxt, kind_rows, micro_rows, t = [0] * S, [], [], 0
    while any(n < 2 * M for n in nxt):
        kinds, micros = [IDLE] * S, [0] * S
        for s in range(S):
            if nxt[s] == 2 * M:
                continue
            k, m = orders[s][nxt[s]]
            if k == FORWARD:
                ready = s == 0 or done.get((FORWARD, s - 1, m), t) < t
            else:
                ready = done.get((FORWARD, s, m), t) < t and (s == S - 1 or done.get((BACKWARD, s + 1, m), t) < t)
            if ready:
                kinds[s], micros[s] = k, m
        for s in range(S):
            if kinds[s] != IDLE:
                done[(kinds[s], s, micros[s])] = t
                nxt[s] += 1
        kind_rows.append(kinds)
        micro_rows.append(micros)
        t += 1
    return Schedule(name, S, M, np.array(kind_rows, np.int32), np.array(micro_rows, np.int32))


# ---------------------------------------------------------------------------------------
# Bubble
@dataclasses.dataclass(frozen=True)
class Bubble:
    """The bubble of a run: theory ``(S - 1) / (M + S - 1)`` and each stage's idle share."""

    num_stages: int
    micro_batches: int
    idle_share: tuple[float, ...]

    @property
    def theory(self) -> float:
        return (self.num_stages - 1) / (self.micro_batches + self.num_stages - 1)

    def __str__(self) -> str:
        S, M = self.num_stages, self.micro_batches
        shares = " ".join(f"{x:.3f}" for x in self.idle_share)
        return f"bubble theory {S - 1}/{M + S - 1} = {self.theory:.3f}; measured idle share per stage: {shares}"


def bubble(schedule: Schedule, work=None) -> Bubble:
    """Theory and measured idle share per stage; ``work`` is an executed run's ``[S, T]`` record
    of what each stage did each tick (the ``work`` of :meth:`PipelineRunner.run`), else the plan is used.

    >>> b = bubble(make_schedule("gpipe", 4, 8))
    >>> round(b.theory, 4), b.idle_share
    (0.2727, (0.2727, 0.2727, 0.2727, 0.2727))
    """
    kinds = schedule.kind.T if work is None else np.asarray(work)
    idle = tuple(round(float(np.mean(row == IDLE)), 4) for row in kinds)
    return Bubble(schedule.num_stages, schedule.micro_batches, idle)


def plot_timeline(schedule: Schedule, work=None, ax=None):
    """Draw the schedule (stages on y, ticks on x; forwards blue, backwards orange) with
    matplotlib; returns the axes."""
    from paddlejax._extras import require

    plt = require("matplotlib.pyplot", extra="plot", feature="plot_timeline")

    kinds = schedule.kind.T if work is None else np.asarray(work)
    ax = ax or plt.subplots(figsize=(max(6, schedule.ticks * 0.3), 0.5 * schedule.num_stages + 1))[1]
    colours = {FORWARD: "tab:blue", BACKWARD: "tab:orange"}
    for s in range(schedule.num_stages):
        for t in range(kinds.shape[1]):
            if kinds[s, t] != IDLE:
                ax.barh(s, 1, left=t, color=colours[int(kinds[s, t])], edgecolor="white")
                ax.text(t + 0.5, s, str(schedule.micro[t, s]), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(schedule.num_stages), [f"stage {s}" for s in range(schedule.num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("tick")
    ax.set_title(f"{schedule.name}: {bubble(schedule, work)}", fontsize=9)
    return ax


# ---------------------------------------------------------------------------------------
# Flat buffers: one per dtype, so that every stage reads and writes the same shapes
class _Layout:
    """Where each of a list of arrays (by shape and dtype) lives in per-dtype flat buffers."""

    def __init__(self, structs):
        self.structs = [jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(x.dtype)) for x in structs]
        self.offsets, self.sizes = [], {}
        for x in self.structs:
            key = x.dtype.name
            self.offsets.append(self.sizes.get(key, 0))
            self.sizes[key] = self.sizes.get(key, 0) + math.prod(x.shape)

    def pack(self, leaves, capacity: dict) -> dict:
        parts = {k: [] for k in capacity}
        for x in leaves:
            parts[jnp.dtype(x.dtype).name].append(jnp.ravel(x))
        return {k: jnp.pad(jnp.concatenate(v), (0, capacity[k] - sum(p.size for p in v))) if v
                else jnp.zeros(capacity[k], k) for k, v in parts.items()}

    def unpack(self, buffers: dict) -> list:
        return [lax.dynamic_slice_in_dim(buffers[x.dtype.name], off, math.prod(x.shape)).reshape(x.shape)
                for x, off in zip(self.structs, self.offsets)]


def _capacity(layouts) -> dict:
    cap: dict[str, int] = {}
    for layout in layouts:
        for k, n in layout.sizes.items():
            cap[k] = max(cap.get(k, 0), n)
    return cap


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


@dataclasses.dataclass
class _StagePlan:
    """Static facts about one stage for the micro-batch shapes of a call."""

    param_names: list[str]
    diff: list[bool]  # which input leaves get gradients (inexact ones, after stage 0)
    params: _Layout
    inputs: _Layout   # what F reads
    outputs: _Layout  # what F sends on (the loss on the last stage)
    stash: _Layout    # what F keeps for B
    residual_tree: object = None
    param_slots: dict = dataclasses.field(default_factory=dict)  # residual index -> parameter leaf index
    aux: list = dataclasses.field(default_factory=list)  # shapes of loss_fn's aux leaves (last stage)
    aux_tree: object = None

    @property
    def grad_in(self) -> _Layout:
        """The gradients B sends back: those of the differentiable inputs."""
        return _Layout([x for x, d in zip(self.inputs.structs, self.diff) if d])

    @property
    def grad_out(self) -> _Layout:
        """The gradients B receives: those of the inexact outputs."""
        return _Layout([x for x in self.outputs.structs if _inexact(x)])


class StageParams:
    """The stages' parameters packed as the pipeline runs them: per dtype one ``[S, capacity]``
    buffer whose row ``s`` holds stage ``s``'s parameters (a parameter several stages use, in
    each of their rows). Sharded over the pipeline axis, each stage's parameters live on its
    devices only.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> from paddlejax.passes.pipeline import split_stages
    >>> params = {"w0": jnp.ones((2, 2)), "w1": jnp.ones((2, 3))}
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.linear(x, p["w0"]), p["w1"]), pj.InputSpec((None, 2)),
    ...                 params=params)
    >>> layout = StageParams(split_stages(prog, 2), params)
    >>> layout.names, layout.pack(params)["float32"].shape
    ([['w0'], ['w1']], (2, 6))
    """

    def __init__(self, split: PipelineSplit, params: dict):
        self.names = [list(stage.param_names) for stage in split.stages]
        self.layouts = [_Layout([params[n] for n in names]) for names in self.names]
        self.capacity = _capacity(self.layouts)
        self.shared = {n for i, names in enumerate(self.names) for n in names
                       if any(n in other for other in self.names[i + 1:])}

    def pack(self, params: dict) -> dict:
        """``{dtype: [S, capacity]}`` from every stage's parameters (a dict by name)."""
        rows = [layout.pack([params[n] for n in names], self.capacity) for names, layout in zip(self.names, self.layouts)]
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows)

    def unpack(self, packed: dict, add_copies: bool = False) -> dict:
        """The parameters by name from :meth:`pack`'s form: a shared one from its first stage, or
        (``add_copies``, for gradients) the sum of its stages' copies."""
        out: dict = {}
        for s, (names, layout) in enumerate(zip(self.names, self.layouts)):
            for n, v in zip(names, layout.unpack({k: b[s] for k, b in packed.items()})):
                out[n] = out[n] + v if add_copies and n in out else out.get(n, v)
        return out

    def mask(self, names, repeats: bool = False) -> dict:
        """``{dtype: bool [S, capacity]}`` (a numpy constant): True at every slot of ``names``, or
        with ``repeats`` only at their second and later copies (what a sum over the packed form
        must leave out to count each parameter once)."""
        out = {k: np.zeros((len(self.names), n), bool) for k, n in self.capacity.items()}
        seen = set()
        for s, (stage_names, layout) in enumerate(zip(self.names, self.layouts)):
            for n, x, offset in zip(stage_names, layout.structs, layout.offsets):
                if n in names and (n in seen or not repeats):
                    out[x.dtype.name][s, offset:offset + math.prod(x.shape)] = True
                seen.add(n)
        return out

    def place(self, packed: dict, values: dict) -> dict:
        """``packed`` with every copy of the parameters named in ``values`` set to them."""
        structs = {n: x for names, layout in zip(self.names, self.layouts) for n, x in zip(names, layout.structs)}
        full = self.pack({n: values[n] if n in values else jnp.zeros(x.shape, x.dtype) for n, x in structs.items()})
        return jax.tree_util.tree_map(jnp.where, self.mask(values), full, packed)

    def share(self, grads: dict) -> dict:
        """Packed gradients with every copy of a shared parameter holding the sum of all copies'."""
        if not self.shared:
            return grads
        summed = self.unpack(grads, add_copies=True)
        return self.place(grads, {n: summed[n] for n in self.shared})


# ---------------------------------------------------------------------------------------
# The runner
class PipelineRunner:
    """Loss and gradients of a split program, pipelined over the mesh axis ``axis``.

    ``loss_fn(outputs, *targets)`` gives a micro-batch's (mean) loss from the program's
    outputs; with ``loss_fn=None`` the program's output is that loss. ``mesh`` needs an axis
    ``axis`` with one device per stage (default: the first ``S`` devices); its other axes run
    data parallel (each replica pipelines its share of every micro-batch, and losses and
    gradients are averaged over the replicas). With ``has_aux``, ``loss_fn`` returns ``(loss,
    aux)`` and the loss becomes ``(loss, aux)`` in the results, as ``jax.value_and_grad``'s.
    :meth:`run` and :meth:`value_and_grad` are pure functions of their arguments (jit them).
    """

    def __init__(self, split: PipelineSplit, loss_fn: Callable | None = None, *, micro_batches: int,
                 schedule: str = "1f1b", recompute: bool = False, mesh: Mesh | None = None, axis: str = "pp",
                 has_aux: bool = False):
        S = split.num_stages
        if has_aux and loss_fn is None:
            raise ValueError("PipelineRunner: has_aux=True needs a loss_fn returning (loss, aux)")
        self.split, self.loss_fn, self.recompute, self.axis = split, loss_fn, recompute, axis
        self.has_aux = has_aux
        self.schedule = make_schedule(schedule, S, micro_batches)
        if mesh is None:
            if len(jax.devices()) < S:
                raise ValueError(f"PipelineRunner: {S} stages need {S} devices, there are {len(jax.devices())}")
            mesh = Mesh(np.array(jax.devices()[:S]), (axis,))
        if axis not in mesh.shape or mesh.shape[axis] != S:
            raise ValueError(f"PipelineRunner: mesh expects an axis '{axis}' of {S} devices (one per stage), "
                             f"got mesh axes {dict(mesh.shape)}")
        self.mesh = mesh
        # any other mesh axes run data parallel: each replica pipelines its rows of every micro-batch
        self.batch_axes = tuple(a for a in mesh.axis_names if a != axis)
        self.replicas = math.prod(mesh.shape[a] for a in self.batch_axes)

    def value_and_grad(self, params: dict, inputs, targets=()):
        """``(loss, grads)``: the mean micro-batch loss and its gradient for every parameter of
        the program. ``inputs`` are the program's inputs (a tuple for several) and ``targets``
        the extra arguments of ``loss_fn`` (a tuple for several), all with the batch first; the
        batch is cut into ``micro_batches`` equal parts."""
        loss, grads, _ = self.run(params, inputs, targets)
        return loss, grads

    def run(self, params: dict, inputs, targets=()):
        """``(loss, grads, work)``: :meth:`value_and_grad`'s results and the executed ``[S, T]``
        record of what each stage did at each tick (IDLE, FORWARD or BACKWARD; see :func:`bubble`);
        with ``has_aux`` the loss is ``(loss, aux)``."""
        layout = StageParams(self.split, params)
        loss, pgrad, work = self._run(layout, layout.pack(params), inputs, targets)
        return loss, layout.unpack(pgrad, add_copies=True), work

    def run_packed(self, layout: StageParams, packed: dict, inputs, targets=()):
        """:meth:`run` on parameters kept packed by ``layout`` (sharded over the axis, so that
        each stage's parameters stay on its devices): the gradients come packed the same way,
        each copy of a parameter several stages use holding the sum of their gradients."""
        loss, pgrad, work = self._run(layout, packed, inputs, targets)
        return loss, layout.share(pgrad), work

    def _run(self, layout: StageParams, packed: dict, inputs, targets):
        M = self.schedule.micro_batches
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        targets = targets if isinstance(targets, tuple) else (targets,)
        mb_inputs = _micro(jax.tree_util.tree_leaves(inputs), M, self.replicas, "inputs")
        target_leaves, targets_tree = jax.tree_util.tree_flatten(targets)
        mb_targets = _micro(target_leaves, M, self.replicas, "targets")
        plans = self._plan(layout, mb_inputs, mb_targets, targets_tree)
        cap = {"params": layout.capacity, "act": _capacity(p.outputs for p in plans[:-1]),
               "grad": _capacity(p.grad_out for p in plans[:-1]), "stash": _capacity(p.stash for p in plans)}
        body = _TickBody(self, plans, cap, targets_tree)
        spec = jax.tree_util.tree_map(lambda _: P(self.axis), packed)
        rows = P(None, self.batch_axes) if self.batch_axes else P()
        loss, aux, pgrad, work = jax.shard_map(body.run, mesh=self.mesh, in_specs=(spec, rows, rows),
                                               out_specs=(P(), P(), spec, P(self.axis)), check_vma=False)(
            packed, mb_inputs, mb_targets)
        return ((loss, jax.tree_util.tree_unflatten(plans[-1].aux_tree, aux)) if self.has_aux else loss), pgrad, work

    # -- the stage functions ------------------------------------------------------------
    def stage_fn(self, s: int, plan: _StagePlan, targets_tree):
        """``f(params, diff_inputs, other_inputs, targets) -> (outputs, aux leaves)`` of stage
        ``s``; the last stage returns ``[loss / M]``, so that the micro-batch losses add up to
        their mean (and ``loss_fn``'s aux leaves, with ``has_aux``; the other stages none)."""
        split, last, M = self.split, s == self.split.num_stages - 1, self.schedule.micro_batches

        def f(p, xd, xn, targets):
            outs = split.stages[s].program.apply(p, *_merge(plan.diff, xd, xn))
            if not last:
                return list(outs), []
            outputs = jax.tree_util.tree_unflatten(split.program.out_tree, outs)
            if self.loss_fn is None:
                if jnp.shape(outputs) != ():
                    raise ValueError("PipelineRunner: without loss_fn the program must return a scalar loss, it "
                                     f"returns {jax.tree_util.tree_map(jnp.shape, outputs)}")
                loss = outputs
            else:
                loss = self.loss_fn(outputs, *jax.tree_util.tree_unflatten(targets_tree, targets))
            aux = []
            if self.has_aux:
                loss, aux = loss
                aux, plan.aux_tree = jax.tree_util.tree_flatten(lax.stop_gradient(aux))
            return [jnp.asarray(loss, jnp.float32) / M], aux

        return f

    def stage_vjp(self, s: int, plan: _StagePlan, p, x, targets, targets_tree):
        """Stage ``s``'s outputs, VJP with respect to its parameters and differentiable inputs,
        and aux leaves."""
        xd, xn = _partition(plan.diff, x)
        f = self.stage_fn(s, plan, targets_tree)
        return jax.vjp(lambda p_, xd_: f(p_, xd_, xn, targets), p, xd, has_aux=True)

    @staticmethod
    def residuals(vjp_fn, p_leaves):
        """The VJP's residual arrays less the parameters (on hand in B), its tree, and where
        the parameters go back in (residual index -> parameter leaf index)."""
        leaves, tree = jax.tree_util.tree_flatten(vjp_fn)
        slots = {i: j for i, r in enumerate(leaves) for j, q in enumerate(p_leaves) if r is q}
        return [r for i, r in enumerate(leaves) if i not in slots], tree, slots

    def _plan(self, layout: StageParams, mb_inputs, mb_targets, targets_tree) -> list[_StagePlan]:
        split, plans = self.split, []
        local = lambda a: jax.ShapeDtypeStruct((a.shape[1] // self.replicas, *a.shape[2:]), a.dtype)  # noqa: E731
        x, t = [local(a) for a in mb_inputs], [local(a) for a in mb_targets]
        for s in range(split.num_stages):
            # shapes alone: a sharding of the caller's would type the probed VJP for another mesh than
            # shard_map's, and the backward pass rebuilds that VJP from it
            names, p = layout.names[s], dict(zip(layout.names[s], layout.layouts[s].structs))
            diff = [s > 0 and _inexact(a) for a in x]
            plan = _StagePlan(names, diff, layout.layouts[s], _Layout(x), _Layout([]), _Layout(x))
            f = self.stage_fn(s, plan, targets_tree)
            outputs, aux = jax.eval_shape(lambda p_, x_, t_: f(p_, *_partition(diff, x_), t_), p, x, t)
            plan.outputs, plan.aux = _Layout(outputs), aux
            if not self.recompute:
                plan.stash = _Layout(jax.eval_shape(functools.partial(self._probe, s, plan, targets_tree), p, x, t))
            plans.append(plan)
            x = plan.outputs.structs
        return plans

    def _probe(self, s, plan, targets_tree, p, x, t):
        _, vjp_fn, _ = self.stage_vjp(s, plan, p, x, t, targets_tree)
        kept, plan.residual_tree, plan.param_slots = self.residuals(vjp_fn, jax.tree_util.tree_leaves(p))
        return kept


class _TickBody:
    """The per-device program: one ``lax.scan`` over the schedule's ticks."""

    def __init__(self, runner: PipelineRunner, plans, cap, targets_tree):
        self.r, self.plans, self.cap, self.targets_tree = runner, plans, cap, targets_tree
        self.slots = max(runner.schedule.in_flight())

    def run(self, packed_params, mb_inputs, mb_targets):
        r, sched, cap = self.r, self.r.schedule, self.cap
        S, M = sched.num_stages, sched.micro_batches
        packed_params = {k: v[0] for k, v in packed_params.items()}
        stage = lax.axis_index(r.axis)
        carry = {"act": _zeros(cap["act"], M + 1), "grad": _zeros(cap["grad"], M + 1),
                 "stash": _zeros(cap["stash"], self.slots),
                 "pgrad": {k: jnp.zeros_like(v) for k, v in packed_params.items()},
                 "loss": jnp.zeros((), jnp.float32),
                 "aux": [jnp.zeros(a.shape, a.dtype) for a in self.plans[-1].aux]}
        branches = [self._idle] + [self._forward(s) for s in range(S)] + [self._backward(s) for s in range(S)]
        env = (packed_params, mb_inputs, mb_targets)

        def tick(carry, row):
            kinds, micros = row
            k, m = kinds[stage], micros[stage]
            index = jnp.where(k == IDLE, 0, jnp.where(k == FORWARD, 1 + stage, 1 + S + stage))
            carry, send_act, send_grad, did = lax.switch(index, branches, carry, m, env)
            got_act = lax.ppermute(send_act, r.axis, [(i, i + 1) for i in range(S - 1)])
            got_grad = lax.ppermute(send_grad, r.axis, [(i + 1, i) for i in range(S - 1)])
            # what a neighbour sent is filed under its micro-batch; M is a slot for "nothing came"
            left, right = jnp.maximum(stage - 1, 0), jnp.minimum(stage + 1, S - 1)
            act_at = jnp.where((stage > 0) & (kinds[left] == FORWARD), micros[left], M)
            grad_at = jnp.where((stage < S - 1) & (kinds[right] == BACKWARD), micros[right], M)
            carry = dict(carry, act=_put(carry["act"], act_at, got_act), grad=_put(carry["grad"], grad_at, got_grad))
            return carry, did

        carry, did = lax.scan(tick, carry, (jnp.asarray(sched.kind), jnp.asarray(sched.micro)))
        # only the last stage holds the loss and aux: the other stages add zeros
        loss, aux, pgrad = lax.psum(carry["loss"], r.axis), lax.psum(carry["aux"], r.axis), carry["pgrad"]
        if r.batch_axes:  # the replicas' mean losses and gradients: those of the whole batch
            loss, pgrad = lax.pmean((loss, pgrad), r.batch_axes)
            aux = [lax.pmean(a, r.batch_axes) if _inexact(a) else a for a in aux]
        return loss, aux, {k: v[None] for k, v in pgrad.items()}, did[None]

    def _messages(self):
        return _zeros(self.cap["act"]), _zeros(self.cap["grad"])

    def _idle(self, carry, m, env):
        return (carry, *self._messages(), jnp.int32(IDLE))

    def _forward(self, s):
        r, plan, last = self.r, self.plans[s], s == len(self.plans) - 1

        def branch(carry, m, env):
            packed_params, mb_inputs, mb_targets = env
            p = dict(zip(plan.param_names, plan.params.unpack(packed_params)))
            x = _row(mb_inputs, m) if s == 0 else plan.inputs.unpack(_get(carry["act"], m))
            t = _row(mb_targets, m)
            if r.recompute:
                (out, aux), kept = r.stage_fn(s, plan, self.targets_tree)(p, *_partition(plan.diff, x), t), x
            else:
                out, vjp_fn, aux = r.stage_vjp(s, plan, p, x, t, self.targets_tree)
                kept, _, slots = r.residuals(vjp_fn, jax.tree_util.tree_leaves(p))
                if slots != plan.param_slots:
                    raise RuntimeError(f"pipeline stage {s}: the VJP residuals differ from the planned layout")
            stash = _put(carry["stash"], m % self.slots, plan.stash.pack(kept, self.cap["stash"]))
            carry = dict(carry, stash=stash)
            send_act, send_grad = self._messages()
            if last:
                carry["loss"] = carry["loss"] + out[0]
                M = r.schedule.micro_batches
                carry["aux"] = [a + b / M if _inexact(a) else b for a, b in zip(carry["aux"], aux)]
            else:
                send_act = plan.outputs.pack(out, self.cap["act"])
            return carry, send_act, send_grad, jnp.int32(FORWARD)

        return branch

    def _backward(self, s):
        r, plan, last = self.r, self.plans[s], s == len(self.plans) - 1

        def branch(carry, m, env):
            packed_params, _, mb_targets = env
            p = dict(zip(plan.param_names, plan.params.unpack(packed_params)))
            kept = plan.stash.unpack(_get(carry["stash"], m % self.slots))
            if r.recompute:
                _, vjp_fn, _ = r.stage_vjp(s, plan, p, kept, _row(mb_targets, m), self.targets_tree)
            else:
                p_leaves, rest = jax.tree_util.tree_leaves(p), iter(kept)
                n = len(kept) + len(plan.param_slots)
                leaves = [p_leaves[plan.param_slots[i]] if i in plan.param_slots else next(rest) for i in range(n)]
                vjp_fn = jax.tree_util.tree_unflatten(plan.residual_tree, leaves)
            if last:
                cot = [jnp.ones((), jnp.float32)]
            else:
                got = iter(plan.grad_out.unpack(_get(carry["grad"], m)))
                cot = [next(got) if _inexact(o) else np.zeros(o.shape, jax.dtypes.float0)
                       for o in plan.outputs.structs]
            dp, dx = vjp_fn(cot)
            # an integer value among the parameters (dropout's key) has float0 "gradients": zeros in its buffer
            grads = plan.params.pack([jnp.zeros(x.shape, x.dtype) if dp[n].dtype == jax.dtypes.float0 else dp[n]
                                      for n, x in zip(plan.param_names, plan.params.structs)], self.cap["params"])
            carry = dict(carry, pgrad=jax.tree_util.tree_map(jnp.add, carry["pgrad"], grads))
            send_act, send_grad = self._messages()
            if s > 0:
                send_grad = plan.grad_in.pack(dx, self.cap["grad"])
            return carry, send_act, send_grad, jnp.int32(BACKWARD)

        return branch


# ---------------------------------------------------------------------------------------
def _partition(mask, leaves):
    return [x for x, d in zip(leaves, mask) if d], [x for x, d in zip(leaves, mask) if not d]


def _merge(mask, diff, other):
    diff, other = iter(diff), iter(other)
    return [next(diff) if d else next(other) for d in mask]


def _micro(leaves, M: int, replicas: int, what: str):
    out = []
    for i, a in enumerate(leaves):
        a = jnp.asarray(a)
        if a.ndim == 0 or a.shape[0] % (M * replicas):
            times = f" x {replicas} data-parallel replicas" if replicas > 1 else ""
            raise ValueError(f"PipelineRunner: {what}[{i}] has shape {a.shape}; its first (batch) dimension "
                             f"must be divisible by micro_batches={M}{times}")
        out.append(a.reshape(M, a.shape[0] // M, *a.shape[1:]))
    return out


def _zeros(capacity: dict, *lead: int) -> dict:
    return {k: jnp.zeros((*lead, n), k) for k, n in capacity.items()}


def _row(arrays, i) -> list:
    return [lax.dynamic_index_in_dim(a, i, keepdims=False) for a in arrays]


def _get(buffers: dict, i):
    return {k: lax.dynamic_index_in_dim(v, i, keepdims=False) for k, v in buffers.items()}


def _put(buffers: dict, i, values: dict) -> dict:
    return {k: lax.dynamic_update_index_in_dim(v, values[k].astype(v.dtype), i, 0) for k, v in buffers.items()}
