"""Run a pass pipeline over a saved program and save the result.

    paddlejax opt out/model --passes "dce,cse,fold_constants{max_elements=64}" -o out/model.opt
"""
from __future__ import annotations

from paddlejax.cli.common import check_not_input, program_path


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--passes", required=True, help="pipeline, e.g. 'dce,cse,fold_constants{max_elements=64}'")
    p.add_argument("-o", "--output", required=True,
                   help="where to save the optimised program: PATH gives PATH.json and PATH.safetensors")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--no-verify", action="store_true", help="skip verification between passes")


def main(args) -> int:
    from paddlejax.io import load, save
    from paddlejax.passes import PassManager

    program_path(args.output)
    check_not_input(args.output, programs=[args.path])
    prog = load(args.path)
    pm = PassManager(args.passes, verify=not args.no_verify, print_ir_after=args.print_ir_after_all)
    out = pm.run(prog)
    save(out, args.output)
    print(pm.report())
    print(f"saved {args.output}")
    return 0
