"""Questions passes ask of a program's ops and values: who reads this, is it stored, what is it
called, what kind of op is this (by its declaration in the op library).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.relu(x @ p["w"]), jnp.ones((1, 2)), params={"w": jnp.eye(2)})
>>> w, dot, relu = prog.body.ops[:3]
>>> param_name(w.result), only_reader(dot.result, relu), stored_array(prog, w.result).shape
('w', True, (2, 2))
"""
from __future__ import annotations

import numpy as np

from paddlejax.ir.core import Op, Program, Value
from paddlejax.ops import registry


def only_reader(v: Value, op: Op) -> bool:
    """``op`` reads ``v`` once and nothing else reads it (a program output counts as a reader)."""
    return len(v.uses) == 1 and v.uses[0][0] is op


def nonnegative(v: Value) -> bool:
    """Whether ``v`` provably holds no negative value: its producer is ``nonnegative`` (a relu,
    an op whose fused activation is one), or passes a non-negative first operand through
    ``keeps_sign`` or ``commutes_with_quantize`` ops (quantize, max-pooling, transposes).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: pj.ops.pool2d(pj.ops.relu(x), kernel_size=2) - 1.0, jnp.ones((1, 1, 4, 4)))
    >>> [(op.type, nonnegative(op.result)) for op in prog.body.ops if op.type in ("relu", "pool2d", "lax.sub")]
    [('relu', True), ('pool2d', True), ('lax.sub', False)]
    """
    while v.producer is not None:
        op = v.producer
        if op.has_trait("nonnegative"):
            return True
        if not (op.has_trait("keeps_sign") or op.has_trait("commutes_with_quantize")) or not op.operands:
            return False
        v = op.operands[0]
    return False


def stored_array(program: Program, v: Value) -> np.ndarray | None:
    """The value of a parameter or named constant, or None for anything computed."""
    op = v.producer
    if op is not None and op.type == "param":
        return np.asarray(program.params[op.attrs["name"]])
    if op is not None and op.type == "constant" and "name" in op.attrs:
        return np.asarray(program.constants[op.attrs["name"]])
    return None


def param_name(v: Value) -> str | None:
    """The name of the parameter ``v`` reads, or None when ``v`` is computed."""
    op = v.producer
    return op.attrs["name"] if op is not None and op.type == "param" else None


def weight_of(op: Op) -> Value:
    """The weight operand of a quantizable op: the input its traits name (``linear``'s
    ``weight``, ``matmul``'s ``y``)."""
    return op.input(op.traits.weight)


def scalar_constant(program: Program, v: Value) -> float | None:
    """The number ``v`` holds if it is one constant element, looking through ops that keep a
    scalar's value (reshapes, broadcasts and casts: the ``reshaping`` trait and casts).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 0.5, jnp.ones(3))
    >>> scalar_constant(prog, prog.body.ops[1].operands[1])
    0.5
    """
    op = v.producer
    while op is not None and (op.has_trait("reshaping") or op.canonical[0] == "cast") and op.operands:
        op = op.operands[0].producer
    if op is None or op.type != "constant":
        return None
    value = np.asarray(op.attrs["value"] if "value" in op.attrs else program.constants[op.attrs["name"]])
    return float(value.reshape(-1)[0]) if value.size == 1 and np.isrealobj(value) else None


def weighted(op_type: str) -> bool:
    """Whether ``op_type`` is a conv / linear: a quantizable weight with an output-channel axis,
    and an optional bias input that a per-channel add can become.

    >>> weighted("conv2d"), weighted("linear"), weighted("matmul"), weighted("lax.add")
    (True, True, False, False)
    """
    opdef = registry.lookup(op_type)
    return (opdef is not None and opdef.traits.weight is not None and opdef.traits.weight_out_axis is not None
            and any(i.name == "bias" and i.optional for i in opdef.inputs))


def fuses_activation(op_type: str) -> bool:
    """Whether ``op_type`` applies an activation to its result through an ``act`` attribute."""
    opdef = registry.lookup(op_type)
    return opdef is not None and "act" in opdef.attrs


def transpose_perm(op: Op | None) -> tuple[int, ...] | None:
    """The permutation of a transpose (``transpose`` or ``lax.transpose``), None for other ops.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> transpose_perm(pj.trace(lambda x: x.T, jnp.ones((2, 3))).body.ops[0])
    (1, 0)
    """
    if op is None:
        return None
    kind, attrs = op.canonical
    return tuple(attrs["perm"]) if kind == "transpose" else None
