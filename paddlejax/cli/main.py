"""``paddlejax`` command: inspect, opt, run, bench, autotune, slim, export, demo and launch.

    paddlejax inspect out/model
    paddlejax opt out/model --passes "dce,cse,fold_constants{max_elements=64}" -o out/model.opt
"""
from __future__ import annotations

import argparse
import sys

from paddlejax.cli import autotune, bench, demo, export, inspect, launch, opt, run, slim

COMMANDS = {"inspect": inspect, "opt": opt, "run": run, "bench": bench, "autotune": autotune, "slim": slim,
            "export": export, "demo": demo, "launch": launch}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paddlejax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__)
        module.add_arguments(p)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from paddlejax.io import ProgramFormatError
    from paddlejax.passes import PassError

    try:
        return COMMANDS[args.command].main(args) or 0
    except (ProgramFormatError, PassError, ValueError, KeyError, OSError) as e:
        print(f"paddlejax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
