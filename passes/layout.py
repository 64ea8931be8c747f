"""Whole-program layout conversion: run every layout-aware op in one data format.

``convert_layout{to=NHWC}`` rewrites each layout-sensitive op (conv, pool, norm, resize ...: the
``layout_sensitive`` trait) over 4-D images whose ``data_format`` differs
from ``to`` into the same op in ``to``, between a transpose of its input into the new layout
and a transpose of its result back. The program computes the same function; then the
transposes are cancelled and sunk (:class:`paddlejax.passes.fusion.EliminateTransposes`): a
transpose back followed by a transpose in again vanishes, and pointwise ops (activations,
``elementwise_*``, casts) between layout ops move into the new layout, so a CNN keeps one
transpose at its input and one where it leaves the image layout (before a flatten or at its
outputs). Exact: only the order of the data changes.

Which layout is faster depends on the device and the shapes (on XLA's CPU backend NHWC
convolutions run faster; on TPUs and GPUs XLA picks its own layouts), so the ``autotune`` pass
times the whole program in both and keeps the faster (its ``layout`` option).

>>> import paddlejax as pj
>>> model = pj.nn.Sequential(pj.nn.Conv2D(3, 4, 3), pj.nn.ReLU(), pj.nn.MaxPool2D(2))
>>> prog = pj.to_static(model, pj.InputSpec((None, 3, 8, 8)))
>>> nhwc = pj.passes.run(prog, "convert_layout{to=NHWC}")
>>> [(op.type, op.attrs.get("data_format")) for op in nhwc.walk() if op.type != "param"]
[('transpose', None), ('conv2d', 'NHWC'), ('relu', None), ('pool2d', 'NHWC'), ('transpose', None), ('return', None)]
"""
from __future__ import annotations

import dataclasses

from paddlejax.ir.core import Op, Program, TensorType
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.fusion import EliminateTransposes
from paddlejax.passes.query import transpose_perm
from paddlejax.passes.rewrite import apply_patterns
# perm into each layout from the other one (transpose: out.shape[i] = x.shape[perm[i]])
INTO = {"NHWC": (0, 2, 3, 1), "NCHW": (0, 3, 1, 2)}


def permuted(t: TensorType, perm) -> TensorType:
    """The type of ``transpose(x: t, perm)``."""
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def _image_op(op: Op) -> bool:
    # only the first result is an image; batch_norm's others are per-channel statistics
    return (op.has_trait("layout_sensitive") and op.attrs.get("data_format") in INTO
            and len(op.operands[0].type.shape) == 4 and len(op.results[0].type.shape) == 4)


def _image_inputs(op: Op) -> set[int]:
    """The operand positions of ``op`` in its data format: the first, and the inputs the
    registry declares ``image`` (a fused residual)."""
    opdef = registry.lookup(op.type)
    declared = opdef.inputs if opdef is not None else []
    return {0} | {i for i, d in enumerate(declared[:len(op.operands)]) if d.image}


def program_layout(program: Program) -> str:
    """The data format of the program's 4-D conv / pool / norm ops: ``"NCHW"``, ``"NHWC"``,
    ``"mixed"``, or ``""`` when it has none.

    >>> import paddlejax as pj
    >>> program_layout(pj.to_static(pj.nn.MaxPool2D(2, data_format="NHWC"), pj.InputSpec((None, 4, 4, 3))))
    'NHWC'
    """
    formats = {op.attrs["data_format"] for op in program.walk() if _image_op(op)}
    return formats.pop() if len(formats) == 1 else "mixed" if formats else ""


@register_pass
@dataclasses.dataclass(frozen=True)
class ConvertLayout(Pass):
    """Run every 4-D conv / pool / norm op in layout ``to`` (``NHWC`` or ``NCHW``), with the
    fewest transposes that keep the program's function (see the module doc). Exact.

    Statistics: ``converted`` ops and the ``transposes`` the program holds afterwards.
    """

    name = "convert_layout"
    to: str = "NHWC"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if self.to not in INTO:
            raise ValueError(f"convert_layout: 'to' must be one of {sorted(INTO)}, got {self.to!r}")
        into, back = INTO[self.to], INTO["NCHW" if self.to == "NHWC" else "NHWC"]
        rewriter = Rewriter(program)
        converted = 0
        moved: dict = {}  # (value, block) -> the value in the new layout, transposed once per block
        def into_layout(x, op):
            key = (x, id(op.parent))
            if key not in moved:
                moved[key] = rewriter.insert_before(op, Op("transpose", [x], [permuted(x.type, into)],
                                                           {"perm": into}, loc=op.loc)).result
            return moved[key]

        for op in [op for op in program.walk() if _image_op(op) and op.attrs["data_format"] != self.to]:
            images = _image_inputs(op)
            operands = [into_layout(x, op) if i in images else x for i, x in enumerate(op.operands)]
            types = [permuted(op.results[0].type, into), *(r.type for r in op.results[1:])]
            new = rewriter.insert_before(op, Op(op.type, operands, types,
                                                {**op.attrs, "data_format": self.to}, loc=op.loc))
            out = rewriter.insert_before(op, Op("transpose", [new.results[0]], [op.results[0].type], {"perm": back},
                                                loc=op.loc))
            rewriter.replace_op(op, [out.result, *new.results[1:]])
            converted += 1
        if converted:
            apply_patterns(program, EliminateTransposes().patterns())
        return PassResult(bool(converted), {"converted": converted,
                                            "transposes": sum(transpose_perm(op) is not None for op in program.walk())})
