"""int8 vs fp32 inference latency and saved size of post-training-quantized programs.

Models: a transformer encoder block stack (matmul-heavy: 4 layers, d=256, 4 heads, FFN 1024,
128 tokens), SmallCNN (benchmarks/passes.py) and the digits CNN, each quantized by
``pj.slim.quant_post`` (hist calibration on random inputs; the accuracy figures on real data
are in the tests). Both programs of a model are compiled with frozen parameters and timed side
by side in one process (calls interleaved, the ratio is the median of per-round ratios), after
the ``autotune`` pass (frozen weights) has picked their conv kernels: for int8 convolutions
the int8-matmul variants, as XLA's CPU int8 convolution is slow.

    python benchmarks/quant.py            # batch 32 (a minute or two on 2 CPU cores)
    python benchmarks/quant.py --quick    # a smoke test
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

import paddlejax as pj
from paddlejax import nn
from paddlejax.models.digits import DigitsCNN
from cnn_models import SmallCNN, randomise_statistics
from timing import alternate, machine, paired_ratio


class Encoder(nn.Layer):
    """``layers`` post-norm transformer encoder layers over ``[batch, tokens, d]``."""

    def __init__(self, d: int, heads: int, ffn: int, layers: int):
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0), layers)

    def forward(self, x):
        return self.encoder(x)


def models(quick: bool) -> dict:
    """name -> (model, input shape without the batch)."""
    d, tokens = (32, 8) if quick else (256, 128)
    return {"Transformer encoder": (Encoder(d, 4, 4 * d, 1 if quick else 4), (tokens, d)),
            "SmallCNN": (SmallCNN(), (3, 32, 32)), "digits CNN": (DigitsCNN(), (1, 8, 8))}


def saved_bytes(program, folder: Path, name: str) -> int:
    pj.save(program, folder / name)
    return (folder / f"{name}.safetensors").stat().st_size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 2, tiny transformer, few repeats")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    batch, repeats = (2, 3) if args.quick else (32, 30)
    print(machine())
    print(f"batch {batch}, frozen parameters, hist calibration, medians of {repeats} alternating calls\n")
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (model, shape) in models(args.quick).items():
            nn.seed(0)
            randomise_statistics(model)
            model.eval()
            fp32 = pj.to_static(model, pj.InputSpec((None, *shape)))
            calib = [rng.normal(size=(batch, *shape)).astype(np.float32) for _ in range(4)]
            # each program with its conv kernels tuned, as a Predictor serves it
            fp32 = pj.passes.run(fp32, f"autotune{{sizes=b={batch} frozen=true}}")
            int8 = pj.slim.quant_post(fp32, calib, algo="hist", progress=False)
            int8 = pj.passes.run(int8, f"autotune{{sizes=b={batch} frozen=true}}")
            x = calib[0]
            runs = {"fp32": fp32.compile(x, freeze_params=True), "int8": int8.compile(x, freeze_params=True)}
            rounds = alternate({k: (lambda f=f: f(x)) for k, f in runs.items()}, 2, args.repeats or repeats,
                               rounds=True)
            ms = {k: 1e3 * statistics.median(t) for k, t in rounds.items()}
            ref = np.asarray(runs["fp32"](x))
            rel = float(np.abs(np.asarray(runs["int8"](x)) - ref).max() / np.abs(ref).max())
            size = saved_bytes(fp32, Path(folder), "fp32") / saved_bytes(int8, Path(folder), "int8")
            quantized = sum(op.type.startswith("quantized_") for op in int8.walk())
            rows.append((name, quantized, ms["fp32"], ms["int8"], paired_ratio(rounds, "fp32", "int8"), size, rel))
    print(f"  {'model':<22}{'int8 ops':>9}{'fp32 ms':>10}{'int8 ms':>10}{'speed-up':>10}{'size ratio':>12}"
          f"{'max rel diff':>14}")
    for name, quantized, fp, q, ratio, size, rel in rows:
        print(f"  {name:<22}{quantized:>9}{fp:>10.2f}{q:>10.2f}{ratio:>9.2f}x{size:>11.2f}x{rel:>14.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
