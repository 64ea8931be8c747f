"""Tune the conv kernels and the layout of a saved program on this device and show every time.

    paddlejax autotune out/model --size b=32 --frozen -o out/model.tuned

One row per conv op of the chosen plan: its input shapes, each candidate kernel's low-quartile
milliseconds ("skip": over the workspace limit or past the op's time limit; "-": not a
candidate for that op), the choice, and whether it was measured now or taken from the cache.
Then one row per whole-program plan (layout, with or without the per-op choices) with its
low-quartile milliseconds, the chosen one first. ``-o`` saves the program in the chosen layout with
the choices recorded as ``kernel`` annotations.
"""
from __future__ import annotations

from paddlejax.cli.common import check_not_input, parse_sizes, program_path
from paddlejax.table import format_table


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--size", action="append", default=[], metavar="NAME=N",
                   help="a symbolic size, e.g. b=32 (repeatable; others are 1)")
    p.add_argument("-o", "--output", help="where to save the tuned program")
    p.add_argument("--cache", default="", help="cache file (default $PADDLEJAX_AUTOTUNE_CACHE or "
                                               "~/.cache/paddlejax/autotune.json)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per candidate; the low quartile is shown")
    p.add_argument("--top-k", type=int, default=2,
                   help="time the default and the k kernels the cost model ranks fastest (0: every kernel)")
    p.add_argument("--workspace-mb", type=float, default=0.0,
                   help="skip kernels needing more extra memory than this (0: no limit)")
    p.add_argument("--layout", default="auto", choices=("auto", "keep", "NCHW", "NHWC"),
                   help="auto: time the program in NCHW and NHWC and keep the faster (default)")
    p.add_argument("--no-check", action="store_true",
                   help="trust the per-op timings: do not time whole programs (needs --layout other than auto)")
    p.add_argument("--frozen", action="store_true", help="time whole programs with frozen parameters")
    p.add_argument("--reduced-precision", action="store_true", help="let bfloat16 kernels compete")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while ops are timed")


def main(args) -> int:
    import jax

    from paddlejax.io import load, save
    from paddlejax.passes import PassContext
    from paddlejax.passes.autotune import Autotune, decision_table, default_cache_path, device_kind

    if args.output:
        program_path(args.output)
        check_not_input(args.output, programs=[args.path])
    program = load(args.path)
    sizes = parse_sizes(program, args.size)
    tune = Autotune(sizes=":".join(f"{k}={v}" for k, v in sizes.items()), repeats=args.repeats, top_k=args.top_k,
                    workspace_mb=args.workspace_mb, reduced_precision=args.reduced_precision, check=not args.no_check, layout=args.layout,
                    frozen=args.frozen, cache=args.cache, progress=not args.no_progress)
    ctx = PassContext()
    result = tune.apply(program, ctx)
    decisions, plans = ctx.cache["autotune"], ctx.cache["autotune_plans"]
    print(f"{program.name}: {len(decisions)} conv ops, {device_kind()}, jax {jax.__version__}, "
          f"cache {args.cache or default_cache_path()}")
    if decisions:
        print("low-quartile ms per kernel:")
        print(format_table(decision_table(decisions, args.reduced_precision)))
    if len(plans) > 1:
        print(f"whole program ({'frozen' if args.frozen else 'argument'} parameters), low-quartile ms:")
        print(format_table([("plan", "ms"), *((p.label, "skip" if p.ms is None else f"{p.ms:.3f}") for p in plans)], right_from=1))
    print(", ".join(f"{k} {v}" for k, v in result.stats.items()))
    if args.output:
        save(program, args.output)
        print(f"saved {args.output}")
    return 0
