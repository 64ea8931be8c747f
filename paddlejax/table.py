"""Plain-text tables, for reports and the command line.

>>> print(format_table([("name", "ms"), ("conv", "1.50")], right_from=1))
name    ms
conv  1.50
"""
from __future__ import annotations

from typing import Sequence


def format_table(rows: Sequence[Sequence[str]], right_from: int | None = None) -> str:
    """``rows`` of strings as aligned columns; columns from ``right_from`` on are right-aligned
    (numbers), the others left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = len(widths) if right_from is None else right_from
    return "\n".join("  ".join(c.rjust(w) if i >= right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)
