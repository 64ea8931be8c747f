"""Compress a saved program: ``paddlejax slim quantize`` (post-training int8 quantization).

    paddlejax slim quantize out/model --calib calib.npy --algo hist -o out/model.int8 --report errors.png

``--calib`` is a ``.npy`` file of calibration inputs (read without unpickling), cut into batches
of ``--batch-size``. The command prints the per-layer error of the int8 program against the
float one on the first batch (the table PaddleSlim users compare layers with) and writes it as
a bar chart with ``--report``.
"""
from __future__ import annotations

from paddlejax.cli.table import format_table


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="slim_command", required=True)
    q = sub.add_parser("quantize", help="post-training int8 quantization of a saved program")
    q.add_argument("path", help="saved program")
    q.add_argument("--calib", required=True, help=".npy file of calibration inputs, batch first")
    q.add_argument("--algo", default="hist", help="hist, KL, mse, avg, abs_max, moving_average_abs_max "
                                                  "(default hist)")
    q.add_argument("--batch-size", type=int, default=32, help="calibration batch size (default 32)")
    q.add_argument("--ops", default="conv2d:depthwise_conv2d:linear:matmul", help="op types to quantize")
    q.add_argument("--skip", default="", help="regular expression: weights whose names match stay float")
    q.add_argument("--weight-bits", type=int, default=8, choices=(8, 4))
    q.add_argument("--asymmetric", action="store_true",
                   help="quantize activations asymmetrically, with a zero point (needs --algo min_max)")
    q.add_argument("--bias-correction", action="store_true",
                   help="add each layer's mean output shift from its int8 weights to its bias")
    q.add_argument("-o", "--output", required=True, help="where to save the int8 program")
    q.add_argument("--report", help="write the per-layer errors as a PNG bar chart here")


def _calibration_batches(path: str, batch_size: int, program) -> list:
    import numpy as np

    if batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as e:  # object arrays would need unpickling: refused
        raise ValueError(f"{path}: not a plain numeric .npy array ({e})") from None
    if not isinstance(data, np.ndarray):
        raise ValueError(f"{path}: expected one .npy array, got an archive of {sorted(data.files)}")
    if len(program.inputs) != 1:
        raise ValueError(f"{program.name} takes {len(program.inputs)} inputs; --calib gives one array")
    if data.ndim == 0 or not len(data):
        raise ValueError(f"{path}: the calibration array is empty")
    return [data[i:i + batch_size] for i in range(0, len(data), batch_size)]


def main(args) -> int:
    from paddlejax.io import load, save
    from paddlejax.slim.quant import LayerError, layer_errors, plot_layer_errors, quant_post

    program = load(args.path)
    batches = _calibration_batches(args.calib, args.batch_size, program)
    int8 = quant_post(program, batches, algo=args.algo, ops=args.ops, skip=args.skip, weight_bits=args.weight_bits,
                      act_symmetric=not args.asymmetric, bias_correction=args.bias_correction)
    save(int8, args.output)
    errors = layer_errors(program, int8, batches[0])
    print(f"{program.name}: {len(errors)} layers quantized ({args.algo}, {sum(len(b) for b in batches)} "
          f"calibration samples); error on the first batch:")
    print(format_table([LayerError.HEADER, *(e.row() for e in errors)], right_from=3))
    print(f"saved {args.output}")
    if args.report:
        plot_layer_errors(errors, args.report, title=f"{program.name}: int8 ({args.algo}) vs fp32")
        print(f"wrote {args.report}")
    return 0
