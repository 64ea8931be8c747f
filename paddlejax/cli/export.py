"""Export a saved program as a jax.export (StableHLO) artifact, parameters included."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("-o", "--output", required=True, help="artifact file, e.g. model.stablehlo")
    p.add_argument("--batch", default="b", help="name of the symbolic batch size (default b)")
    p.add_argument("--static", action="store_true", help="keep the traced sizes; no symbolic batch")
    p.add_argument("--platform", action="append", help="target platform(s): cpu, cuda, rocm, tpu")


def main(args) -> int:
    from paddlejax.stablehlo import export
    from paddlejax.io import load

    prog = load(args.path)
    exp = export(prog, args.output, batch=None if args.static else args.batch, platforms=args.platform)
    ins = ", ".join(str(a) for a in exp.in_avals)
    print(f"exported {prog.name}({ins}) for {', '.join(exp.platforms)} to {args.output}")
    return 0
