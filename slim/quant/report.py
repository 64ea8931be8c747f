"""Per-layer quantization error: each quantized op's output beside the float op it replaced.

PaddleSlim users compare a quantized model layer by layer to find the layer that loses the
accuracy. :func:`layer_errors` runs the float and the int8 program on the same inputs and, for
every int8 op (``quantized_*``, ``weight_only_*``), compares its output with the output of
the float op over the same weight (matched by the weight's parameter name; matmuls of two
activations by their order). The errors include what the layers before passed on, as they do
when the int8 model runs. :func:`plot_layer_errors` draws them.

>>> import numpy as np, jax.numpy as jnp, paddlejax as pj
>>> rng = np.random.default_rng(0)
>>> prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.relu(pj.ops.linear(x, p["a"])), p["b"]),
...                 pj.InputSpec((None, 8)), params={"a": rng.normal(size=(8, 8)).astype(np.float32),
...                                                   "b": rng.normal(size=(8, 2)).astype(np.float32)})
>>> data = [rng.normal(size=(16, 8)).astype(np.float32)]
>>> int8 = pj.slim.quant_post(prog, data, algo="abs_max", progress=False)
>>> [(e.layer, e.op) for e in layer_errors(prog, int8, data[0])]
[('a', 'quantized_linear'), ('b', 'quantized_linear')]
>>> all(e.cosine > 0.999 for e in layer_errors(prog, int8, data[0]))
True
"""
from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import numpy as np

from paddlejax._extras import new_figure
from paddlejax.ir.core import Op, Program
from paddlejax.lowering import bind_inputs, run_ops
from paddlejax.passes import run as run_passes
from paddlejax.passes.quant import QUANTIZABLE

INT8_OPS = ("quantized_conv2d", "quantized_linear", "quantized_matmul", "weight_only_conv2d", "weight_only_linear")


@dataclasses.dataclass
class LayerError:
    """One quantized op against its float original: ``relative`` is ||int8 - fp32|| / ||fp32||."""

    layer: str
    op: str
    shape: tuple[int, ...]
    max_abs: float
    mean_abs: float
    relative: float
    cosine: float

    HEADER: ClassVar[tuple[str, ...]] = ("layer", "op", "shape", "max |diff|", "mean |diff|", "relative", "cosine")

    def row(self) -> tuple[str, ...]:
        """The fields as strings, in the order of :attr:`HEADER`."""
        return (self.layer, self.op, "x".join(map(str, self.shape)), f"{self.max_abs:.4g}", f"{self.mean_abs:.4g}",
                f"{self.relative:.3%}", f"{self.cosine:.6f}")


def _weight_name(op: Op) -> str | None:
    w = op.operands[1].producer
    return w.attrs["name"] if w is not None and w.type == "param" else None


def _outputs(program: Program, ops: list[Op], inputs) -> list[np.ndarray]:
    leaves, dims = bind_inputs(program, inputs if isinstance(inputs, tuple) else (inputs,))
    env = run_ops(program, program.body.ops[:-1], dict(zip(program.inputs, leaves)), dims)
    return [np.asarray(env[op.result], np.float64) for op in ops]


def _layers(program: Program, types, suffixes=()) -> dict[str, Op]:
    """The ops of ``types`` by the name of their weight less its int8 suffix (``matmul_<k>`` for
    a matmul of two activations)."""
    layers, unnamed = {}, 0
    for op in program.body.ops:
        if op.type in types:
            name = _weight_name(op)
            if name is None:
                name, unnamed = f"matmul_{unnamed}", unnamed + 1
            for suffix in suffixes:
                name = name.removesuffix(suffix)
            layers[name] = op
    return layers


def layer_errors(fp32: Program, int8: Program, inputs) -> list[LayerError]:
    """The error of every int8 op of ``int8`` against the matching op of ``fp32`` on ``inputs``
    (a batch, or a tuple for several inputs), in program order."""
    quantized = _layers(int8, INT8_OPS, (".int8", ".int4"))
    original = _layers(fp32, QUANTIZABLE)
    if set(quantized) - set(original):  # quant_post folded the batch norms first: compare folded layers
        fp32 = run_passes(fp32, "fold_conv_bn,fold_linear_bn")
        original = _layers(fp32, QUANTIZABLE)
    missing = sorted(set(quantized) - set(original))
    if missing:
        raise ValueError(f"layer_errors: {fp32.name} has no float op for the int8 layers {missing}; "
                         "pass the program the int8 one was made from")
    names = list(quantized)
    got = _outputs(int8, [quantized[n] for n in names], inputs)
    want = _outputs(fp32, [original[n] for n in names], inputs)
    errors = []
    for name, a, b in zip(names, got, want):
        diff = a - b
        norm = np.linalg.norm(b)
        cosine = float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * norm)) if norm and np.linalg.norm(a) else 0.0
        errors.append(LayerError(name, quantized[name].type, a.shape, float(np.abs(diff).max()),
                                 float(np.abs(diff).mean()), float(np.linalg.norm(diff) / norm) if norm else 0.0,
                                 cosine))
    return errors


def plot_layer_errors(errors: list[LayerError], path: str | os.PathLike, title: str = "") -> None:
    """A PNG bar chart of each layer's relative error, in program order."""
    fig = new_figure("plot_layer_errors", figsize=(max(4.0, 0.5 * len(errors) + 2), 3.5))
    ax = fig.subplots()
    ax.bar(range(len(errors)), [100 * e.relative for e in errors], color="tab:orange")
    ax.set_xticks(range(len(errors)), [e.layer for e in errors], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("relative error of the output (%)")
    ax.set_title(title or "int8 vs fp32, per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
