"""Automatic mixed precision: Paddle's white/black/gray list rules, decided on the program.

Every op of the main block is classified by its ``amp`` trait (declared in the op library):

- **white** (conv, matmul, linear, attention, ``lax.dot_general``/``conv_general_dilated``):
  runs in the low dtype; its float inputs (parameters included: the fp32 master weights stay
  in ``program.params``) are cast down;
- **black** (softmax, losses, sums and means, ``exp``/``log``/``pow``/division, ...): runs in
  float32; inputs the pass had lowered are cast back up;
- **norm** (batch/layer/group norm): the normalised input follows the low dtype while the
  statistics, scale and shift stay float32 (the kernels compute statistics in float32);
- **cast** (``cast``, ``lax.convert_element_type``): left as they are, their dtype is their point;
- **gray** (everything else: activations, elementwise, pooling, reshapes...): follows its
  inputs — low when one of them was lowered (the others are cast down), float32 otherwise.

Ops with sub-blocks and the program's outputs get their original dtypes back, so the program's
signature does not change. Casts are ``cast`` ops, so the printed program shows where they are.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.softmax(pj.ops.relu(pj.ops.matmul(x, p["w"]))),
...                 jnp.ones((2, 4)), params={"w": jnp.ones((4, 3))})
>>> amp = pj.passes.run(prog, "amp")
>>> [op.type for op in amp.walk()]
['param', 'cast', 'cast', 'matmul', 'relu', 'cast', 'softmax', 'return']
>>> amp.outputs[0].type.dtype
'float32'
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paddlejax.ir.core import Op, Program, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ir.verifier import Shapes, infer_types
from paddlejax.ops.traits import STRUCTURAL, amp_class
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.options import op_names

LOW_DTYPES = ("bfloat16", "float16")
_FLOAT32 = ("float32",)


def _is_f32(t: TensorType) -> bool:
    return t.dtype in _FLOAT32


@register_pass
@dataclasses.dataclass(frozen=True)
class AutoMixedPrecision(Pass):
    """Cast the program to ``dtype`` where Paddle's AMP lists allow it (see the module doc).

    ``white`` / ``black`` move op types into those lists (separated by ``:`` on a command
    line: ``amp{dtype=float16,black=gelu}``); an op type that does not exist is refused.
    """

    name = "amp"
    dtype: str = "bfloat16"
    white: str = ""
    black: str = ""

    def _classes(self):
        """op type -> class, for the op types the options move."""
        white = op_names(self.white, "amp: option 'white' names")
        black = op_names(self.black, "amp: option 'black' names")
        for name in white + black:
            if name in STRUCTURAL:
                raise ValueError(f"amp: '{name}' is part of the program's structure, not an op to move between "
                                 "lists (a program keeps its input and output dtypes)")
        both = sorted(set(white) & set(black))
        if both:
            raise ValueError(f"amp: op type '{both[0]}' is in both 'white' and 'black'")
        return {**dict.fromkeys(white, "white"), **dict.fromkeys(black, "black")}

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.dtype not in LOW_DTYPES:
            raise ValueError(f"amp: dtype expects one of {LOW_DTYPES}, got {self.dtype!r}")
        moved = self._classes()
        rewriter = Rewriter(program)
        shapes = Shapes(program)
        original: dict[Value, TensorType] = {}  # values the pass has lowered
        cache: dict[tuple[int, str], Value] = {}
        stats = {"low_precision_ops": 0, "casts": 0}

        def cast(op: Op, index: int, dtype: str) -> None:
            v = op.operands[index]
            key = (id(v), dtype)
            if key not in cache:
                t = TensorType(v.type.shape, dtype)
                cache[key] = rewriter.insert_before(op, Op("cast", [v], [t], {"dtype": np.dtype(dtype)})).result
                stats["casts"] += 1
            rewriter.set_operand(op, index, cache[key])

        for op in list(program.body.ops):
            floats = [i for i, v in enumerate(op.operands) if _is_f32(v.type) or v in original]
            lowered = [i for i in floats if op.operands[i] in original]
            kind = moved.get(op.type) or amp_class(op.type)
            if kind == "cast":
                continue
            if kind == "black":
                kind = "keep"
            elif kind == "white":
                kind = "low"
            elif kind == "norm":
                kind = "low" if 0 in lowered else "keep"
                floats = [0]
            else:
                kind = "low" if lowered else "keep"
            if kind == "keep":
                for i in lowered:
                    cast(op, i, original[op.operands[i]].dtype)
                continue
            for i in floats:
                if op.operands[i].type.dtype != self.dtype:
                    cast(op, i, self.dtype)
            stats["low_precision_ops"] += 1
            new_types = infer_types(op, [v.type for v in op.operands], shapes)
            for result, t in zip(op.results, new_types):
                if t != result.type:
                    original[result] = result.type
                    rewriter.set_result_type(result, t)
        return PassResult(rewriter.changed, stats)
