"""Static estimates over a program: FLOPs per op (memory: :mod:`paddlejax.passes.memory`),
and its parameters counted as trainable weights or buffers.

Symbolic sizes are given concrete values (``sizes={"b": 32}``; every unnamed symbol is 1);
:func:`check_sizes` checks values that come from a user.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x, w: x @ w, pj.InputSpec((None, 4)), jnp.ones((4, 8)))
>>> flops(prog, sizes={"b": 2})
128
"""
from __future__ import annotations

import math

import numpy as np

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


# XLA counts the bytes of a buffer in a signed 64-bit integer
MAX_BUFFER_BYTES = 2 ** 63 - 1


def check_sizes(program: Program, sizes: dict) -> dict:
    """``sizes`` if each names a symbolic size of ``program`` and is a positive int with which
    every tensor of the program stays addressable (:data:`MAX_BUFFER_BYTES`); else one error.

    >>> import paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
    >>> check_sizes(prog, {"b": 32})
    {'b': 32}
    >>> check_sizes(prog, {"n": 32})
    Traceback (most recent call last):
    ValueError: size 'n' is not a symbolic size of <lambda>; its sizes: b
    """
    known = sorted(size_env(program, {}))
    for name, value in sizes.items():
        if name not in known:
            raise ValueError(f"size '{name}' is not a symbolic size of {program.name}; "
                             f"its sizes: {', '.join(known) or 'none (all sizes are static)'}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"size '{name}' must be a positive int, got {value!r}")
    env = size_env(program, sizes)
    for v in [*program.inputs, *(r for op in program.walk() for r in op.results)]:
        nbytes = math.prod(concrete_shape(v.type, env)) * np.dtype(v.type.dtype).itemsize
        if nbytes > MAX_BUFFER_BYTES:
            shown = ", ".join(f"{k}={n}" for k, n in sizes.items())
            raise ValueError(f"sizes {shown} make a {v.type} tensor of {nbytes:.3g} bytes, more than XLA "
                             f"addresses ({MAX_BUFFER_BYTES:.3g}); give smaller sizes")
    return sizes


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
    if op.type in ("custom_jvp", "custom_vjp"):  # a forward call runs the primal block
        return sum(op_flops(o, env) for o in op.blocks[0].ops)
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


def buffer_params(program: Program) -> set[str]:
    """Names of the parameters that are buffers, not trained weights: those the program reads
    only through op inputs the op library declares ``state`` (batch norm's running mean and
    variance). The other parameters are trainable.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> def f(p, x):
    ...     return pj.ops.batch_norm(x, p["mean"], p["var"], p["scale"])[0]
    >>> prog = pj.trace(f, jnp.ones((2, 3)), params={"mean": jnp.zeros(3), "var": jnp.ones(3), "scale": jnp.ones(3)})
    >>> sorted(buffer_params(prog))
    ['mean', 'var']
    """
    def state_input(op, index) -> bool:
        opdef = registry.lookup(op.type)
        return (opdef is not None and not (opdef.inputs and opdef.inputs[-1].variadic)
                and index < len(opdef.inputs) and opdef.inputs[index].state)

    return {op.attrs["name"] for op in program.param_ops()
            if op.result.uses and all(state_input(user, i) for user, i in op.result.uses)}
