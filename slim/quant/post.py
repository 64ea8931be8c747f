"""Post-training quantization: calibrate a fake-quantized program's activation scales on sample
data, then convert it to int8 kernels.

``quant_post(program_or_path, calib_data, algo="hist")`` runs the pipeline PaddleSlim's
``quant_post_static`` runs: fake-quant ops in front of the chosen conv / linear / matmul ops
(``insert_fake_quant``), one observer per activation fed with the *float* program's values on
every calibration batch (:func:`calibrate`), the observers' scales written into the program,
then ``convert_int8`` and ``dce``. With ``weight_bits=4`` only the weights are quantized, to
int4 packed two to a byte (``weight_only_linear`` / ``weight_only_conv2d``, about 8 times
smaller than float32), and the activations stay float: nothing is calibrated.

>>> import numpy as np, jax.numpy as jnp, paddlejax as pj
>>> rng = np.random.default_rng(0)
>>> prog = pj.trace(lambda p, x: pj.ops.relu(pj.ops.linear(x, p["w"])), pj.InputSpec((None, 8)),
...                 params={"w": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)})
>>> data = [rng.normal(size=(16, 8)).astype(np.float32) for _ in range(4)]
>>> int8 = quant_post(prog, data, algo="abs_max", progress=False)
>>> [op.type for op in int8.walk() if op.type != "param"]
['quantize', 'quantized_linear', 'relu', 'return']
>>> bool(np.abs(int8(data[0]) - prog(data[0])).max() < 0.1)
True
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Iterable, Iterator

import jax
import numpy as np

from paddlejax.io import load
from paddlejax.ir.core import Op, Program, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes import run as run_passes
from paddlejax.passes.quant import FAKE_QUANT, QUANTIZABLE, InsertFakeQuant, is_fake_quantized
from paddlejax.passes.query import param_name, weight_of
from paddlejax.slim.quant.aware import convert
from paddlejax.slim.quant.observers import make_observer


def activation_scales(program: Program) -> dict[str, Op]:
    """The scale parameter's name (the minimum's for an asymmetric range) -> its fake-quant
    op, for every fake-quantized activation (an input that is not a parameter) of ``program``."""
    return {param_name(op.operands[1]): op for op in program.walk()
            if op.type in FAKE_QUANT and param_name(op.operands[0]) is None}


def activation_taps(program: Program) -> dict[str, Value]:
    """The activations that the fake-quant ops of ``program`` quantize, by scale name (see
    :func:`activation_scales`)."""
    return {name: op.operands[0] for name, op in activation_scales(program).items()}


def _float_probe(program: Program, taps: Callable[[Program], dict[str, Value]]) -> tuple[Program, list[str]]:
    """A copy of ``program`` without its fake-quant ops whose outputs are the values ``taps``
    picks in it (float values: not the outputs of fake-quant ops), by name."""
    probe = program.clone()
    values = taps(probe)
    rewriter = Rewriter(probe)
    for op in [op for op in probe.walk() if op.type in FAKE_QUANT]:
        rewriter.replace_op(op, [op.operands[0]])
    probe.set_outputs(values)
    return probe, list(values)


def probe_batches(program: Program, calib_data: Iterable, caller: str, progress: bool,
                  taps: Callable[[Program], dict[str, Value]] = activation_taps) -> Iterator[dict]:
    """For each batch of ``calib_data``, the float values that ``taps`` picks in ``program``
    (by default the activations its fake-quant ops quantize, by scale name)."""
    probe, names = _float_probe(program, taps)
    if not names:
        raise ValueError(f"{caller}: {program.name} has no fake-quantized activation to calibrate; "
                         "run insert_fake_quant first (with act_bits 8 or 4)")
    run = jax.jit(probe.apply)
    batches = 0
    for batch in _progress(calib_data, progress, caller):
        inputs = batch if isinstance(batch, tuple) else (batch,)
        try:
            values = run(probe.params, *inputs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{caller}: batch {batches} does not fit {program.name}: {e}") from None
        yield values
        batches += 1
    if not batches:
        raise ValueError(f"{caller}: calib_data gave no batch")


def calibrate(program: Program, calib_data: Iterable, algo: str = "hist", *, progress: bool = True,
              **observer_options) -> dict[str, np.ndarray]:
    """Set the activation scales of a fake-quantized ``program`` (in place) from
    ``calib_data``, an iterable of input batches (arrays, or tuples for several inputs),
    observed by ``algo`` (see :func:`paddlejax.slim.quant.make_observer`); returns the scales
    (a ``(min, max)`` pair for an asymmetric activation, which needs ``algo="min_max"``).

    The observers see the float program's activations: the fake-quant ops are left out while
    calibrating, as in PaddleSlim.
    """
    make_observer(algo, **observer_options)  # an unknown algorithm or option fails before any batch runs
    observers = {}
    for values in probe_batches(program, calib_data, "calibrate", progress):
        for name, value in values.items():
            observers.setdefault(name, make_observer(algo, **observer_options)).observe(np.asarray(value))
    fake_quant, scales = activation_scales(program), {}
    for name, observer in observers.items():
        op = fake_quant[name]
        if op.type == "fake_quantize":
            scales[name] = observer.scale()
            program.params[name] = jax.numpy.asarray(scales[name], jax.numpy.float32)
        else:
            scales[name] = observer.range()
            for bound, value in zip(op.operands[1:], scales[name]):
                program.params[param_name(bound)] = jax.numpy.asarray(value, jax.numpy.float32)
    return scales


def _progress(data, show: bool, desc: str):
    if not show:
        return data
    from tqdm.auto import tqdm

    return tqdm(data, desc=desc, unit="batch", total=len(data) if hasattr(data, "__len__") else None)


def quant_post(program_or_path: Program | str | os.PathLike, calib_data: Iterable, algo: str = "hist", *,
               ops: str = "conv2d:depthwise_conv2d:linear:matmul", skip: str = "", weight_bits: int = 8,
               channel_wise: bool = True, act_symmetric: bool = True, bias_correction: bool = False,
               fold_batch_norm: bool = True, keep_float: int = 0, progress: bool = True,
               output: str | os.PathLike | None = None, **observer_options) -> Program:
    """The int8 version of a program (or the path of a saved one), calibrated on
    ``calib_data`` with ``algo``; saved to ``output`` when given. ``ops`` and ``skip`` choose
    the ops as for ``insert_fake_quant`` (a regular expression on the weight's name);
    ``weight_bits=4`` quantizes the weights only, to packed int4 (activations stay float and
    ``calib_data`` serves only ``bias_correction``);
    ``act_symmetric=False`` quantizes activations asymmetrically (with ``algo="min_max"``);
    ``bias_correction`` adds each layer's mean output shift from int8 weights, measured on
    ``calib_data`` (which is then read twice), to its bias (:mod:`paddlejax.slim.quant.bias`);
    ``fold_batch_norm`` first folds inference-mode batch norms into the convolutions and linears
    before them (PaddleSlim's ``optimize_model``), so that the weights are quantized as they
    will compute and no float batch norm sits between int8 ops.
    ``keep_float=k`` leaves the ``k`` layers in float whose quantization alone moves the
    outputs most on ``calib_data`` (:func:`~paddlejax.slim.quant.quant_sensitivity`, which
    reads it twice more: pass a list).
    See the module doc for the steps. A layer that no int8 kernel computes (e.g. a matmul of
    an asymmetric activation) stays fake-quantized, in float, with a warning naming it.

    >>> import numpy as np, jax.numpy as jnp, paddlejax as pj
    >>> w = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 64)), params={"w": w})
    >>> int4 = quant_post(prog, [], weight_bits=4)
    >>> [op.type for op in int4.walk() if op.type != "param"], int4.params["w.int4"].shape   # two rows per byte
    (['weight_only_linear', 'return'], (32, 32))
    """
    from paddlejax.io import save

    if weight_bits not in (8, 4):
        raise ValueError(f"quant_post: weight_bits must be 8 (int8 weights and activations) or 4 (packed int4 "
                         f"weights, float activations), got {weight_bits!r}")
    weight_only = weight_bits == 4
    source = program_or_path if isinstance(program_or_path, Program) else load(program_or_path)
    if weight_only and not act_symmetric:
        raise ValueError("quant_post: weight_bits=4 quantizes the weights only and leaves the activations float; "
                         "act_symmetric=False quantizes activations: use weight_bits=8 with it")
    if not act_symmetric and algo != "min_max":
        raise ValueError(f"quant_post: asymmetric activations are calibrated by their range: algo='min_max', "
                         f"not {algo!r}")
    if fold_batch_norm:
        source = run_passes(source, "fold_conv_bn,fold_linear_bn,dce")
    if (not isinstance(keep_float, int) or isinstance(keep_float, bool) or keep_float < 0
            or (keep_float and weight_only)):
        raise ValueError(f"quant_post: keep_float counts the int8 layers to leave in float (>= 0, with "
                         f"weight_bits=8), got {keep_float!r}" + (" with weight_bits=4" if weight_only else ""))
    if keep_float:
        from paddlejax.slim.quant.sensitivity import keep_float_pattern, quant_sensitivity

        worst = quant_sensitivity(source, calib_data, algo, ops=ops, skip=skip, fold_batch_norm=False,
                                  progress=progress, **observer_options)[:keep_float]
        skip = keep_float_pattern(skip, [s.layer for s in worst])
    fake = run_passes(source, [InsertFakeQuant(ops=ops, skip=skip, weight_bits=weight_bits,
                                               act_bits=0 if weight_only else 8, channel_wise=channel_wise,
                                               act_symmetric=act_symmetric)])
    if not any(op.type in FAKE_QUANT for op in fake.walk()):
        raise ValueError(f"quant_post: nothing to quantize in {source.name}: no {ops.replace(':', ', ')} op "
                         f"with a parameter weight" + (f" outside skip={skip!r}" if skip else ""))
    if bias_correction and not weight_only and iter(calib_data) is calib_data:
        raise ValueError("quant_post: bias_correction reads calib_data twice; pass a list (or another re-iterable "
                         "collection) of batches, not an iterator")
    if not weight_only:
        calibrate(fake, calib_data, algo, progress=progress, **observer_options)
    if bias_correction:
        from paddlejax.slim.quant.bias import correct_bias

        correct_bias(fake, calib_data, progress=progress)
    int8 = convert(fake)
    _warn_float_layers(int8)
    if output is not None:
        save(int8, output)
    return int8


def _warn_float_layers(program: Program) -> None:
    """Warn about the quantizable ops of a converted ``program`` still reading a fake-quantized
    value, and why: conversion found no int8 kernel for them, so they compute in float."""
    reasons: dict[str, list[str]] = {}
    for op in program.walk():
        if op.type not in QUANTIZABLE or not any(is_fake_quantized(v) for v in (op.input("x"), weight_of(op))):
            continue
        x, w = op.input("x"), weight_of(op)
        name = param_name(w.producer.operands[0] if is_fake_quantized(w) else w) or f"{op.type} at {op.loc}"
        if is_fake_quantized(x) and x.producer.type == "fake_quantize_asym":
            why = ("an asymmetric activation folds its zero point only into a linear or a convolution with a "
                   "stored bias or none")
        elif not is_fake_quantized(x):
            why = "weight-only kernels take a linear, a convolution or a 2-D matmul weight without transposes"
        else:
            why = "no int8 kernel takes these bit widths"
        reasons.setdefault(why, []).append(name)
    for why, names in reasons.items():
        warnings.warn(f"quant_post: {', '.join(names)} stay float (fake-quantized): {why}; leave them out with "
                      f"skip= to silence this", stacklevel=3)
