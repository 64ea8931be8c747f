"""The line charts compression draws (sensitivity, search rewards): one figure, labelled and saved.

>>> import os, tempfile
>>> def draw(ax):
...     ax.plot([1, 2], [0.5, 0.7], marker="o", label="reward")
>>> path = line_chart(draw, os.path.join(tempfile.mkdtemp(), "c.png"), "step", "reward", "demo", "example")
>>> os.path.getsize(path) > 1000
True
"""
from __future__ import annotations

from typing import Callable


def line_chart(draw: Callable, path: str, xlabel: str, ylabel: str, title: str, feature: str,
               legend_size: int = 8) -> str:
    """A 7x4.5 inch chart whose lines ``draw(ax)`` plots, with labels, a grid and a legend,
    written to ``path`` (PNG); returns ``path``. ``feature`` names the caller when matplotlib
    is missing."""
    from paddlejax._extras import new_figure

    fig = new_figure(feature, figsize=(7, 4.5))
    ax = fig.subplots()
    draw(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
