"""Tensor-parallel layout marks: ``sharding_constraint(x, dim=-1, mesh_axis="mp")`` is the identity
and asks XLA's partitioner to split dimension ``dim`` of ``x`` over the mesh axis ``mesh_axis``
(None, the default: keep that dimension whole on every device); the other dimensions stay the partitioner's
choice (so a batch split over ``"dp"`` stays split).

The mark reads the mesh of the surrounding ``jax.set_mesh``: without one, on a mesh without the
named axis (one device, data parallel only), or inside a ``shard_map`` that made every axis
manual, it does nothing, so a tensor-parallel model runs unchanged anywhere. It is how Megatron-style layers (:mod:`paddlejax.distributed.tensor_parallel`)
say where activations are split; XLA then inserts the collectives (an all-reduce after a
row-parallel matmul, an all-gather where a column-parallel output is gathered).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.sharding_constraint(x * 2.0, dim=-1, mesh_axis="mp"), jnp.ones((2, 4)))
>>> [op.type for op in prog.walk()][1:3]
['lax.mul', 'sharding_constraint']
>>> prog(jnp.ones((2, 4))).tolist()[0]
[2.0, 2.0, 2.0, 2.0]
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits

# mesh axes that never split the batch: pipeline stages and tensor-parallel groups
NOT_BATCH = ("pp", "mp")


def mesh_axes() -> tuple[str, ...]:
    """The axes of the mesh set by ``jax.set_mesh`` around the current trace that XLA's partitioner
    still splits over: not those a surrounding ``shard_map`` made manual (none: ``()``)."""
    mesh = jax.sharding.get_abstract_mesh()
    return tuple(a for a, kind in zip(mesh.axis_names, mesh.axis_types) if kind != jax.sharding.AxisType.Manual)


def batch_axes() -> tuple[str, ...]:
    """The axes of :func:`mesh_axes` that split the batch: all but pipeline stages (``"pp"``) and
    tensor-parallel groups (``"mp"``), in mesh order."""
    return tuple(a for a in mesh_axes() if a not in NOT_BATCH)


def laid_out(x, spec: P):
    """``x`` resharded to ``spec`` where the mesh's axes are explicit (``jax.make_mesh``'s default,
    under which ``shard_map`` takes only inputs already laid out as its ``in_specs`` say); as it
    is on an auto mesh, where the partitioner moves it."""
    mesh = jax.sharding.get_abstract_mesh()
    if jax.sharding.AxisType.Explicit in mesh.axis_types:
        return jax.sharding.reshard(x, spec)
    return x


def sharding_problem(spec, rank: int) -> str | None:
    """What is wrong with a parameter's ``sharding`` (one entry per dimension: a mesh axis name, a
    tuple of them, or None for whole), or None when it is well formed.

    >>> sharding_problem((None, "mp"), 2) is None, sharding_problem(("mp",), 2)
    (True, 'has 1 entries for a rank-2 value')
    """
    if not isinstance(spec, tuple):
        return f"must be a tuple, got {spec!r}"
    if len(spec) != rank:
        return f"has {len(spec)} entries for a rank-{rank} value"
    names = [a for entry in spec for a in (entry if isinstance(entry, tuple) else (entry,)) if a is not None]
    if not all(isinstance(a, str) and a for a in names):
        return f"entries must be mesh axis names, tuples of them or None, got {spec!r}"
    if len(set(names)) != len(names):
        return f"names a mesh axis twice in {spec!r}"
    return None


def partition_spec(spec, axes: tuple[str, ...]) -> P:
    """A parameter's ``sharding`` as a ``PartitionSpec`` on a mesh with ``axes``: axes the mesh
    lacks are dropped (that dimension is whole there), so one program runs on any mesh.

    >>> tuple(partition_spec((None, "mp"), ("dp", "mp"))), tuple(partition_spec((None, "mp"), ("dp",)))
    ((None, 'mp'), (None, None))
    """
    def keep(entry):
        kept = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a in axes)
        return kept[0] if len(kept) == 1 else (kept or None)

    return P(*(keep(entry) for entry in spec))


def _sharding_constraint(x, *, dim, mesh_axis):
    """``x``, its dimension ``dim`` split over ``mesh_axis`` (None: whole) where the mesh has that axis."""
    axes = mesh_axes()
    if not axes or (mesh_axis is not None and mesh_axis not in axes) or x.ndim == 0:
        return x
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"sharding_constraint: dim {dim} is out of range for rank {x.ndim}")
    spec = [P.UNCONSTRAINED] * x.ndim
    spec[dim] = mesh_axis
    return jax.lax.with_sharding_constraint(x, P(*spec))


sharding_constraint = define(
    "sharding_constraint", _sharding_constraint, inputs=[Input("x")],
    attrs={"dim": Attr("int", -1), "mesh_axis": Attr("str", None, optional=True)},
    flops=lambda ins, outs, attrs: 0, traits=Traits(channels="identity"))
