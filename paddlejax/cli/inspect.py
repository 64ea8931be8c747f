"""Show a saved program: its IR, parameter counts, FLOPs and estimated memory.

    paddlejax inspect out/model --size b=32 --memory

Parameters are counted apart from buffers: parameters the ops read only as state (batch norm's
running mean and variance), which training does not update by gradients. ``--memory`` adds the live-bytes timeline (peak, where, largest live tensors there), the
in-place reuse plan and XLA's own figures; ``--plot out.png`` draws live bytes per op.
"""
from __future__ import annotations

from paddlejax.cli.common import parse_sizes, plot_path


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program (PATH, PATH.json or PATH.safetensors)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=N",
                   help="value of a symbolic size for the estimates (default 1), e.g. --size b=32")
    p.add_argument("--locs", action="store_true", help="show source lines")
    p.add_argument("--no-ir", action="store_true", help="print the summary only")
    p.add_argument("--memory", action="store_true",
                   help="live-memory timeline, in-place reuse plan and XLA's memory analysis")
    p.add_argument("--plot", metavar="PNG", help="with --memory: plot live bytes per op to this file")


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n:.3g} P{unit}"


def _count(params: dict, names) -> tuple[int, int]:
    """Elements and bytes of the parameters ``names``."""
    import numpy as np

    sizes = [(int(np.size(params[n])), np.dtype(params[n].dtype).itemsize) for n in names]
    return sum(n for n, _ in sizes), sum(n * itemsize for n, itemsize in sizes)


def main(args) -> int:
    from paddlejax import analysis
    from paddlejax.io import load
    from paddlejax.passes import memory

    if args.plot and not args.memory:
        raise ValueError("--plot needs --memory")
    if args.plot:
        plot_path(args.plot, "--plot")
    prog = load(args.path)
    sizes = parse_sizes(prog, args.size)
    if not args.no_ir:
        print(prog.format(locs=args.locs))
        print()
    live = memory.liveness(prog, sizes)
    n_ops = sum(1 for op in prog.walk() if op.type not in ("param", "constant", "return"))
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "symbolic sizes = 1"
    total = live.param_bytes + live.constant_bytes + live.peak_bytes
    print(f"program      {prog.name}")
    print(f"ops          {n_ops}")
    params, buffers = prog.used_params(), analysis.buffer_params(prog)
    count, nbytes = _count(params, params.keys() - buffers)
    print(f"parameters   {count:,} trainable ({_human(nbytes, 'B')})")
    count, nbytes = _count(params, buffers)
    print(f"buffers      {count:,} ({_human(nbytes, 'B')}; running statistics, not trained)")
    print(f"FLOPs        {_human(analysis.flops(prog, sizes), 'FLOP')} per call ({shown})")
    print(f"activations  {_human(live.peak_bytes, 'B')} peak live (estimate, {shown})")
    print(f"memory       {_human(total, 'B')} estimated total")
    if args.memory:
        _memory_report(prog, live, sizes, args.plot)
    return 0


def _memory_report(prog, live, sizes, plot) -> None:
    from paddlejax.passes import memory

    ops = prog.body.ops
    names = memory.value_names(prog)
    print()
    print(f"peak         {_human(live.peak_bytes, 'B')} live during op #{live.peak_op} ({ops[live.peak_op].type})")
    for v, n in live.top_live(live.peak_op):
        print(f"  {names[v]:<10} {_human(n, 'B'):>10}  {v.type}")
    plan = memory.plan_inplace(prog, sizes)
    print(f"in-place     {len(plan.reuses)} reuses, peak {_human(plan.peak_bytes_reused, 'B')} "
          f"(saves {_human(plan.saved_bytes, 'B')})")
    c = memory.compare_with_xla(prog, sizes)
    print(f"estimate     {_human(c.estimate_bytes, 'B')} (parameters + constants + peak activations)")
    print(f"XLA          {_human(c.xla_bytes, 'B')} (arguments {_human(c.xla_argument_bytes, 'B')}, "
          f"outputs {_human(c.xla_output_bytes, 'B')}, temp {_human(c.xla_temp_bytes, 'B')})")
    if plot:
        _plot(live.timeline, plot, prog.name)
        print(f"plot         {plot}")


def _plot(timeline, path, title) -> None:
    from paddlejax._extras import new_figure

    fig = new_figure("inspect --plot", figsize=(8, 3))
    ax = fig.subplots()
    ax.step(range(len(timeline)), timeline, where="mid")
    ax.set_xlabel("op index")
    ax.set_ylabel("live activation bytes")
    ax.set_title(f"{title}: live memory per op")
    fig.tight_layout()
    fig.savefig(path)
