"""Lowering: run a Program by interpreting its ops with JAX.

Called under ``jax.jit`` (``prog(x)``) the interpreter runs once, at trace time, and emits
the same primitives the captured function did, so XLA compiles the same program. Under
``jax.grad`` it is an ordinary JAX function. Consecutive ops marked ``remat_segment=k`` (by
the ``remat`` pass) run as one ``jax.checkpoint`` function, recomputed in the backward pass;
marked ``remat_offload`` too, the segment's inputs wait for the backward pass in host memory.
An op marked ``kernel="name"`` (by the ``autotune`` pass) runs its registered variant of that
name inline instead of binding the op's primitive. Ops holding a custom derivative rule
(``custom_jvp``, ``custom_vjp``) run as ``jax.custom_jvp`` / ``jax.custom_vjp`` functions, so
JAX differentiates them with the captured rule.

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
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero, zero_from_primal

from paddlejax import adapter
from paddlejax.ir.attrs import dim_symbols, eval_dim, kernel_attrs, resolve
from paddlejax.ir.core import Block, Op, Program, TensorType
from paddlejax.ops import registry


class Context:
    """What ops read besides their operands: parameters, constants and solved symbolic sizes."""

    def __init__(self, params, constants, dims):
        self.params = params
        self.constants = constants
        self.dims = dims


# NumPy's 64-bit defaults and the 32-bit types JAX computes in while 64-bit mode is off
_NARROWED = {"float64": "float32", "int64": "int32", "uint64": "uint32", "complex128": "complex64"}


def dtype_name(x) -> str:
    """The dtype name of an input: an array's, or what NumPy makes of a scalar or list."""
    try:
        return np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).name
    except TypeError:  # e.g. a PRNG key's dtype, which no program input declares
        return str(x.dtype)


def input_dtype(declared: str, got: str) -> str | None:
    """The dtype a program input declared ``declared`` takes an input of dtype ``got`` as.

    One rule for :meth:`Program.__call__`, :meth:`Program.apply` and the inference
    :class:`~paddlejax.inference.Predictor`: an input of the declared dtype is taken as it is;
    one of its 64-bit twin (float64 for float32, int64 for int32, uint64 for uint32,
    complex128 for complex64: NumPy's defaults) is cast to the declared dtype, as ``jax.jit``
    casts NumPy arrays; any other dtype is refused (``None``): no silent change of kind or
    of a reduced precision.

    >>> input_dtype("float32", "float64"), input_dtype("float32", "int32"), input_dtype("bfloat16", "float64")
    ('float32', None, None)
    """
    want = jax.dtypes.canonicalize_dtype(declared).name
    return want if got == want or _NARROWED.get(got) == want else None


def bind_inputs(program: Program, inputs: tuple) -> tuple[list, dict]:
    """Flatten ``inputs``, check them against the program's input types (casting 64-bit twins
    of the declared dtypes, see :func:`input_dtype`), and solve symbolic sizes."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(inputs))
    if not same_structure(tree, program.in_tree):
        raise TypeError(f"{program.name}: expects inputs structured as {program.in_tree}, got {tree}")
    dims: dict[str, Any] = {}
    for i, (value, x) in enumerate(zip(program.inputs, leaves)):
        got = TensorType(tuple(x.shape) if hasattr(x, "shape") else np.shape(x), dtype_name(x))
        want = value.type
        dtype = input_dtype(want.dtype, got.dtype)
        ok = dtype is not None and len(got.shape) == len(want.shape)
        for w, g in zip(want.shape, got.shape) if ok else ():
            if isinstance(w, int):
                ok &= (w == g)
            elif w.isidentifier():
                ok &= dims.setdefault(w, g) is g or dims[w] == g
            else:  # an expression such as 32*h: solved for its one symbol, then checked
                ok &= _solve_dim(w, g, dims)
        if not ok:
            raise ValueError(f"{program.name}: input '{value.name}' expects {want}, got "
                             f"{got}")
        if got.dtype != dtype:
            leaves[i] = x.astype(dtype) if hasattr(x, "astype") else np.asarray(x, dtype)
    return leaves, dims


def _solve_dim(expr: str, size, dims: dict) -> bool:
    """Bind the one unbound symbol of a linear size expression (``32*h``, ``2*s + 1``) so that
    it equals ``size``; False when no whole, positive value does or the bound ones disagree.

    >>> env = {}; _solve_dim("32*h", 320, env), env
    (True, {'h': 10})
    >>> _solve_dim("32*w", 100, env)
    False
    """
    unbound = sorted(dim_symbols(expr) - set(dims))
    if len(unbound) == 1 and isinstance(size, (int, np.integer)):
        s = unbound[0]
        at0, at1 = eval_dim(expr, {**dims, s: 0}), eval_dim(expr, {**dims, s: 1})
        slope = at1 - at0
        if slope == 0 or (size - at0) % slope or (size - at0) // slope < 1:
            return False
        dims[s] = int((size - at0) // slope)
    elif unbound:
        return True  # several unknowns (or a traced size): jax checks the shapes when it runs
    return eval_dim(expr, dims) == size


def same_structure(got, expected) -> bool:
    """Whether pytree structure ``got`` is ``expected``, a named tuple matching by its name and
    fields (a loaded program whose named tuple class was not imported holds a stand-in).

    >>> import collections, jax
    >>> Point = collections.namedtuple("Point", "x y")
    >>> Stand = collections.namedtuple("Point", "x y")
    >>> same_structure(jax.tree_util.tree_structure(Point(1, 2)), jax.tree_util.tree_structure(Stand(1, 2)))
    True
    """
    return got == expected or _structure(got) == _structure(expected)


def _structure(tree):
    """A pytree structure with named tuple classes known by their name and fields: a loaded
    program whose named tuple class was not imported holds a stand-in of the same shape."""
    data = tree.node_data()
    if data is None:
        return None
    kind, aux = data
    if isinstance(getattr(kind, "_fields", None), tuple) and issubclass(kind, tuple):
        kind, aux = ("namedtuple", kind.__name__, kind._fields), None
    return kind, aux, tuple(_structure(c) for c in tree.children())


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


# the name the inputs of an offloaded remat segment carry for the checkpoint policy
_OFFLOADED = "paddlejax_offloaded"
_OFFLOAD_POLICY = jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=[], names_which_can_be_offloaded=[_OFFLOADED],
    offload_src="device", offload_dst="pinned_host")


def _run_remat_segment(ops: list[Op], env: dict, ctx) -> None:
    """Run consecutive ops marked with one ``remat_segment`` inside one ``jax.checkpoint``.

    Under ``jax.grad`` only the segment's inputs are kept for the backward pass; the values
    computed inside are recomputed there. Under ``remat_offload`` the activations among the
    inputs (values ops compute: not the program's inputs, parameters or constants, which are
    held anyway) are kept as host-memory copies: named inside the
    checkpoint, so that the policy offloads the names and the backward pass reads them back.
    """
    inside = {id(op) for op in ops}
    inputs = list(dict.fromkeys(v for op in ops for v in op.operands if v in env))
    outputs = [r for op in ops for r in op.results if any(id(u) not in inside for u in r.users)]
    offload = ops[0].attrs.get("remat_offload", False)
    offloaded = [offload and isinstance(v.owner, Op) and v.owner.type not in ("param", "constant") for v in inputs]

    def run(*args):
        args = [checkpoint_name(a, _OFFLOADED) if off else a for a, off in zip(args, offloaded)]
        local = dict(zip(inputs, args))
        for op in ops:
            _run_op(op, local, ctx)
        return [local[r] for r in outputs]

    policy = _OFFLOAD_POLICY if offload else None
    env.update(zip(outputs, jax.checkpoint(run, policy=policy)(*[env[v] for v in inputs])))


def lower_op(op: Op, args: list, ctx) -> list:
    """The JAX values of ``op``'s results given its operand values."""
    rule = _RULES.get(op.type)
    if rule is not None:
        return rule(op, args, ctx)
    attrs = resolve(kernel_attrs(op.attrs), ctx.dims)
    if op.type.startswith("lax."):
        if adapter.lax_primitive(op.type[4:]) is None:
            raise ValueError(f"unknown JAX primitive '{op.type[4:]}' (op {op.type})")
        return adapter.bind_lax(op.type[4:], args, attrs)
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
    """``lax.while_loop`` of the cond and body blocks. A cond block may return a predicate per
    row (``vmap`` of a loop whose condition depends on the row): the loop then runs while any
    row's holds, and a row whose predicate fails keeps its carried values, as JAX's own
    lowering of a batched predicate does."""
    cond_block, body_block = op.blocks
    nc, nb = op.attrs["cond_nconsts"], op.attrs["body_nconsts"]
    cconsts, bconsts, init = args[:nc], args[nc:nc + nb], args[nc + nb:]
    rows = len(cond_block.results[0].type.shape)

    def pred(c):
        return run_block(cond_block, [*cconsts, *c], ctx)[0]

    def body(c):
        new = run_block(body_block, [*bconsts, *c], ctx)
        if not rows:
            return tuple(new)
        p = pred(c)
        return tuple(lax.select(lax.broadcast_in_dim(p, jax.numpy.shape(n), tuple(range(rows))), n, old)
                     for n, old in zip(new, c))

    out = lax.while_loop(lambda c: lax.reduce_or(pred(c), tuple(range(rows))) if rows else pred(c),
                         body, tuple(init))
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


def _reduce(op, args, ctx):
    """``lax.reduce`` with the computation block as its reducer."""
    (block,) = op.blocks
    n = len(args) // 2
    dims = op.attrs["dimensions"]
    if n == 1:
        return [lax.reduce(args[0], args[1], lambda a, b: run_block(block, [a, b], ctx)[0], dims)]
    out = lax.reduce(tuple(args[:n]), tuple(args[n:]), lambda a, b: tuple(run_block(block, [*a, *b], ctx)), dims)
    return list(out)


def _custom_linear_solve(op, args, ctx):
    """``custom_linear_solve`` of the blocks (``matvec``, ``solve`` and, for reverse-mode
    gradients, ``vecmat`` and ``transpose_solve``), so JAX differentiates it implicitly."""
    functions = {b.name: (lambda *a, b=b: run_block(b, list(a), ctx)) for b in op.blocks}
    return adapter.bind_linear_solve(args, op.attrs["const_lengths"], functions)


def _custom_jvp(op, args, ctx):
    """``jax.custom_jvp`` of the primal block with the jvp block as its rule.

    The rule block takes the primal inputs and the tangents of the differentiable ones and
    returns the outputs and the tangents of those not in ``zero_tangents``.
    """
    primal, rule = op.blocks
    nc = op.attrs["num_consts"]
    consts, n_out = args[:nc], len(op.results)
    zero = set(op.attrs.get("zero_tangents", ()))
    has_tangent = [adapter.differentiable(v.type.dtype) for v in op.operands[nc:]]

    @jax.custom_jvp
    def fn(*xs):
        return tuple(run_block(primal, [*consts, *xs], ctx))

    def jvp(primals, tangents):
        dense = [jax.numpy.zeros_like(x) if isinstance(t, SymbolicZero) else t
                 for x, t, d in zip(primals, tangents, has_tangent) if d]
        out = run_block(rule, [*primals, *dense], ctx)
        nonzero = iter(out[n_out:])
        return tuple(out[:n_out]), tuple(zero_from_primal(y, symbolic_zeros=True) if i in zero else next(nonzero)
                                         for i, y in enumerate(out[:n_out]))

    fn.defjvp(jvp, symbolic_zeros=True)
    return list(fn(*args[nc:]))


def _custom_vjp(op, args, ctx):
    """``jax.custom_vjp`` of the primal block with the fwd and bwd blocks as its rule.

    The fwd block returns ``(*residuals, *outputs)``; the bwd block takes the residuals and
    the cotangents of the differentiable outputs and returns those of the differentiable
    inputs (the others get none).
    """
    primal, fwd_block, bwd_block = op.blocks
    nc = op.attrs["num_consts"]
    consts, n_res = args[:nc], len(fwd_block.results) - len(op.results)
    in_diff = [adapter.differentiable(v.type.dtype) for v in op.operands[nc:]]
    out_diff = [adapter.differentiable(r.type.dtype) for r in op.results]

    @jax.custom_vjp
    def fn(*xs):
        return tuple(run_block(primal, [*consts, *xs], ctx))

    def fwd(*xs):
        out = run_block(fwd_block, list(xs), ctx)
        return tuple(out[n_res:]), tuple(out[:n_res])

    def bwd(res, cts):
        grads = iter(run_block(bwd_block, [*res, *(c for c, d in zip(cts, out_diff) if d)], ctx))
        return tuple(next(grads) if d else None for d in in_diff)

    fn.defvjp(fwd, bwd)
    return list(fn(*args[nc:]))


def _dim_as_value(op, args, ctx):
    dim = resolve(op.attrs["dim"], ctx.dims)
    if isinstance(dim, int):  # a size known at run time is a constant (its primitive only lowers symbols)
        return [np.asarray(dim, jax.numpy.dtype(op.result.type.dtype))]
    return [adapter.lax_primitive("dim_as_value").bind(dim=dim)]


_RULES: dict[str, Callable] = {"param": _param, "constant": _constant, "cond": _cond,
                               "while": _while, "scan": _scan, "custom_jvp": _custom_jvp,
                               "custom_vjp": _custom_vjp, "lax.dim_as_value": _dim_as_value,
                               "reduce": _reduce, "custom_linear_solve": _custom_linear_solve}

