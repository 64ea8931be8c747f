"""Lowering: run a Program by interpreting its ops with JAX.

Called under ``jax.jit`` (``prog(x)``) the interpreter runs once, at trace time, and emits
the same primitives the captured function did, so XLA compiles the same program. Under
``jax.grad`` it is an ordinary JAX function. Consecutive ops marked ``remat_segment=k`` (by
the ``remat`` pass) run as one ``jax.checkpoint`` function, recomputed in the backward pass.
An op marked ``kernel="name"`` (by the ``autotune`` pass) runs its registered variant of that
name inline instead of binding the op's primitive.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: x * 2.0, jnp.ones(3))
>>> run_program(prog, prog.params, (jnp.arange(3.0),)).tolist()
[0.0, 2.0, 4.0]
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax import lax

from paddlejax import adapter
from paddlejax.ir.attrs import kernel_attrs, resolve
from paddlejax.ir.core import Block, Op, Program, TensorType
from paddlejax.ops import registry


class Context:
    """What ops read besides their operands: parameters, constants and solved symbolic sizes."""

    def __init__(self, params, constants, dims):
        self.params = params
        self.constants = constants
        self.dims = dims


def bind_inputs(program: Program, inputs: tuple) -> tuple[list, dict]:
    """Flatten ``inputs``, check them against the program's input types, and solve symbolic sizes."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(inputs))
    if tree != program.in_tree:
        raise TypeError(f"{program.name}: expects inputs structured as {program.in_tree}, got {tree}")
    dims: dict[str, Any] = {}
    for value, x in zip(program.inputs, leaves):
        got = TensorType(tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape),
                         jax.dtypes.canonicalize_dtype(jax.numpy.result_type(x)).name)
        want = value.type
        ok = len(got.shape) == len(want.shape) and got.dtype == jax.dtypes.canonicalize_dtype(want.dtype).name
        for w, g in zip(want.shape, got.shape) if ok else ():
            if isinstance(w, int):
                ok &= (w == g)
            elif w.isidentifier():
                ok &= dims.setdefault(w, g) is g or dims[w] == g
        if not ok:
            raise ValueError(f"{program.name}: input '{value.name}' expects {want}, got "
                             f"{got}")
    return leaves, dims


def run_program(program: Program, params: dict, inputs: tuple):
    """Evaluate ``program`` on ``inputs`` with parameters ``params``."""
    leaves, dims = bind_inputs(program, inputs)
    ctx = Context(params, program.constants, dims)
    outs = run_block(program.body, leaves, ctx)
    return jax.tree_util.tree_unflatten(program.out_tree, outs)


def run_block(block: Block, args, ctx) -> list:
    env = dict(zip(block.args, args))
    _run_ops(block.ops[:-1], env, ctx)
    return [env[v] for v in block.results]


def run_ops(program: Program, ops, env: dict, dims: dict | None = None) -> dict:
    """Evaluate ``ops`` of ``program`` in order; ``env`` maps values to arrays and gains the results.

    This runs any stretch of a block, e.g. only the ops between some values and others;
    ``dims`` gives sizes (or ``jax.export`` symbolic dimensions) to symbolic names.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0 + 1.0, jnp.ones(3))
    >>> env = run_ops(prog, prog.body.ops[:-1], {prog.inputs[0]: jnp.arange(3.0)})
    >>> env[prog.outputs[0]].tolist()
    [1.0, 3.0, 5.0]
    """
    return _run_ops(ops, env, Context(program.params, program.constants, dims or {}))


def _run_ops(ops, env: dict, ctx) -> dict:
    ops = list(ops)
    i = 0
    while i < len(ops):
        segment = ops[i].attrs.get("remat_segment")
        end = i + 1
        while segment is not None and end < len(ops) and ops[end].attrs.get("remat_segment") == segment:
            end += 1
        if segment is None:
            _run_op(ops[i], env, ctx)
        else:
            _run_remat_segment(ops[i:end], env, ctx)
        i = end
    return env


def _run_op(op: Op, env: dict, ctx) -> None:
    env.update(zip(op.results, lower_op(op, [env[v] for v in op.operands], ctx)))


def _run_remat_segment(ops: list[Op], env: dict, ctx) -> None:
    """Run consecutive ops marked with one ``remat_segment`` inside one ``jax.checkpoint``.

    Under ``jax.grad`` only the segment's inputs are kept for the backward pass; the values
    computed inside are recomputed there.
    """
    inside = {id(op) for op in ops}
    inputs = list(dict.fromkeys(v for op in ops for v in op.operands if v in env))
    outputs = [r for op in ops for r in op.results if any(id(u) not in inside for u in r.users)]

    def run(*args):
        local = dict(zip(inputs, args))
        for op in ops:
            _run_op(op, local, ctx)
        return [local[r] for r in outputs]

    env.update(zip(outputs, jax.checkpoint(run)(*[env[v] for v in inputs])))


def lower_op(op: Op, args: list, ctx) -> list:
    """The JAX values of ``op``'s results given its operand values."""
    rule = _RULES.get(op.type)
    if rule is not None:
        return rule(op, args, ctx)
    attrs = resolve(kernel_attrs(op.attrs), ctx.dims)
    if op.type.startswith("lax."):
        prim = adapter.lax_primitive(op.type[4:])
        if prim is None:
            raise ValueError(f"unknown JAX primitive '{op.type[4:]}' (op {op.type})")
        out = prim.bind(*adapter.match_varying(args), **attrs)
        return list(out) if prim.multiple_results else [out]
    opdef = registry.get(op.type)
    out = _kernel(op, opdef)(*args, **attrs)
    return list(out) if opdef.multiple_results else [out]


def _kernel(op: Op, opdef) -> Callable:
    """What runs ``op``: its primitive, or the variant its ``kernel`` annotation names."""
    name = op.attrs.get("kernel")
    if name is None:
        return opdef.bind
    if name not in opdef.variants:
        raise ValueError(f"op {op.type}: unknown kernel variant '{name}'; "
                         f"known: {', '.join(sorted(opdef.variants)) or 'none'}")
    return opdef.variants[name]


def _param(op, args, ctx):
    name = op.attrs["name"]
    if name not in ctx.params:
        raise KeyError(f"parameter '{name}' is missing from the params given to the program")
    return [ctx.params[name]]


def _constant(op, args, ctx):
    if "name" in op.attrs:
        return [ctx.constants[op.attrs["name"]]]
    return [np.asarray(op.attrs["value"], jax.numpy.dtype(op.result.type.dtype))]


def _cond(op, args, ctx):
    index, *operands = args
    branches = [lambda *a, b=b: run_block(b, a, ctx) for b in op.blocks]
    return list(lax.switch(index, branches, *operands))


def _while(op, args, ctx):
    cond_block, body_block = op.blocks
    nc, nb = op.attrs["cond_nconsts"], op.attrs["body_nconsts"]
    cconsts, bconsts, init = args[:nc], args[nc:nc + nb], args[nc + nb:]
    out = lax.while_loop(lambda c: run_block(cond_block, [*cconsts, *c], ctx)[0],
                         lambda c: tuple(run_block(body_block, [*bconsts, *c], ctx)),
                         tuple(init))
    return list(out)


def _scan(op, args, ctx):
    (body,) = op.blocks
    nc, ncarry = op.attrs["num_consts"], op.attrs["num_carry"]
    consts, init, xs = args[:nc], args[nc:nc + ncarry], args[nc + ncarry:]

    def step(carry, x):
        res = run_block(body, [*consts, *carry, *x], ctx)
        return tuple(res[:ncarry]), tuple(res[ncarry:])

    length = resolve(op.attrs["length"], ctx.dims)
    carry, ys = lax.scan(step, tuple(init), tuple(xs), length=length,
                         reverse=op.attrs["reverse"], unroll=op.attrs["unroll"])
    return [*carry, *ys]


def _dim_as_value(op, args, ctx):
    dim = resolve(op.attrs["dim"], ctx.dims)
    if isinstance(dim, int):  # a size known at run time is a constant (its primitive only lowers symbols)
        return [np.asarray(dim, jax.numpy.dtype(op.result.type.dtype))]
    return [adapter.lax_primitive("dim_as_value").bind(dim=dim)]


_RULES: dict[str, Callable] = {"param": _param, "constant": _constant, "cond": _cond,
                               "while": _while, "scan": _scan, "lax.dim_as_value": _dim_as_value}

