"""``paddlejax`` command: inspect, opt, run, bench, autotune, slim, export, convert, hub, demo and launch.

    paddlejax inspect out/model
    paddlejax opt out/model --passes "dce,cse,fold_constants{max_elements=64}" -o out/model.opt
"""
from __future__ import annotations

import argparse
import sys

from paddlejax.cli import autotune, bench, convert, demo, export, hub, inspect, launch, opt, run, slim
from paddlejax.cli.common import HelpFormatter

COMMANDS = {"inspect": inspect, "opt": opt, "run": run, "bench": bench, "autotune": autotune, "slim": slim,
            "export": export, "convert": convert, "hub": hub, "demo": demo, "launch": launch}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paddlejax", description=__doc__, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                           formatter_class=HelpFormatter)
        module.add_arguments(p)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from paddlejax.dispatch import dispatch_from_environment
    from paddlejax.io import ProgramFormatError
    from paddlejax.passes import PassError

    try:
        # commands that call compiled programs and wait for them say so with CPU_DISPATCH = "sync"
        dispatch_from_environment(getattr(COMMANDS[args.command], "CPU_DISPATCH", None))
        return COMMANDS[args.command].main(args) or 0
    except (ProgramFormatError, PassError, ValueError, KeyError, OSError, ModuleNotFoundError) as e:
        # a KeyError's str() is the repr of its message, quotes included
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"paddlejax {args.command}: error: {message}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"paddlejax {args.command}: error: out of memory{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
