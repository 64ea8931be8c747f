"""Measure a saved program's inference latency with and without the inference passes, frozen or not.

    paddlejax bench out/model --batch 32 --repeats 50

Every variant runs in this one process on the same random inputs, their calls interleaved round
by round, so the ratios are comparable even on a shared, noisy machine. Each row is a Predictor
compiled for exactly ``--batch``; "build s" is the time to create it (passes, autotuning unless
cached, compilation).
"""
from __future__ import annotations

import math
import statistics
import time

from paddlejax.table import format_table


CPU_DISPATCH = "sync"  # each call is waited for: run it on the calling thread (paddlejax.dispatch)


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per variant; the median is shown")
    p.add_argument("--no-passes", action="store_true", help="only the program as saved, without the inference passes")


def _build(program, batch: int, passes: str | None, freeze: bool):
    """The predictor and the seconds it took to build (passes, tuning, compilation)."""
    from paddlejax.inference import Config, Predictor

    start = time.perf_counter()
    predictor = Predictor(program, Config(passes=passes, freeze_params=freeze, max_batch_size=batch))
    return predictor, time.perf_counter() - start


def main(args) -> int:
    import jax

    from paddlejax.inference import batch_dim
    from paddlejax.io import load
    from paddlejax.passes.autotune import measure_programs, random_inputs

    if args.batch < 1 or args.repeats < 1:
        raise ValueError(f"--batch and --repeats must be positive, got {args.batch} and {args.repeats}")
    program = load(args.path)
    inputs = random_inputs(program, {batch_dim(program): args.batch})
    variants = [("as saved", ""), ("inference passes", None)][: 1 if args.no_passes else 2]
    built = {f"{label}, {'frozen' if freeze else 'argument'} params": _build(program, args.batch, passes, freeze)
             for label, passes in variants for freeze in (False, True)}
    # calls interleaved round by round, so that every variant sees the same machine
    rounds = measure_programs({name: predictor for name, (predictor, _) in built.items()}, tuple(inputs),
                              warmup=1, repeats=args.repeats, deadline=math.inf)
    rows = [(name, build, statistics.median(rounds[name])) for name, (_, build) in built.items()]
    base = rows[0][2]
    print(f"{program.name}: batch {args.batch}, {args.repeats} repeats, {jax.devices()[0].device_kind}")
    table = [("variant", "build s", "median ms", "samples/s", "speedup")]
    table += [(name, f"{build:.2f}", f"{t * 1e3:.3f}", f"{args.batch / t:,.0f}", f"{base / t:.2f}x")
              for name, build, t in rows]
    print(format_table(table, right_from=1))
    return 0
