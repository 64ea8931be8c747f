"""Paddle's autodiff API on JAX: dygraph transforms and static ``gradients`` on programs.

Dygraph (on arrays and functions): :func:`grad` and :func:`value_and_grad` (as ``jax.grad``,
with ``nnx.Module`` arguments differentiated with respect to their ``nnx.Param`` state),
:func:`jacobian`, :func:`hessian`, :func:`jvp` and :func:`vjp` (Paddle's
``paddle.autograd`` / ``paddle.incubate.autograd`` conventions).

Static (on a :class:`~paddlejax.ir.Program`): :func:`gradients` appends the ops computing
gradients to the program, as ``paddle.static.gradients`` does: it interprets the ops between
the inputs and the targets with the lowering, traces their ``jax.vjp`` and inserts the
resulting ops. Make the gradients outputs with :meth:`Program.set_outputs
<paddlejax.ir.Program.set_outputs>` to run them.

>>> import jax.numpy as jnp, paddlejax as pj
>>> grad(lambda x: jnp.sum(x ** 3))(jnp.array([1.0, 2.0])).tolist()
[3.0, 12.0]
>>> prog = pj.trace(lambda x: jnp.sum(x ** 3), jnp.ones(2))
>>> (dx,) = gradients(prog.outputs[0], prog.inputs[0])
>>> prog.set_outputs(dx)
>>> prog(jnp.array([1.0, 2.0])).tolist()
[3.0, 12.0]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from paddlejax import adapter
from paddlejax.capture import insert_jaxpr
from paddlejax.ir.core import Op, Value, program_of
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ir.verifier import Shapes
from paddlejax.lowering import run_ops

# ---------------------------------------------------------------------------------------
# Dygraph


def _differentiate(kind: str, fn, argnums, has_aux):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        from flax import nnx

        is_module = lambda x: isinstance(x, nnx.Module)  # noqa: E731
        # nnx's transform differentiates modules w.r.t. their Params and carries their state
        # updates (batch statistics, RNG counters) out of the trace; jax's is the plain one.
        with_modules = any(map(is_module, jax.tree_util.tree_leaves(args, is_leaf=is_module)))
        transform = getattr(nnx if with_modules else jax, kind)
        return transform(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)

    return call


def grad(fn, argnums=0, has_aux=False):
    """The gradient of scalar ``fn`` with respect to the arguments ``argnums``, as ``jax.grad``.

    An ``nnx.Module`` argument is differentiated with respect to its ``nnx.Param`` state and
    its gradient is an ``nnx.State`` (as ``nnx.grad`` gives); grads nest for higher orders.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> g = grad(lambda m, x: m(x).sum())(model, jnp.ones((4, 2)))
    >>> g["kernel"][...].tolist(), g["bias"][...].tolist()
    ([[4.0], [4.0]], [4.0])
    """
    return _differentiate("grad", fn, argnums, has_aux)


def value_and_grad(fn, argnums=0, has_aux=False):
    """``(fn(*args), grad(fn)(*args))`` in one pass, as ``jax.value_and_grad``; see :func:`grad`.

    >>> import jax.numpy as jnp
    >>> value, g = value_and_grad(lambda x: jnp.sum(x ** 2))(jnp.array([1.0, 2.0]))
    >>> float(value), g.tolist()
    (5.0, [2.0, 4.0])
    """
    return _differentiate("value_and_grad", fn, argnums, has_aux)


def _arguments(xs, caller: str) -> tuple[list, bool]:
    """``(arrays, is_sequence)`` for Paddle's ``xs``: one array or a tuple/list of arrays."""
    is_sequence = isinstance(xs, (tuple, list))
    args = list(xs) if is_sequence else [xs]
    if not args:
        raise ValueError(f"{caller}: xs is an empty sequence; pass an array or a tuple of arrays")
    return [jnp.asarray(x) for x in args], is_sequence


def _like(v, reference, caller: str, what: str, reference_what: str) -> list:
    """``v`` (array or sequence) checked against ``reference`` arrays and cast to their dtypes."""
    given = list(v) if isinstance(v, (tuple, list)) else [v]
    if len(given) != len(reference):
        raise ValueError(f"{caller}: v has {len(given)} arrays but {reference_what} has {len(reference)}")
    out = []
    for i, (t, r) in enumerate(zip(given, reference)):
        t = jnp.asarray(t)
        if t.shape != r.shape:
            raise ValueError(f"{caller}: v[{i}] has shape {t.shape}, expected {r.shape} like {what}[{i}]")
        out.append(t.astype(r.dtype))
    return out


def jacobian(func, xs):
    """The Jacobian of ``func`` at ``xs`` (one array or a tuple of arrays passed as ``func(*xs)``).

    ``J[i][j]`` is d outputs[i] / d xs[j] of shape ``outputs[i].shape + xs[j].shape`` (for
    0-D and 1-D arrays that is Paddle's ``[M, N]`` matrix; reshape to ``(M, N)`` for Paddle's
    flattened form of larger arrays). The index over outputs is dropped when ``func`` returns
    one array and the index over inputs when ``xs`` is one array, as in
    ``paddle.autograd.jacobian``; the values are ``jax.jacrev``'s.

    >>> import jax.numpy as jnp
    >>> jacobian(lambda x: x ** 2, jnp.array([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    >>> j = jacobian(lambda x, y: x * y, (jnp.array([1.0, 2.0]), jnp.array(3.0)))
    >>> j[0].tolist(), j[1].tolist()
    ([[3.0, 0.0], [0.0, 3.0]], [1.0, 2.0])
    """
    args, is_sequence = _arguments(xs, "jacobian")
    argnums = tuple(range(len(args))) if is_sequence else 0
    return jax.jacrev(func, argnums=argnums)(*args)


def hessian(func, xs):
    """The Hessian of ``func`` (returning one element) at ``xs`` (an array or a tuple of arrays).

    For one array of shape ``S`` the result has shape ``S + S``; for a tuple it is a nested
    tuple with ``H[i][j]`` of shape ``xs[i].shape + xs[j].shape``, as in
    ``paddle.autograd.hessian``. ``func`` may return shape ``()`` or ``(1,)``.

    >>> import jax.numpy as jnp
    >>> hessian(lambda x: jnp.sum(x ** 3), jnp.array([1.0, 2.0])).tolist()
    [[6.0, 0.0], [0.0, 12.0]]
    """
    args, is_sequence = _arguments(xs, "hessian")

    def scalar(*a):
        out = func(*a)
        if not hasattr(out, "shape") or out.size != 1:
            got = f"shape {out.shape}" if hasattr(out, "shape") else type(out).__name__
            raise ValueError(f"hessian: func must return one array with a single element, got {got}")
        return jnp.reshape(out, ())

    argnums = tuple(range(len(args))) if is_sequence else 0
    return jax.hessian(scalar, argnums=argnums)(*args)


def jvp(func, xs, v=None):
    """``(func(*xs), J·v)``: the forward-mode product of ``func``'s Jacobian with ``v``.

    ``v`` is shaped like ``xs`` (one array or a tuple of arrays) and defaults to ones, as in
    ``paddle.incubate.autograd.jvp``; the result is shaped like ``func``'s output.

    >>> import jax.numpy as jnp
    >>> out, tangent = jvp(lambda x: x ** 2, jnp.array([1.0, 2.0]))
    >>> out.tolist(), tangent.tolist()
    ([1.0, 4.0], [2.0, 4.0])
    """
    args, _ = _arguments(xs, "jvp")
    tangents = [jnp.ones_like(x) for x in args] if v is None else _like(v, args, "jvp", "xs", "xs")
    return jax.jvp(func, tuple(args), tuple(tangents))


def vjp(func, xs, v=None):
    """``(func(*xs), vᵀ·J)``: the reverse-mode product of ``v`` with ``func``'s Jacobian.

    ``v`` is shaped like ``func``'s output (one array or a tuple) and defaults to ones; the
    result is shaped like ``xs``, as in ``paddle.incubate.autograd.vjp``.

    >>> import jax.numpy as jnp
    >>> out, cotangent = vjp(lambda x: jnp.sum(x ** 2), jnp.array([1.0, 2.0]))
    >>> float(out), cotangent.tolist()
    (5.0, [2.0, 4.0])
    """
    args, is_sequence = _arguments(xs, "vjp")
    out, pullback = jax.vjp(func, *args)
    leaves, tree = jax.tree_util.tree_flatten(out)
    if v is None:
        cotangents = [jnp.ones_like(o) for o in leaves]
    else:
        cotangents = _like(v, leaves, "vjp", "the output", "func's output")
    grads = pullback(jax.tree_util.tree_unflatten(tree, cotangents))
    return out, (tuple(grads) if is_sequence else grads[0])


# ---------------------------------------------------------------------------------------
# Static: gradients appended to a program


def _as_list(values) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _describe(label: str, v: Value) -> str:
    source = f"%{v.name}" if v.name else f"a result of {v.owner.type}"
    return f"{label} ({source}: {v.type})"


def gradients(targets, inputs, target_gradients=None, no_grad_set=None) -> list:
    """Append to the program the ops computing the gradients of ``targets`` w.r.t. ``inputs``.

    As ``paddle.static.gradients``: ``targets`` and ``inputs`` are values (or lists of
    values) of one program's main block — inputs, parameters (``param`` op results) or any
    intermediate value. The new ops compute d(Σᵢ sum(targets[i] · target_gradients[i])) / d
    inputs[j], with ``target_gradients`` (values of the same program, typed like the targets)
    defaulting to ones, which only a single-element target may rely on. Values in
    ``no_grad_set`` are held constant. Returns a list with one value per input, or ``None``
    where no target depends on that input (as Paddle does).

    The gradient of an input that other inputs depend on is the total derivative (through
    those inputs too). The ops go before the program's ``return`` and reuse the forward ops
    rather than copy them. Call ``gradients`` on the returned values for higher orders,
    compute on them with :func:`paddlejax.capture.emit` (a gradient penalty, say) and make
    them outputs with :meth:`~paddlejax.ir.Program.set_outputs` to run them.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: jnp.sum((x @ p["w"]) ** 2), jnp.ones((1, 2)),
    ...                 params={"w": jnp.array([[1.0], [2.0]])})
    >>> w = prog.param_ops()[0].result
    >>> dw, dx = gradients(prog.outputs[0], [w, prog.inputs[0]])
    >>> (ddw,) = gradients(dx, w, target_gradients=prog.inputs[0])  # second order
    >>> prog.set_outputs([dw, dx, ddw])
    >>> [g.ravel().tolist() for g in prog(jnp.ones((1, 2)))]
    [[6.0, 6.0], [6.0, 12.0], [12.0, 12.0]]
    """
    targets, inputs = _as_list(targets), _as_list(inputs)
    cotangents = [None] * len(targets) if target_gradients is None else _as_list(target_gradients)
    stop = [] if no_grad_set is None else list(no_grad_set)
    if not targets or not inputs:
        raise ValueError("gradients: targets and inputs must each hold at least one value")
    if len(cotangents) != len(targets):
        raise ValueError(f"gradients: {len(targets)} targets but {len(cotangents)} target_gradients")
    labelled = ([(f"targets[{i}]", v) for i, v in enumerate(targets)]
                + [(f"inputs[{i}]", v) for i, v in enumerate(inputs)]
                + [(f"target_gradients[{i}]", v) for i, v in enumerate(cotangents) if v is not None]
                + [(f"no_grad_set[{i}]", v) for i, v in enumerate(stop)])
    program = program_of([v for _, v in labelled], "gradients", [label for label, _ in labelled])
    for label, v in labelled[:len(targets) + len(inputs)]:
        if not jnp.issubdtype(jnp.dtype(v.type.dtype), jnp.inexact):
            raise TypeError(f"gradients: {_describe(label, v)} is not floating-point; only "
                            "floating-point values have gradients")
    for i, (t, c) in enumerate(zip(targets, cotangents)):
        if c is None and t.type.size != 1:
            raise ValueError(f"gradients: {_describe(f'targets[{i}]', t)} is not a single element; "
                             f"pass target_gradients[{i}], a value of type {t.type}")
        if c is not None and c.type != t.type:
            raise ValueError(f"gradients: target_gradients[{i}] is {c.type} but targets[{i}] is {t.type}")
    between = _Slice(program.body.ops[:-1], targets, inputs, set(stop))
    if not between.leaves and not between.shifted:
        return [None] * len(inputs)
    pairs = [(t, c) for t, c in zip(targets, cotangents) if t in between.live]
    grads = _insert_vjp(program, between, pairs)
    return [grads.get(x) for x in inputs]


class _Slice:
    """The ops that lie between the inputs and the targets, and the values they read."""

    def __init__(self, ops, targets, inputs, stop: set):
        self.stop = stop
        self.live = {x for x in inputs if x not in stop}  # values that depend on an input
        forward = set()
        for op in ops:
            if any(v in self.live for v in op.operands):
                forward.add(op)
                self.live.update(r for r in op.results if r not in stop)
        needed = {t for t in targets if t not in stop}  # values the targets depend on
        backward = set()
        for op in reversed(ops):
            if any(r in needed for r in op.results):
                backward.add(op)
                needed.update(v for v in op.operands if v not in stop)
        self.ops = [op for op in ops if op in forward and op in backward]
        reached = list(dict.fromkeys(x for x in inputs if x in needed and x not in stop))
        # An input computed from other inputs gets a zero "shift" argument added to it: the
        # gradient w.r.t. the shift is the gradient w.r.t. that input.
        self.shifted = [x for x in reached if x.producer in forward]
        self.leaves = [x for x in reached if x.producer not in forward]
        produced = {r for op in self.ops for r in op.results} | set(self.leaves)
        self.free = list(dict.fromkeys(v for op in self.ops for v in op.operands if v not in produced))

    def run(self, program, leaf_arrays, free_arrays, shifts, dims) -> dict:
        """Evaluate the slice; returns the environment of values."""
        env = dict(zip(self.free, free_arrays))
        env.update(zip(self.leaves, leaf_arrays))
        shift_of = dict(zip(self.shifted, shifts))
        for op in self.ops:
            run_ops(program, [op], env, dims)
            for r in op.results:
                if r in shift_of:
                    env[r] = env[r] + shift_of[r]
                elif r in self.stop:
                    env[r] = jax.lax.stop_gradient(env[r])
        return env


def _insert_vjp(program, between: _Slice, pairs) -> dict[Value, Value]:
    """Trace the slice's VJP, insert it before ``return``; the gradient value of each reached input."""
    shapes = Shapes(program)
    given = [c for _, c in pairs if c is not None]

    def backward(leaf_arrays, free_arrays, given_arrays):
        def forward(leaf_arrays, shifts):
            env = between.run(program, leaf_arrays, free_arrays, shifts, shapes.env)
            return [env[t] for t, _ in pairs]

        zeros = [jnp.zeros(shapes.struct(x.type).shape, x.type.dtype) for x in between.shifted]
        _, pullback = jax.vjp(forward, list(leaf_arrays), zeros)
        supplied = iter(given_arrays)
        cotangents = [jnp.ones(shapes.struct(t.type).shape, t.type.dtype) if c is None else next(supplied)
                      for t, c in pairs]
        leaf_grads, shift_grads = pullback(cotangents)
        return [*leaf_grads, *shift_grads]

    groups = (between.leaves, between.free, given)
    jaxpr, consts = adapter.make_jaxpr(backward, *[[shapes.struct(v.type) for v in g] for g in groups])
    rewriter = Rewriter(program)
    existing = list(program.body.ops)
    outs = insert_jaxpr(rewriter, program.body.terminator, jaxpr, consts, [v for g in groups for v in g])
    old = set(existing)
    new_ops = [op for op in program.body.ops if op not in old]
    outs = _reuse_forward(rewriter, existing, new_ops, outs)
    _erase_unused(rewriter, new_ops, set(outs))
    return dict(zip([*between.leaves, *between.shifted], outs))


def _key(op: Op):
    """What an op computes: ops with equal keys have equal results (programs are pure)."""
    if op.blocks or op.type in ("return", "param"):
        return None
    return (op.type, tuple(id(v) for v in op.operands), repr(sorted(op.attrs.items())),
            tuple(r.type for r in op.results))


def _reuse_forward(rewriter: Rewriter, existing: list[Op], new_ops: list[Op], outs: list[Value]) -> list[Value]:
    """Replace new ops that recompute an existing op (the traced forward pass) by its results."""
    seen = {}
    for op in existing:
        if (key := _key(op)) is not None:
            seen.setdefault(key, op)
    moved: dict[Value, Value] = {}
    for op in new_ops:
        key = _key(op)
        if key is None:
            continue
        if key in seen:
            moved.update(zip(op.results, seen[key].results))
            rewriter.replace_op(op, seen[key].results)
        else:
            seen[key] = op
    return [moved.get(v, v) for v in outs]


def _erase_unused(rewriter: Rewriter, new_ops: list[Op], keep: set[Value]) -> None:
    """Erase new ops whose results nobody reads (the traced VJP's unused primal outputs)."""
    for op in reversed(new_ops):
        if op.parent is not None and not any(r.uses or r in keep for r in op.results):
            rewriter.erase_op(op)
