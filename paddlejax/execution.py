"""Running and compiling programs: ``prog(x)``, ``prog.apply`` and ``prog.compile`` live here.

A :class:`~paddlejax.ir.Program` is data; this module, in the lowering layer above the IR,
turns it into jitted functions over :func:`paddlejax.lowering.run_program`. The Program's own
methods are one-line conveniences over these functions.

>>> import jax, jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
>>> call(prog, jnp.ones((1, 2))).tolist()
[[1.0, 1.0]]
>>> f = compile_program(prog, jax.ShapeDtypeStruct((3, 2), "float32"), freeze_params=True)
>>> f(jnp.ones((3, 2))).shape
(3, 2)
"""
from __future__ import annotations

import collections
import functools
import hashlib
import weakref

import jax
import numpy as np

from paddlejax.ir.core import Program
from paddlejax.lowering import run_program, same_structure

# One jitted ``apply`` per program, rebuilt when a rewrite bumps the program's revision.
_JITTED: "weakref.WeakKeyDictionary[Program, tuple[int, object]]" = weakref.WeakKeyDictionary()
# The last few ahead-of-time compilations, by all that decides the executable: the same program
# compiled again for the same shapes (the plan the autotuner timed, then compiled by the
# Predictor that chose it) takes the executable already built instead of XLA's seconds.
RECENT_COMPILATIONS = 4
_RECENT: "collections.OrderedDict[tuple, jax.stages.Compiled]" = collections.OrderedDict()


def call(program: Program, *inputs):
    """``program(*inputs)`` with its own parameters, compiled with ``jax.jit`` on first call
    (and again after the program is rewritten)."""
    cached = _JITTED.get(program)
    if cached is None or cached[0] != program.revision:
        cached = _JITTED[program] = (program.revision, jax.jit(functools.partial(run_apply, program)))
    return cached[1](program.params, *inputs)


def run_apply(program: Program, params: dict, *inputs):
    """The program as a pure function of ``params``: what :meth:`Program.apply` runs."""
    return run_program(program, params, inputs)


class CompiledProgram:
    """``f(*inputs)`` calling ``func(*bound, *leaves of inputs)``; ``func`` is the jitted or
    compiled function (``f.func``, as with ``functools.partial``: ``memory_analysis()``,
    ``as_text()`` when compiled ahead of time)."""

    def __init__(self, func, bound: tuple, program: Program):
        self.func = func
        self.bound = bound
        self.name, self.in_tree = program.name, program.in_tree

    def __call__(self, *inputs):
        leaves, tree = jax.tree_util.tree_flatten(inputs)
        if not same_structure(tree, self.in_tree):
            raise TypeError(f"{self.name}: expects inputs structured as {self.in_tree}, got {tree}")
        return self.func(*self.bound, *leaves)


def compile_program(program: Program, *example_inputs, freeze_params: bool = False,
                    donate: bool = False) -> CompiledProgram:
    """A compiled callable of a snapshot of ``program`` and its parameters (see
    :meth:`Program.compile` for the options)."""
    snapshot, params = program.clone(), program.used_params()
    in_tree = snapshot.in_tree
    donated = tuple(snapshot.body.terminator.attrs.get("donate", ())) if donate else ()
    key = None
    if example_inputs:
        key = _compilation_key(snapshot, params if freeze_params else {}, jax.tree_util.tree_leaves(example_inputs),
                               donated)
        if key in _RECENT:
            _RECENT.move_to_end(key)
            return CompiledProgram(_RECENT[key], () if freeze_params else (params,), snapshot)

    def run(p, *leaves):
        return run_program(snapshot, p, jax.tree_util.tree_unflatten(in_tree, leaves))

    # inputs are passed flat, so that a donated input is one positional argument
    if freeze_params:
        fn, bound = jax.jit(functools.partial(run, params), donate_argnums=donated), ()
    else:
        fn, bound = jax.jit(run, donate_argnums=tuple(i + 1 for i in donated)), (params,)
    if example_inputs:
        fn = fn.lower(*bound, *jax.tree_util.tree_leaves(example_inputs)).compile()
    if key is not None:
        _RECENT[key] = fn
        while len(_RECENT) > RECENT_COMPILATIONS:
            _RECENT.popitem(last=False)
    return CompiledProgram(fn, bound, snapshot)


def _compilation_key(program: Program, frozen: dict, leaves: list, donated: tuple) -> tuple:
    """What decides an ahead-of-time executable: the program's text, the values of the
    parameters frozen into it, the inputs' shapes and dtypes, donation, and the default device
    and precision it is compiled for."""
    digest = hashlib.blake2b(str(program).encode(), digest_size=20)
    for name in sorted(frozen):
        value = np.ascontiguousarray(frozen[name])
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        digest.update(memoryview(value).cast("B"))
    return (digest.hexdigest(), tuple((tuple(x.shape), str(x.dtype)) for x in leaves), donated,
            str(jax.config.jax_default_device or jax.devices()[0]), jax.config.jax_enable_x64)
