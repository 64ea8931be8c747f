"""Structured pruning of a program: whole channels removed, weights really smaller, no masks.

``prune(program, ratios={producer: ratio} | ratio, criterion=...)`` or ``prune(program,
flops=0.5)`` (remove about half of the FLOPs, with one ratio for every group) ranks the
channels of each dependency group (:mod:`~paddlejax.slim.pruning.groups`) by a criterion and
cuts the lowest from every weight, bias and per-channel parameter they touch; the op types and
attributes stay, the types are inferred again, and the result is verified.

Criteria (PaddleSlim's names): ``l1_norm`` and ``l2_norm`` of each output channel's filter,
``geometry_median`` (FPGM: the filters nearest the others' geometric median are the most
replaceable), ``bn_scale`` (network slimming: the following batch norm's ``|gamma|``),
``taylor`` (first order: ``|w * dL/dw|`` summed over a filter, the loss's change if it went, from
labelled ``samples``).

>>> import jax.numpy as jnp, numpy as np, paddlejax as pj
>>> w1 = np.ones((4, 2, 3, 3), np.float32); w1[1] = 0.1
>>> p = {"w1": jnp.asarray(w1), "w2": jnp.ones((3, 4, 3, 3))}
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["w1"])), p["w2"]),
...                 pj.InputSpec((None, 2, 8, 8)), params=p)
>>> small = prune(prog, ratios=0.25)
>>> small.params["w1"].shape, small.params["w2"].shape
((3, 2, 3, 3), (3, 3, 3, 3))
"""
from __future__ import annotations

import numpy as np

from paddlejax.ir.core import Program, TensorType
from paddlejax.slim.pruning.groups import ChannelGraph, Group

CRITERIA = ("l1_norm", "l2_norm", "geometry_median", "bn_scale", "taylor")


def _taylor_gradients(program: Program, samples) -> dict:
    """Gradients of the mean cross-entropy of ``samples = (inputs, integer labels)``."""
    import jax
    import optax

    if not (isinstance(samples, (tuple, list)) and len(samples) == 2):
        raise ValueError("prune: criterion 'taylor' needs samples=(inputs, labels) to take gradients on")
    inputs, labels = samples

    def loss(params):
        logits = program.apply(params, inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return jax.grad(loss)(program.params)


def channel_scores(graph: ChannelGraph, criterion: str, samples=None) -> dict[int, float]:
    """A score per channel id (higher: more important) from each producer's weights (and,
    for ``taylor``, their gradients on ``samples``)."""
    if criterion not in CRITERIA:
        raise ValueError(f"prune: criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    params = graph.program.params
    if criterion == "taylor":
        grads = _taylor_gradients(graph.program, samples)
        params = {name: np.asarray(params[name]) * np.asarray(grads[name]) for name in graph.producers}
        criterion = "l1_norm"  # |w * g| summed over each filter
    scores: dict[int, float] = {}
    if criterion == "bn_scale":
        for name, ids in graph.scales.items():
            for i, s in zip(ids, np.abs(np.asarray(params[name], np.float64))):
                scores[int(i)] = scores.get(int(i), 0.0) + float(s)
        return scores
    for name, (axis, ids) in graph.producers.items():
        filters = np.moveaxis(np.asarray(params[name], np.float64), axis, 0).reshape(len(ids), -1)
        if criterion == "l1_norm":
            values = np.abs(filters).sum(1)
        elif criterion == "l2_norm":
            values = np.sqrt((filters ** 2).sum(1))
        else:  # FPGM: a filter's summed distance to the others; small means replaceable
            values = np.sqrt(((filters[:, None, :] - filters[None, :, :]) ** 2).sum(-1)).sum(1)
        for i, v in zip(ids, values):
            scores[int(i)] = scores.get(int(i), 0.0) + float(v)
    return scores


def kept_count(size: int, ratio: float, round_to: int = 1) -> int:
    """How many of ``size`` channels (or heads) a group keeps at ``ratio``: at least one, and a
    multiple of ``round_to`` (the nearest; the whole group if it has fewer than ``round_to``).

    >>> kept_count(64, 0.3), kept_count(64, 0.3, round_to=8), kept_count(6, 0.5, round_to=8)
    (45, 48, 6)
    """
    keep = size - min(int(size * ratio), size - 1)
    if round_to > 1:
        keep = size if size < round_to else min(size, max(round_to, round_to * round(keep / round_to)))
    return keep


def _dropped(groups: list[Group], ratios: dict[tuple[str, ...], float], scores: dict[int, float],
             round_to: int = 1) -> set[int]:
    dropped: set[int] = set()
    for group in groups:
        ratio = ratios.get(group.producers, 0.0)
        count = len(group.classes) - kept_count(len(group.classes), ratio, round_to)
        if count <= 0:
            continue
        ranked = sorted(group.classes, key=lambda c: (sum(scores.get(i, 0.0) for i in c), c))
        for members in ranked[:count]:
            dropped.update(members)
    return dropped


def apply(program: Program, dropped: set[int], graph: ChannelGraph | None = None) -> Program:
    """A copy of ``program`` without the channels ``dropped`` (ids of ``graph``, which must be
    the graph of that copy's source: build it with :class:`ChannelGraph` on ``program``)."""
    from paddlejax.ir.verifier import Shapes, cached_infer_types, verify
    from paddlejax.passes import run as run_passes

    graph = graph or ChannelGraph(program)
    out = program.clone()
    params = dict(out.params)
    drop = np.array(sorted(dropped), dtype=np.int64)
    for s in graph.slices:
        keep = ~np.isin(s.origin, drop)
        if not keep.all():
            params[s.param] = np.compress(keep, np.asarray(params[s.param]), axis=s.axis)
    out.params = {k: np.asarray(v) for k, v in params.items()}
    regrouped = {id(op) for op in graph.regrouped}
    resized: dict[int, list] = {}
    for op, axis, ids in graph.resized:
        resized.setdefault(id(op), []).append((axis, ids))
    shapes = Shapes(out)
    for old, op in zip(program.body.ops, out.body.ops):
        if id(old) in graph.dead:
            continue
        if op.type == "param":
            value = out.params[op.attrs["name"]]
            op.results[0].type = TensorType(tuple(value.shape), op.results[0].type.dtype)
            continue
        if op.type in ("constant", "return"):
            continue
        if id(old) in regrouped:
            op.attrs = {**op.attrs, "groups": op.operands[0].type.shape[
                old.traits.channel_axis(old.attrs, len(old.operands[0].type.shape))]}
        for axis, ids in resized.get(id(old), ()):
            op.attrs = _written_size(op.attrs, axis, int(np.count_nonzero(~np.isin(ids, drop))))
        for r, t in zip(op.results, cached_infer_types(op, [v.type for v in op.operands], shapes)):
            r.type = t
    if graph.dead:  # their types were not followed: they go
        out = run_passes(out, "dce")
    verify(out)
    return out


def _written_size(attrs: dict, axis: int, size: int) -> dict:
    """``attrs`` of a reshape with the size written for result ``axis`` set to ``size`` (sizes
    the op copies or infers, 0 and -1 in Paddle's ``shape``, follow by themselves)."""
    for key in ("shape", "new_sizes"):
        written = attrs.get(key)
        if written is not None and isinstance(written[axis], int) and written[axis] > 0:
            return {**attrs, key: (*written[:axis], size, *written[axis + 1:])}
    return attrs


def prune(program: Program, ratios: float | dict[str, float] | None = None, *, flops: float | None = None,
          criterion: str = "l1_norm", samples=None, pruned_params: str | None = None, round_to: int = 1) -> Program:
    """A copy of ``program`` with channels pruned: ``ratios`` is one ratio for every group or
    ``{producer weight: ratio}`` (a group's ratio is its first named producer's); ``flops``
    (instead) is the fraction of the FLOPs to remove, reached with one ratio for all groups.
    ``pruned_params`` (a regular expression, PaddleSlim's option) limits the one ratio to the
    groups with a producer weight whose name it matches in full.
    Groups keep at least one channel; frozen channels (those reaching the outputs) stay.
    ``round_to`` keeps channel counts that are multiples of it (:func:`kept_count`): widths
    of 8 or 16 suit the vector and matrix units that run convolutions, where odd widths leave
    much of the FLOPs saving unpaid in latency.
    ``samples`` (``(inputs, integer labels)``) feed the ``taylor`` criterion."""
    import re

    from paddlejax import analysis

    if (ratios is None) == (flops is None):
        raise ValueError("prune: give ratios or flops (the fraction of FLOPs to remove)")
    if isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1:
        raise ValueError(f"prune: round_to expects an int >= 1, got {round_to!r}")
    graph = ChannelGraph(program)
    groups = graph.groups()
    if pruned_params is not None:
        try:
            pattern = re.compile(pruned_params)
        except re.error as e:
            raise ValueError(f"prune: pruned_params {pruned_params!r} is not a regular expression: {e}") from None
        groups = [g for g in groups if any(pattern.fullmatch(n) for n in g.producers)]
        if not groups:
            raise ValueError(f"prune: pruned_params {pruned_params!r} matches no prunable weight; prunable: "
                             f"{sorted(n for g in graph.groups() for n in g.producers)[:8]}")
    scores = channel_scores(graph, criterion, samples)
    if flops is not None:
        if not 0 < flops < 1:
            raise ValueError(f"prune: flops is the fraction of FLOPs to remove, in (0, 1); got {flops!r}")
        sizes = {d: 1 for v in program.inputs for d in v.type.shape if isinstance(d, str)}
        base = analysis.flops(program, sizes)
        low, high, best = 0.0, 1.0, program
        for _ in range(12):  # bisection on the common ratio
            ratio = (low + high) / 2
            candidate = apply(program, _dropped(groups, {g.producers: ratio for g in groups}, scores, round_to),
                              graph)
            if analysis.flops(candidate, sizes) <= base * (1 - flops):
                high, best = ratio, candidate
            else:
                low = ratio
        return best
    if isinstance(ratios, (int, float)):
        if not 0 <= ratios < 1:
            raise ValueError(f"prune: a ratio is in [0, 1), got {ratios!r}")
        by_group = {g.producers: float(ratios) for g in groups}
    else:
        known = {name for g in groups for name in g.producers}
        unknown = sorted(set(ratios) - known)
        if unknown:
            raise ValueError(f"prune: {unknown} produce no prunable channels; prunable: {sorted(known)}")
        by_group = {g.producers: next((ratios[n] for n in g.producers if n in ratios), 0.0) for g in groups}
    return apply(program, _dropped(groups, by_group, scores, round_to), graph)
