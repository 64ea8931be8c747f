"""Arithmetic ops: Paddle's elementwise binaries, linear, matmul, embedding and einsum.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.math import linear, elementwise_add
>>> linear(jnp.ones((2, 3)), jnp.ones((3, 4))).shape  # weight is [in, out], as in Paddle
(2, 4)
>>> elementwise_add(jnp.ones((2, 1)), jnp.arange(3.0)).tolist()
[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
>>> from paddlejax.ops.math import einsum
>>> einsum(jnp.ones((2, 3)), jnp.ones((3, 4)), equation="ij,jk->ik").shape
(2, 4)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from paddlejax.ops.activation import fused_activation, fused_activation_attrs, nonnegative_act
from paddlejax.ops.registry import Attr, Input, define, elementwise_flops
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import attr_error, input_error


def _elementwise(name: str, fn, doc: str, **traits):
    def kernel(x, y, *, act=None, act_alpha=None):
        try:
            jnp.broadcast_shapes(x.shape, y.shape)  # jnp's accepts symbolic sizes
        except ValueError:
            raise ValueError(f"{name}: inputs 'x' {tuple(x.shape)} and 'y' {tuple(y.shape)} "
                             "do not broadcast") from None
        return fused_activation(fn(x, y), act, act_alpha)

    kernel.__doc__ = doc
    kernel.__name__ = name
    return define(name, kernel, inputs=[Input("x"), Input("y")], attrs=fused_activation_attrs(),
                  flops=elementwise_flops,
                  traits=Traits(pointwise=True, broadcasting=True, channels="identity", nonnegative=nonnegative_act,
                                **traits))


elementwise_add = _elementwise("elementwise_add", jnp.add, "x + y with numpy broadcasting.",
                               commutative=True, unit=0.0, saved_for_backward=())
elementwise_sub = _elementwise("elementwise_sub", jnp.subtract, "x - y with numpy broadcasting.",
                               unit=0.0, saved_for_backward=())
elementwise_mul = _elementwise("elementwise_mul", jnp.multiply, "x * y with numpy broadcasting.",
                               commutative=True, unit=1.0, saved_for_backward=("operands",))
# division and powers overflow the narrow float types: Paddle keeps them in float32
elementwise_div = _elementwise("elementwise_div", jnp.true_divide, "x / y with numpy broadcasting.",
                               unit=1.0, amp="black", saved_for_backward=("operands", "new"))
elementwise_max = _elementwise("elementwise_max", jnp.maximum, "Elementwise maximum with numpy broadcasting.",
                               commutative=True)
elementwise_min = _elementwise("elementwise_min", jnp.minimum, "Elementwise minimum with numpy broadcasting.",
                               commutative=True)
elementwise_pow = _elementwise("elementwise_pow", jnp.power, "x ** y with numpy broadcasting.", amp="black")


def _linear(x, weight, bias=None, *, act=None, act_alpha=None):
    """``act(x @ weight + bias)`` with Paddle's ``[in_features, out_features]`` weight."""
    if x.shape[-1] != weight.shape[0]:
        raise input_error("linear", "weight", f"shape [{x.shape[-1]}, out_features]", weight.shape)
    if bias is not None and bias.shape != weight.shape[1:]:
        raise input_error("linear", "bias", f"shape {weight.shape[1:]}", bias.shape)
    y = jnp.matmul(x, weight)
    return fused_activation(y if bias is None else y + bias, act, act_alpha)


linear = define("linear", _linear,
                inputs=[Input("x", rank=tuple(range(1, 9)), dtype="float"), Input("weight", rank=2, dtype="float"),
                        Input("bias", rank=1, dtype="float", optional=True)],
                attrs=fused_activation_attrs(),
                flops=lambda ins, outs, attrs: 2 * math.prod(ins[0]) * ins[1][1],
                traits=Traits(amp="white", channels="consumed", weight="weight",
                              weight_out_axis=lambda attrs, rank: rank - 1, channel_axis=lambda attrs, rank: rank - 1,
                              weight_in_axis=lambda attrs, rank: 0, saved_for_backward=("operands",)))


def _contracted(shape, transpose_x):
    """Size of x's contracted dimension."""
    return shape[-2] if transpose_x and len(shape) >= 2 else shape[-1]


def matmul_operands(op: str, x, y, transpose_x: bool, transpose_y: bool, names=("x", "y")):
    """``x`` and ``y`` with the transposes applied (the last two axes swapped), checked to
    multiply: contracted sizes equal, batch dimensions broadcasting; errors name ``op`` and
    the inputs' ``names``.

    >>> import jax.numpy as jnp
    >>> [a.shape for a in matmul_operands("matmul", jnp.ones((2, 3)), jnp.ones((4, 3)), False, True)]
    [(2, 3), (3, 4)]
    """
    if transpose_x and x.ndim >= 2:
        x = jnp.swapaxes(x, -1, -2)
    if transpose_y and y.ndim >= 2:
        y = jnp.swapaxes(y, -1, -2)
    ky = y.shape[-2] if y.ndim >= 2 else y.shape[0]
    if x.shape[-1] != ky:
        raise input_error(op, names[1], f"contracted size {x.shape[-1]} (after transpose_x={transpose_x}, "
                          f"transpose_y={transpose_y})", tuple(y.shape))
    try:
        jnp.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: batch dimensions of '{names[0]}' {x.shape} and '{names[1]}' {y.shape} "
                         "do not broadcast") from None
    return x, y


def _matmul(x, y, *, transpose_x, transpose_y):
    """Batched matrix product with numpy broadcasting; transposes swap the last two axes."""
    return jnp.matmul(*matmul_operands("matmul", x, y, transpose_x, transpose_y))


def _matmul_flops(in_shapes, out_shapes, attrs):
    return 2 * math.prod(out_shapes[0]) * _contracted(in_shapes[0], attrs.get("transpose_x", False))


matmul = define("matmul", _matmul, inputs=[Input("x", rank=tuple(range(1, 9))), Input("y", rank=tuple(range(1, 9)))],
                attrs={"transpose_x": Attr("bool", False), "transpose_y": Attr("bool", False)},
                flops=_matmul_flops,
                # a transposed y has its output channels first: one scale for the whole of it
                traits=Traits(amp="white", channels="consumed", weight="y",
                              weight_out_axis=lambda attrs, rank: None if attrs.get("transpose_y") else rank - 1,
                              saved_for_backward=("operands",)))


def _embedding(ids, weight, *, padding_idx):
    """Rows of ``weight`` picked by ``ids``; the ``padding_idx`` row reads as zeros and gets no gradient."""
    return mask_padding("embedding", ids, jnp.take(weight, ids, axis=0), weight.shape[0], padding_idx)


def mask_padding(op: str, ids, rows, vocab: int, padding_idx: int | None):
    """``rows`` looked up for ``ids`` with those of id ``padding_idx`` (None: none) zeroed, so that
    row reads as zeros and gets no gradient."""
    if padding_idx is None:
        return rows
    if not -vocab <= padding_idx < vocab:
        raise attr_error(op, "padding_idx", f"an index in [{-vocab}, {vocab})", padding_idx)
    return jnp.where((ids == padding_idx % vocab)[..., None], jnp.zeros((), rows.dtype), rows)


embedding = define("embedding", _embedding, inputs=[Input("ids", dtype="int"), Input("weight", rank=2, dtype="float")],
                   attrs={"padding_idx": Attr("int", None, optional=True)},
                   traits=Traits(channels="produced", channel_axis=lambda attrs, rank: rank - 1))


def _einsum_output(equation: str) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, the output spelled out for an implicit equation
    (numpy's rule: the broadcast axes, then the letters used once, in alphabetical order)."""
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if not arrow:
        letters = [ch for term in terms for ch in term if ch.isalpha()]
        output = ("..." if "..." in inputs else "") + "".join(sorted(ch for ch in set(letters)
                                                                     if letters.count(ch) == 1))
    return terms, output


def _einsum(*operands, equation):
    """Einstein summation over ``operands`` as ``equation`` spells it (``"bij,bjk->bik"``;
    ``...`` for broadcast axes; without ``->``, numpy's implicit output)."""
    terms, _ = _einsum_output(equation)
    if len(terms) != len(operands):
        raise attr_error("einsum", "equation", f"one subscript per operand ({len(operands)} operands)", equation)
    try:
        return jnp.einsum(equation, *operands)
    except ValueError as e:
        shapes = ", ".join(str(tuple(o.shape)) for o in operands)
        raise attr_error("einsum", "equation", f"subscripts that fit the operands' shapes ({shapes}): {e}",
                         equation) from None


def _einsum_flops(in_shapes, out_shapes, attrs):
    """FLOPs of the contraction order jnp.einsum takes (a multiply-add counts 2)."""
    structs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in in_shapes]
    return int(jnp.einsum_path(attrs["equation"], *structs)[1].opt_cost)


def _einsum_couples_batch(attrs) -> bool:
    """Whether the output's leading axis mixes the operands' leading axes: it does unless every
    operand either leads with the output's first subscript or lacks it (a broadcast weight)."""
    terms, output = _einsum_output(attrs["equation"])
    lead = "..." if output.startswith("...") else output[:1]
    return not lead or not all(term.startswith(lead) or lead not in term for term in terms)


einsum = define("einsum", _einsum, inputs=[Input("operands", variadic=True)],
                attrs={"equation": Attr("str")}, flops=_einsum_flops,
                traits=Traits(amp="white", batch_coupled=_einsum_couples_batch, saved_for_backward=("operands",)))
