"""Gradient all-reduce inside ``shard_map`` (fused into buckets, or hierarchical), and a count of
the collectives in compiled HLO.

Fusion packs gradients of one dtype, in order, into buckets of at most ``bucket_mb`` megabytes
(a larger gradient gets a bucket of its own), concatenates each bucket flat and all-reduces it
with one ``psum``: fewer, larger collectives, as Paddle's ``fuse_all_reduce_ops``.

Hierarchical all-reduce on the axes ``("inter", "intra")`` sums within a node (``intra``) and
then across nodes (``inter``): two all-reduces. The bandwidth-optimal alternative
(reduce-scatter intra, all-reduce inter, all-gather intra) ends in ``all_gather``, whose result
``shard_map`` types as varying over ``intra``; the replicated gradients an optimizer needs would
then require switching off its replication check, so both levels are ``psum``.

>>> import jax, jax.numpy as jnp
>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(jax.devices()[:2], ("dp",))
>>> mean = jax.shard_map(lambda g: all_reduce_mean(g, ("dp",), fuse=True), mesh=mesh,
...                      in_specs=P("dp"), out_specs=P())
>>> step = jax.jit(mean)
>>> step({"a": jnp.array([1.0, 3.0]), "b": jnp.array([[2.0], [4.0]])})["a"].tolist()
[2.0]
>>> collective_stats(step.lower({"a": jnp.ones(2), "b": jnp.ones((2, 1))}).compile())["all-reduce"]
1
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")
_INSTRUCTION = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b(?P<dtype>pred|[subf]\d+|bf16|f8\w*|c\d+)\[(?P<dims>[\d,]*)\]")
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY )?%?(?P<name>[\w.-]+) .*\{$")
_BRANCHES = re.compile(r"(?:branch_computations=\{(?P<list>[^}]*)\}|(?:true|false)_computation=(?P<one>%?[\w.-]+))")
_NAME = re.compile(r"[\w.-]+")  # a computation's name where it is called (with or without "%")


def buckets(leaves, bucket_mb: float) -> list[list[int]]:
    """Indices of ``leaves`` grouped into buckets of one dtype and at most ``bucket_mb`` MB each.

    >>> buckets([jnp.zeros(100), jnp.zeros(100), jnp.zeros(300)], bucket_mb=1e-3)
    [[0, 1], [2]]
    """
    limit = bucket_mb * 2**20
    out, open_bucket = [], {}  # dtype -> (index into out, bytes so far)
    for i, leaf in enumerate(leaves):
        size = leaf.size * leaf.dtype.itemsize
        slot = open_bucket.get(leaf.dtype)
        if slot is not None and slot[1] + size <= limit:
            out[slot[0]].append(i)
            open_bucket[leaf.dtype] = (slot[0], slot[1] + size)
        else:
            out.append([i])
            open_bucket[leaf.dtype] = (len(out) - 1, size)
    return out


def psum(x, axes: tuple[str, ...], hierarchical: bool = False):
    """``lax.psum`` over ``axes``; ``hierarchical`` sums over the last (innermost) axis first."""
    if not hierarchical:
        return lax.psum(x, axes)
    for axis in reversed(axes):
        x = lax.psum(x, axis)
    return x


def all_reduce_mean(grads, axes: tuple[str, ...], *, fuse: bool = False, bucket_mb: float = 32.0,
                    hierarchical: bool = False):
    """The mean of ``grads`` (a pytree) over the mesh ``axes``; call inside ``shard_map``.

    Without ``fuse``, one all-reduce per leaf; with it, one per bucket (see :func:`buckets`).
    """
    n = math.prod(lax.axis_size(a) for a in axes)
    leaves, treedef = jax.tree.flatten(grads)
    if not fuse:
        return jax.tree.unflatten(treedef, [psum(g, axes, hierarchical) / n for g in leaves])
    out = list(leaves)
    for bucket in buckets(leaves, bucket_mb):
        flat = psum(jnp.concatenate([leaves[i].reshape(-1) for i in bucket]), axes, hierarchical) / n
        offsets = np.cumsum([leaves[i].size for i in bucket])[:-1]
        for i, part in zip(bucket, jnp.split(flat, offsets)):
            out[i] = part.reshape(leaves[i].shape)
    return jax.tree.unflatten(treedef, out)


def all_to_all(x, axes: tuple[str, ...], split_axis: int, concat_axis: int, hierarchical: bool = False):
    """``lax.all_to_all`` over the devices of the mesh ``axes`` (inside ``shard_map``): ``x``'s
    ``split_axis`` cut into one piece per device, piece ``j`` sent to device ``j`` (row-major over
    ``axes``), the pieces received concatenated along ``concat_axis`` in the senders' order.

    ``hierarchical`` exchanges over the innermost axis first and then over each outer one (two
    steps on ``("inter", "intra")``: within a node, then across nodes), with the same result. Each
    device then sends one message across the nodes to each other node, carrying every piece bound
    for it, where the flat exchange sends one per device there: fewer, larger messages over the
    slow links, at the price of moving the data twice (Paddle 2.3's topology-aware all-to-all).

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(jax.devices()[:4], ("dp",))
    >>> swap = jax.shard_map(lambda x: all_to_all(x, ("dp",), 0, 0), mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))
    >>> swap(jnp.arange(16.0)).tolist()[:4]   # device 0 receives every device's first piece
    [0.0, 4.0, 8.0, 12.0]
    """
    if not hierarchical or len(axes) == 1:
        return lax.all_to_all(x, axes, split_axis, concat_axis, tiled=True)
    sizes = [lax.axis_size(a) for a in axes]
    n = math.prod(sizes)
    pieces = jnp.moveaxis(x, split_axis, 0)
    rest = pieces.shape[1:]
    pieces = pieces.reshape(*sizes, pieces.shape[0] // n, *rest)  # [destination per axis..., piece]
    for i in reversed(range(len(axes))):  # innermost first: within a node, then across
        pieces = lax.all_to_all(pieces, axes[i], i, i, tiled=True)
    # [sender per axis..., piece] -> the senders' pieces in x's layout, concatenated along concat_axis
    pieces = jnp.moveaxis(pieces.reshape(n, -1, *rest), 1, split_axis + 1)
    pieces = jnp.moveaxis(pieces, 0, concat_axis)
    shape = list(pieces.shape)
    return pieces.reshape(*shape[:concat_axis], n * shape[concat_axis + 1], *shape[concat_axis + 2:])


def _hlo_text(compiled_or_hlo) -> str:
    if isinstance(compiled_or_hlo, str):
        return compiled_or_hlo
    if isinstance(compiled_or_hlo, jax.stages.Lowered):
        compiled_or_hlo = compiled_or_hlo.compile()  # a Lowered: its text is StableHLO, not HLO
    return compiled_or_hlo.as_text()


def _arrays(shape: str) -> list[int]:
    """Bytes of every array in an HLO shape (one, or a tuple)."""
    sizes = []
    for m in _ARRAY.finditer(shape):
        bits = 8 if m["dtype"] == "pred" else int(re.match(r"\D+(\d+)", m["dtype"])[1])
        sizes.append(math.prod(int(d) for d in m["dims"].split(",") if d) * bits // 8)
    return sizes


def _computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """The HLO module's computations (name -> instruction lines) and the entry's name."""
    bodies, entry, current = {}, None, None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = bodies.setdefault(m["name"], [])
            entry = m["name"] if m["entry"] else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
    return bodies, entry


def _conditional(bodies: dict[str, list[str]], entry: str | None) -> set[str]:
    """Computations that run only in a branch of a ``conditional`` (not on every execution)."""
    if entry is None:
        return set()
    always, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in always or name not in bodies:
            continue
        always.add(name)
        for line in bodies[name]:
            branches = {b for m in _BRANCHES.finditer(line) for b in _NAME.findall(m["list"] or m["one"])}
            callees = {c for c in _NAME.findall(line.split(" metadata=")[0].split("(", 1)[-1]) if c in bodies}
            todo.extend(callees - branches)
    return set(bodies) - always


def collective_stats(compiled_or_hlo) -> dict[str, int]:
    """Counts of the collectives in HLO (a ``Compiled``, a ``Lowered`` that is compiled first, or
    HLO text such as ``lowered.as_text(dialect="hlo")``, before XLA's optimisations):
    ``{"all-reduce": instructions, "all-reduce buffers": arrays, "all-reduce bytes": result
    bytes, "all-reduce conditional" and "all-reduce conditional bytes": those that run only in
    a branch of a conditional (gradient merge's all-reduce, every k-th step), ...}`` for
    all-reduce, reduce-scatter, all-gather, collective-permute and all-to-all.

    XLA's own combiner may merge several collectives into one instruction over a tuple; the
    ``buffers`` count still tells them apart. An async pair (``-start``/``-done``) counts once,
    with the ``-start`` result's arrays."""
    keys = ("", " buffers", " bytes", " conditional", " conditional bytes")
    stats = {f"{op}{key}": 0 for op in COLLECTIVES for key in keys}
    text = _hlo_text(compiled_or_hlo)
    bodies, entry = _computations(text)
    conditional = _conditional(bodies, entry)
    for name, lines in bodies.items() if entry is not None else [(None, text.splitlines())]:
        for m in _INSTRUCTION.finditer("\n".join(lines)):
            sizes = _arrays(m["shape"])
            stats[m["op"]] += 1
            stats[f"{m['op']} buffers"] += len(sizes)
            stats[f"{m['op']} bytes"] += sum(sizes)
            if name in conditional:
                stats[f"{m['op']} conditional"] += 1
                stats[f"{m['op']} conditional bytes"] += sum(sizes)
    return stats
