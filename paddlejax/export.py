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

from paddlejax.ir.core import Program
from paddlejax.lowering import run_program


def _input_specs(program: Program, batch: str | None) -> list:
    """ShapeDtypeStructs of the inputs; symbolic sizes share one scope.

    With ``batch``, a static leading size becomes the symbol ``batch``; sizes that are
    already symbolic keep their names.
    """
    dims = []
    for v in program.inputs:
        shape = [str(d) for d in v.type.shape]
        if batch is not None and shape and v.type.shape and isinstance(v.type.shape[0], int):
            shape[0] = batch
        dims.append(shape)
    scope = jax.export.SymbolicScope()
    out = []
    for shape, v in zip(dims, program.inputs):
        sym = jax.export.symbolic_shape(",".join(shape), scope=scope) if shape else ()
        out.append(jax.ShapeDtypeStruct(sym, jax.numpy.dtype(v.type.dtype)))
    return out


def export(program: Program, path=None, batch: str | None = "b", platforms=None) -> jax.export.Exported:
    """Export ``program`` (parameters included) and, if ``path`` is given, write it there.

    ``batch`` names the symbolic leading size given to inputs whose leading size is static
    (``None`` keeps static sizes); ``platforms`` (e.g. ``["cpu", "cuda"]``) picks targets.
    """
    params = program.params

    def fn(*leaves):
        inputs = jax.tree_util.tree_unflatten(program.in_tree, leaves)
        return run_program(program, params, inputs)

    specs = _input_specs(program, batch)
    try:
        exported = jax.export.export(jax.jit(fn), platforms=platforms)(*specs)
    except Exception as e:
        if batch is not None and any(isinstance(d, int) for v in program.inputs for d in v.type.shape[:1]):
            raise ValueError(f"cannot export '{program.name}' with a symbolic batch '{batch}': the "
                             "program was traced with a fixed batch size that its ops depend on. "
                             "Trace with pj.InputSpec((None, ...)) or export with batch=None. "
                             f"({type(e).__name__}: {str(e).splitlines()[0]})") from e
        raise
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(exported.serialize())
    return exported
