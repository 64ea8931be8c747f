"""``int8_dataflow``: quantized convolutions hand int8 tensors to the next quantized op.

After ``convert_int8`` each int8 convolution returns float32 and the next quantized op's input
is quantized again: ``quantize(pool(quantized_conv2d(...)), s)``. Paddle Inference instead
keeps the tensor int8 between them (int8 conv -> fused requantize -> int8 pooling -> ...).
This pass does the same: when the only path from a ``quantized_conv2d`` to a per-tensor
``quantize`` runs through ops that commute with quantization (the ``commutes_with_quantize``
trait: transposes, reshapes, max-pooling), the convolution takes the quantize's scale as its
``out_scale`` input and returns int8, those ops run on int8, and the quantize goes.
Concatenations of different scales and average pooling stay float.

Residual connections (option ``residual``, on by default, as in Paddle Inference's int8 ResNets):
``quantize(act(quantized_conv2d(...) + x), s)``, where ``x`` is also quantized for another
convolution, is itself a dequantized int8 tensor, or is fake-quantized (a projection shortcut's
output, calibrated by ``quant_post``: ``insert_fake_quant``'s ``shortcuts``), becomes one
``quantized_conv2d`` that adds the int8 ``x`` (its ``residual`` input, with that scale) before
the activation and returns int8; oneDNN adds it in place (a ``sum`` post-op). Other readers of
the sum read its dequantized int8 value. A shortcut with no scale stays a float add.

A convolution whose int8 input provably holds no negative value (after a relu, through
max-pooling and quantizers: :func:`paddlejax.passes.query.nonnegative`) is marked
``x_nonnegative``: oneDNN reads that input as uint8 (the same bytes), as Paddle Inference's u8
dataflow does.

Tolerance: the requantize rounds the same float value the quantize rounded, and the ops between
select elements, so the result is exact up to the float rounding of the convolution's rescale
(a tie at a half step may round to the other neighbour: one int8 level, rarely). A fused
residual adds ``x`` rounded and clipped to its int8 grid (half a step of its scale per element,
more where the calibrated range clips an outlier), and the readers of a fused sum see it
rounded to the output's grid: the rounding the next convolution's input already had.

>>> import numpy as np, paddlejax as pj
>>> model = pj.nn.Sequential(pj.nn.Conv2D(3, 8, 3, padding=1), pj.nn.ReLU(), pj.nn.MaxPool2D(2),
...                          pj.nn.Conv2D(8, 4, 3))
>>> model.eval()
>>> prog = pj.to_static(model, pj.InputSpec((None, 3, 8, 8)))
>>> calib = [np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32)]
>>> int8 = pj.passes.run(pj.slim.quant_post(prog, calib, progress=False), "fuse_bias_act,int8_dataflow,dce")
>>> [(op.type, op.result.type.dtype) for op in int8.walk() if op.type not in ("param", "return")]
[('quantize', 'int8'), ('quantized_conv2d', 'int8'), ('pool2d', 'int8'), ('quantized_conv2d', 'float32')]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paddlejax.ir.core import Op, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import register_pass
from paddlejax.passes.query import nonnegative, only_reader, param_name
from paddlejax.passes.rewrite import PatternPass, RewritePattern


class _Requantize(RewritePattern):
    """``quantize(f(...g(quantized_conv2d(...))), s)`` -> ``f(...g(quantized_conv2d(..., s)))``."""

    label = "requantized"

    def match_and_rewrite(self, quantize: Op, rewriter: Rewriter) -> bool:
        if quantize.type != "quantize" or quantize.attrs.get("bits", 8) != 8:
            return False
        scale = quantize.operands[1]
        if scale.type.shape != ():
            return False
        chain, v = [], quantize.operands[0]
        while v.producer is not None and v.producer.type != "quantized_conv2d":
            op = v.producer
            if not op.has_trait("commutes_with_quantize") or len(op.results) != 1 or op.blocks \
                    or not op.operands or not only_reader(v, quantize if not chain else chain[-1]):
                return False
            chain.append(op)
            v = op.operands[0]
        conv = v.producer
        if conv is None or conv.input("out_scale") is not None or conv.result.type.dtype != "float32" \
                or not only_reader(v, chain[-1] if chain else quantize):
            return False
        out = rewriter.insert_before(quantize, Op(conv.type, [*_with_bias(conv, rewriter), scale],
                                                  [_int8(conv.result.type)], dict(conv.attrs), loc=conv.loc)).result
        for op in reversed(chain):
            out = rewriter.insert_before(quantize, Op(op.type, [out, *op.operands[1:]], [_int8(op.result.type)],
                                                      dict(op.attrs), loc=op.loc)).result
        rewriter.replace_op(quantize, [out])
        for op in [*chain, conv]:
            rewriter.erase_op(op)
        return True


class _FuseResidual(RewritePattern):
    """``quantize(act(quantized_conv2d(...) + x), s)`` with ``x`` also read as int8 ``x_q`` (scale
    ``sx``) -> ``quantized_conv2d(..., s, x_q, sx){act}``."""

    label = "residual_fused"

    def match_and_rewrite(self, quantize: Op, rewriter: Rewriter) -> bool:
        if not _per_tensor_int8(quantize, "quantize"):
            return False
        add = quantize.operands[0].producer
        if add is None or add.canonical[0] != "elementwise_add" or any(v.type != add.result.type
                                                                       for v in add.operands):
            return False
        act = add.canonical[1]
        scale = quantize.operands[1]
        for conv_value, x in (add.operands, add.operands[::-1]):
            conv = conv_value.producer
            if (conv is not None and conv.type == "quantized_conv2d" and conv_value is not x
                    and only_reader(conv_value, add) and conv.input("out_scale") is None
                    and conv.attrs.get("act") is None and _available_at(scale, add)):
                residual = _as_int8(x, add, rewriter)
                if residual is not None:
                    break
        else:
            return False
        attrs = {**conv.attrs, "act": act.get("act"), "act_alpha": act.get("act_alpha")}
        out = rewriter.insert_before(add, Op(conv.type, [*_with_bias(conv, rewriter), scale, *residual],
                                             [_int8(add.result.type)], attrs, loc=add.loc)).result
        rewriter.replace_op(quantize, [out])
        if add.result.uses:  # the sum's float readers read its int8 value
            back = rewriter.insert_after(out.producer, Op("dequantize", [out, scale], [add.result.type],
                                                          {"bits": 8, "axis": None}, loc=add.loc))
            rewriter.replace_all_uses_with(add.result, back.result)
        rewriter.erase_op(add)
        rewriter.erase_op(conv)
        if not x.uses and x.producer is not None and x.producer.has_trait("pure"):
            rewriter.erase_op(x.producer)  # the shortcut's fake quantize, say: its readers now read int8
        return True


def _per_tensor_int8(op: Op, kind: str) -> bool:
    return op.type == kind and op.attrs.get("bits", 8) == 8 and op.attrs.get("axis") is None \
        and op.operands[1].type.shape == ()


def _as_int8(x: Value, at: Op, rewriter: Rewriter) -> tuple[Value, Value] | None:
    """``(x_q, scale)`` of ``x`` in int8, available at ``at``: the tensor ``x`` was dequantized
    from, the quantize of a fake-quantized ``x`` (a calibrated shortcut), or a per-tensor
    quantize of ``x`` placed before ``at``."""
    if x.producer is not None and _per_tensor_int8(x.producer, "dequantize") \
            and x.producer.operands[0].type.dtype == "int8":
        return x.producer.operands[0], x.producer.operands[1]
    if x.producer is not None and _per_tensor_int8(x.producer, "fake_quantize"):
        v, scale = x.producer.operands
        quantize = rewriter.insert_before(x.producer, Op("quantize", [v, scale], [_int8(v.type)],
                                                         {"bits": 8, "axis": None}, loc=x.producer.loc))
        return quantize.result, scale
    for reader in x.users:
        if _per_tensor_int8(reader, "quantize") and _available_at(reader.result, at) \
                and _available_at(reader.operands[1], at):
            return reader.result, reader.operands[1]
    return None


def _available_at(v: Value, op: Op) -> bool:
    """Whether ``v`` is defined before ``op`` runs: earlier in its block or in an enclosing one."""
    producer = v.producer
    if producer is None:
        return True
    block = op.parent
    while block is not None:
        if producer.parent is block:
            return block.ops.index(producer) < block.ops.index(op)
        op = block.parent
        block = op.parent if isinstance(op, Op) else None
    return False


def _with_bias(conv: Op, rewriter: Rewriter) -> list[Value]:
    """``conv``'s operands with a bias: a zero one when it has none (the inputs after it are
    positional)."""
    operands = list(conv.operands)
    if conv.input("bias") is None:
        c = conv.input("w_q").type.shape[0]
        base = f"{param_name(conv.input('w_q')) or 'quantized_conv2d'}.zero_bias"
        operands.append(rewriter.param(base, np.zeros(c, np.float32)))
    return operands


def _int8(t: TensorType) -> TensorType:
    return TensorType(t.shape, "int8")


class _MarkNonnegative(RewritePattern):
    """A ``quantized_conv2d`` whose int8 input provably holds no negative value (after a relu
    and max-pooling, say) gets ``x_nonnegative``: oneDNN then reads it as uint8."""

    label = "nonnegative_inputs"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if op.type != "quantized_conv2d" or op.attrs.get("x_nonnegative") or not nonnegative(op.operands[0]):
            return False
        rewriter.set_attr(op, "x_nonnegative", True)
        return True


@register_pass
@dataclasses.dataclass(frozen=True)
class Int8Dataflow(PatternPass):
    """Keep tensors int8 between quantized convolutions and the quantized ops they feed, and,
    with ``residual``, fuse residual adds into the convolution before them (see the module
    doc). Exact up to the rescale's float rounding; a fused residual rounds to its int8 grid.

    Statistics: ``requantized`` convolutions, ``residual_fused`` adds, and the convolutions
    marked with ``nonnegative_inputs`` (``x_nonnegative``: their int8 input holds no negative
    value, which oneDNN then reads as uint8).
    """

    name = "int8_dataflow"
    residual: bool = True

    def patterns(self) -> list[RewritePattern]:
        return [_Requantize(), *([_FuseResidual()] if self.residual else []), _MarkNonnegative()]
