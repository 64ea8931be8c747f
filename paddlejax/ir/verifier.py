"""The verifier: structure, use lists and types, re-inferred through the op registry.

Every result type is recomputed from the operand types (``jax.eval_shape`` of the op's
kernel or primitive, symbolic sizes included) and compared with the recorded one. Errors
name the op by position, type and source line.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(x), jnp.ones(3))
>>> prog.verify()                       # silent when the program is well formed
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from paddlejax import adapter
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Block, Op, Program, TensorType, Value
from paddlejax.ops.sharding import sharding_problem

STRUCTURAL = ("param", "constant", "return", "cond", "while", "scan", "custom_jvp", "custom_vjp", "reduce",
              "custom_linear_solve")


class VerificationError(ValueError):
    """The program is malformed; the message names the op."""


def _describe(op: Op, index: int) -> str:
    loc = f" ({op.loc})" if op.loc else ""
    return f"op #{index} '{op.type}'{loc}"


class Shapes:
    """Symbolic sizes shared by all types of one program."""

    def __init__(self, program: Program):
        self.scope = jax.export.SymbolicScope()
        self.env: dict = {}
        symbols = set()
        for v in program.inputs:
            for d in v.type.shape:
                if isinstance(d, str):
                    symbols |= attrs_lib.dim_symbols(d)
        if symbols:
            names = sorted(symbols)
            dims = jax.export.symbolic_shape(",".join(names), scope=self.scope)
            self.env = dict(zip(names, dims))

    def struct(self, t: TensorType):
        shape = tuple(d if isinstance(d, int) else attrs_lib.eval_dim(d, self.env) for d in t.shape)
        return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(t.dtype))


def infer_types(op: Op, in_types: list[TensorType], shapes: "Shapes") -> list[TensorType]:
    """Result types of a registry or lax op with operands of ``in_types``."""
    attrs = attrs_lib.resolve(attrs_lib.kernel_attrs(op.attrs), shapes.env)
    if op.type.startswith("lax."):
        name = op.type[4:]
        if adapter.lax_primitive(name) is None:
            raise VerificationError(f"unknown JAX primitive '{name}'")
        multiple = adapter.lax_primitive(name).multiple_results

        def fn(*args):
            out = adapter.bind_lax(name, args, attrs)
            return out if multiple else out[0]
    else:
        from paddlejax.ops import registry

        opdef = registry.lookup(op.type)
        if opdef is None:
            raise VerificationError(f"unknown op type '{op.type}'")
        attrs = opdef.check_attrs(attrs)
        opdef.check_inputs([shapes.struct(t) for t in in_types])
        fn = functools.partial(opdef.bind, **attrs)
        multiple = opdef.multiple_results
    out = jax.eval_shape(fn, *[shapes.struct(t) for t in in_types])
    if op.type == "lax.reshape" and in_types[0].is_static and out.size != in_types[0].size:
        # lax's abstract rule for reshape leaves the element count to lowering
        raise VerificationError(f"reshape of {in_types[0]} ({in_types[0].size} elements) to "
                                f"{tuple(out.shape)} ({out.size} elements)")
    return [TensorType.of(o) for o in (out if multiple else [out])]


class _Verifier:
    def __init__(self, program: Program):
        self.program = program
        self.shapes = Shapes(program)
        self.index = 0

    def block(self, block: Block, expect_args=None) -> None:
        defined: set[Value] = set(block.args)
        if expect_args is not None:
            got = [a.type for a in block.args]
            if got != list(expect_args):
                raise VerificationError(f"block '{block.name}' has arguments {_types(got)}, "
                                        f"expected {_types(expect_args)}")
        if not block.ops or block.ops[-1].type != "return":
            raise VerificationError(f"block '{block.name}' does not end in return")
        for op in block.ops:
            idx = self.index
            self.index += 1
            where = _describe(op, idx)
            if op.parent is not block:
                raise VerificationError(f"{where}: parent link is broken")
            if op.type == "return" and op is not block.ops[-1]:
                raise VerificationError(f"{where}: return before the end of block '{block.name}'")
            for i, v in enumerate(op.operands):
                if v not in defined:
                    raise VerificationError(f"{where}: operand {i} is used before it is defined "
                                            "(or comes from another block)")
                if (op, i) not in v.uses:
                    raise VerificationError(f"{where}: operand {i} is missing from its use list")
            for r in op.results:
                for user, i in r.uses:
                    if i >= len(user.operands) or user.operands[i] is not r:
                        raise VerificationError(f"{where}: stale use of result {r.index} by '{user.type}'")
            try:
                self.check_op(op)
            except VerificationError as e:
                raise VerificationError(f"{where}: {e}") from None
            except Exception as e:  # a kernel or primitive rejecting its inputs
                raise VerificationError(f"{where}: {type(e).__name__}: {_first_line(e)}") from None
            defined.update(op.results)

    def check_op(self, op: Op) -> None:
        check_attrs(op, len(self.program.inputs) if op.parent is self.program.body else None)
        try:
            attrs_lib.resolve(op.attrs, self.shapes.env)  # symbolic sizes name only the inputs' symbols
        except attrs_lib.AttrError as e:
            raise VerificationError(str(e)) from None
        in_types = [v.type for v in op.operands]
        out_types = [r.type for r in op.results]
        if op.type == "return":
            return
        if op.type == "param":
            self._check_param(op, out_types)
        elif op.type == "constant":
            self._check_constant(op, out_types)
        elif op.type == "cond":
            self._check_cond(op, in_types, out_types)
        elif op.type == "while":
            self._check_while(op, in_types, out_types)
        elif op.type == "scan":
            self._check_scan(op, in_types, out_types)
        elif op.type == "custom_jvp":
            self._check_custom_jvp(op, in_types, out_types)
        elif op.type == "custom_vjp":
            self._check_custom_vjp(op, in_types, out_types)
        elif op.type == "reduce":
            self._check_reduce(op, in_types, out_types)
        elif op.type == "custom_linear_solve":
            self._check_linear_solve(op, in_types, out_types)
        else:
            if op.blocks:
                raise VerificationError(f"only {', '.join(STRUCTURAL[3:])} hold blocks")
            inferred = cached_infer_types(op, in_types, self.shapes)
            if inferred != out_types:
                raise VerificationError(f"results are {_types(out_types)} but the inputs give "
                                        f"{_types(inferred)}")

    def _check_param(self, op, out_types):
        name = op.attrs.get("name")
        if op.operands or len(out_types) != 1 or not isinstance(name, str):
            raise VerificationError("a param has no operands, one result and a name")
        if name not in self.program.params:
            raise VerificationError(f"parameter '{name}' has no value")
        want = TensorType.of(self.program.params[name])
        if want != out_types[0]:
            raise VerificationError(f"parameter '{name}' is {want} but the program says {out_types[0]}")
        unknown = sorted(set(op.attrs) - {"name", "sharding"})
        if unknown:
            raise VerificationError(f"parameter '{name}' has unknown attributes {unknown}; a param takes only "
                                    "sharding")
        if "sharding" in op.attrs:
            problem = sharding_problem(op.attrs["sharding"], len(want.shape))
            if problem:
                raise VerificationError(f"parameter '{name}': sharding {problem}")

    def _check_constant(self, op, out_types):
        if op.operands or len(out_types) != 1:
            raise VerificationError("a constant has no operands and one result")
        if "name" in op.attrs:
            name = op.attrs["name"]
            if name not in self.program.constants:
                raise VerificationError(f"constant '{name}' has no value")
            want = TensorType.of(self.program.constants[name])
            if want != out_types[0]:
                raise VerificationError(f"constant '{name}' is {want} but the program says {out_types[0]}")
            return
        value = op.attrs.get("value")
        if not isinstance(value, (bool, int, float)) or out_types[0].shape != ():
            raise VerificationError("an inline constant is a scalar bool, int or float")
        np.asarray(value, jax.numpy.dtype(out_types[0].dtype))

    def _check_cond(self, op, in_types, out_types):
        if not op.blocks or not in_types or in_types[0] != TensorType((), "int32"):
            raise VerificationError("cond takes an i32[] index and at least one branch")
        for b in op.blocks:
            self.block(b, in_types[1:])
            self._results(b, out_types)

    def _check_while(self, op, in_types, out_types):
        nc, nb = op.attrs.get("cond_nconsts"), op.attrs.get("body_nconsts")
        if len(op.blocks) != 2 or not _count(nc) or not _count(nb) or nc + nb > len(in_types):
            raise VerificationError("while takes cond and body blocks and valid const counts")
        carry = in_types[nc + nb:]
        self.block(op.blocks[0], in_types[:nc] + carry)
        # a predicate per row (vmap of a loop) covers the leading axes of every carried value
        pred = [v.type for v in op.blocks[0].results]
        if len(pred) != 1 or pred[0].dtype != "bool" or any(t.shape[:len(pred[0].shape)] != pred[0].shape
                                                            for t in carry):
            raise VerificationError(f"block 'cond' returns {_types(pred)}, expected (bool[]) or a bool per "
                                    "row of the carried values")
        self.block(op.blocks[1], in_types[nc:nc + nb] + carry)
        self._results(op.blocks[1], carry)
        if out_types != carry:
            raise VerificationError("while results must match its carried values")

    def _check_scan(self, op, in_types, out_types):
        a = op.attrs
        nc, ncarry, length = a.get("num_consts"), a.get("num_carry"), a.get("length")
        if len(op.blocks) != 1 or not _count(nc) or not _count(ncarry) \
                or nc + ncarry > len(in_types) or not isinstance(a.get("reverse"), bool):
            raise VerificationError("scan takes one body block and valid counts")
        unroll = a.get("unroll")
        if not (isinstance(unroll, bool) or (isinstance(unroll, int) and 1 <= unroll < 2 ** 31)):
            raise VerificationError(f"scan unroll must be true, false or an int >= 1, not {unroll!r}")
        if not (isinstance(length, attrs_lib.SymDim) or (isinstance(length, int) and not isinstance(length, bool)
                                                         and 0 <= length < 2 ** 62)):
            raise VerificationError(f"scan length must be a dimension, not {length!r}")
        length = length.expr if isinstance(length, attrs_lib.SymDim) else length
        xs = in_types[nc + ncarry:]
        if any(not t.shape or t.shape[0] != length for t in xs):
            raise VerificationError(f"scanned inputs must have leading size {length}")
        carry = in_types[nc:nc + ncarry]
        self.block(op.blocks[0], in_types[:nc] + carry + [TensorType(t.shape[1:], t.dtype) for t in xs])
        body_out = [v.type for v in op.blocks[0].results]
        if body_out[:ncarry] != carry:
            raise VerificationError(f"scan body returns carry {_types(body_out[:ncarry])}, expected {_types(carry)}")
        ys = [TensorType((length, *t.shape), t.dtype) for t in body_out[ncarry:]]
        if out_types != carry + ys:
            raise VerificationError(f"scan results are {_types(out_types)}, expected {_types(carry + ys)}")

    def _check_reduce(self, op, in_types, out_types):
        dims = op.attrs.get("dimensions")
        n = len(in_types) // 2
        if len(op.blocks) != 1 or not n or 2 * n != len(in_types) or not isinstance(dims, tuple) \
                or not all(_count(d) for d in dims):
            raise VerificationError("reduce takes operands and as many init values, a computation block "
                                    "and a tuple of dimensions")
        operands, inits = in_types[:n], in_types[n:]
        rank = len(operands[0].shape)
        if len(set(dims)) != len(dims) or any(d >= rank for d in dims):
            raise VerificationError(f"reduce dimensions {dims} are not distinct axes of {operands[0]}")
        if any(t.shape != operands[0].shape for t in operands) or any(t.shape != () for t in inits) \
                or [t.dtype for t in operands] != [t.dtype for t in inits]:
            raise VerificationError("reduce operands share one shape, and each init value is a scalar of "
                                    "its operand's dtype")
        self.block(op.blocks[0], inits + inits)
        self._results(op.blocks[0], inits)
        kept = tuple(d for i, d in enumerate(operands[0].shape) if i not in dims)
        want = [TensorType(kept, t.dtype) for t in operands]
        if out_types != want:
            raise VerificationError(f"reduce results are {_types(out_types)}, expected {_types(want)}")

    def _check_linear_solve(self, op, in_types, out_types):
        from paddlejax.adapter import LINEAR_SOLVE_PARTS

        lengths = op.attrs.get("const_lengths")
        names = [b.name for b in op.blocks]
        if not (isinstance(lengths, tuple) and len(lengths) == 4 and all(_count(n) for n in lengths)
                and sum(lengths) <= len(in_types)):
            raise VerificationError("custom_linear_solve takes const_lengths: four counts of constants "
                                    "within its operands")
        if names not in (["matvec", "solve"], list(LINEAR_SOLVE_PARTS)):
            raise VerificationError(f"custom_linear_solve holds blocks (matvec, solve) or "
                                    f"{LINEAR_SOLVE_PARTS}, not {tuple(names)}")
        b = in_types[sum(lengths):]
        start = 0
        for part, n in zip(LINEAR_SOLVE_PARTS, lengths):
            consts, start = in_types[start:start + n], start + n
            if part in names:
                block = op.blocks[names.index(part)]
                self.block(block, consts + b)
                got = [v.type for v in block.results]
                linear_map = part in ("matvec", "vecmat")  # the solves may add auxiliary outputs
                if got[:len(b)] != b or (linear_map and len(got) != len(b)):
                    raise VerificationError(f"block '{part}' returns {_types(got)}, expected {_types(b)}"
                                            + ("" if linear_map else " and any auxiliary values"))
            elif n:
                raise VerificationError(f"custom_linear_solve has {n} constants for its missing '{part}' block")
        solve = [v.type for v in op.blocks[names.index("solve")].results]
        if out_types != solve:
            raise VerificationError(f"custom_linear_solve results are {_types(out_types)}, expected "
                                    f"{_types(solve)}")

    def _primal(self, op, in_types, out_types, n_blocks) -> list[TensorType]:
        """Check the counts and the primal block of a custom derivative op; its primal inputs."""
        nc = op.attrs.get("num_consts")
        if len(op.blocks) != n_blocks or not isinstance(nc, int) or isinstance(nc, bool) \
                or not 0 <= nc <= len(in_types):
            raise VerificationError(f"{op.type} takes {n_blocks} blocks and a num_consts of at most "
                                    f"{len(in_types)} (its operand count)")
        self.block(op.blocks[0], in_types)
        self._results(op.blocks[0], out_types)
        return in_types[nc:]

    def _check_custom_jvp(self, op, in_types, out_types):
        xs = self._primal(op, in_types, out_types, 2)
        zero = op.attrs.get("zero_tangents", ())
        if not isinstance(zero, tuple) or any(not isinstance(i, int) or not 0 <= i < len(out_types) for i in zero):
            raise VerificationError(f"zero_tangents must be a tuple of output indices below {len(out_types)}")
        tangents = [t for i, t in enumerate(out_types) if i not in zero]
        if any(not _differentiable(t) for t in tangents):
            raise VerificationError("an output without tangents (integer or bool) must be listed in zero_tangents")
        self.block(op.blocks[1], xs + [t for t in xs if _differentiable(t)])
        self._results(op.blocks[1], out_types + tangents)

    def _check_custom_vjp(self, op, in_types, out_types):
        xs = self._primal(op, in_types, out_types, 3)
        fwd, bwd = op.blocks[1:]
        self.block(fwd, xs)
        n_res = len(fwd.results) - len(out_types)
        got = [v.type for v in fwd.results]
        if n_res < 0 or got[n_res:] != out_types:
            raise VerificationError(f"block 'fwd' returns {_types(got)}, expected residuals and then "
                                    f"{_types(out_types)}")
        self.block(bwd, got[:n_res] + [t for t in out_types if _differentiable(t)])
        self._results(bwd, [t for t in xs if _differentiable(t)])

    def _results(self, block, expected):
        got = [v.type for v in block.results]
        if got != list(expected):
            raise VerificationError(f"block '{block.name}' returns {_types(got)}, expected {_types(expected)}")


def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def check_attrs(op: Op, num_inputs: int | None = None) -> None:
    """Check the attributes ``op`` carries beyond its types: a generic ``lax.*`` op's parameters
    against :mod:`paddlejax.ops.lax_params`, and the pass annotations (``kernel`` names a
    variant of the op, ``remat_segment`` is a segment number that ``remat_offload`` may mark
    offloaded, ``donate`` lists distinct inputs
    of the program, of which there are ``num_inputs`` when ``op`` is the main block's return).

    >>> import paddlejax as pj
    >>> check_attrs(pj.ir.Op("lax.cumsum", [], [], {"axis": 0, "reverse": 1}))
    Traceback (most recent call last):
    ...
    paddlejax.ir.verifier.VerificationError: attribute 'reverse' must be true or false, not 1
    """
    from paddlejax.ops import lax_params, registry

    attrs = op.attrs
    if op.type.startswith("lax."):
        try:
            lax_params.check(op.type[4:], attrs_lib.kernel_attrs(attrs))
        except lax_params.ParamError as e:
            raise VerificationError(str(e)) from None
    if "kernel" in attrs:
        opdef = registry.lookup(op.type)
        variants = sorted(opdef.variants) if opdef is not None else []
        if attrs["kernel"] not in variants:
            raise VerificationError(f"kernel {attrs['kernel']!r} is not a variant of {op.type} "
                                    f"(known: {', '.join(variants) or 'none'})")
    if "remat_segment" in attrs and not (_count(attrs["remat_segment"]) and attrs["remat_segment"] < 2 ** 31):
        raise VerificationError(f"remat_segment must be an int >= 0, not {attrs['remat_segment']!r}")
    if "remat_offload" in attrs and (attrs["remat_offload"] is not True or "remat_segment" not in attrs):
        raise VerificationError(f"remat_offload must be true and only on an op with a remat_segment, "
                                f"not {attrs['remat_offload']!r}")
    if "donate" in attrs:
        donate = attrs["donate"]
        if op.type != "return" or num_inputs is None:
            raise VerificationError("only the main block's return carries a donate annotation")
        if (not isinstance(donate, tuple) or not all(_count(i) and i < num_inputs for i in donate)
                or len(set(donate)) != len(donate)):
            raise VerificationError(f"donate must list distinct input positions below {num_inputs}, "
                                    f"not {donate!r}")


_CACHE: dict = {}


def cached_infer_types(op: Op, in_types: list[TensorType], shapes: "Shapes") -> list[TensorType]:
    """:func:`infer_types`, remembered by op type, attributes and operand types: a program
    rewritten many times over (pruning tries ratio after ratio) infers each op once.

    >>> import paddlejax as pj
    >>> prog = pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((2, 3)))
    >>> op = next(o for o in prog.walk() if o.type == "relu")
    >>> cached_infer_types(op, [v.type for v in op.operands], Shapes(prog)) == [op.results[0].type]
    True
    """
    try:
        key = (op.type, tuple(sorted(op.attrs.items())), tuple(in_types),
               tuple(sorted(shapes.env)))
        hash(key)
    except TypeError:
        return infer_types(op, in_types, shapes)
    if key not in _CACHE:
        if len(_CACHE) > 50_000:
            _CACHE.clear()
        _CACHE[key] = infer_types(op, in_types, shapes)
    return _CACHE[key]


def _differentiable(t: TensorType) -> bool:
    return adapter.differentiable(jax.numpy.dtype(t.dtype))


def _types(ts) -> str:
    return "(" + ", ".join(str(t) for t in ts) + ")"


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def verify(program: Program) -> None:
    """Check ``program``; raise :class:`VerificationError` on the first problem."""
    v = _Verifier(program)
    if program.body.parent is not program:
        raise VerificationError("program body is detached")
    v.block(program.body)
    if len(program.outputs) != program.out_tree.num_leaves:
        raise VerificationError(f"program returns {len(program.outputs)} values but its output "
                                f"structure has {program.out_tree.num_leaves}")
    if len(program.inputs) != program.in_tree.num_leaves:
        raise VerificationError(f"program takes {len(program.inputs)} inputs but its input "
                                f"structure has {program.in_tree.num_leaves}")

