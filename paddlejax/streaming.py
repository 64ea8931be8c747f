"""Layer-by-layer streaming inference of a model whose parameters do not fit in device memory
(the ring memory offloading of Paddle's large-model inference).

:class:`StreamingPredictor` keeps every parameter in host memory (the ``pinned_host`` memory kind)
and cuts the program into consecutive segments of about equal parameter bytes
(:func:`paddlejax.passes.pipeline.split_stages` with ``balance="params"``). A call runs the
segments in order, each compiled once; while segment ``k`` runs, segment ``k + 1``'s
parameters are already on their way to the device (JAX dispatches the copy and the computation
without waiting), and segment ``k``'s are dropped once it has run. Device memory then holds the
parameters of at most two segments, a ring of two slots, plus the activations between them.
``device_budget_mb`` cuts segments so that every two neighbours fit in it together.

Where the backend has no ``pinned_host`` memory the predictor says so when it is made.

>>> import jax.numpy as jnp, paddlejax as pj
>>> def mlp(p, x):
...     for i in range(4):
...         x = pj.ops.linear(x, p[f"w{i}"], act="relu")
...     return x
>>> prog = pj.trace(mlp, pj.InputSpec((None, 8)), params={f"w{i}": jnp.full((8, 8), 0.1) for i in range(4)})
>>> streaming = StreamingPredictor(prog, device_budget_mb=0.0005)   # 512 bytes: two layers at a time
>>> streaming.num_segments, streaming(jnp.ones((2, 8))).shape
(4, (2, 8))
>>> streaming.peak_param_bytes <= 512
True
"""
from __future__ import annotations

import functools
import os

import jax
import numpy as np

from paddlejax.io import load
from paddlejax.ir.core import Program
from paddlejax.passes.pipeline import PipelineSplit, split_groups, split_stages
from paddlejax.train.placement import require_pinned_host


class StreamingPredictor:
    """``program`` (or the path of a saved one) run segment by segment with its parameters in
    host memory; give ``segments`` (how many) or ``device_budget_mb`` (the device memory the
    parameters may take at once: segments are cut so that every two neighbours fit in it).

    ``num_segments``, ``segment_bytes`` (each segment's parameter bytes) and, after a call,
    ``peak_param_bytes`` and ``peak_bytes`` (parameters and activations the predictor held on the
    device at once) describe the run.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"], jnp.ones((1, 4)), params={"w": jnp.ones((4, 4))})
    >>> StreamingPredictor(prog, device_budget_mb=1e-5)
    Traceback (most recent call last):
    ...
    ValueError: StreamingPredictor: one op reads 64 bytes of parameters ('w'), more than device_budget_mb=1e-05 (10 bytes) holds beside the segment before it (0 bytes)
    """

    def __init__(self, program: Program | str | os.PathLike, segments: int | None = None,
                 device_budget_mb: float | None = None, device=None):
        program = program if isinstance(program, Program) else load(program)
        if (segments is None) == (device_budget_mb is None):
            raise ValueError("StreamingPredictor: give segments or device_budget_mb (one of them)")
        self.device = device or jax.devices()[0]
        require_pinned_host("StreamingPredictor", self.device)
        self.split = self._split(program, segments, device_budget_mb)
        host = jax.sharding.SingleDeviceSharding(self.device, memory_kind="pinned_host")
        self.on_device = jax.sharding.SingleDeviceSharding(self.device, memory_kind="device")
        self.host_params = [jax.device_put(self.split.stage_params(program.params, k), host)
                            for k in range(self.num_segments)]
        self.segment_bytes = [sum(int(v.nbytes) for v in p.values()) for p in self.host_params]
        self._run = [jax.jit(functools.partial(self.split.run_stage, k)) for k in range(self.num_segments)]
        self.peak_param_bytes = self.peak_bytes = 0

    @staticmethod
    def _split(program: Program, segments, budget_mb) -> PipelineSplit:
        if segments is not None:
            if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
                raise ValueError(f"StreamingPredictor: segments expects an int >= 1, got {segments!r}")
            return split_stages(program, segments, balance="params")
        if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or budget_mb <= 0:
            raise ValueError(f"StreamingPredictor: device_budget_mb expects a number > 0, got {budget_mb!r}")
        budget = budget_mb * 2**20
        owner = {op.result: op.attrs["name"] for op in program.param_ops()}
        reads = lambda op: {owner[v] for v in op.operands if v in owner}  # noqa: E731
        size = lambda names: sum(int(program.params[n].nbytes) for n in names)  # noqa: E731
        # greedy: a segment grows while it fits in half the budget and beside the one before it, so
        # every two neighbours fit (a segment holds each parameter it reads); an op over half the
        # budget makes a segment of its own
        groups, previous, current = [[]], 0, set()
        for op in program.body.ops[:-1]:
            if op.type in ("param", "constant"):
                continue
            grown = current | reads(op)
            if groups[-1] and size(grown) > min(budget / 2, budget - previous):
                groups.append([])
                previous, current, grown = size(current), set(), reads(op)
            if previous + size(grown) > budget:
                what = "one op reads" if not groups[-1] else "a segment reads"
                raise ValueError(f"StreamingPredictor: {what} {size(grown)} bytes of parameters "
                                 f"({', '.join(map(repr, sorted(grown)))}), more than device_budget_mb={budget_mb} "
                                 f"({int(budget)} bytes) holds beside the segment before it ({previous} bytes)")
            groups[-1].append(op)
            current = grown
        return split_groups(program, groups)

    @property
    def num_segments(self) -> int:
        return self.split.num_stages

    def __call__(self, *inputs):
        """The program's outputs for ``inputs``, as NumPy arrays (in the program's structure)."""
        leaves = [jax.device_put(x, self.on_device) for x in jax.tree_util.tree_leaves(inputs)]
        ring = {0: jax.device_put(self.host_params[0], self.on_device)}
        peak_params = peak = 0
        for k in range(self.num_segments):
            if k + 1 < self.num_segments:  # on its way while segment k runs
                ring[k + 1] = jax.device_put(self.host_params[k + 1], self.on_device)
            held = sum(self.segment_bytes[i] for i in ring)
            peak_params = max(peak_params, held)
            peak = max(peak, held + sum(int(x.nbytes) for x in leaves))
            leaves = self._run[k](ring.pop(k), leaves)
        self.peak_param_bytes, self.peak_bytes = peak_params, peak
        return jax.tree_util.tree_unflatten(self.split.program.out_tree, [np.asarray(x) for x in leaves])
