"""Quantization passes: simulate int8 with fake-quant ops, then convert to int8 kernels.

``insert_fake_quant`` puts a ``fake_quantize`` (quantize, then dequantize, with straight-through
gradients) in front of the inputs of every conv2d / depthwise_conv2d / linear / matmul chosen
by its options: on the weight, with the weight's absolute maximum per output channel (or per
tensor) as its scale, and on each activation input, with a scale parameter named
``<op name>.input_scale`` (``.x_scale`` / ``.y_scale`` for a matmul of two activations) that
calibration (:func:`paddlejax.slim.quant.calibrate`) or training sets. The program then
computes what the int8 program will, in float: the one to evaluate, calibrate and train (QAT).

``convert_int8`` turns each op whose inputs are all fake-quantized into its int8 kernel:
``quantize`` of the activation, the weight stored as an int8 parameter (``<weight>.int8``),
and ``quantized_conv2d`` / ``quantized_linear`` / ``quantized_matmul``, which multiply int8 by
int8 with int32 accumulation and rescale once. A linear or matmul whose activation is not
fake-quantized but whose weight is becomes ``weight_only_linear`` (int8 or packed int4). The
converted program equals the fake-quant one up to float rounding of the rescale (the tests use
1e-5 relative).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 2)),
...                 params={"w": jnp.array([[1.0, -0.5], [0.25, 2.0]])})
>>> fake = pj.passes.run(prog, "insert_fake_quant")
>>> [op.type for op in fake.walk() if op.type != "param"]
['fake_quantize', 'fake_quantize', 'linear', 'return']
>>> fake.params["w.quant_scale"].tolist()   # per output channel
[1.0, 2.0]
>>> int8 = pj.passes.run(fake, "convert_int8,dce")
>>> [op.type for op in int8.walk() if op.type != "param"], int8.params["w.int8"].dtype.name
(['quantize', 'quantized_linear', 'return'], 'int8')
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from paddlejax.ir.core import Op, Program, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops.quant import pack_int4, quantize
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.fusion import stored_array

QUANTIZABLE = ("conv2d", "depthwise_conv2d", "linear", "matmul")
SCALE_SUFFIX = {"weight": "quant_scale", "input": "input_scale", "x": "x_scale", "y": "y_scale"}


def _param_name(v: Value) -> str | None:
    op = v.producer
    return op.attrs["name"] if op is not None and op.type == "param" else None


def weight_axis(op: Op) -> int | None:
    """The output-channel axis of ``op``'s weight (operand 1), or None for a per-tensor scale:
    0 for an OIHW conv weight, the last for a linear ``[in, out]`` weight or a matmul ``y``."""
    if op.type in ("conv2d", "depthwise_conv2d"):
        return 0
    if op.type == "matmul" and op.attrs.get("transpose_y"):
        return None
    return len(op.operands[1].type.shape) - 1


def _is_fake_quantized(v: Value) -> bool:
    return v.producer is not None and v.producer.type == "fake_quantize"


@register_pass
@dataclasses.dataclass(frozen=True)
class InsertFakeQuant(Pass):
    """Fake-quantize the inputs of the ops ``ops`` (colon-separated types) whose name -- the
    weight's parameter name, or ``<type>_<k>`` for a matmul of two activations -- does not
    match the regular expression ``skip``. ``weight_bits`` / ``act_bits`` are 8 or 4 (0:
    leave that input in float, e.g. ``act_bits=0`` for weight-only quantization);
    ``channel_wise`` gives each output channel of a weight its own scale. Ops already
    fake-quantized are left alone, so running the pass twice changes nothing.

    Statistics: ``ops`` quantized, ``weights`` and ``activations`` fake-quantized.
    """

    name = "insert_fake_quant"
    ops: str = ":".join(QUANTIZABLE)
    skip: str = ""
    weight_bits: int = 8
    act_bits: int = 8
    channel_wise: bool = True

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        types = [t for t in self.ops.replace(",", ":").split(":") if t]
        unknown = sorted(set(types) - set(QUANTIZABLE))
        if unknown:
            raise ValueError(f"insert_fake_quant: cannot quantize op types {unknown}; known: {list(QUANTIZABLE)}")
        for option in ("weight_bits", "act_bits"):
            if getattr(self, option) not in (0, 4, 8):
                raise ValueError(f"insert_fake_quant: {option} must be 8, 4 or 0 (float), got {getattr(self, option)}")
        skip = re.compile(self.skip) if self.skip else None
        rewriter = Rewriter(program)
        stats = {"ops": 0, "weights": 0, "activations": 0}
        unnamed = 0
        for op in [op for op in program.walk() if op.type in types]:
            if any(_is_fake_quantized(v) for v in op.operands[:2]):
                continue
            weight = _param_name(op.operands[1])
            if weight is None and op.type != "matmul":
                continue  # a conv or linear over a computed weight: nothing to store as int8
            name = weight or f"{op.type}_{unnamed}"
            unnamed += weight is None
            if skip is not None and skip.search(name):
                continue
            changed = False
            if weight is not None and self.weight_bits:
                self._fake_quantize(rewriter, op, 1, f"{weight}.{SCALE_SUFFIX['weight']}", self.weight_bits,
                                    weight_axis(op) if self.channel_wise else None)
                stats["weights"] += 1
                changed = True
            if self.act_bits:
                inputs = [0] if weight is not None else [0, 1]
                for i in inputs:
                    role = "input" if weight is not None else "xy"[i]
                    self._fake_quantize(rewriter, op, i, f"{name}.{SCALE_SUFFIX[role]}", self.act_bits, None)
                    stats["activations"] += 1
                    changed = True
            stats["ops"] += changed
        return PassResult(rewriter.changed, stats)

    @staticmethod
    def _fake_quantize(rewriter: Rewriter, op: Op, index: int, scale_name: str, bits: int, axis: int | None) -> None:
        v = op.operands[index]
        stored = stored_array(rewriter.program, v)
        if stored is None:  # an activation: calibration or training sets the scale
            scale = np.float32(1.0)
        else:
            reduce = tuple(d for d in range(stored.ndim) if axis is None or d != axis % stored.ndim)
            scale = np.abs(stored).max(axis=reduce).astype(np.float32)
        scale_value = rewriter.param(scale_name, scale)
        fq = rewriter.insert_before(op, Op("fake_quantize", [v, scale_value], [v.type], {"bits": bits, "axis": axis},
                                           loc=op.loc))
        rewriter.set_operand(op, index, fq.result)


def _quantized_weight(program: Program, fq: Op) -> tuple[np.ndarray, np.ndarray, int, int | None]:
    """(int8 values, scale, bits, axis) of a fake-quantized parameter, by the ``quantize`` op."""
    w = stored_array(program, fq.operands[0])
    scale = stored_array(program, fq.operands[1]).astype(np.float32)
    bits, axis = fq.attrs["bits"], fq.attrs["axis"]
    return np.asarray(quantize(w, scale, bits=bits, axis=axis)), scale, bits, axis


@register_pass
@dataclasses.dataclass(frozen=True)
class ConvertInt8(Pass):
    """Replace fake-quantized conv / linear / matmul ops by their int8 kernels (see the module
    doc). Only 8-bit activations run as int8; 4-bit weights of a linear with a float
    activation become packed ``weight_only_linear``. ``dce`` afterwards drops the float weights.

    Statistics: ``int8`` ops and ``weight_only`` ops.
    """

    name = "convert_int8"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        rewriter = Rewriter(program)
        stats = {"int8": 0, "weight_only": 0}
        for op in [op for op in program.walk() if op.type in QUANTIZABLE]:
            x, w = op.operands[:2]
            y_fq = w.producer if _is_fake_quantized(w) else None
            w_fq = y_fq if y_fq is not None and _param_name(y_fq.operands[0]) else None  # a stored weight
            x_fq = x.producer if _is_fake_quantized(x) and x.producer.attrs["bits"] == 8 else None
            # int8 x int8: a stored 8-bit weight, or a matmul's second activation
            if x_fq is not None and y_fq is not None and y_fq.attrs["bits"] == 8 and (w_fq or op.type == "matmul"):
                self._int8(rewriter, op, x_fq, y_fq, w_fq is not None)
                stats["int8"] += 1
            elif w_fq is not None and not _is_fake_quantized(x) and self._weight_only(rewriter, op, w_fq):
                stats["weight_only"] += 1
        for op in [op for op in program.walk() if op.type == "fake_quantize" and not op.result.uses]:
            rewriter.erase_op(op)
        return PassResult(rewriter.changed, stats)

    def _int8(self, rewriter: Rewriter, op: Op, x_fq: Op, w_fq: Op, stored: bool) -> None:
        x_q = self._quantize(rewriter, op, x_fq)
        if stored:
            q, scale, _, _ = _quantized_weight(rewriter.program, w_fq)
            w_q = rewriter.param(f"{_param_name(w_fq.operands[0])}.int8", q)
            w_scale = w_fq.operands[1]
        else:  # a matmul of two activations
            w_q, w_scale = self._quantize(rewriter, op, w_fq), w_fq.operands[1]
        x_scale, rest = x_fq.operands[1], op.operands[2:]
        if op.type in ("conv2d", "depthwise_conv2d"):
            attrs = {k: v for k, v in op.attrs.items() if k != "kernel"}
            attrs.setdefault("groups", op.operands[0].type.shape[1 if attrs["data_format"] == "NCHW" else 3])
            new = Op("quantized_conv2d", [x_q, w_q, x_scale, w_scale, *rest], [op.result.type], attrs, loc=op.loc)
        elif op.type == "linear":
            new = Op("quantized_linear", [x_q, w_q, x_scale, w_scale, *rest], [op.result.type], dict(op.attrs),
                     loc=op.loc)
        else:
            new = Op("quantized_matmul", [x_q, w_q, x_scale, w_scale], [op.result.type], dict(op.attrs), loc=op.loc)
        rewriter.replace_op(op, [rewriter.insert_before(op, new).result])

    @staticmethod
    def _quantize(rewriter: Rewriter, op: Op, fq: Op) -> Value:
        x, scale = fq.operands
        int8 = TensorType(x.type.shape, "int8")
        return rewriter.insert_before(op, Op("quantize", [x, scale], [int8], dict(fq.attrs), loc=op.loc)).result

    @staticmethod
    def _weight_only(rewriter: Rewriter, op: Op, w_fq: Op) -> bool:
        if op.type not in ("linear", "matmul") or w_fq.attrs["axis"] not in (None, len(op.operands[1].type.shape) - 1) \
                or op.type == "matmul" and (op.attrs.get("transpose_x") or op.attrs.get("transpose_y")
                                            or len(op.operands[1].type.shape) != 2):
            return False
        q, scale, bits, axis = _quantized_weight(rewriter.program, w_fq)
        name = _param_name(w_fq.operands[0])
        w_q = rewriter.param(f"{name}.int4" if bits == 4 else f"{name}.int8", pack_int4(q) if bits == 4 else q)
        if axis is None:  # weight_only_linear takes a per-output-channel scale
            scale = np.full(q.shape[-1], scale, np.float32)
        attrs = {"bits": bits, **{k: op.attrs[k] for k in ("act", "act_alpha") if k in op.attrs}}
        new = Op("weight_only_linear", [op.operands[0], w_q, rewriter.param(f"{name}.weight_scale", scale),
                                        *op.operands[2:]], [op.result.type], attrs, loc=op.loc)
        rewriter.replace_op(op, [rewriter.insert_before(op, new).result])
        return True
