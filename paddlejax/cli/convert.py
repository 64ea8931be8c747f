"""Convert another framework's model file into a saved program.

    paddlejax convert model.onnx -o out/model
    paddlejax convert det.onnx -o out/det --input-shape x=?,3,640,640
    paddlejax convert inference.pdmodel -o out/model

The format comes from the file's suffix: .onnx (ONNX), .pdmodel (Paddle's legacy format) or .json
(Paddle 3's PIR format), each with its .pdiparams beside it, .h5 or .hdf5 (a Keras 2 model). ``--input-shape NAME=DIMS`` fixes an input's
dynamic sizes (``?`` keeps one dynamic); static sizes let XLA specialise and the Predictor
freeze the weights. The saved program (PATH.json and PATH.safetensors) then takes every pass,
``paddlejax slim``, ``paddlejax run`` and the Predictor like any other.
"""
from __future__ import annotations

from paddlejax.cli.common import check_not_input, parse_input_shape, program_path

FORMATS = {".onnx": "from_onnx", ".pdmodel": "from_paddle", ".json": "from_paddle", ".h5": "from_keras",
           ".hdf5": "from_keras"}


def add_arguments(p) -> None:
    p.add_argument("path", help="model file: .onnx, .pdmodel or .json (Paddle, with .pdiparams beside it), .h5 or .hdf5")
    p.add_argument("-o", "--output", required=True,
                   help="where to save the program: PATH gives PATH.json and PATH.safetensors")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                   help="an input's shape, comma-separated, ? for a dynamic size (repeat for several inputs)")
    p.add_argument("--name", help="the program's name (default: the model's graph name)")


def main(args) -> int:
    import os

    from paddlejax import convert
    from paddlejax.io import save

    suffix = os.path.splitext(args.path)[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"{args.path}: unknown model format {suffix or '(no suffix)'!r}; "
                         f"known: {', '.join(sorted(FORMATS))}")
    output = program_path(args.output)
    check_not_input(output, files=[args.path])
    shapes = dict(parse_input_shape(item) for item in args.input_shape)
    prog = getattr(convert, FORMATS[suffix])(args.path, input_shapes=shapes or None, name=args.name)
    save(prog, output)
    counts: dict[str, int] = {}
    for op in prog.walk():
        if op.type not in ("param", "constant", "return"):
            counts[op.type] = counts.get(op.type, 0) + 1
    top = ", ".join(f"{t} {n}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1])[:6])
    inputs = ", ".join(f"{v.name}: {v.type}" for v in prog.inputs)
    print(f"converted {args.path} to {output} ({output}.json, {output}.safetensors)\n"
          f"  {prog.name}({inputs}): {sum(counts.values())} ops ({top}), {prog.num_params():,} parameters")
    return 0
