"""Device meshes for a :class:`~paddlejax.distributed.Strategy`.

Data parallelism runs over the axis ``"dp"``, or, with ``hierarchical_allreduce``, over the
pair ``("inter", "intra")`` (``inter_nranks`` groups of neighbouring devices: the nodes). A
pipeline adds a leading ``"pp"`` axis; expert parallelism an ``"ep"`` axis after the
data-parallel ones (the batch is split over it too); tensor parallelism a trailing ``"mp"`` axis
(its collectives are the most frequent, so its groups are neighbouring devices): the mesh is
``pp_degree x dp_degree x expert_parallel_degree x tensor_parallel_degree``.

>>> import jax
>>> from paddlejax.distributed import Strategy, make_mesh, dp_axes
>>> mesh = make_mesh(Strategy(hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2))
>>> dict(mesh.shape), dp_axes(mesh)
({'inter': 2, 'intra': 4}, ('inter', 'intra'))
>>> dict(make_mesh(Strategy(tensor_parallel_degree=2, expert_parallel_degree=2)).shape)
{'dp': 2, 'ep': 2, 'mp': 2}
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh

from paddlejax.distributed.strategy import Strategy

DP, INTER, INTRA, PP, EP, MP = "dp", "inter", "intra", "pp", "ep", "mp"


def make_mesh(strategy: Strategy | None = None, devices=None) -> Mesh:
    """The mesh ``strategy`` asks for over ``devices`` (default ``jax.devices()``).

    Raises ``ValueError`` when ``pp_degree x dp_degree x tensor_parallel_degree`` is not the
    device count, or when ``hierarchical_allreduce_inter_nranks`` does not divide the
    data-parallel size.
    """
    strategy = strategy or Strategy()
    devices = np.asarray(jax.devices() if devices is None else devices).reshape(-1)
    n, pp, ep, mp = devices.size, strategy.pp_size, strategy.expert_parallel_degree, strategy.tensor_parallel_degree
    if strategy.dp_degree is None and n % (pp * ep * mp):
        raise ValueError(f"Strategy: pp_degree {pp} x expert_parallel_degree {ep} x tensor_parallel_degree {mp} does "
                         f"not divide the device count {n}")
    dp = strategy.dp_degree if strategy.dp_degree is not None else n // (pp * ep * mp)
    if pp * dp * ep * mp != n:
        raise ValueError(f"Strategy: pp_degree {pp} x dp_degree {dp} x expert_parallel_degree {ep} x "
                         f"tensor_parallel_degree {mp} = {pp * dp * ep * mp} devices, but there are {n}")
    if strategy.sharding.degree not in (None, dp):
        raise ValueError(f"Strategy.sharding.degree: {strategy.sharding.degree} must equal the data-parallel "
                         f"size {dp} (ZeRO shards over all data-parallel devices)")
    if strategy.hierarchical_allreduce:
        inter = strategy.hierarchical_allreduce_inter_nranks
        if dp % inter:
            raise ValueError(f"Strategy.hierarchical_allreduce_inter_nranks: {inter} does not divide the "
                             f"data-parallel size {dp}")
        shape, names = (inter, dp // inter), (INTER, INTRA)
    else:
        shape, names = (dp,), (DP,)
    if pp > 1:
        shape, names = (pp, *shape), (PP, *names)
    if ep > 1:
        shape, names = (*shape, ep), (*names, EP)
    if mp > 1:
        shape, names = (*shape, mp), (*names, MP)
    return Mesh(devices.reshape(shape), names)


def dp_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the batch is split over (every axis but ``"pp"`` and ``"mp"``)."""
    return tuple(a for a in mesh.axis_names if a not in (PP, MP))


def dp_size(mesh: Mesh) -> int:
    """The number of data-parallel replicas of ``mesh``."""
    return math.prod(mesh.shape[a] for a in dp_axes(mesh))


def check_batch(batch_size: int, mesh: Mesh) -> None:
    """Raise ``ValueError`` unless ``batch_size`` splits evenly over the data-parallel devices."""
    size = dp_size(mesh)
    if batch_size % size:
        raise ValueError(f"batch size {batch_size} is not divisible by the data-parallel size {size}")
