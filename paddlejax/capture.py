"""Capture: turn a JAX function or a Flax NNX module into a :class:`~paddlejax.ir.Program`.

``trace`` runs ``jax.make_jaxpr`` over (parameters, inputs) and converts the jaxpr: our
primitives become registry ops, other JAX primitives become generic ``lax.*`` ops carrying
their parameters, nested calls (``jit``) are inlined, ``jax.checkpoint`` is inlined as a remat
segment, and ``cond``/``while``/``scan``, ``lax.reduce`` with a custom computation and
``custom_linear_solve`` (``jnp.linalg.solve``, ``inv``) become ops with sub-blocks. Jaxprs a
primitive carries but that follow from its name (a combining scatter's update function) are
left out and rebuilt when the program runs. Typed PRNG keys are held by their raw data
(``uint32[..., 2]``) and jax.random's key operations by their computation on it, so raw keys
go into ``jax.random`` functions as data; the program's own inputs and outputs are never
typed keys. Functions with custom derivative rules (``jax.custom_jvp``,
``jax.custom_vjp``) become ``custom_jvp`` / ``custom_vjp`` ops holding the primal
computation and the rule as sub-blocks, so gradients of the program use the rule. A rule
usually calls its own function again (``jax.nn.relu``'s rule computes ``relu(x)``), which
JAX expands lazily; the program keeps rules of functions called inside rules two levels
deep, so first and second derivatives use the rules, and inlines deeper calls.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: jnp.tanh(x) + 1.0, pj.InputSpec((None, 3)))
>>> print(prog.inputs[0].type)
f32[b,3]
"""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import jax
import numpy as np

from paddlejax import adapter
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Block, Op, Program, TensorType, Value, program_of
from paddlejax.ops import registry


class CaptureError(ValueError):
    """A construct the IR cannot represent; the message names the source line."""


class CaptureWarning(UserWarning):
    """Capture kept a function's values but not its custom derivative rule; the message names
    the function and the source line.

    >>> import warnings, jax, jax.numpy as jnp, paddlejax as pj
    >>> f = jax.custom_vjp(lambda x: x)
    >>> f.defvjp(lambda x: (x, x), lambda x, g: (g if float(x) > 0 else -g,))  # needs a value
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     prog = pj.trace(f, jnp.ones(()))
    >>> [w.category.__name__ for w in caught]
    ['CaptureWarning']
    """


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """Shape and dtype of an input; ``None`` or a name in ``shape`` is a symbolic size.

    ``None`` on the first axis is the batch size ``b``, shared by all inputs; ``None`` on axis
    ``i > 0`` is the size ``d<i>`` (a sequence length: ``(None, None)`` is ``(b, d1)``), shared
    by the inputs that leave that axis open; strings name sizes explicitly (``"b"`` for the batch
    size elsewhere, as in an RNN state ``(layers, "b", hidden)``).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> pj.trace(lambda ids: ids * 2, InputSpec((None, None), "int32")).inputs[0].type.shape
    ('b', 'd1')
    """

    shape: tuple
    dtype: Any = "float32"
    name: str | None = None


def input_structs(leaves) -> list:
    """``jax.ShapeDtypeStruct``s for inputs given as :class:`InputSpec`, structs or arrays,
    their symbolic sizes in one shared scope (so ``b`` is one size across inputs).

    >>> [s.shape for s in input_structs([InputSpec((None, 3)), jax.numpy.ones((2,))])]
    [(b, 3), (2,)]
    """
    specs = []
    needs_scope = False
    for x in leaves:
        if isinstance(x, InputSpec):
            dims = tuple(("b" if i == 0 else f"d{i}") if d is None else d for i, d in enumerate(x.shape))
            needs_scope |= any(isinstance(d, str) for d in dims)
            specs.append((dims, jax.numpy.dtype(x.dtype)))
        elif isinstance(x, jax.ShapeDtypeStruct):
            specs.append((tuple(x.shape), x.dtype))
        else:
            arr = np.asarray(x) if not isinstance(x, jax.Array) else x
            specs.append((tuple(arr.shape), arr.dtype))
    scope = jax.export.SymbolicScope() if needs_scope else None
    out = []
    for dims, dtype in specs:
        if any(isinstance(d, str) for d in dims):
            dims = jax.export.symbolic_shape(", ".join(str(d) for d in dims), scope=scope)
        out.append(jax.ShapeDtypeStruct(dims, dtype))
    return out


def _path_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


def _is_numeric(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _module_function(module):
    """``(call(params, *inputs), params)`` for an NNX module; parameters named by path."""
    from flax import nnx

    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    names = [_path_name(p) for p, _ in leaves]
    variables = [v for _, v in leaves]
    # a module may also hold plain arrays (not Variables): they are state too
    values = [v.get_value() if isinstance(v, nnx.Variable) else v for v in variables]
    params = {n: x for n, x in zip(names, values) if _is_numeric(x)}
    shardings = {n: spec for n, v in zip(names, variables) if n in params and (spec := variable_sharding(v))}

    def call(p, *inputs):
        new = [v if n not in p else v.replace(p[n]) if isinstance(v, nnx.Variable) else p[n]
               for n, v in zip(names, variables)]
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, new))(*inputs)

    return call, params, shardings, type(module).__name__


def variable_sharding(variable) -> tuple | None:
    """The mesh axes an NNX variable's dimensions are split over (Flax's ``out_sharding``
    metadata, as ``nnx.with_partitioning`` and the tensor-parallel layers set it), or None.
    Logical axis names are mapped to mesh axes by Flax's rules: those of the surrounding
    ``nnx.logical_axis_rules`` and the variable's own ``sharding_rules``.

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> variable_sharding(nnx.Param(jnp.ones((2, 4)), out_sharding=(None, "mp"), eager_sharding=False))
    (None, 'mp')
    >>> w = nnx.Param(jnp.ones((2, 4)), out_sharding=("embed", "mlp"), eager_sharding=False)
    >>> with nnx.logical_axis_rules((("embed", None), ("mlp", "mp"))):
    ...     variable_sharding(w)
    (None, 'mp')
    """
    from flax import nnx
    from flax.core import spmd

    if not isinstance(variable, nnx.Variable):
        return None
    metadata = variable.get_metadata()
    spec = next((metadata[k] for k in ("out_sharding", "sharding_names", "sharding") if metadata.get(k)), None)
    if spec is None:
        return None
    rules = spmd.composite_rules(spmd.get_logical_axis_rules(), metadata.get("sharding_rules") or ())
    if rules:
        spec = spmd.from_sharding_rules(spec, rules)
    return tuple(tuple(e) if isinstance(e, list) else e for e in spec)


def _pytree_function(fn, params):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [_path_name(p) for p, _ in leaves]
    if len(set(names)) != len(names):
        raise CaptureError("parameter names collide after flattening; use a dict with unique keys")

    def call(p, *inputs):
        return fn(jax.tree_util.tree_unflatten(treedef, [p[n] for n in names]), *inputs)

    return call, dict(zip(names, (v for _, v in leaves)))


def _arg_names(fn, n: int) -> list[str]:
    try:
        sig = inspect.signature(fn)
        names = [p.name for p in sig.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    if len(names) < n:
        names = ["x"] if n == 1 else [f"x{i}" for i in range(n)]
    return names[:n]


def trace(fn, *example_inputs, params=None, name: str | None = None, shardings: dict | None = None) -> Program:
    """Capture ``fn`` (a function or an ``nnx.Module``) on example inputs as a Program.

    Example inputs may be arrays, ``jax.ShapeDtypeStruct`` or :class:`InputSpec` (with
    symbolic sizes), arranged in any pytree. For a plain function, ``params=tree`` makes
    ``fn(params, *inputs)`` take its parameters from the program, named by their pytree
    path. Arrays the function closes over become constants. ``shardings`` maps parameter names
    to the mesh axes their dimensions are split over (a module's come from its variables'
    ``out_sharding``); the param ops record them.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"] + p["b"], jnp.ones((4, 2)),
    ...                 params={"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
    >>> sorted(prog.params)
    ['b', 'w']
    """
    from flax import nnx

    if isinstance(fn, nnx.Module):
        if params is not None:
            raise TypeError("trace(module, ...) takes its parameters from the module; drop params=")
        call, flat_params, module_shardings, default_name = _module_function(fn)
        shardings = {**module_shardings, **(shardings or {})}
        arg_names = _arg_names(fn.__call__, len(example_inputs))
    elif params is not None:
        call, flat_params = _pytree_function(fn, params)
        default_name = getattr(fn, "__name__", "main")
        arg_names = _arg_names(fn, len(example_inputs) + 1)[1:]
    else:
        call, flat_params = (lambda p, *inputs: fn(*inputs)), {}
        default_name = getattr(fn, "__name__", "main")
        arg_names = _arg_names(fn, len(example_inputs))

    leaves, in_treedef = jax.tree_util.tree_flatten_with_path(tuple(example_inputs),
                                                              is_leaf=lambda x: isinstance(x, InputSpec))
    input_names = [_input_name(p, arg_names, x) for p, x in leaves]
    structs = input_structs([x for _, x in leaves])
    for input_name, struct in zip(input_names, structs):
        if adapter.is_key(struct):
            raise CaptureError(f"input '{input_name}' is a typed PRNG key array, which a program cannot take; pass "
                               "its raw data (jax.random.key_data(key)) and rebuild the key inside the "
                               "function with jax.random.wrap_key_data")
    param_names = list(flat_params)
    out_tree = []

    def flat_fn(param_values, *input_values):
        inputs = jax.tree_util.tree_unflatten(in_treedef, input_values)
        out = call(dict(zip(param_names, param_values)), *inputs)
        flat, tree = jax.tree_util.tree_flatten(out)
        out_tree.append(tree)
        return flat

    param_structs = [jax.ShapeDtypeStruct(np.shape(v), jax.numpy.result_type(v)) for v in flat_params.values()]
    jaxpr, consts = adapter.make_jaxpr(flat_fn, param_structs, *structs)
    unknown = sorted(set(shardings or {}) - set(param_names))
    if unknown:
        raise CaptureError(f"shardings name parameters the function does not have: {unknown[:5]}")
    return _Converter().program(jaxpr, consts, param_names, flat_params, input_names,
                                in_treedef, out_tree[0], name or default_name, shardings or {})


def insert_jaxpr(rewriter, anchor: Op, jaxpr, consts, operands: list[Value]) -> list[Value]:
    """Insert the ops of ``jaxpr`` before ``anchor``; returns the values of its outputs.

    ``operands`` (values defined before ``anchor``) feed the jaxpr's inputs in order;
    ``jaxpr, consts`` come from :func:`paddlejax.adapter.make_jaxpr`. Array constants join the
    program's constants under fresh names. This is how new computation (gradients, for one)
    is spliced into an existing program.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> from paddlejax import adapter
    >>> from paddlejax.ir import Rewriter
    >>> prog = pj.trace(lambda x: x + 1.0, jnp.ones(3))
    >>> jaxpr, consts = adapter.make_jaxpr(jnp.sin, jnp.ones(3))
    >>> ret = prog.body.terminator
    >>> (y,) = insert_jaxpr(Rewriter(prog), ret, jaxpr, consts, [prog.outputs[0]])
    >>> [op.type for op in prog.walk()]
    ['constant', 'lax.add', 'lax.sin', 'return']
    """
    if len(operands) != len(jaxpr.invars):
        raise ValueError(f"insert_jaxpr: the jaxpr takes {len(jaxpr.invars)} inputs, got "
                         f"{len(operands)} operands")
    program = rewriter.program
    # Ops are built in a scratch block over placeholders, then moved and rewired, so that a
    # failed conversion leaves the program untouched.
    scratch = Block([v.type for v in operands])
    converter = _Converter(dict(program.constants))
    env = dict(zip(jaxpr.invars, scratch.args))
    converter._bind_consts(scratch, env, jaxpr.constvars, consts)
    converter._convert(jaxpr, scratch, env)
    outs = [converter._read(scratch, env, v) for v in jaxpr.outvars]
    program.constants.update(converter.constants)
    for op in scratch.ops:
        rewriter.insert_before(anchor, op)
    for placeholder, value in zip(scratch.args, operands):
        rewriter.replace_all_uses_with(placeholder, value)
    real = dict(zip(scratch.args, operands))
    return [real.get(v, v) for v in outs]


def emit(fn, *values):
    """Append to a program the ops computing ``fn(*values)``; returns the new values.

    ``values`` (any pytree of :class:`~paddlejax.ir.Value`) belong to the main block of one
    program; ``fn`` is any JAX function of arrays of their types. Its ops go before the
    program's ``return`` and its results come back as values, structured like ``fn``'s
    output, e.g. to keep building after :func:`paddlejax.autodiff.gradients`.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0, jnp.ones(3))
    >>> total = emit(jnp.sum, prog.outputs[0])
    >>> prog.set_outputs(total)
    >>> float(prog(jnp.arange(3.0)))
    6.0
    """
    from paddlejax.ir.rewriter import Rewriter
    from paddlejax.ir.verifier import Shapes

    leaves, in_tree = jax.tree_util.tree_flatten(values)
    program = program_of(leaves, "emit")
    shapes = Shapes(program)
    out_tree = []

    def flat_fn(*arrays):
        flat, tree = jax.tree_util.tree_flatten(fn(*jax.tree_util.tree_unflatten(in_tree, arrays)))
        out_tree.append(tree)
        return flat

    jaxpr, consts = adapter.make_jaxpr(flat_fn, *[shapes.struct(v.type) for v in leaves])
    outs = insert_jaxpr(Rewriter(program), program.body.terminator, jaxpr, consts, leaves)
    return jax.tree_util.tree_unflatten(out_tree[0], outs)


def _input_name(path, arg_names, x) -> str:
    if isinstance(x, InputSpec) and x.name:
        return x.name
    idx = path[0].idx if path and hasattr(path[0], "idx") else 0
    rest = _path_name(path[1:]) if len(path) > 1 else ""
    base = arg_names[idx] if idx < len(arg_names) else f"arg{idx}"
    return f"{base}.{rest}" if rest else base


# Primitives whose sub-jaxpr is inlined: plain calls and remat (its ops marked as one remat
# segment, see _REMAT). A custom derivative whose rule cannot be captured is inlined too, with
# a CaptureWarning.
_INLINE = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr", "custom_lin": None,
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}


class _Converter:
    """Walks a jaxpr and builds the equivalent blocks of ops."""

    def __init__(self, constants: dict[str, Any] | None = None):
        self.constants: dict[str, Any] = {} if constants is None else constants
        self.rule_depth = 0  # how many custom derivative rules enclose the block being built
        self.remat_segments = 0

    def program(self, jaxpr, consts, param_names, params, input_names, in_tree, out_tree, name, shardings):
        n_params = len(param_names)
        input_vars = jaxpr.invars[n_params:]
        body = Block([_type(v.aval) for v in input_vars], "main", input_names)
        env = dict(zip(input_vars, body.args))
        for var, pname in zip(jaxpr.invars[:n_params], param_names):
            layout = {"sharding": shardings[pname]} if pname in shardings else {}
            env[var] = body.append(Op("param", [], [_type(var.aval)], {"name": pname, **layout})).result
        self._bind_consts(body, env, jaxpr.constvars, consts)
        self._convert(jaxpr, body, env)
        for i, v in enumerate(jaxpr.outvars):
            if adapter.is_key(v.aval):
                raise CaptureError(f"output {i} is a typed PRNG key array, which a program cannot return; "
                                   "return its raw data (jax.random.key_data(key)) instead")
        body.append(Op("return", [self._read(body, env, v) for v in jaxpr.outvars], []))
        used = {op.attrs["name"] for op in body.ops if op.type == "param" and op.result.uses}
        body.ops = [op for op in body.ops if op.type != "param" or op.attrs["name"] in used]
        params = {n: v for n, v in params.items() if n in used}
        return Program(body, params, self.constants, in_tree, out_tree, name)

    def _bind_consts(self, block, env, constvars, consts):
        for var, value in zip(constvars, consts):
            if var.aval.dtype == jax.dtypes.float0:
                continue  # the zero tangent of an integer output, which the rule block drops
            env[var] = self._constant(block, value, var.aval)

    def _constant(self, block, value, aval):
        ttype = _type(aval)
        # NumPy constants may be 64-bit where JAX computes in 32 bits, as jit would cast them
        value = np.asarray(adapter.key_data(value)).astype(jax.numpy.dtype(ttype.dtype), copy=False)
        if value.ndim == 0 and (value.dtype.kind in "biuf"):
            attrs = {"value": value.item()}
        else:
            i = len(self.constants)
            while f"const{i}" in self.constants:  # the program may already hold constants
                i += 1
            cname = f"const{i}"
            self.constants[cname] = value
            attrs = {"name": cname}
        return block.append(Op("constant", [], [ttype], attrs)).result

    def _read(self, block, env, v):
        if adapter.is_literal(v):
            return self._constant(block, v.val, v.aval)
        return env[v]

    def _sub_block(self, closed, name):
        return self._block_of(adapter.sub_jaxpr(*adapter.open_jaxpr(closed)), name)

    def _block_of(self, sub: adapter.SubJaxpr, name):
        block = Block([_type(v.aval) for v in sub.invars], name)
        env = dict(zip(sub.invars, block.args))
        self._bind_consts(block, env, sub.constvars, sub.consts)
        self._convert(sub, block, env)
        block.append(Op("return", [self._read(block, env, v) for v in sub.outvars], []))
        return block

    def _convert(self, jaxpr, block, env):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if eqn.outvars and all(v.aval.dtype == jax.dtypes.float0 for v in eqn.outvars):
                continue  # the zero tangent of an integer output, which the rule block drops
            operands = [self._read(block, env, v) for v in eqn.invars]
            op = None
            if name in adapter.KEY_PRIMITIVES or (name not in _KEEPS_KEYS and any(
                    adapter.is_key(v.aval) for v in (*eqn.invars, *eqn.outvars))):
                self._inline_key_op(eqn, operands, block, env)
                continue
            if name == "device_put" and all(d is None for d in eqn.params["devices"]):
                env.update((v, x) for v, x in zip(eqn.outvars, operands) if not adapter.is_dropvar(v))
                continue
            if name in _CUSTOM:
                op = self._custom_derivative(eqn, operands)
            elif name not in _INLINE:
                op = self._make_op(eqn, operands)
            if op is None:
                start = len(block.ops)
                self._inline(eqn, operands, block, env)
                if name in _REMAT:
                    self._mark_remat(block.ops[start:])
                continue
            block.append(op)
            for var, value in zip(eqn.outvars, op.results):
                if not adapter.is_dropvar(var):
                    env[var] = value

    def _inline(self, eqn, operands, block, env):
        key = _INLINE[eqn.primitive.name]
        if key is None:
            raise CaptureError(f"{_where(eqn)}: '{eqn.primitive.name}' cannot be captured")
        inner, consts = adapter.open_jaxpr(eqn.params[key])
        self._inline_jaxpr(eqn, inner, consts, operands, block, env)

    def _inline_jaxpr(self, eqn, inner, consts, operands, block, env):
        if len(inner.invars) != len(operands):
            raise CaptureError(f"{_where(eqn)}: cannot inline '{eqn.primitive.name}' "
                               f"({len(operands)} operands for {len(inner.invars)} inputs)")
        inner_env = dict(zip(inner.invars, operands))
        start = len(block.ops)
        self._bind_consts(block, inner_env, inner.constvars, consts)
        self._convert(inner, block, inner_env)
        loc = adapter.source_line(eqn)
        for op in block.ops[start:]:  # ops of a function JAX traced once and cached have no line of their own
            op.loc = op.loc or loc
        for var, out in zip(eqn.outvars, inner.outvars):
            if not adapter.is_dropvar(var):
                env[var] = self._read(block, inner_env, out)

    def _inline_key_op(self, eqn, operands, block, env):
        """Inline a PRNG key primitive, or a shape operation on key arrays, as its computation on
        the keys' raw data."""
        fn = adapter.key_computation(eqn)
        if fn is None:
            raise CaptureError(f"{_where(eqn)}: '{eqn.primitive.name}' on an array of typed PRNG keys cannot be "
                               "captured (a program holds keys by their raw data and captures jax.random's key "
                               "operations and the shape operations on keys); work on jax.random.key_data(keys) "
                               "instead")
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in map(adapter.key_data_aval,
                                                                          (v.aval for v in eqn.invars))]
        inner, consts = adapter.make_jaxpr(fn, *structs)
        self._inline_jaxpr(eqn, inner, consts, operands, block, env)

    def _mark_remat(self, ops):
        """Ops inlined from ``jax.checkpoint`` form one remat segment, which lowering recomputes
        in the backward pass as JAX would. (Constants are left out: they are not recomputed and
        print without attributes.)"""
        for op in ops:
            if op.type != "constant":
                op.attrs["remat_segment"] = self.remat_segments
        self.remat_segments += 1

    def _custom_derivative(self, eqn, operands) -> Op | None:
        """A ``custom_jvp`` / ``custom_vjp`` op keeping the rule, or None when the primal
        computation is inlined instead: inside rules ``_RULE_DEPTH`` deep, or (with a
        warning) when the rule cannot be captured."""
        if self.rule_depth >= _RULE_DEPTH:
            return None
        kind, params = _CUSTOM[eqn.primitive.name], eqn.params
        fn_name = adapter.custom_rule_name(params)
        in_avals = [v.aval for v in eqn.invars]
        constants = dict(self.constants)
        self.rule_depth += 1
        try:
            if kind == "custom_jvp":
                rule, zero_tangents = adapter.custom_jvp_rule(params, in_avals)
                rules = [self._block_of(rule, "jvp")]
            else:
                fwd, bwd = adapter.custom_vjp_rule(params, in_avals)
                rules, zero_tangents = [self._block_of(fwd, "fwd"), self._block_of(bwd, "bwd")], []
        except Exception as e:  # the rule is user code traced on abstract values: anything may fail
            self.constants.clear()  # drop what the failed rule added
            self.constants.update(constants)
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"{_where(eqn)}: the {kind} rule of '{fn_name}' cannot be captured "
                          f"({type(e).__name__}: {reason}); the program keeps its primal "
                          "computation, so gradients through the program ignore the rule",
                          CaptureWarning, stacklevel=2)
            return None
        finally:
            self.rule_depth -= 1
        attrs = {"name": fn_name, "num_consts": params["num_consts"]}
        if zero_tangents:
            attrs["zero_tangents"] = tuple(zero_tangents)
        result_types = [_type(v.aval) for v in eqn.outvars]
        blocks = [self._sub_block(params["call_jaxpr"], "primal"), *rules]
        return Op(kind, operands, result_types, attrs, blocks, adapter.source_line(eqn))

    def _make_op(self, eqn, operands):
        result_types = [_type(v.aval) for v in eqn.outvars]
        loc = adapter.source_line(eqn)
        params = eqn.params
        opdef = registry.by_primitive(eqn.primitive)
        if opdef is not None:
            return Op(opdef.name, operands, result_types, attrs_lib.from_jax(dict(params)), loc=loc)
        name = eqn.primitive.name
        if name == "empty2":  # differentiating cond/scan makes these placeholders; they lower to zero
            zero = np.zeros((), jax.numpy.dtype(result_types[0].dtype)).item()
            return Op("constant", [], result_types, {"value": zero}, loc=loc)
        if name == "cond":
            blocks = [self._sub_block(b, f"branch{i}") for i, b in enumerate(params["branches"])]
            return Op("cond", operands, result_types, {}, blocks, loc)
        if name == "while":
            blocks = [self._sub_block(params["cond_jaxpr"], "cond"), self._sub_block(params["body_jaxpr"], "body")]
            attrs = {"cond_nconsts": params["cond_nconsts"], "body_nconsts": params["body_nconsts"]}
            return Op("while", operands, result_types, attrs, blocks, loc)
        if name == "scan":
            num_consts, num_carry = adapter.scan_counts(params)
            attrs = {"num_consts": num_consts, "num_carry": num_carry,
                     **{k: params[k] for k in ("length", "reverse", "unroll")}}
            attrs = attrs_lib.from_jax(attrs)
            return Op("scan", operands, result_types, attrs, [self._sub_block(params["jaxpr"], "body")], loc)
        if name == "reduce":
            return Op("reduce", operands, result_types, {"dimensions": tuple(params["dimensions"])},
                      [self._sub_block(params["jaxpr"], "computation")], loc)
        if name == "custom_linear_solve":
            lengths, jaxprs = adapter.linear_solve_parts(params)
            blocks = [self._sub_block(j, part) for part, j in jaxprs.items()]
            return Op("custom_linear_solve", operands, result_types, {"const_lengths": lengths}, blocks, loc)
        if name in adapter.KEY_OPERAND and not adapter.is_default_key(eqn.invars[0].aval):
            raise CaptureError(f"{_where(eqn)}: '{name}' takes a key of another PRNG implementation than "
                               "threefry2x32, which a program cannot hold; use the default keys")
        if adapter.lax_primitive(name) is not eqn.primitive:
            raise CaptureError(f"{_where(eqn)}: primitive '{name}' is not a JAX primitive paddlejax "
                               f"can capture (only lax primitives and paddlejax ops){_ADVICE.get(name, '')}")
        params = dict(params)
        if name.startswith("scatter"):
            if not adapter.is_standard_scatter(name, params):
                raise CaptureError(f"{_where(eqn)}: '{name}' applies a function to the scattered elements "
                                   "(x.at[i].apply(f)), which a program cannot hold; write "
                                   "x.at[i].set(f(x[i])) for unique indices")
            del params["update_jaxpr"], params["update_consts"]  # lowering rebuilds them from the name
        for key in ("sharding", "out_sharding"):
            if adapter.trivial_sharding(params.get(key)):
                params[key] = None
        attrs = attrs_lib.from_jax(params)
        for key, value in attrs.items():
            if not attrs_lib.encodable(value):
                raise CaptureError(f"{_where(eqn)}: '{name}' has a parameter '{key}' of type "
                                   f"{type(value).__name__} that a program cannot hold")
        return Op(f"lax.{name}", operands, result_types, attrs, loc=loc)


# Primitives that hold typed keys as they are (in sub-jaxprs, or as an operand they keep).
_KEEPS_KEYS = {"cond", "while", "scan", *_INLINE, *adapter.KEY_OPERAND}

# What to do instead, for primitives that run Python code (a program holds none).
_CALLBACK = "; a program holds no Python code: compute it with jax functions, or call it outside the traced function"
_ADVICE = {"pure_callback": _CALLBACK, "io_callback": _CALLBACK, "callback": _CALLBACK,
           "debug_callback": "; remove the jax.debug.callback call", "debug_print": "; remove the jax.debug.print call"}

# Remat primitives (``jax.checkpoint``), inlined as one remat segment each.
_REMAT = ("checkpoint", "remat", "remat2")


def _type(aval) -> TensorType:
    """The type of a value in the program: a typed key array is held by its raw data."""
    return TensorType.of(adapter.key_data_aval(aval))


# The JAX primitives of functions with custom derivative rules, and the ops they become.
_CUSTOM = {"custom_jvp_call": "custom_jvp", "custom_vjp_call": "custom_vjp"}
_RULE_DEPTH = 2


def _where(eqn) -> str:
    return adapter.source_line(eqn) or "<unknown source line>"
