"""Inference latency of programs before and after the optimisation passes, pass by pass.

Models (eval mode, batch 32, 32x32x3 images; see cnn_models.py): SmallCNN, ResNet-18 for
32x32 inputs and MobileNetV2. Each model is traced in Paddle's NCHW layout; the rows add the passes one group at a time
(parameters as arguments of the executable) -- cleanup, batch-norm folding, bias/activation
fusion, conv autotuning at the benchmark's batch size (per-op kernel choices alone, then with
the whole-program check and layout choice) -- then freeze the parameters into the executable
(untuned, tuned as frozen, with bfloat16 convolutions allowed), then show the same network
built in NHWC. The autotune ratios (untuned / tuned latency, the median of the ratios of calls
made in the same round) must not fall below 1.
All variants of a model are timed side by side in one process (alternating calls, medians) and
checked against the unoptimised program's outputs.

    python benchmarks/passes.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/passes.py --quick    # a smoke test
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

import paddlejax as pj
from cnn_models import MODELS, randomise_statistics
from paddlejax import nn
from timing import alternate, machine, paired_ratio

CLEANUP = "eliminate_identity,fold_constants,cse,dce"
FOLD = f"{CLEANUP},fold_conv_bn,fold_linear_bn,dce"
FUSE = f"{FOLD},fuse_bias_act,fuse_elementwise_act,eliminate_transposes,dce"


def stages(batch: int, tune_repeats: int = 10) -> list[tuple[str, str, bool]]:
    """(label, pipeline, frozen parameters) of each row, the tuning done at ``batch`` with
    ``tune_repeats`` timed runs per candidate."""
    size = f"sizes=b={batch} repeats={tune_repeats}"
    return [("as traced", "", False), ("cleanup", CLEANUP, False), ("+ fold_conv_bn, fold_linear_bn", FOLD, False),
            ("+ fuse_bias_act, fuse_elementwise_act", FUSE, False),
            ("+ autotune, per-op kernels only", f"{FUSE},autotune{{{size} check=false layout=keep}}", False),
            ("+ autotune, whole-program plans", f"{FUSE},autotune{{{size}}}", False),
            ("fused, frozen params", FUSE, True),
            ("+ autotune for frozen params", f"{FUSE},autotune{{{size} frozen=true}}", True),
            ("+ bf16 convs allowed (opt-in)", f"{FUSE},autotune{{{size} frozen=true reduced_precision=true}}", True)]


# (tuned, untuned) rows: autotuning must never make the program slower
AUTOTUNE_RATIOS = [("+ autotune, whole-program plans", "+ fuse_bias_act, fuse_elementwise_act"),
                   ("+ autotune for frozen params", "fused, frozen params")]


def variants(name: str, batch: int, image: int, tune_repeats: int) -> tuple[dict, np.ndarray, dict]:
    """The compiled variants of one model, the input, and each variant's op count."""
    nn.seed(0)
    model = MODELS[name](data_format="NCHW", image=image)
    randomise_statistics(model)
    model.eval()
    x = np.random.default_rng(0).normal(size=(batch, 3, image, image)).astype(np.float32)
    traced = pj.to_static(model, pj.InputSpec((None, 3, image, image)))
    runs, ops = {}, {}
    rows = stages(batch, tune_repeats)
    for label, pipeline, frozen in rows:
        prog = pj.passes.run(traced, pipeline) if pipeline else traced
        runs[label] = (prog.compile(x, freeze_params=frozen), x)
        ops[label] = sum(1 for op in prog.walk() if op.type not in ("param", "constant", "return"))
    nhwc = MODELS[name](data_format="NHWC", image=image)
    nn.set_state_dict(nhwc, nn.state_dict(model))
    nhwc.eval()
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    prog = pj.passes.run(pj.to_static(nhwc, pj.InputSpec((None, image, image, 3))), rows[-2][1])
    label = "the model built in NHWC, frozen, tuned"
    runs[label] = (prog.compile(x_nhwc, freeze_params=True), x_nhwc)
    ops[label] = sum(1 for op in prog.walk() if op.type not in ("param", "constant", "return"))
    return runs, x, ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 2, 16x16 images, few repeats (smoke test)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    batch, image = (2, 16) if args.quick else (32, 32)
    repeats = args.repeats or (3 if args.quick else 30)
    print(machine())
    print(f"batch {batch}, {image}x{image}x3 images, fp32, medians of {repeats} alternating calls\n")
    for name in args.models.split(","):
        runs, x, ops = variants(name, batch, image, tune_repeats=2 if args.quick else 10)
        reference = np.asarray(runs["as traced"][0](x))
        errors = {k: float(np.abs(np.asarray(f(a)) - reference).max()) for k, (f, a) in runs.items()}
        rounds = alternate({k: (lambda f=f, a=a: f(a)) for k, (f, a) in runs.items()}, 2, repeats, rounds=True)
        ms = {k: 1e3 * statistics.median(t) for k, t in rounds.items()}
        base = ms["as traced"]
        print(f"{name}")
        print(f"  {'variant':<44}{'ops':>5}{'ms':>10}{'speed-up':>10}{'max |diff|':>12}")
        for label in runs:
            print(f"  {label:<44}{ops[label]:>5}{ms[label]:>10.2f}{base / ms[label]:>9.2f}x{errors[label]:>12.2e}")
        for tuned, untuned in AUTOTUNE_RATIOS:
            print(f"  autotune ratio ({untuned} / {tuned}): {paired_ratio(rounds, untuned, tuned):.2f}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
