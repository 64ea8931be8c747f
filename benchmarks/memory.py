"""Memory: the peak estimate beside XLA's figure, and remat in a scan-over-layers training step.

Part 1 (eval mode, batch 32, 32x32x3 images; the models of passes.py): the estimate of
``paddlejax.passes.memory.compare_with_xla`` -- parameters, constants, the liveness peak of
the activations and the conv weight copies XLA makes -- beside XLA's ``memory_analysis()``
argument + output + temp bytes. SmallCNN compiles into one fused kernel that never
materialises its activations, so the estimate is an upper bound there, not a close figure.

Part 2: a residual tanh MLP, ``h + 0.5 * tanh(h @ w1 + b1) @ w2``, run as one ``lax.scan``
over 16 stacked layers (batch 256, width 512, hidden 1024), where XLA on CPU honours remat.
The training step is ``jax.grad`` of a squared-error loss through the program; its peak
activation memory is XLA's temp bytes for the compiled step. Rows: without remat, then
``remat{budget=B}`` with B half the planner's own estimate of the stored bytes, and with B
half of XLA's unplanned figure; each with the planner's estimate, XLA's temp bytes, the ratio
to the unplanned step, the step time (alternating calls, medians) and the largest difference
of the loss and gradients from the unplanned step's.

    python benchmarks/memory.py            # full run (about a minute on 2 CPU cores)
    python benchmarks/memory.py --quick    # a smoke test
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

import paddlejax as pj
from paddlejax import nn
from paddlejax.lowering import run_program
from paddlejax.passes.memory import compare_with_xla, stored_bytes
from cnn_models import MODELS, randomise_statistics
from timing import alternate, machine

MIB = 2 ** 20


def estimates(batch: int, image: int) -> None:
    """Print our estimate beside XLA's for each model of passes.py."""
    print(f"Peak memory of inference, batch {batch}, {image}x{image}x3 images, fp32, parameters as arguments (MiB)")
    print(f"  {'model':<14}{'params':>9}{'act. peak':>11}{'w. copies':>11}{'estimate':>10}{'XLA':>9}"
          f"{'XLA temp':>10}{'est./XLA':>10}")
    for name, build in MODELS.items():
        nn.seed(0)
        model = build(data_format="NCHW", image=image)
        randomise_statistics(model)
        model.eval()
        c = compare_with_xla(pj.to_static(model, pj.InputSpec((None, 3, image, image))), {"b": batch})
        print(f"  {name:<14}{c.param_bytes / MIB:>9.2f}{c.peak_activation_bytes / MIB:>11.2f}"
              f"{c.layout_copy_bytes / MIB:>11.2f}{c.estimate_bytes / MIB:>10.2f}{c.xla_bytes / MIB:>9.2f}"
              f"{c.xla_temp_bytes / MIB:>10.2f}{c.estimate_bytes / c.xla_bytes:>10.2f}")
    print("  (w. copies: conv weights XLA copies to its layout before the first op; SmallCNN compiles into one\n"
          "   fused kernel that never materialises the activations the liveness counts: an upper bound there)")
    print()


def scan_mlp(p, x):
    """``layers`` residual tanh blocks as one ``lax.scan`` over stacked weights."""
    def layer(h, w):
        w1, b1, w2 = w
        return h + (jax.numpy.tanh(h @ w1 + b1) @ w2) * 0.5, None
    return jax.lax.scan(layer, x, (p["w1"], p["b1"], p["w2"]))[0]


def training_step(program: pj.Program, x: np.ndarray):
    """The jitted loss-and-gradients step of ``program`` and XLA's temp bytes for it."""
    step = jax.jit(jax.value_and_grad(lambda q: (run_program(program, q, (x,)) ** 2).mean()))
    temp = step.lower(program.params).compile().memory_analysis().temp_size_in_bytes
    return step, int(temp)


def remat_in_scan(layers: int, batch: int, width: int, hidden: int, repeats: int) -> None:
    """Print the remat rows for the scan-over-layers MLP."""
    rng = np.random.default_rng(0)
    p = {"w1": (rng.normal(size=(layers, width, hidden)) / np.sqrt(width)).astype(np.float32),
         "b1": np.zeros((layers, hidden), np.float32),
         "w2": (rng.normal(size=(layers, hidden, width)) / np.sqrt(hidden)).astype(np.float32)}
    x = rng.normal(size=(batch, width)).astype(np.float32)
    prog = pj.trace(scan_mlp, pj.InputSpec((None, width)), params=p)
    sizes = f"sizes=b={batch}"
    estimate = stored_bytes(prog, {"b": batch})
    step, temp = training_step(prog, x)
    rows = {"without remat": (prog, estimate, step, temp)}
    for label, budget in (("remat, B = 50% of estimate", estimate // 2), ("remat, B = 50% of XLA's", temp // 2)):
        planned = pj.passes.run(prog, f"remat{{budget={budget},{sizes}}}")
        rows[f"{label} ({budget / MIB:.1f} MiB)"] = (planned, stored_bytes(planned, {"b": batch}),
                                                      *training_step(planned, x))
    loss, grads = step(prog.params)
    diffs = {}
    for label, (program, _, fn, _) in rows.items():
        got_loss, got_grads = fn(program.params)
        diffs[label] = max(abs(float(got_loss - loss)),
                           *(float(np.abs(np.asarray(got_grads[k] - grads[k])).max()) for k in grads))
    ms = alternate({label: (lambda fn=fn, q=program.params: fn(q)) for label, (program, _, fn, _) in rows.items()},
                   2, repeats)
    print(f"Training step of a {layers}-layer residual MLP in one lax.scan, batch {batch}, width {width}, "
          f"hidden {hidden}, fp32")
    print(f"  {'variant':<42}{'estimate MiB':>13}{'XLA temp MiB':>14}{'/ unplanned':>12}{'ms':>9}"
          f"{'max |diff|':>12}")
    for label, (_, est, _, t) in rows.items():
        print(f"  {label:<42}{est / MIB:>13.2f}{t / MIB:>14.2f}{t / temp:>12.2f}{ms[label]:>9.1f}"
              f"{diffs[label]:>12.2e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test)")
    args = p.parse_args(argv)
    print(machine(), end="\n\n")
    if args.quick:
        estimates(batch=2, image=16)
        remat_in_scan(layers=4, batch=16, width=64, hidden=128, repeats=3)
    else:
        estimates(batch=32, image=32)
        remat_in_scan(layers=16, batch=256, width=512, hidden=1024, repeats=20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
