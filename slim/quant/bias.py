"""Empirical bias correction for post-training quantization (Nagel et al., "Data-Free
Quantization Through Weight Equalization and Bias Correction", section 4.2).

Rounding a layer's weights to int8 shifts the mean of its outputs, per output channel, by
``E[op(x, W - W_q)]``. The ops are linear in ``x``, so that is ``op(E[x], W - W_q)`` with the
mean over the batch, averaged over the other output axes: one pass over the calibration data
measures ``E[x]`` for every layer, and the shift goes into the layer's bias.

>>> import numpy as np, jax.numpy as jnp, paddlejax as pj
>>> rng = np.random.default_rng(0)
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 16)),
...                 params={"w": jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)})
>>> fake = pj.passes.run(prog, "insert_fake_quant{weight_bits=4}")
>>> data = [rng.normal(1.0, 1.0, size=(32, 16)).astype(np.float32)]
>>> _ = pj.slim.calibrate(fake, data, "abs_max", progress=False)
>>> shifts = correct_bias(fake, data, progress=False)
>>> list(shifts), sorted(fake.used_params())
(['w'], ['w', 'w.bias_correction', 'w.input_scale', 'w.quant_scale'])
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from paddlejax.ir.core import Op, Program, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.ops.common import channel_axis
from paddlejax.ops.quant import dequantize
from paddlejax.passes.quant import is_fake_quantized, is_stored_weight, quantized_weight
from paddlejax.passes.query import param_name, stored_array, weight_of, weighted
from paddlejax.slim.quant.post import probe_batches


def _targets(program: Program) -> list[Op]:
    """The conv / linear ops (weighted ops: a weight and a bias input) with a fake-quantized stored weight, an input fake-quantized
    symmetrically or float (weight-only), a stored bias or none, and no fused activation
    (after which the shift would not be linear), in program order."""
    out = []
    for op in program.walk():
        if not weighted(op.type) or op.attrs.get("act") is not None:
            continue
        x, w, bias = op.operands[0], weight_of(op), op.input("bias")
        stored_bias = bias is None or param_name(bias) is not None
        if is_fake_quantized(w) and w.producer.type == "fake_quantize" and is_stored_weight(program, w.producer) \
                and (not is_fake_quantized(x) or x.producer.type == "fake_quantize") and stored_bias:
            out.append(op)
    return out


def _inputs(program: Program) -> dict[str, Value]:
    """The float input of each op of :func:`_targets`, by its position."""
    return {str(i): op.operands[0].producer.operands[0] if is_fake_quantized(op.operands[0]) else op.operands[0]
            for i, op in enumerate(_targets(program))}


def _output_shift(program: Program, op: Op, mean_x: np.ndarray) -> np.ndarray:
    """``op(E[x], W - W_q)`` averaged over every output axis but the channel's."""
    w_fq = weight_of(op).producer
    q, scale, bits, axis = quantized_weight(program, w_fq)
    error = stored_array(program, w_fq.operands[0]) - np.asarray(dequantize(q, scale, bits=bits, axis=axis))
    attrs = {k: v for k, v in op.attrs.items() if k not in ("act", "act_alpha")}
    y = np.asarray(registry.get(op.type)(mean_x[None].astype(np.float32), error.astype(np.float32), **attrs))
    keep = channel_axis(op.attrs["data_format"], y.ndim) if op.has_trait("layout_sensitive") else y.ndim - 1
    return y.mean(axis=tuple(d for d in range(y.ndim) if d != keep))


def correct_bias(program: Program, calib_data: Iterable, *, progress: bool = True) -> dict[str, np.ndarray]:
    """Add to the bias of every fake-quantized conv / linear of ``program`` (in place; a layer
    without one gets a ``<weight>.bias_correction`` bias) the mean output shift of its
    quantized weight on ``calib_data``; returns the shifts by weight name."""
    targets = {str(i): op for i, op in enumerate(_targets(program))}
    if not targets:
        raise ValueError(f"correct_bias: {program.name} has no fake-quantized conv or linear to correct (with a "
                         "stored weight, a stored bias or none, and no fused activation); run insert_fake_quant first")
    sums, counts = {}, {}
    for values in probe_batches(program, calib_data, "correct_bias", progress, taps=_inputs):
        for name, op in targets.items():
            x = np.asarray(values[name], np.float64)
            # each row of a linear's [..., in] input is a sample: sequence lengths may differ
            if not op.has_trait("layout_sensitive"):
                x = x.reshape(-1, x.shape[-1])
            sums[name] = sums.get(name, 0) + x.sum(axis=0)
            counts[name] = counts.get(name, 0) + len(x)
    rewriter = Rewriter(program)
    shifts = {}
    for name, op in targets.items():
        weight = param_name(weight_of(op).producer.operands[0])
        shift = _output_shift(program, op, sums[name] / counts[name]).astype(np.float32)
        shifts[weight] = shift
        if op.input("bias") is not None:
            bias = param_name(op.input("bias"))
            program.params[bias] = np.asarray(program.params[bias]) + shift
        else:
            bias = rewriter.param(f"{weight}.bias_correction", shift)
            new = Op(op.type, [*op.operands, bias], [op.result.type], dict(op.attrs), loc=op.loc)
            rewriter.replace_op(op, [rewriter.insert_before(op, new).result])
    return shifts
