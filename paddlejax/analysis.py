"""Static estimates over a program: FLOPs per op (memory: :mod:`paddlejax.passes.memory`).

Symbolic sizes are given concrete values (``sizes={"b": 32}``; every unnamed symbol is 1).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x, w: x @ w, pj.InputSpec((None, 4)), jnp.ones((4, 8)))
>>> flops(prog, sizes={"b": 2})
128
"""
from __future__ import annotations

import math


from paddlejax.ir.attrs import dim_symbols, eval_dim, resolve
from paddlejax.ir.core import Op, Program, TensorType
from paddlejax.ops import registry

# lax primitives that only move or reinterpret data: no arithmetic.
_DATA_MOVEMENT = {"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice",
                  "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "gather", "copy",
                  "copy_p", "convert_element_type", "iota", "select_n", "rev", "split", "bitcast_convert_type"}


def size_env(program: Program, sizes: dict | None) -> dict:
    """Values of the program's symbolic sizes: those in ``sizes``, 1 for the others."""
    env = {s: 1 for v in program.inputs for d in v.type.shape if isinstance(d, str) for s in dim_symbols(d)}
    env.update(sizes or {})
    return env


def concrete_shape(t: TensorType, env: dict) -> tuple[int, ...]:
    """The shape of ``t`` with symbolic sizes evaluated in ``env``."""
    return tuple(d if isinstance(d, int) else int(eval_dim(d, env)) for d in t.shape)


def op_flops(op: Op, env: dict) -> int:
    """FLOPs of one op (sub-blocks included; a while loop's body counted once)."""
    ins = [concrete_shape(v.type, env) for v in op.operands]
    outs = [concrete_shape(r.type, env) for r in op.results]
    if op.type in ("param", "constant", "return"):
        return 0
    if op.type in ("cond", "while", "scan"):
        inner = [sum(op_flops(o, env) for o in b.ops) for b in op.blocks]
        if op.type == "cond":
            return max(inner, default=0)
        if op.type == "scan":
            return inner[0] * int(resolve(op.attrs["length"], env))
        return sum(inner)
    if op.type.startswith("lax."):
        name = op.type[4:]
        if name == "dot_general":
            (lc, _), _ = op.attrs["dimension_numbers"]
            return 2 * math.prod(outs[0]) * math.prod(ins[0][d] for d in lc)
        if name == "conv_general_dilated":
            rhs = ins[1]
            spec = op.attrs["dimension_numbers"]
            kernel_in = rhs[spec.rhs_spec[1]] if spec is not None else rhs[1]
            spatial = math.prod(rhs[d] for d in spec.rhs_spec[2:]) if spec is not None else math.prod(rhs[2:])
            return 2 * math.prod(outs[0]) * kernel_in * spatial
        if name in _DATA_MOVEMENT:
            return 0
        if name.startswith("reduce_") or name == "argmax" or name == "argmin":
            return math.prod(ins[0]) if ins else 0
        return sum(math.prod(s) for s in outs)
    opdef = registry.lookup(op.type)
    if opdef is None or opdef.flops is None:
        return 0
    return int(opdef.flops(ins, outs, resolve(op.attrs, env)))


def flops(program: Program, sizes: dict | None = None) -> int:
    """Total FLOPs of one call of the program."""
    env = size_env(program, sizes)
    return sum(op_flops(op, env) for op in program.body.ops)
