"""Pictures of pruning: the program's ops coloured by the channel group their results carry.

>>> import jax.numpy as jnp, os, tempfile, paddlejax as pj
>>> p = {"w1": jnp.ones((4, 2, 3, 3)), "w2": jnp.ones((3, 4, 3, 3))}
>>> prog = pj.trace(lambda p, x: pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["w1"])), p["w2"]),
...                 pj.InputSpec((None, 2, 8, 8)), params=p)
>>> path = os.path.join(tempfile.mkdtemp(), "groups.png")
>>> plot_groups(prog, path) == path and os.path.getsize(path) > 1000
True
"""
from __future__ import annotations

import os

from paddlejax._extras import new_figure
from paddlejax.ir.core import Program
from paddlejax.passes.query import param_name
from paddlejax.slim.pruning.groups import ChannelGraph


def plot_groups(program: Program, path: str | os.PathLike, max_ops: int = 80, title: str | None = None):
    """Draw ``program``'s main-block ops top to bottom, each coloured by the prunable group
    whose channels its result carries (grey: none; hatched: frozen channels that cannot be
    pruned), with data-flow edges (skip connections curve aside) and a legend of the groups
    and their channel counts. Writes a PNG to ``path`` and returns it."""
    fig = new_figure("plot_groups")  # first: without matplotlib the error names the extra
    import matplotlib
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    graph = ChannelGraph(program)
    groups = graph.groups()
    root_group = {graph.sets.find(i): k for k, g in enumerate(groups) for c in g.classes for i in c}
    frozen = {graph.sets.find(i) for i in graph.frozen}
    ops = [op for op in program.body.ops if op.type not in ("param", "constant", "return")][:max_ops]
    row = {id(op): i for i, op in enumerate(ops)}
    colours = matplotlib.colormaps["tab10"]
    fig.set_size_inches(7, 0.32 * len(ops) + 1.5)
    ax = fig.subplots()
    for i, op in enumerate(ops):
        found = [graph.sets.find(int(x)) for _, ids in graph.tracked(op.results[0]) for x in ids if x >= 0] \
            if op.results else []
        member = next((root_group[r] for r in found if r in root_group), None)
        colour = colours(member % 10) if member is not None else "0.85"
        hatch = "///" if member is None and any(r in frozen for r in found) else None
        ax.add_patch(Rectangle((-1, -i - 0.35), 2, 0.7, facecolor=colour, hatch=hatch, edgecolor="0.3", lw=0.6))
        weight = next((param_name(v) for v in op.operands if param_name(v) is not None), None)
        ax.text(0, -i, op.type + (f"  {weight}" if weight else ""), ha="center", va="center", fontsize=7)
        for v in op.operands:
            src = v.producer
            if src is not None and id(src) in row:
                j = row[id(src)]
                bend = 0.0 if i - j == 1 else 0.5
                ax.add_patch(FancyArrowPatch((1 if bend else 0, -j - 0.35 if not bend else -j),
                                             (1 if bend else 0, -i + 0.35 if not bend else -i),
                                             connectionstyle=f"arc3,rad={-bend}", arrowstyle="-|>",
                                             mutation_scale=7, lw=0.6, color="0.4"))
    handles = [Patch(facecolor=colours(k % 10), label=f"{', '.join(g.producers)[:48]} ({len(g.classes)})")
               for k, g in enumerate(groups)]
    handles += [Patch(facecolor="0.85", hatch="///", label="frozen (reaches an output or an op without a rule)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7, frameon=False,
              title="prunable groups (channels)", title_fontsize=8)
    ax.set_xlim(-1.2, 2.2)
    ax.set_ylim(-len(ops) + 0.3, 0.7)
    ax.axis("off")
    ax.set_title(title or f"{program.name}: channel groups", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
