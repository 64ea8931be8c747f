"""Conv kernel variants side by side on the 3x3 convolutions of ResNet-18 for 32x32 inputs.

For each stride-1 3x3 conv of the CIFAR ResNet-18 (64/128/256/512 channels at 32/16/8/4
pixels, padding 1, batch 32), in NHWC and NCHW, every conv2d kernel -- the default
(lax.conv in the op's layout) and the variants lax_nhwc, im2col, shifted_matmul, winograd and
lax_bf16 (reduced precision) -- is jitted twice: with the weight closed over as a constant of
the executable (how the inference Predictor runs with frozen parameters, letting XLA fold
weight transforms) and with the weight as an argument. All kernels of one conv are timed side
by side (alternating calls, medians) and checked against the default's output.

    python benchmarks/conv_variants.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/conv_variants.py --quick    # a smoke test
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj
from timing import alternate, machine

KERNELS = ("default", "lax_nhwc", "im2col", "shifted_matmul", "winograd", "lax_bf16")
CONVS = ((64, 32), (128, 16), (256, 8), (512, 4))   # (channels, spatial size) of ResNet-18's 3x3 convs


def kernel(name: str):
    return pj.ops.conv2d if name == "default" else pj.ops.conv2d.variants[name]


def compiled(name: str, weight, frozen: bool, data_format: str):
    """``f(x)`` running kernel ``name`` jitted with the weight as a constant or an argument."""
    attrs = pj.ops.conv2d.check_attrs({"padding": 1, "data_format": data_format})
    k = kernel(name)
    if frozen:
        constant = jnp.asarray(weight)
        return jax.jit(lambda x: k(x, constant, **attrs))
    fn = jax.jit(lambda x, w: k(x, w, **attrs))
    return lambda x: fn(x, weight)


def bench(channels: int, size: int, batch: int, data_format: str, repeats: int) -> dict:
    """Per (kernel, frozen): median ms and the largest difference from the default, relative to
    the default output's largest magnitude."""
    rng = np.random.default_rng(0)
    shape = (batch, channels, size, size) if data_format == "NCHW" else (batch, size, size, channels)
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    weight = jnp.asarray((rng.normal(size=(channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32))
    fns = {(name, frozen): compiled(name, weight, frozen, data_format) for frozen in (True, False) for name in KERNELS}
    reference = np.asarray(fns["default", False](x))
    scale = float(np.abs(reference).max())
    errors = {k: float(np.abs(np.asarray(f(x)) - reference).max()) / scale for k, f in fns.items()}
    ms = alternate({k: (lambda f=f: f(x)) for k, f in fns.items()}, warmup=2, repeats=repeats)
    return {k: (ms[k], errors[k]) for k in fns}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 2, channels and sizes / 8, few repeats (smoke test)")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)
    batch, shrink = (2, 8) if args.quick else (32, 1)
    repeats = args.repeats or (3 if args.quick else 15)
    convs = [(c // shrink, max(s // shrink, 2)) for c, s in CONVS]
    print(machine())
    print(f"conv2d 3x3, stride 1, padding 1, batch {batch}, fp32 data, medians of {repeats} alternating calls (ms)")
    print("weight 'const': closed over by jit (frozen parameters); 'arg': an argument of the executable")
    print("max rel diff: largest |variant - default| / largest |default| over the f32 variants (lax_bf16 apart)\n")
    header = (f"{'conv':<16}{'layout':<7}{'weight':<7}" + "".join(f"{k:>15}" for k in KERNELS)
              + f"{'best f32':>16}{'speed-up':>9}{'max rel diff':>14}{'bf16 diff':>11}")
    print(header)
    for channels, size in convs:
        for data_format in ("NHWC", "NCHW"):
            results = bench(channels, size, batch, data_format, repeats)
            for frozen in (True, False):
                ms = {k: results[k, frozen][0] for k in KERNELS}
                f32 = {k: t for k, t in ms.items() if k not in pj.ops.conv2d.reduced_precision}
                best = min(f32, key=f32.get)
                diff = max(results[k, frozen][1] for k in f32)
                label, bf16_diff = f"{channels}ch {size}x{size}", results["lax_bf16", frozen][1]
                print(f"{label:<16}{data_format:<7}{'const' if frozen else 'arg':<7}"
                      + "".join(f"{ms[k]:>15.2f}" for k in KERNELS)
                      + f"{best:>16}{ms['default'] / ms[best]:>8.2f}x{diff:>14.1e}{bf16_diff:>11.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
