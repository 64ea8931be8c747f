"""Export a saved program as a jax.export (StableHLO) artifact, parameters included.

    paddlejax export out/model -o out/model.stablehlo --platform cpu --platform cuda

A program traced with a static batch size gets a symbolic one (``--batch``, default ``b``),
so the artifact serves any batch; ``--static`` keeps the traced sizes.
"""
from __future__ import annotations

from paddlejax.cli.common import check_not_input, file_path

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("-o", "--output", required=True, help="artifact file, e.g. model.stablehlo")
    p.add_argument("--batch", help="name of the symbolic batch size given to inputs traced with a static "
                                   "one (default b)")
    p.add_argument("--static", action="store_true", help="keep the traced sizes; no symbolic batch")
    p.add_argument("--platform", action="append", choices=PLATFORMS,
                   help="target platform (repeat for several; default: this machine's)")


def main(args) -> int:
    from paddlejax.stablehlo import export
    from paddlejax.io import load

    file_path(args.output)
    check_not_input(args.output, programs=[args.path], program=False)
    if args.batch is not None and args.static:
        raise ValueError("--batch names a symbolic batch size; --static keeps the traced sizes: give one of them")
    if args.batch is not None and not args.batch.isidentifier():
        raise ValueError(f"--batch expects the name of a symbolic size (an identifier such as b), got {args.batch!r}")
    prog = load(args.path)
    if args.batch is not None and not any(v.type.shape and isinstance(v.type.shape[0], int) for v in prog.inputs):
        symbolic = sorted({str(v.type.shape[0]) for v in prog.inputs if v.type.shape})
        raise ValueError(f"--batch {args.batch}: {prog.name}'s inputs already lead with symbolic sizes "
                         f"({', '.join(symbolic) or 'none'}); --batch only names a static batch size made symbolic")
    exp = export(prog, args.output, batch=None if args.static else args.batch or "b", platforms=args.platform)
    ins = ", ".join(str(a) for a in exp.in_avals)
    print(f"exported {prog.name}({ins}) for {', '.join(exp.platforms)} to {args.output}")
    return 0
