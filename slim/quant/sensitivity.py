"""Which layers lose the accuracy when quantized: each one quantized alone, the rest in float.

PaddleSlim's PTQ analysis (``AnalysisPTQ``) quantizes one layer at a time and measures the
model's output against the float model's, then leaves the worst layers in float.
:func:`quant_sensitivity` does the same on a program: it fake-quantizes every layer
``quant_post`` would, calibrates them on ``data``, and compiles the program once with a switch
per layer, so that measuring *n* layers costs *n* runs of the compiled program per batch, not
*n* compilations. ``quant_post(..., keep_float=k)`` uses it to keep the *k* most sensitive
layers in float.

>>> import numpy as np, paddlejax as pj
>>> rng = np.random.default_rng(0)
>>> prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.relu(pj.ops.linear(x, p["a"])), p["b"]),
...                 pj.InputSpec((None, 8)), params={"a": rng.normal(size=(8, 8)).astype(np.float32),
...                                                   "b": rng.normal(size=(8, 2)).astype(np.float32)})
>>> data = [rng.normal(size=(16, 8)).astype(np.float32)]
>>> [(s.layer, 0 < s.relative < 0.05) for s in quant_sensitivity(prog, data, algo="abs_max", progress=False)]
[('b', True), ('a', True)]
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import ClassVar, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.ir.core import Op, Program
from paddlejax.ir.rewriter import Rewriter
from paddlejax.lowering import bind_inputs, run_ops
from paddlejax.passes import run as run_passes
from paddlejax.passes.options import op_types
from paddlejax.passes.quant import FAKE_QUANT, QUANTIZABLE, InsertFakeQuant, is_fake_quantized, quant_layers
from paddlejax.slim.quant.post import _progress, calibrate


@dataclasses.dataclass(frozen=True)
class LayerSensitivity:
    """One layer quantized alone: ``relative`` is ||y_int8 - y_fp32|| / ||y_fp32|| over the
    program's outputs, averaged over the batches."""

    layer: str
    op: str
    relative: float

    HEADER: ClassVar[tuple[str, ...]] = ("layer", "op", "relative")

    def row(self) -> tuple[str, ...]:
        """The fields as strings, in the order of :attr:`HEADER`."""
        return self.layer, self.op, f"{self.relative:.3%}"


def quant_sensitivity(program: Program, data: Iterable, algo: str = "hist", *,
                      ops: str = "conv2d:depthwise_conv2d:linear:matmul", skip: str = "",
                      fold_batch_norm: bool = True, progress: bool = True,
                      **observer_options) -> list[LayerSensitivity]:
    """The layers ``quant_post`` would quantize (same ``ops``, ``skip``, ``algo`` and
    observer options), worst first, each by the error of the program's outputs when it alone
    is int8 (fake-quantized with the scales calibrated on ``data``). ``data`` is read twice
    (calibration, then measurement): pass a list of batches, not an iterator.

    Layers inside control flow (``cond``/``while``/``scan`` bodies) stay float and are not
    measured.
    """
    if iter(data) is data:
        raise ValueError("quant_sensitivity: data is read twice (calibration, then measurement); pass a list "
                         "(or another re-iterable collection) of batches, not an iterator")
    types = op_types(ops, QUANTIZABLE, "quant_sensitivity: cannot quantize")
    if not any(jnp.issubdtype(v.type.dtype, jnp.floating) for v in program.outputs):
        raise ValueError(f"quant_sensitivity: {program.name} has no float output to compare (its outputs: "
                         f"{', '.join(str(v.type) for v in program.outputs)}); measure the program before its argmax")
    source = run_passes(program, "fold_conv_bn,fold_linear_bn,dce") if fold_batch_norm else program
    # shortcuts off: a residual add's output scale belongs to no one layer
    fake = run_passes(source, [InsertFakeQuant(ops=ops, skip=skip, shortcuts=False)])
    _float_sub_blocks(fake)
    layers = [(op, name) for op, name in quant_layers(fake, types)
              if op.parent is fake.body and any(is_fake_quantized(v) for v in op.operands)]
    if not layers:
        raise ValueError(f"quant_sensitivity: nothing to quantize in {program.name}: no {ops.replace(':', ', ')} op"
                         + (f" outside skip={skip!r}" if skip else ""))
    calibrate(fake, data, algo, progress=progress, **observer_options)
    run = jax.jit(_switched(fake, [op for op, _ in layers]))
    off = jnp.zeros(len(layers), bool)
    totals, batches = np.zeros(len(layers)), 0
    for batch in _progress(data, progress, "quant_sensitivity"):
        inputs = batch if isinstance(batch, tuple) else (batch,)
        want = _flat(run(off, *inputs))
        for i in range(len(layers)):
            got = _flat(run(off.at[i].set(True), *inputs))
            totals[i] += np.linalg.norm(got - want) / max(np.linalg.norm(want), np.finfo(np.float32).tiny)
        batches += 1
    result = [LayerSensitivity(name, op.type, float(t / batches)) for (op, name), t in zip(layers, totals)]
    return sorted(result, key=lambda s: -math.inf if math.isnan(s.relative) else -s.relative)  # NaN: worst


def keep_float_pattern(skip: str, layers: Iterable[str]) -> str:
    """``skip`` widened to match ``layers`` by their whole names too.

    >>> keep_float_pattern("^head", ["conv.w", "fc"])
    '(?:^head)|^(?:conv\\\\.w|fc)$'
    """
    names = "|".join(re.escape(name) for name in layers)
    return "|".join(p for p in (f"(?:{skip})" if skip else "", f"^(?:{names})$" if names else "") if p)


def _float_sub_blocks(program: Program) -> None:
    """Drop the fake quants inside control-flow bodies: those layers stay float."""
    rewriter = Rewriter(program)
    for op in [op for op in program.walk() if op.type in FAKE_QUANT and op.parent is not program.body]:
        rewriter.replace_op(op, [op.operands[0]])


def _switched(program: Program, layers: list[Op]):
    """``program.apply``'s computation with a switch per op of ``layers``: ``flags[i]`` True
    reads that op's fake-quantized inputs, False the float values they quantize."""
    index = {op: i for i, op in enumerate(layers)}
    body = program.body.ops[:-1]

    def run(flags, *inputs):
        leaves, dims = bind_inputs(program, inputs)
        env = dict(zip(program.inputs, leaves))
        for op in body:
            if op not in index:
                run_ops(program, [op], env, dims)
                continue
            quantized = {v: env[v] for v in op.operands if is_fake_quantized(v)}
            env.update({v: jnp.where(flags[index[op]], q, env[v.producer.operands[0]]) for v, q in quantized.items()})
            run_ops(program, [op], env, dims)
            env.update(quantized)
        return [env[v] for v in program.outputs]

    return run


def _flat(outputs) -> np.ndarray:
    return np.concatenate([np.asarray(o, np.float64).ravel() for o in outputs
                           if jnp.issubdtype(o.dtype, jnp.floating)])
