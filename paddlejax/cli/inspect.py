"""Show a saved program: its IR, parameter count, FLOPs and estimated memory."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program (PATH, PATH.json or PATH.safetensors)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=N",
                   help="value of a symbolic size for the estimates (default 1), e.g. --size b=32")
    p.add_argument("--locs", action="store_true", help="show source lines")
    p.add_argument("--no-ir", action="store_true", help="print the summary only")


def parse_sizes(items) -> dict[str, int]:
    sizes = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not value.isdigit():
            raise ValueError(f"--size expects NAME=N, got {item!r}")
        sizes[name] = int(value)
    return sizes


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n:.3g} P{unit}"


def main(args) -> int:
    from paddlejax import analysis
    from paddlejax.io import load

    prog = load(args.path)
    sizes = parse_sizes(args.size)
    if not args.no_ir:
        print(prog.format(locs=args.locs))
        print()
    mem = analysis.estimate_memory(prog, sizes)
    n_ops = sum(1 for op in prog.walk() if op.type not in ("param", "constant", "return"))
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "symbolic sizes = 1"
    print(f"program      {prog.name}")
    print(f"ops          {n_ops}")
    print(f"parameters   {prog.num_params():,} ({_human(mem.param_bytes, 'B')})")
    print(f"FLOPs        {_human(analysis.flops(prog, sizes), 'FLOP')} per call ({shown})")
    print(f"activations  {_human(mem.peak_activation_bytes, 'B')} peak live (estimate, {shown})")
    print(f"memory       {_human(mem.total_bytes, 'B')} estimated total")
    return 0
