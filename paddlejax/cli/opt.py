"""Run a pass pipeline over a saved program, or over its text form, and save or print the result.

    paddlejax opt out/model --passes "dce,cse,fold_constants{max_elements=64}" -o out/model.opt
    paddlejax opt model.pdir --passes fold_conv_bn,dce --emit text
    paddlejax opt model.pdir --params w.safetensors --passes inference -o out/model.opt
    paddlejax opt - --passes dce --emit text -o small.pdir < model.pdir

A program's text (what print(program) shows) lives in a .pdir file, or comes on stdin as -;
its parameters come from --params, or from the .safetensors file beside the .pdir file. Without
either, the parameters are placeholders (pj.parse): fine for looking at what passes do with
--emit text, refused for a saved program. --emit text writes the optimised text to -o FILE.pdir
(with FILE.safetensors beside it when there are real parameters) or to stdout.
"""
from __future__ import annotations

import os
import sys

from paddlejax.cli.common import check_not_input, file_path, program_path

TEXT_SUFFIX = ".pdir"


def add_arguments(p) -> None:
    p.add_argument("path", help=f"saved program, its text in a {TEXT_SUFFIX} file, or - for text on stdin")
    p.add_argument("--passes", required=True, help="pipeline, e.g. 'dce,cse,fold_constants{max_elements=64}'")
    p.add_argument("--params", help=f"safetensors file of the parameters of a text program (default: the "
                                     f"one beside the {TEXT_SUFFIX} file)")
    p.add_argument("--emit", choices=("json", "text"), default="json",
                   help="json: save as PATH.json and PATH.safetensors (the default); text: the program's text")
    p.add_argument("-o", "--output",
                   help="where to save the optimised program: PATH gives PATH.json and PATH.safetensors; with "
                        f"--emit text a {TEXT_SUFFIX} file (default: stdout)")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--no-verify", action="store_true", help="skip verification between passes")


def _is_text(path: str) -> bool:
    return path == "-" or path.endswith(TEXT_SUFFIX)


def _stem(path: str) -> str:
    return path[: -len(TEXT_SUFFIX)] if path.endswith(TEXT_SUFFIX) else path


def _params_path(args) -> str | None:
    """The parameter file of a text program: --params, else the one beside it, if any."""
    if args.params is not None or not _is_text(args.path) or args.path == "-":
        return args.params
    beside = _stem(args.path) + ".safetensors"
    return beside if os.path.isfile(beside) else None


def _read_text(path: str) -> str:
    from paddlejax import files
    from paddlejax.io import MAX_FILE_BYTES

    data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1) if path == "-" else files.read_regular(path, MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"stdin holds more than {MAX_FILE_BYTES} bytes; refusing")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{'stdin' if path == '-' else path}: not UTF-8 text ({e.reason} at byte {e.start})") \
            from None


def _load(args, params: str | None):
    from paddlejax.io import ProgramFormatError, load
    from paddlejax.ir.parser import ParseError, parse

    if not _is_text(args.path):
        return load(args.path)
    try:
        return parse(_read_text(args.path), params=params)
    except ParseError as e:
        raise ProgramFormatError(f"{'stdin' if args.path == '-' else args.path}: {e}") from None


def _check_outputs(args, params: str | None) -> None:
    """Refuse outputs that are directories or would overwrite an input, before any work."""
    if params is not None and not _is_text(args.path):
        raise ValueError(f"--params is for a program's text ({TEXT_SUFFIX} or -); {args.path} is a saved program "
                         "with its own tensors")
    inputs = [f for f in (args.path, params) if f not in (None, "-")]
    if args.emit == "json":
        if args.output is None:
            raise ValueError("-o is required to save a program (or give --emit text)")
        program_path(args.output)
        check_not_input(args.output, programs=[] if _is_text(args.path) else [args.path], files=inputs)
        if _is_text(args.path) and params is None:
            where = "stdin" if args.path == "-" else args.path
            raise ValueError(f"{where} has no parameter values to save: give --params FILE.safetensors"
                             + ("" if args.path == "-" else f" (or put {_stem(args.path)}.safetensors beside it)"))
    elif args.output not in (None, "-"):
        file_path(args.output, suffixes=(TEXT_SUFFIX,))
        for out in (args.output, _stem(args.output) + ".safetensors"):
            check_not_input(out, programs=[] if _is_text(args.path) else [args.path], files=inputs, program=False)


def _tensor_bytes(program) -> bytes:
    import numpy as np
    import safetensors.numpy

    tensors = {f"{kind}/{name}": np.require(np.asarray(value), requirements="C")
               for kind, arrays in (("params", program.used_params()), ("constants", program.used_constants()))
               for name, value in arrays.items()}
    return safetensors.numpy.save(tensors, metadata={"format": "paddlejax.tensors"})


def main(args) -> int:
    from paddlejax import files
    from paddlejax.io import save
    from paddlejax.passes import PassManager

    params = _params_path(args)
    _check_outputs(args, params)
    to_stdout = args.emit == "text" and args.output in (None, "-")
    prog = _load(args, params)
    pm = PassManager(args.passes, verify=not args.no_verify, print_ir_after=args.print_ir_after_all,
                     stream=sys.stderr if to_stdout else None)
    out = pm.run(prog)
    if args.emit == "json":
        save(out, args.output)
        print(pm.report())
        print(f"saved {args.output}")
        return 0
    text = out.format() + "\n"
    if to_stdout:
        print(pm.report(), file=sys.stderr)
        sys.stdout.write(text)
        return 0
    written = {args.output: text.encode()}
    real = not _is_text(args.path) or params is not None
    if real and (out.used_params() or out.used_constants()):
        written[_stem(args.output) + ".safetensors"] = _tensor_bytes(out)
    files.write_together(written)
    print(pm.report())
    print(f"wrote {', '.join(written)}")
    return 0
