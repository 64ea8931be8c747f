"""Tune the conv kernels of a saved program on this device and show every candidate's time.

    paddlejax autotune out/model --size b=32 -o out/model.tuned

One row per conv op: its input shapes, each candidate kernel's median milliseconds ("skip":
over the workspace limit or past the op's time limit; "-": not a candidate for that op), the
choice, and whether it was measured now or taken from the cache. ``-o`` saves the program
with the choices recorded as ``kernel`` annotations.
"""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--size", action="append", default=[], metavar="NAME=N",
                   help="a symbolic size, e.g. b=32 (repeatable; others are 1)")
    p.add_argument("-o", "--output", help="where to save the tuned program")
    p.add_argument("--cache", default="", help="cache file (default $PADDLEJAX_AUTOTUNE_CACHE or "
                                               "~/.cache/paddlejax/autotune.json)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per candidate; the median is shown")
    p.add_argument("--workspace-mb", type=float, default=0.0,
                   help="skip kernels needing more extra memory than this (0: no limit)")


def _table(decisions) -> list[tuple[str, ...]]:
    from paddlejax.passes.autotune import candidates

    columns = list(dict.fromkeys(c for d in decisions for c in candidates(d.signature["op"])))
    rows = [("#", "op", "input shapes", *columns, "chosen", "from")]
    for i, d in enumerate(decisions):
        shapes = ", ".join("x".join(map(str, s)) for s in d.signature["shapes"])
        times = [("-" if c not in d.times_ms else "skip" if d.times_ms[c] is None else f"{d.times_ms[c]:.3f}")
                 for c in columns]
        rows.append((str(i), d.signature["op"], shapes, *times, d.chosen, "cache" if d.cached else "measured"))
    return rows


def main(args) -> int:
    import jax

    from paddlejax.io import load, save
    from paddlejax.passes import PassContext
    from paddlejax.passes.autotune import Autotune, default_cache_path, device_kind

    program = load(args.path)
    tune = Autotune(sizes=":".join(args.size), repeats=args.repeats, workspace_mb=args.workspace_mb,
                    cache=args.cache)
    ctx = PassContext()
    result = tune.apply(program, ctx)
    decisions = ctx.cache["autotune"]
    print(f"{program.name}: {len(decisions)} conv ops, {device_kind()}, jax {jax.__version__}, "
          f"cache {args.cache or default_cache_path()}")
    if decisions:
        print("median ms per kernel:")
        rows = _table(decisions)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(", ".join(f"{k} {v}" for k, v in result.stats.items()))
    if args.output:
        save(program, args.output)
        print(f"saved {args.output}")
    return 0
