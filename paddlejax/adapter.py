"""The one place that touches JAX internals (``jax.extend`` and ``jax.interpreters``).

Those modules carry no compatibility promise, so everything paddlejax needs from them is
wrapped here: making a primitive from a reference kernel, reading jaxprs, finding lax
primitives by name, and the small differences between jax 0.10 and 0.11.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys

import jax
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

Primitive = jcore.Primitive
Literal = jcore.Literal
Var = jcore.Var
DropVar = jcore.DropVar


def _aval_varying(aval) -> frozenset:
    """Mesh axes over which a value varies inside ``shard_map`` (empty outside)."""
    mat = getattr(aval, "mat", None)  # jax >= 0.10: manual-axis type
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))


def varying_axes(x) -> frozenset:
    """The mesh axes over which ``x`` varies inside ``shard_map`` (those its rows differ over);
    empty outside ``shard_map``.

    >>> varying_axes(jax.numpy.ones(3))
    frozenset()
    """
    return _aval_varying(jax.typeof(x))


def match_varying(args):
    """Inside ``shard_map``, bring all inputs to the same set of varying mesh axes.

    Lax ops do the same before binding; without it a replicated weight meeting a sharded
    activation is a type error.
    """
    axes = frozenset().union(*(varying_axes(a) for a in args))
    if not axes:
        return args
    out = []
    for a in args:
        missing = tuple(sorted(axes - varying_axes(a)))
        out.append(jax.lax.pcast(a, missing, to="varying") if missing else a)
    return out


def _shaped(struct, template):
    """An abstract value of ``struct``'s shape and dtype that varies like ``template``."""
    if template is None:
        return jax.core.ShapedArray(struct.shape, struct.dtype)
    spec = jax.sharding.PartitionSpec(*[None] * len(struct.shape))
    sharding = jax.sharding.NamedSharding(template.sharding.mesh, spec)
    return template.update(shape=struct.shape, dtype=struct.dtype, weak_type=False, sharding=sharding)


def make_primitive(name: str, kernel, multiple_results: bool = False):
    """Wrap ``kernel(*arrays, **attrs)`` as a JAX primitive called ``name``.

    Abstract evaluation, lowering, JVP and batching all come from the kernel itself, so the
    primitive computes exactly what the kernel computes. Returns ``bind(*arrays, **attrs)``.

    >>> bind = make_primitive("my_double", lambda x: 2 * x)
    >>> float(bind(jax.numpy.float32(3.0)))
    6.0
    """
    prim = Primitive(name)
    prim.multiple_results = multiple_results

    def call(*args, **params):
        return kernel(*args, **params)

    prim.def_impl(call)

    @functools.lru_cache(maxsize=4096)
    def _abstract(avals, params):
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
        return jax.eval_shape(functools.partial(kernel, **dict(params)), *structs)

    def abstract_eval(*avals, **params):
        varying = [a for a in avals if _aval_varying(a)]
        template = max(varying, key=lambda a: len(_aval_varying(a))) if varying else None
        key = tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in avals)
        out = _abstract(key, tuple(sorted(params.items())))
        if multiple_results:
            return [_shaped(o, template) for o in out]
        return _shaped(out, template)

    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(call, multiple_results=multiple_results))

    def jvp(primals, tangents, **params):
        tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
        out = prim.bind(*primals, **params)
        _, t_out = jax.jvp(functools.partial(kernel, **params), tuple(primals), tangents)
        return out, t_out

    ad.primitive_jvps[prim] = jvp

    def batch(axis_data, args, dims, **params):
        if all(d is None for d in dims):
            out = prim.bind(*args, **params)
            return out, ([None] * len(out) if multiple_results else None)
        # a vmap that names a mesh axis (spmd_axis_name) keeps naming it inside the kernel, so the
        # kernel's sharding constraints split the mapped dimension over that axis too
        spmd = getattr(axis_data, "spmd_name", None)
        out = jax.vmap(functools.partial(kernel, **params), in_axes=tuple(dims), out_axes=0,
                       spmd_axis_name=spmd)(*args)
        return out, ([0] * len(out) if multiple_results else 0)

    batching.fancy_primitive_batchers[prim] = batch

    def bind(*args, **params):
        out = prim.bind(*match_varying(args), **params)
        return tuple(out) if multiple_results else out  # eager and traced calls agree

    bind.primitive = prim
    return bind


def make_bilinear_primitive(name: str, kernel, transpose_lhs, transpose_rhs):
    """Wrap ``kernel(a, b, **params)``, linear in ``a`` and in ``b`` separately (a convolution, a
    matrix product), as a JAX primitive whose derivatives need no reference kernel: its JVP is
    the primitive itself on the tangents, and reverse mode calls
    ``transpose_lhs(ct, b, a_shape, **params)`` for ``a``'s cotangent and
    ``transpose_rhs(ct, a, b_shape, **params)`` for ``b``'s (as ``lax.conv_general_dilated``
    declares its own). Batching maps the kernel over the batch. Returns ``bind(a, b, **params)``.

    >>> mul = make_bilinear_primitive("my_mul", lambda a, b: a * b,
    ...                               lambda ct, b, shape: ct * b, lambda ct, a, shape: ct * a)
    >>> float(jax.grad(lambda a: mul(a, jax.numpy.float32(3.0)))(jax.numpy.float32(2.0)))
    3.0
    """
    prim = Primitive(name)
    prim.def_impl(kernel)

    def abstract_eval(a, b, **params):
        out = jax.eval_shape(functools.partial(kernel, **params), jax.ShapeDtypeStruct(a.shape, a.dtype),
                             jax.ShapeDtypeStruct(b.shape, b.dtype))
        return jax.core.ShapedArray(out.shape, out.dtype)

    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(kernel, multiple_results=False))
    ad.defbilinear(prim, lambda ct, a, b, **params: transpose_lhs(ct, b, a.aval.shape, **params),
                   lambda ct, a, b, **params: transpose_rhs(ct, a, b.aval.shape, **params))

    def batch(args, dims, **params):
        return jax.vmap(functools.partial(kernel, **params), in_axes=tuple(dims))(*args), 0

    batching.primitive_batchers[prim] = batch

    def bind(a, b, **params):
        return prim.bind(*match_varying((a, b)), **params)

    bind.primitive = prim
    return bind


def make_linear_primitive(name: str, kernel, reference, transpose, n_linear: int, multiple_results: bool = False):
    """Wrap ``kernel(*linear, *rest, **params)``, linear in its first ``n_linear`` arguments
    jointly (a derivative's tangent map, given the primal values in ``rest``), as a JAX
    primitive whose reverse mode calls ``transpose(cts, *rest, **params)`` for the linear
    arguments' cotangents (a sequence, ``cts`` a sequence too when there are several results).
    ``reference`` is the same function in plain JAX: the derivatives with respect to ``rest``
    (second order) and batching come from it. Returns ``bind(*args, **params)``.

    >>> scale = make_linear_primitive("my_scale", lambda t, s: t * s, lambda t, s: t * s,
    ...                               lambda ct, s: [ct * s], n_linear=1)
    >>> float(jax.grad(lambda t: scale(t, jax.numpy.float32(3.0)))(jax.numpy.float32(2.0)))
    3.0
    """
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(kernel)

    def abstract_eval(*avals, **params):
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
        out = jax.eval_shape(functools.partial(reference, **params), *structs)
        if multiple_results:
            return [jax.core.ShapedArray(o.shape, o.dtype) for o in out]
        return jax.core.ShapedArray(out.shape, out.dtype)

    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(kernel, multiple_results=multiple_results))

    def jvp(primals, tangents, **params):
        tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
        _, t_out = jax.jvp(functools.partial(reference, **params), tuple(primals), tangents)
        return prim.bind(*primals, **params), t_out

    ad.primitive_jvps[prim] = jvp

    def transpose_rule(cts, *args, **params):
        cts = [ad.instantiate_zeros(ct) for ct in cts] if multiple_results else ad.instantiate_zeros(cts)
        rest = args[n_linear:]
        if any(ad.is_undefined_primal(a) for a in rest):
            raise ValueError(f"{name} is linear in its first {n_linear} arguments only")
        out = transpose(cts, *rest, **params)
        return [ct if ad.is_undefined_primal(a) else None for ct, a in zip(out, args)] + [None] * len(rest)

    ad.primitive_transposes[prim] = transpose_rule

    def batch(args, dims, **params):
        out = jax.vmap(functools.partial(reference, **params), in_axes=tuple(dims))(*args)
        return out, ([0] * len(out) if multiple_results else 0)

    batching.primitive_batchers[prim] = batch

    def bind(*args, **params):
        out = prim.bind(*match_varying(args), **params)
        return tuple(out) if multiple_results else out

    bind.primitive = prim
    return bind


# ---------------------------------------------------------------------------------------
# Reading jaxprs

def make_jaxpr(fn, *args):
    """``jax.make_jaxpr`` that returns ``(jaxpr, consts)`` on every supported jax version."""
    closed = jax.make_jaxpr(fn)(*args)
    return closed.jaxpr, list(closed.consts)


def open_jaxpr(j):
    """``(jaxpr, consts)`` of a sub-jaxpr found in equation params (closed or open)."""
    if hasattr(j, "consts") and hasattr(j, "jaxpr"):
        return j.jaxpr, list(j.consts)
    return j, []


def scan_counts(params) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation: its own params up to jax 0.10; from
    0.11 on, the lengths of the first two groups of its flat input tree ``ft_in``
    (constants, carry, scanned)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))


def differentiable(dtype) -> bool:
    """Whether values of ``dtype`` have tangents of their own type (floating and complex do;
    integers and booleans have ``float0`` tangents, which a program never holds).

    >>> differentiable(jax.numpy.float32), differentiable(jax.numpy.int32)
    (True, False)
    """
    return jax.numpy.issubdtype(dtype, jax.numpy.inexact)


@dataclasses.dataclass
class SubJaxpr:
    """A jaxpr read as a block: its equations run over ``invars`` (with ``constvars`` bound to
    ``consts``) and the block returns ``outvars``, which may also name inputs or constants.
    :func:`sub_jaxpr` makes one."""

    eqns: list
    constvars: list
    consts: list
    invars: list
    outvars: list


def sub_jaxpr(jaxpr, consts, outvars=None) -> SubJaxpr:
    """The parts of ``jaxpr`` traced with ``consts``. Up to jax 0.10 an open jaxpr lists its
    constant variables apart; from 0.11 on they lead its inputs unless values are attached.

    >>> jaxpr, consts = make_jaxpr(lambda x: x + 1.0, 1.0)
    >>> part = sub_jaxpr(jaxpr, consts)
    >>> len(part.invars), len(part.eqns)
    (1, 1)
    """
    all_vars = [*jaxpr.constvars, *jaxpr.invars]
    n = len(consts)
    return SubJaxpr(list(jaxpr.eqns), all_vars[:n], list(consts), all_vars[n:],
                    list(jaxpr.outvars if outvars is None else outvars))


def custom_rule_name(params) -> str:
    """The name of the function a ``custom_jvp_call`` / ``custom_vjp_call`` equation wraps.

    >>> jaxpr, _ = make_jaxpr(jax.nn.relu, 1.0)
    >>> custom_rule_name(jaxpr.eqns[0].params)
    'relu'
    """
    jaxpr, _ = open_jaxpr(params["call_jaxpr"])
    return getattr(jaxpr.debug_info, "func_name", None) or "<unknown>"


def _no_tracers(consts, what: str) -> None:
    # A rule that closes over a value of the traced function is traced after capture ends, so
    # it holds a leaked tracer; JAX itself cannot stage such a rule either.
    if any(isinstance(c, jax.core.Tracer) for c in consts):
        raise ValueError(f"its {what} closes over a traced value of the enclosing function")


def custom_jvp_rule(params, in_avals) -> tuple[SubJaxpr, list[int]]:
    """The JVP rule of a ``custom_jvp_call`` equation with inputs ``in_avals``, traced.

    The rule maps the primal inputs (the equation's inputs after its ``num_consts``
    constants) and the tangents of the differentiable ones to the outputs and the tangents
    of the outputs not listed in the returned ``zero_tangents`` (those the rule leaves
    zero, and every non-differentiable output).

    >>> eqn = make_jaxpr(jax.nn.relu, 1.0)[0].eqns[0]
    >>> rule, zero_tangents = custom_jvp_rule(eqn.params, [v.aval for v in eqn.invars])
    >>> len(rule.invars), len(rule.outvars), zero_tangents   # (x, dx) -> (relu(x), d relu)
    (2, 2, [])
    """
    xs = in_avals[params["num_consts"]:]
    jaxpr, consts, out_zeros = params["jvp_jaxpr_fun"].call_wrapped(*[not differentiable(a.dtype) for a in xs])
    _no_tracers(consts, "JVP rule")
    n_out = len(out_zeros)
    nonzero = iter(jaxpr.outvars[n_out:])
    tangents = [None if z else next(nonzero) for z in out_zeros]
    tangents = [t if t is not None and differentiable(t.aval.dtype) else None for t in tangents]
    outvars = [*jaxpr.outvars[:n_out], *(t for t in tangents if t is not None)]
    return sub_jaxpr(jaxpr, consts, outvars), [i for i, t in enumerate(tangents) if t is None]


def custom_vjp_rule(params, in_avals) -> tuple[SubJaxpr, SubJaxpr]:
    """The forward and backward rules of a ``custom_vjp_call`` equation with inputs ``in_avals``.

    The forward rule maps the primal inputs (after the ``num_consts`` constants) to
    ``(*residuals, *outputs)``; the backward rule maps ``(*residuals, *cotangents of the
    differentiable outputs)`` to the cotangents of the differentiable inputs. The backward
    rule is a Python function, traced here on abstract values.

    >>> f = jax.custom_vjp(lambda x: x)
    >>> f.defvjp(lambda x: (x, None), lambda _, g: (0.1 * g,))
    >>> eqn = make_jaxpr(f, 1.0)[0].eqns[0]
    >>> fwd, bwd = custom_vjp_rule(eqn.params, [v.aval for v in eqn.invars])
    >>> len(fwd.outvars), [e.primitive.name for e in bwd.eqns]   # no residuals; 0.1 * g
    (1, ['mul'])
    """
    n = params["num_consts"]
    xs = in_avals[n:]
    fwd, fwd_consts = params["fwd_jaxpr_thunk"].call_wrapped(*[differentiable(a.dtype) for a in xs])
    _no_tracers(fwd_consts, "forward rule")
    fwd_rule = sub_jaxpr(fwd, fwd_consts)
    _, _, forwards = params["out_trees"]()
    # Residuals that are inputs are left out of the forward jaxpr's outputs and forwarded.
    kept = iter(fwd_rule.outvars)
    residuals = [next(kept) if f is None else fwd_rule.invars[f - n] for f in forwards]
    outs = list(kept)
    fwd_rule.outvars = [*residuals, *outs]
    out_avals = [v.aval for v in outs]
    bwd = params["bwd"]

    def flat_bwd(*args):
        res, cts = iter(args[:len(residuals)]), iter(args[len(residuals):])
        all_cts = [next(cts) if differentiable(a.dtype) else np.zeros(a.shape, jax.dtypes.float0)
                   for a in out_avals]
        in_cts = bwd.call_wrapped(*res, *all_cts)
        if isinstance(in_cts, tuple):  # jax >= 0.11: (cotangents, backward-pass logs)
            in_cts = in_cts[0]
        return [jax.numpy.asarray(ad.instantiate_zeros(ct), a.dtype)
                for ct, a in zip(in_cts, xs) if differentiable(a.dtype)]

    structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in residuals]
    structs += [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals if differentiable(a.dtype)]
    bwd_jaxpr, bwd_consts = make_jaxpr(flat_bwd, *structs)
    _no_tracers(bwd_consts, "backward rule")
    return fwd_rule, sub_jaxpr(bwd_jaxpr, bwd_consts)


def is_literal(x) -> bool:
    return isinstance(x, Literal)


def is_dropvar(x) -> bool:
    return isinstance(x, DropVar)


_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def source_line(eqn) -> str | None:
    """``file.py:LINE`` of the user frame that produced a jaxpr equation, if known.

    Frames inside JAX and inside the ``paddlejax`` kernel are skipped, so an op called
    from a model points at the model's line.
    """
    from jax._src import source_info_util  # jaxpr source info has no public reader

    for frame in source_info_util.user_frames(eqn.source_info.traceback):
        if not frame.file_name.startswith(_OWN_DIR):
            return f"{frame.file_name}:{frame.start_line}"
    return None



def backends_initialized() -> bool:
    """Whether JAX has created its backends (clients), after which their options are fixed."""
    from jax._src import xla_bridge  # no public query; an unknown answer counts as created

    query = getattr(xla_bridge, "backends_are_initialized", None)
    return True if query is None else bool(query())


# ---------------------------------------------------------------------------------------
# lax primitives by name

@functools.cache
def _lax_primitives() -> dict[str, Primitive]:
    found: dict[str, Primitive] = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(("jax._src.lax", "jax._src.ad_util", "jax._src.prng",
                                                   "jax._src.random", "jax._src.nn", "jax._src.numpy",
                                                   "jax._src.pjit", "jax._src.core", "jax._src.export.shape_poly")):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, Primitive):
                found.setdefault(value.name, value)
    return found


def lax_primitive(name: str) -> Primitive | None:
    """The JAX primitive called ``name`` (``"add"``, ``"dot_general"``, …), or None."""
    return _lax_primitives().get(name)


def bind_lax(name: str, args, params: dict):
    """Bind ``lax.<name>`` on ``args`` with ``params``, adding the parameters a program does
    not hold because they follow from the primitive (a combining scatter's update jaxpr);
    returns a list of results.

    >>> [y.tolist() for y in bind_lax("scatter-add", [jax.numpy.zeros(2), jax.numpy.array([[1]]),
    ...     jax.numpy.ones(1)], {"dimension_numbers": jax.lax.ScatterDimensionNumbers((), (0,), (0,)),
    ...     "indices_are_sorted": True, "unique_indices": True, "mode": jax.lax.GatherScatterMode.CLIP})]
    [[0.0, 1.0]]
    """
    prim = lax_primitive(name)
    if name in SCATTER_COMBINE:
        jaxpr, consts = scatter_update_jaxpr(name, np.dtype(args[0].dtype))
        params = {**params, "update_jaxpr": jaxpr, "update_consts": consts}
    elif name == "scatter":
        params = {**params, "update_jaxpr": None, "update_consts": ()}
    elif name in KEY_OPERAND:
        args = [jax.random.wrap_key_data(args[0], impl="threefry2x32"), *args[1:]]
    out = prim.bind(*match_varying(args), **params)
    return list(out) if prim.multiple_results else [out]


# How each combining scatter merges an update into the operand: the jaxpr its ``update_jaxpr``
# parameter holds, which lowering needs and a program rebuilds from the primitive's name.
SCATTER_COMBINE = {"scatter-add": jax.lax.add, "scatter-sub": jax.lax.sub, "scatter-mul": jax.lax.mul,
                   "scatter-min": jax.lax.min, "scatter-max": jax.lax.max}


def scatter_update_jaxpr(name: str, dtype):
    """``(update_jaxpr, update_consts)`` of a ``name`` scatter on operands of ``dtype``, as
    ``jax.lax.scatter_add`` and its siblings make them."""
    from jax._src.lax import lax as lax_internal  # the one reducer builder scatters use

    return lax_internal._reduction_jaxpr(SCATTER_COMBINE[name], jax.core.ShapedArray((), np.dtype(dtype)))


def is_standard_scatter(name: str, params: dict) -> bool:
    """Whether a scatter equation's update jaxpr is the one its primitive implies (so a program
    may drop it): none for ``scatter`` (a plain set), the combining op for the others; a
    ``scatter`` with an update function (``x.at[i].apply(f)``) is not."""
    jaxpr = params.get("update_jaxpr")
    if name not in SCATTER_COMBINE:
        return jaxpr is None
    expected, _ = scatter_update_jaxpr(name, jaxpr.invars[0].aval.dtype) if jaxpr is not None else (None, ())
    return (jaxpr is not None and not params.get("update_consts")
            and [e.primitive for e in jaxpr.eqns] == [e.primitive for e in expected.eqns])


def trivial_sharding(value) -> bool:
    """Whether a ``sharding`` parameter says nothing: a ``NamedSharding`` over the empty mesh
    that JAX's own transforms (vmap, jacfwd) attach outside any mesh, equivalent to None.

    >>> trivial_sharding(jax.sharding.NamedSharding(jax.sharding.AbstractMesh((), ()),
    ...                                             jax.sharding.PartitionSpec(None)))
    True
    """
    mesh = getattr(value, "mesh", None)
    spec = getattr(value, "spec", None)
    return (isinstance(value, jax.sharding.NamedSharding) and mesh is not None and mesh.empty
            and all(s is None for s in spec))


# ---------------------------------------------------------------------------------------
# PRNG keys: a program holds a typed key array by its raw data (uint32[..., 2] for the
# default threefry keys), and the primitives that act on keys by their implementation on
# that data, as JAX's own lowering does.

KEY_PRIMITIVES = frozenset({"random_wrap", "random_unwrap", "random_clone", "random_seed", "random_split",
                            "random_fold_in", "random_bits"})
# Primitives that take a (default, threefry) key as their first operand and keep their own
# derivative rule: a program holds them as generic ops on the key's raw data.
KEY_OPERAND = frozenset({"random_gamma"})


def is_key(aval) -> bool:
    """Whether an abstract value (or array) is a typed PRNG key array."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def is_default_key(aval) -> bool:
    """Whether a key array's abstract value holds threefry2x32 keys (JAX's default)."""
    return is_key(aval) and aval.dtype._impl.name == "threefry2x32"


def key_data_aval(aval):
    """The abstract value of a key array's raw data (other values are returned as they are)."""
    from jax._src import core  # no public reader of a key type's data layout

    return core.physical_aval(aval) if is_key(aval) else aval


def key_data(value):
    """The raw data of a typed key array (other values are returned as they are)."""
    return jax.random.key_data(value) if is_key(value) else value


def wrap_key_data(data, like):
    """Keys of ``like``'s key type (an array or ``jax.ShapeDtypeStruct``) from their raw ``data``."""
    return jax.random.wrap_key_data(data, impl=like.dtype._impl)  # the type's PRNG implementation


def key_computation(eqn):
    """A function of the raw data of a key equation's operands that computes the raw data of its
    results (one value), mirroring JAX's lowering of ``random_split``, ``random_bits`` … and of
    the shape operations on key arrays (slicing, reshaping, broadcasting, selecting, gathering);
    None for other primitives.

    >>> eqn = make_jaxpr(lambda k: jax.random.split(k), jax.random.key(0))[0].eqns[0]
    >>> key_computation(eqn)(jax.random.key_data(jax.random.key(0))).shape
    (2, 2)
    """
    from jax._src.random import prng

    name, params = eqn.primitive.name, eqn.params
    aval = eqn.invars[0].aval
    if name in ("random_wrap", "random_unwrap", "random_clone"):
        return lambda data: data
    if name == "random_seed":
        return functools.partial(prng.random_seed_impl_base, impl=params["impl"])
    if name not in KEY_PRIMITIVES:
        return _key_shape_op(eqn)
    impl, ndim = aval.dtype._impl, aval.ndim  # a key dtype names its implementation only here
    if name == "random_split":
        return lambda data: prng.random_split_impl_base(impl, data, ndim, shape=params["shape"])
    if name == "random_bits":
        return lambda data: prng.random_bits_impl_base(impl, data, ndim, bit_width=params["bit_width"],
                                                       shape=params["shape"])
    return lambda data, msgs: prng.random_fold_in_impl_base(impl, data, msgs, aval.shape)


def _key_shape_op(eqn):
    """A shape operation on key arrays as the same operation on their raw data, whose trailing
    axes (the key's words) ride along."""
    name, p = eqn.primitive.name, eqn.params
    out = next(v.aval for v in eqn.outvars if is_key(v.aval))
    tail = key_data_aval(out).shape[out.ndim:]
    k, n = len(tail), out.ndim
    own = tuple(range(n, n + k))  # the positions of the key words in the result
    if name in ("copy", "copy_p", "squeeze", "rev", "concatenate", "stack", "unstack", "random_clone"):
        return lambda *xs: eqn.primitive.bind(*xs, **p)
    if name == "slice":
        strides = None if p["strides"] is None else (*p["strides"], *[1] * k)
        return lambda x: jax.lax.slice(x, (*p["start_indices"], *[0] * k), (*p["limit_indices"], *tail), strides)
    if name == "reshape" and p.get("dimensions") is None:
        return lambda x: jax.lax.reshape(x, (*p["new_sizes"], *tail))
    if name == "broadcast_in_dim":
        return lambda x: jax.lax.broadcast_in_dim(x, (*p["shape"], *tail), (*p["broadcast_dimensions"], *own))
    if name == "transpose":
        return lambda x: jax.lax.transpose(x, (*p["permutation"], *own))
    if name == "select_n":
        def select(which, *cases):
            if which.ndim:
                which = jax.lax.broadcast_in_dim(which, cases[0].shape, tuple(range(which.ndim)))
            return jax.lax.select_n(which, *cases)
        return select
    if name == "dynamic_slice":
        return lambda x, *i: jax.lax.dynamic_slice(x, (*i, *[np.zeros((), i[0].dtype)] * k), (*p["slice_sizes"], *tail))
    if name == "dynamic_update_slice":
        return lambda x, u, *i: jax.lax.dynamic_update_slice(x, u, (*i, *[np.zeros((), i[0].dtype)] * k))
    if name == "gather":
        dn = p["dimension_numbers"]
        dn = dn._replace(offset_dims=(*dn.offset_dims, *own))
        return lambda x, i: jax.lax.gather(x, i, dn, (*p["slice_sizes"], *tail),
                                           indices_are_sorted=p["indices_are_sorted"],
                                           unique_indices=p["unique_indices"], mode=p["mode"],
                                           fill_value=p["fill_value"])
    return None


# ---------------------------------------------------------------------------------------
# custom_linear_solve

LINEAR_SOLVE_PARTS = ("matvec", "vecmat", "solve", "transpose_solve")


def linear_solve_parts(params) -> tuple[tuple[int, ...], dict]:
    """``(const_lengths, jaxprs)`` of a ``custom_linear_solve`` equation: how many constants each
    of its four functions takes (:data:`LINEAR_SOLVE_PARTS` order) and, by name, the closed
    jaxprs of those present (``vecmat`` and ``transpose_solve`` are absent when the solve
    defines no transpose)."""
    lengths = tuple(int(n) for n in params["const_lengths"])
    jaxprs = {k: j for k, j in zip(LINEAR_SOLVE_PARTS, params["jaxprs"]) if j is not None}
    return lengths, jaxprs


def bind_linear_solve(args, const_lengths, functions: dict):
    """Bind ``custom_linear_solve`` on ``args`` (the constants of the four functions, then the
    right-hand side ``b``); ``functions`` maps the names in :data:`LINEAR_SOLVE_PARTS` that are
    present to Python functions of ``(*constants, *b)``, traced here into the primitive's
    jaxprs. Gradients then use ``matvec``/``solve`` (forward) and ``vecmat``/``transpose_solve``
    (reverse) exactly as ``jax.lax.custom_linear_solve`` does."""
    from jax._src.lax.control_flow import solves

    n = sum(const_lengths)
    b = args[n:]
    offsets = np.cumsum((0, *const_lengths))
    jaxprs = []
    for i, part in enumerate(LINEAR_SOLVE_PARTS):
        fn = functions.get(part)
        consts = args[offsets[i]:offsets[i + 1]]
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (*consts, *b)]
        jaxprs.append(None if fn is None else jax.make_jaxpr(fn)(*structs))
    prim = solves.linear_solve_p
    return list(prim.bind(*args, const_lengths=solves._LinearSolveTuple(*const_lengths),
                          jaxprs=solves._LinearSolveTuple(*jaxprs)))
