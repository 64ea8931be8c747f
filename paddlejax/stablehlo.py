"""Export a program as a ``jax.export`` (StableHLO) artifact for deployment without paddlejax.

The parameters are baked into the artifact as constants; a symbolic batch size makes one
artifact serve any batch. A fresh process needs only JAX:

    exp = jax.export.deserialize(open("model.stablehlo", "rb").read())
    y = exp.call(x)

>>> import jax.numpy as jnp, paddlejax as pj, tempfile, os
>>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
>>> exp = pj.export(prog, os.path.join(tempfile.mkdtemp(), "m.stablehlo"))
>>> exp.call(jnp.ones((5, 3))).shape
(5, 3)
"""
from __future__ import annotations

from pathlib import Path

import jax

from paddlejax.ir.core import Program, TensorType
from paddlejax.lowering import run_program


def _with_symbolic_batch(program: Program, batch: str) -> Program:
    """A copy whose inputs with a static leading size take the symbolic size ``batch``.

    Only the signature changes, so the copy is checked at a second batch size: ops whose
    attributes baked in the traced batch size fail there, and the error says how to trace.
    """
    relaxed = program.clone()
    probes = []
    for v in relaxed.inputs:
        shape = v.type.shape
        if shape and isinstance(shape[0], int):
            probes.append(jax.ShapeDtypeStruct((shape[0] + 1, *shape[1:]), jax.numpy.dtype(v.type.dtype)))
            v.type = TensorType((batch, *shape[1:]), v.type.dtype)
        else:
            probes.append(None)
    if all(p is not None for p in probes):
        inputs = jax.tree_util.tree_unflatten(relaxed.in_tree, probes)
        try:
            # lowering, not just shape evaluation: some lax shape rules check sizes only there
            jax.jit(lambda *a: run_program(relaxed, relaxed.params, a)).lower(*inputs)
        except Exception as e:
            raise ValueError(f"cannot export '{program.name}' with a symbolic batch '{batch}': the "
                             "program was traced with a fixed batch size that its ops depend on. Trace "
                             "with pj.InputSpec((None, ...)) or export with batch=None. "
                             f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return relaxed


def _input_specs(program: Program) -> list:
    """ShapeDtypeStructs of the inputs; symbolic sizes share one scope."""
    scope = jax.export.SymbolicScope()
    out = []
    for v in program.inputs:
        shape = ",".join(str(d) for d in v.type.shape)
        sym = jax.export.symbolic_shape(shape, scope=scope) if shape else ()
        out.append(jax.ShapeDtypeStruct(sym, jax.numpy.dtype(v.type.dtype)))
    return out


def export(program: Program, path=None, batch: str | None = "b", platforms=None) -> jax.export.Exported:
    """Export ``program`` (parameters included) and, if ``path`` is given, write it there.

    ``batch`` names the symbolic leading size given to inputs whose leading size is static
    (``None`` keeps static sizes); ``platforms`` (e.g. ``["cpu", "cuda"]``) picks targets.
    """
    static = any(v.type.shape and isinstance(v.type.shape[0], int) for v in program.inputs)
    if batch is not None and static:
        program = _with_symbolic_batch(program, batch)
    params = program.params

    def fn(*leaves):
        inputs = jax.tree_util.tree_unflatten(program.in_tree, leaves)
        return run_program(program, params, inputs)

    specs = _input_specs(program)
    exported = jax.export.export(jax.jit(fn), platforms=platforms)(*specs)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(exported.serialize())
    return exported
