"""Compress a saved program: ``paddlejax slim quantize`` (post-training int8 quantization),
``paddlejax slim prune`` (structured channel pruning), ``paddlejax slim sparsify`` (unstructured
or N:M sparse weights, saved compactly) and ``paddlejax slim compress`` (auto-compression from
unlabelled samples, or a PaddleSlim 1.x compression config).

    paddlejax slim quantize out/model --calib calib.npy --algo hist -o out/model.int8 --report errors.png
    paddlejax slim quantize out/model --calib calib.npy --weight-bits 4 -o out/model.int4
    paddlejax slim prune out/model --flops 0.5 --criterion l1_norm --round-to 8 -o out/model.pruned
    paddlejax slim sparsify out/model --n 2 --m 4 -o out/model.sparse
    paddlejax slim compress out/model --data samples.npz --target-speedup 1.5 -o out/model.small

``--calib`` is a ``.npy`` file of calibration inputs (read without unpickling), cut into batches
of ``--batch-size``. The command prints the per-layer error of the int8 program against the
float one on the first batch (the table PaddleSlim users compare layers with) and writes it as
a bar chart with ``--report``.
"""
from __future__ import annotations

import zipfile

from paddlejax.cli.common import check_not_input, plot_path, program_path, read_arrays
from paddlejax.table import format_table

QUANTIZE = """Post-training quantization of a saved program: int8 weights and activations, calibrated on
--calib (--weight-bits 8), or int4 weights packed two to a byte with float activations
(--weight-bits 4, weight-only: nothing to calibrate). Prints each layer's error against the
float program on the first calibration batch, and the size of the weights before and after.

    paddlejax slim quantize out/model --calib calib.npy --algo hist -o out/model.int8 --report errors.png
    paddlejax slim quantize out/model --calib calib.npy --algo min_max --asymmetric -o out/model.asym
    paddlejax slim quantize out/model --calib calib.npy --weight-bits 4 -o out/model.int4
"""
PRUNE = """Structured pruning of a saved program: whole channels are removed from every weight,
bias and per-channel parameter they touch (groups found from the op traits: conv -> batch norm ->
activation -> conv, residual adds, depthwise convolutions, concat, flatten -> linear), so the
saved weights are really smaller and nothing is masked. Prints each group's channels before and
after, and the FLOPs and parameters of both programs.

    paddlejax slim prune out/model --flops 0.5 -o out/model.pruned
    paddlejax slim prune out/model --ratio 0.3 --criterion geometry_median -o out/model.pruned
    paddlejax slim prune out/model --ratios conv1.weight=0.5,layer1.0.conv1.weight=0.25 -o out/model.pruned
"""
SPARSIFY = """Sparse weights for a saved program: the weights of the ops whose traits name one (conv2d,
linear, matmul) get magnitude masks (--ratio: that fraction of each weight zeroed, or of all of them
with --scope global) or N:M masks along their input channels (--n and --m: at most n of every m
kept, 2:4 by default, as Paddle's ASP). The program is saved sparse: each masked weight as its
kept values and a bitmask. Prints each weight's density before and after, and the stored size.
Fine-tune it afterwards with paddlejax.slim.sparsity.decorate to keep the zeros.

    paddlejax slim sparsify out/model -o out/model.sparse                  # 2:4
    paddlejax slim sparsify out/model --ratio 0.75 --scope global -o out/model.sparse
    paddlejax slim sparsify out/model --n 2 --m 4 --exclude fc.weight -o out/model.sparse
"""
COMPRESS = """Auto-compression of a saved program from unlabelled samples, without its training code:
candidate strategies (post-training int8; structured pruning, then distillation with the original as
teacher; quantization-aware training with that distillation; pruning, distillation and int8) are
built and timed on this machine through Predictors, and the one at least --target-speedup times
faster with the least output drift on held-out samples is saved. Prints each candidate's latency,
speed-up and drift. With --config, a PaddleSlim 1.x compression config (version, pruners,
controllers, distillers, strategies, compressor) runs instead.

--data is an .npz file with one array per program input (named as the inputs), an .npy file
(one-input programs) or a directory of <input>.npy files; rows are samples.

    paddlejax slim compress out/model --data samples.npz --target-speedup 1.5 -o out/model.small
    paddlejax slim compress out/model --data samples/ --strategies ptq,prune_distill --plot act.png -o out/small
    paddlejax slim compress out/model --data samples.npz --config compress.yaml -o out/model.small
"""
# The observers that calibrate one scale (or range) per activation (paddlejax.slim.quant.OBSERVERS).
ALGOS = ("hist", "KL", "mse", "avg", "abs_max", "moving_average_abs_max", "min_max")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="slim_command", required=True)
    q = sub.add_parser("quantize", help="post-training int8 (or int4 weight-only) quantization of a saved program",
                       description=QUANTIZE, formatter_class=p.formatter_class)
    q.add_argument("path", help="saved program")
    q.add_argument("--calib", required=True, help=".npy file of calibration inputs, batch first (with --weight-bits "
                                                  "4, read only by --bias-correction and the error table)")
    q.add_argument("--algo", choices=ALGOS, metavar="ALGO",
                   help=f"how activation scales are calibrated: {', '.join(ALGOS)} (default hist; min_max for "
                        "--asymmetric)")
    q.add_argument("--batch-size", type=int, default=32, help="calibration batch size (default 32)")
    q.add_argument("--ops", default="conv2d:depthwise_conv2d:linear:matmul", help="op types to quantize")
    q.add_argument("--skip", default="", help="regular expression: weights whose names match stay float")
    q.add_argument("--weight-bits", type=int, default=8, choices=(8, 4),
                   help="8: int8 weights and activations (default); 4: int4 weights packed two to a byte, "
                        "activations left float (weight-only, about 8x smaller weights)")
    q.add_argument("--asymmetric", action="store_true",
                   help="quantize activations asymmetrically, with a zero point, calibrated by their range "
                        "(--algo min_max, the default with it; needs --weight-bits 8)")
    q.add_argument("--bias-correction", action="store_true",
                   help="add each layer's mean output shift from its int8 weights to its bias")
    q.add_argument("-o", "--output", required=True, help="where to save the quantized program")
    q.add_argument("--report", help="write the per-layer errors as a PNG bar chart here")
    r = sub.add_parser("prune", help="structured channel pruning of a saved program", description=PRUNE,
                       formatter_class=p.formatter_class)
    r.add_argument("path", help="saved program")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--flops", type=float, help="fraction of the FLOPs to remove, e.g. 0.5")
    how.add_argument("--ratio", type=float, help="fraction of the channels to remove from every group")
    how.add_argument("--ratios", help="NAME=RATIO,... per producer weight (the names the table lists)")
    r.add_argument("--criterion", default="l1_norm", help="l1_norm (default), l2_norm, geometry_median, bn_scale")
    r.add_argument("--round-to", type=int, default=1,
                   help="keep channel counts that are multiples of this (8 or 16 suit SIMD kernels; default 1)")
    r.add_argument("-o", "--output", required=True, help="where to save the pruned program")
    s = sub.add_parser("sparsify", help="unstructured or N:M sparse weights, saved compactly", description=SPARSIFY,
                       formatter_class=p.formatter_class)
    s.add_argument("path", help="saved program")
    s.add_argument("--ratio", type=float, help="fraction of the weights to zero by magnitude (unstructured)")
    s.add_argument("--scope", choices=("tensor", "global"), default="tensor",
                   help="with --ratio: rank magnitudes within each weight (default) or across all of them")
    s.add_argument("--n", type=int, help="N:M sparsity: weights kept in every group (default 2)")
    s.add_argument("--m", type=int, help="N:M sparsity: group size along the input channels (default 4)")
    s.add_argument("--mask-algo", choices=("mask_1d", "mask_2d_greedy"), default="mask_1d",
                   help="N:M masks along rows only (default) or in m x m blocks, rows and columns")
    s.add_argument("--exclude", default="", help="NAME,... weights left dense")
    s.add_argument("--min-size", type=int, default=1024,
                   help="weights with fewer elements stay dense (default 1024)")
    s.add_argument("-o", "--output", required=True, help="where to save the sparse program")
    c = sub.add_parser("compress", help="auto-compression from unlabelled samples (or a 1.x compression config)",
                       description=COMPRESS, formatter_class=p.formatter_class)
    c.add_argument("path", help="saved program")
    c.add_argument("--data", required=True, help="unlabelled samples: .npz, .npy or a directory of .npy files")
    c.add_argument("--target-speedup", type=float, default=1.5, help="speed-up over the original to reach "
                                                                     "(default 1.5)")
    c.add_argument("--strategies", help="comma-separated candidates among ptq, prune_distill, qat_distill, "
                                        "prune_distill+ptq (default: all)")
    c.add_argument("--config", help="a PaddleSlim 1.x compression config (YAML) to run instead of the search")
    c.add_argument("--prune-flops", type=float, help="fraction of FLOPs pruning removes (default: 1 - 1/target)")
    c.add_argument("--epochs", type=int, default=3, help="distillation epochs of training strategies (default 3)")
    c.add_argument("--lr", type=float, default=2e-4, help="distillation learning rate (default 2e-4)")
    c.add_argument("--batch-size", type=int, default=32, help="batch size of training and timing (default 32)")
    c.add_argument("--plot", help="write speed-up against drift as a PNG here")
    c.add_argument("-o", "--output", required=True, help="where to save the chosen program")


def _calibration_batches(path: str, batch_size: int, program) -> list:
    if batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    if zipfile.is_zipfile(path):
        raise ValueError(f"{path}: expected one .npy array, got a .npz archive")
    (data,) = read_arrays(path)  # checked first: no unpickling, no allocation a forged header merely claims
    if len(program.inputs) != 1:
        raise ValueError(f"{program.name} takes {len(program.inputs)} inputs; --calib gives one array")
    if data.ndim == 0 or not len(data):
        raise ValueError(f"{path}: the calibration array is empty")
    return [data[i:i + batch_size] for i in range(0, len(data), batch_size)]


def main(args) -> int:
    return {"quantize": _quantize, "prune": _prune, "sparsify": _sparsify,
            "compress": _compress}[args.slim_command](args)


def _ratios(text: str) -> dict[str, float]:
    ratios = {}
    for item in filter(None, text.split(",")):
        name, eq, value = item.partition("=")
        try:
            ratios[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--ratios expects NAME=RATIO,..., got {item!r}") from None
        if not eq:
            raise ValueError(f"--ratios expects NAME=RATIO,..., got {item!r}")
    return ratios


def _prune(args) -> int:
    import numpy as np

    from paddlejax import analysis
    from paddlejax.io import load, save
    from paddlejax.slim.pruning import ChannelGraph, prune

    program_path(args.output)
    check_not_input(args.output, programs=[args.path])
    program = load(args.path)
    ratios = args.ratio if args.ratio is not None else _ratios(args.ratios) if args.ratios is not None else None
    pruned = prune(program, ratios, flops=args.flops, criterion=args.criterion, round_to=args.round_to)
    save(pruned, args.output)
    rows = [("group (producers)", "channels", "kept")]
    graph = ChannelGraph(program)
    for group in graph.groups():
        first = group.producers[0]
        axis = graph.producers[first][0]
        rows.append((", ".join(group.producers), str(len(group.classes)), str(pruned.params[first].shape[axis])))
    print(f"{program.name}: {len(rows) - 1} prunable groups ({args.criterion})")
    print(format_table(rows, right_from=1))
    sizes = {d: 1 for v in program.inputs for d in v.type.shape if isinstance(d, str)}
    flops = [analysis.flops(p, sizes) for p in (program, pruned)]
    count = [sum(np.size(v) for v in p.used_params().values()) for p in (program, pruned)]
    print(f"FLOPs per sample: {flops[0]:,} -> {flops[1]:,} ({1 - flops[1] / flops[0]:.1%} removed); "
          f"parameters: {count[0]:,} -> {count[1]:,}")
    print(f"saved {args.output}")
    return 0


def _quantize(args) -> int:
    import sys
    import warnings

    import numpy as np

    from paddlejax.io import load, save
    from paddlejax.slim.quant import LayerError, layer_errors, plot_layer_errors, quant_post

    program_path(args.output)
    check_not_input(args.output, programs=[args.path])
    if args.report:
        plot_path(args.report, "--report")
    if args.algo is None:
        args.algo = "min_max" if args.asymmetric else "hist"
    program = load(args.path)
    batches = _calibration_batches(args.calib, args.batch_size, program)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = quant_post(program, batches, algo=args.algo, ops=args.ops, skip=args.skip,
                               weight_bits=args.weight_bits, act_symmetric=not args.asymmetric,
                               bias_correction=args.bias_correction)
    for w in caught:
        print(f"paddlejax slim: warning: {w.message}", file=sys.stderr)
    save(quantized, args.output)
    errors = layer_errors(program, quantized, batches[0])
    how = "int4 weight-only" if args.weight_bits == 4 else args.algo
    print(f"{program.name}: {len(errors)} layers quantized ({how}, {sum(len(b) for b in batches)} "
          f"calibration samples); error on the first batch:")
    print(format_table([LayerError.HEADER, *(e.row() for e in errors)], right_from=3))
    before, after = (sum(np.asarray(a).nbytes for a in p.used_params().values()) for p in (program, quantized))
    print(f"weights: {_size(before)} -> {_size(after)} ({before / max(after, 1):.1f}x smaller)")
    print(f"saved {args.output}")
    if args.report:
        title = f"{program.name}: {'int4 weights' if args.weight_bits == 4 else f'int8 ({args.algo})'} vs fp32"
        plot_layer_errors(errors, args.report, title=title)
        print(f"wrote {args.report}")
    return 0


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:.1f} MiB"


def _sparsify(args) -> int:
    import os
    import re

    import numpy as np

    from paddlejax.io import load, save
    from paddlejax.slim.sparsity import prune_program, sparsity

    output = program_path(args.output)
    check_not_input(args.output, programs=[args.path])
    if args.ratio is not None and (args.n is not None or args.m is not None):
        raise ValueError("give --ratio (unstructured) or --n and --m (N:M), not both")
    program = load(args.path)
    sparse, masks = prune_program(program, args.ratio, n=args.n, m=args.m, mask_algo=args.mask_algo,
                                  scope=args.scope, exclude=[e.strip() for e in args.exclude.split(",") if e.strip()],
                                  min_size=args.min_size)
    save(sparse, output, sparse=True)
    scope = "per weight" if args.scope == "tensor" else "global"
    how = (f"{args.ratio:.0%} by magnitude ({scope})" if args.ratio is not None
           else f"{args.n or 2}:{args.m or 4} ({args.mask_algo})")
    before, after = sparsity(program), sparsity(sparse)
    print(f"{program.name}: {len(masks)} of {len(before)} weights sparse, {how}")
    rows = [("weight", "shape", "density", "after")]
    rows += [(name, "x".join(map(str, np.shape(program.params[name]))), f"{before[name]:.3f}", f"{after[name]:.3f}")
             for name in before]
    print(format_table(rows, right_from=1))
    dense = sum(np.asarray(a).nbytes for p in (sparse.used_params(), sparse.used_constants()) for a in p.values())
    stored = os.path.getsize(re.sub(r"\.(json|safetensors)$", "", output) + ".safetensors")
    print(f"tensors: {_size(dense)} dense -> {_size(stored)} stored ({stored / dense:.2f} of dense)")
    print(f"saved {args.output}")
    return 0


def _compress(args) -> int:
    from paddlejax.io import load, save
    from paddlejax.slim.auto_compress import STRATEGIES, auto_compress, compress_with_config
    from paddlejax.slim.compress_config import read_config

    program_path(args.output)
    check_not_input(args.output, programs=[args.path], files=[args.data])
    if args.plot:
        plot_path(args.plot, "--plot")
    if args.batch_size < 1 or args.epochs < 0:
        raise ValueError(f"--batch-size must be positive and --epochs not negative, got {args.batch_size}, "
                         f"{args.epochs}")
    plan = read_config(args.config) if args.config else None  # a bad config fails before anything trains
    program = load(args.path)
    if plan is not None:
        print(f"{program.name}: compression config {args.config} ({', '.join(s.name for s in plan.strategies)})")
        if plan.ignored:
            print(f"read but without meaning here: {', '.join(plan.ignored)}")
        result = compress_with_config(program, args.data, plan.source, batch_size=args.batch_size,
                                      learning_rate=args.lr)
    else:
        strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip()) if args.strategies \
            else STRATEGIES
        print(f"{program.name}: auto-compression, target {args.target_speedup:.2f}x")
        result = auto_compress(program, args.data, args.target_speedup, strategies=strategies,
                               prune_flops=args.prune_flops, epochs=args.epochs, learning_rate=args.lr,
                               batch_size=args.batch_size)
    print(result.table())
    save(result.program, args.output)
    print(f"saved {args.output} ({result.chosen})")
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0
