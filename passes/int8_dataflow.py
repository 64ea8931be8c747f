"""``int8_dataflow``: quantized convolutions hand int8 tensors to the next quantized op.

After ``convert_int8`` each int8 convolution returns float32 and the next quantized op's input
is quantized again: ``quantize(pool(quantized_conv2d(...)), s)``. Paddle Inference instead
keeps the tensor int8 between them (int8 conv -> fused requantize -> int8 pooling -> ...).
This pass does the same: when the only path from a ``quantized_conv2d`` to a per-tensor
``quantize`` runs through ops that commute with quantization (the ``commutes_with_quantize``
trait: transposes, reshapes, max-pooling), the convolution takes the quantize's scale as its
``out_scale`` input and returns int8, those ops run on int8, and the quantize goes. Residual
adds, concatenations of different scales and average pooling stay float.

Tolerance: the requantize rounds the same float value the quantize rounded, and the ops between
select elements, so the result is exact up to the float rounding of the convolution's rescale
(a tie at a half step may round to the other neighbour: one int8 level, rarely).

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

from paddlejax.ir.core import Op, TensorType
from paddlejax.ir.rewriter import Rewriter
from paddlejax.passes.base import register_pass
from paddlejax.passes.query import only_reader, param_name
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
        operands = list(conv.operands)
        if conv.input("bias") is None:  # out_scale is the trailing input: a zero bias goes before it
            c = conv.input("w_q").type.shape[0]
            base = f"{param_name(conv.input('w_q')) or 'quantized_conv2d'}.zero_bias"
            operands.append(rewriter.param(base, np.zeros(c, np.float32)))
        int8 = lambda t: TensorType(t.shape, "int8")  # noqa: E731
        out = rewriter.insert_before(quantize, Op(conv.type, [*operands, scale], [int8(conv.result.type)],
                                                  dict(conv.attrs), loc=conv.loc)).result
        for op in reversed(chain):
            out = rewriter.insert_before(quantize, Op(op.type, [out, *op.operands[1:]], [int8(op.result.type)],
                                                      dict(op.attrs), loc=op.loc)).result
        rewriter.replace_op(quantize, [out])
        for op in [*chain, conv]:
            rewriter.erase_op(op)
        return True


@register_pass
@dataclasses.dataclass(frozen=True)
class Int8Dataflow(PatternPass):
    """Keep tensors int8 between quantized convolutions and the quantized ops they feed (see
    the module doc). Exact up to the rescale's float rounding."""

    name = "int8_dataflow"

    def patterns(self) -> list[RewritePattern]:
        return [_Requantize()]
