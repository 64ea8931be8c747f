"""Sparsity on CPU: inference speed of dense vs sparse weights, the saved size, and accuracy.

1. Speed, side by side in one process, at default threads and on one thread: a 1024x1024 linear
   layer (batch 1 and 32), an MLP (784-1024-1024-10) and the DigitsCNN, dense and with 75 %
   unstructured or 2:4 sparse weights, (a) through the Predictor (frozen weights: the fast path),
   the zeros stored dense; (b) through ``jax.experimental.sparse`` (BCOO matmuls) under ``jax.jit``
   beside the dense jitted function, where the model is matmuls (not the CNN: BCOO has no
   convolution); (c) for the linear layer, outside XLA, scipy's CSR matmul beside numpy's BLAS,
   both on one thread, to show what a sparse kernel gives on this CPU.
2. Saved size: ``pj.save(..., sparse=True)`` against the dense file.
3. Accuracy: DigitsCNN trained on scikit-learn's digits (benchmarks/slim.py's recipe), pruned to
   2:4 and to 75 % by magnitude, fine-tuned with ``slim.sparsity.decorate`` (the zeros stay zeros).

One thread: ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` alone
does not limit XLA's CPU threads on jax 0.10.2 (the CPU time of a jitted matmul loop stayed ~1.9x its
wall time on 2 cores), so the single-thread run also pins its process to one CPU (as ``taskset`` does)
before jax starts; the benchmark prints the CPU / wall ratio of each run as the check.

Measured here (2-core AMD EPYC, jax 0.10.2, full run, on a machine shared with other jobs: the
CPU / wall check read 1.0 at default threads, where a quiet machine gives ~1.9, and 0.68 on one
thread): XLA's CPU backend has no sparse kernels, and sparsity gives no inference speed-up on any
XLA path. Zeros stored dense run the dense kernels: the Predictor's 75 % and 2:4 programs time as
the dense ones (0.96-1.10x, within the noise, at either thread count, for the linear layer, the
MLP and the DigitsCNN). BCOO lowers to gathers and a scatter-add: 0.24-0.47x of the dense jitted
time at batch 1, 0.02-0.25x at batch 32. scipy's CSR product, a generic sparse kernel, is slower
than one-thread BLAS too (0.38-0.84x at 75 %): these weights (4 MiB) stay in cache, so the product
is not memory-bound and skipping zeros does not pay for the indexing. The seed's figure (+30 % at
75 %, fp32, one thread) needs what XLA lacks: a sparse GEMM built for the CPU (oneDNN's or MKL's
sparse matmul, XNNPACK's sparse inference of 1x1 convolutions, LIBXSMM), called through an XLA
FFI custom call, at high sparsity and on weights larger than the caches or at batch 1, where the
product is memory-bound; or GPU 2:4 sparse tensor cores (cuSPARSELt, Ampere and later; NVIDIA
quotes up to twice the dense math rate), which JAX does not expose. What sparsity gives here is the
saved size: 0.28-0.29 of the dense tensor file at 75 %, 0.53-0.54 at 2:4, for float32; and the
DigitsCNN keeps its accuracy (99.72 % dense; 99.17 % at 75 % and at 2:4 after 6 epochs of
fine-tuning with ``decorate``, from 63.06 % and 98.06 % right after pruning).

    python benchmarks/sparsity.py            # the full run (a few minutes)
    python benchmarks/sparsity.py --quick    # tiny settings: a smoke test
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _pin_to_one_cpu() -> None:
    """Before jax starts: XLA's flags for one thread, BLAS on one thread, and the process on one
    CPU (the threads jax starts inherit it)."""
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_THREAD_FLAGS}".strip()
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _one_thread(argv: list) -> bool:
    return "--threads=1" in argv or any(a == "--threads" and b == "1" for a, b in zip(argv, argv[1:]))


if __name__ == "__main__" and _one_thread(sys.argv[1:]):
    _pin_to_one_cpu()

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import alternate, machine, paired_ratio  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax.inference import Config, Predictor  # noqa: E402
from paddlejax.passes.manager import inference_pipeline  # noqa: E402
from paddlejax.nn.program_layer import ProgramLayer  # noqa: E402
from paddlejax.slim.sparsity import decorate, prune_program, sparsity  # noqa: E402

SPARSE = {"75%": {"ratio": 0.75}, "2:4": {"n": 2, "m": 4}}
# The Predictor's passes but autotune: dense and sparse programs then run the same kernels, and
# kernel choices measured on a noisy machine do not blur the comparison.
PASSES = ",".join(p for p in inference_pipeline().split(",") if p != "autotune")


def cpu_per_wall() -> float:
    """CPU time over wall time while a jitted 1024x1024 matmul runs: about the threads it used."""
    x = jnp.asarray(np.random.default_rng(0).random((1024, 1024), np.float32))
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(20):
        f(x).block_until_ready()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


# -- 1. speed -------------------------------------------------------------------------------------------

def mlp(params, x):
    """A stack of ``x @ w + b`` with ReLU between: the same function for dense and BCOO weights."""
    layers = len(params) // 2
    for i in range(layers):
        x = x @ params[f"l{i}.w"] + params[f"l{i}.b"]
        x = jax.nn.relu(x) if i < layers - 1 else x
    return x


def mlp_params(sizes, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        params[f"l{i}.w"] = (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32)
        params[f"l{i}.b"] = np.zeros(b, np.float32)
    return params


def predictor(program, batch: int) -> Predictor:
    config = Config(max_batch_size=batch, batch_buckets=(batch,), progress=False, passes=PASSES, freeze_params=True)
    return Predictor(program, config)


def measure(label: str, path: str, fns: dict, repeats: int) -> list:
    """Rows ``(model, path, weights, ms, dense / this)``: ``fns`` (the dense one first) called in
    turn with nothing else between them, each first in its round as often as the others (the first
    call after a long one, e.g. a BCOO product, starts with cold caches); the ratio is the median
    of same-round ratios."""
    names = list(fns)
    times = {k: [] for k in names}
    for shift in range(len(names)):
        order = names[shift:] + names[:shift]
        got = alternate({k: fns[k] for k in order}, warmup=1, repeats=max(1, repeats // len(names)), rounds=True)
        for k in names:
            times[k] += got[k]
    return [(label, path, k, 1e3 * statistics.median(times[k]), paired_ratio(times, names[0], k)) for k in names]


def sparse_variants(program, bcoo: bool) -> tuple[dict, dict | None]:
    """``program`` dense and pruned each way, and with ``bcoo`` their weights for :func:`mlp`,
    the pruned ones' matrices as BCOO (keyed by row name), made once for every batch size."""
    variants = {"dense": program, **{k: prune_program(program, **v, min_size=0)[0] for k, v in SPARSE.items()}}
    if not bcoo:
        return variants, None
    from jax.experimental import sparse as jsparse

    # jitted, one compilation per shape (eagerly, each of its many ops compiles for each matrix)
    to_bcoo = jax.jit(jsparse.BCOO.fromdense, static_argnames="nse")
    weights = {}
    for name, prog in variants.items():
        w = {k: jnp.asarray(v) for k, v in prog.params.items()}
        if name != "dense":
            w = {k: to_bcoo(v, nse=int(np.count_nonzero(v))) if v.ndim == 2 else v for k, v in w.items()}
        weights[name if name == "dense" else f"{name} BCOO"] = w
    return variants, weights


def speed_case(label: str, variants: dict, batch: int, repeats: int, bcoo: dict | None, reference: bool) -> list:
    """The rows of the programs ``variants`` (from :func:`sparse_variants`, with the BCOO weights
    ``bcoo``) through each path (see :func:`measure`)."""
    x = np.random.default_rng(1).random((batch, *variants["dense"].inputs[0].type.shape[1:]), np.float32)
    rows = measure(label, "Predictor (frozen)", {name: (lambda p=predictor(prog, batch): p(x))
                                                 for name, prog in variants.items()}, repeats)
    if bcoo:
        step = jax.jit(mlp)  # BCOO weights are pytrees: the same function runs sparse matmuls
        fns = {name: lambda w=weights: step(w, x).block_until_ready() for name, weights in bcoo.items()}
        rows += measure(label, "jax.jit", fns, repeats)
    if reference:
        import scipy.sparse
        from threadpoolctl import threadpool_limits

        fns = {}
        for name, prog in variants.items():
            w = np.asarray(prog.params["l0.w"]).T.copy()  # [out, in]: CSR rows are the outputs
            key, a = ("dense BLAS", w) if name == "dense" else (f"{name} CSR", scipy.sparse.csr_matrix(w))
            fns[key] = lambda a=a: a @ x.T
        with threadpool_limits(1, "blas"):  # scipy's CSR product runs on one thread: so does BLAS here
            rows += measure(label, "outside XLA", fns, repeats)
    return rows


def speed(args) -> None:
    threads = "1 (pinned to one CPU)" if args.threads == "1" else f"all ({len(os.sched_getaffinity(0))} CPUs)"
    print(f"\nthreads: {threads}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
          f"CPU time / wall time of a jitted matmul loop: {cpu_per_wall():.2f}")
    repeats = 5 if args.quick else 40
    from paddlejax.models.digits import DigitsCNN

    linear = pj.trace(mlp, pj.InputSpec((None, 1024)), params=mlp_params((1024, 1024)), name="linear")
    net = pj.trace(mlp, pj.InputSpec((None, 784)), params=mlp_params((784, 1024, 1024, 10)), name="MLP")
    pj.nn.seed(0)
    cnn = DigitsCNN()
    cnn.eval()
    cnn = pj.to_static(cnn, pj.InputSpec((None, 1, 8, 8)), name="DigitsCNN")
    rows = []
    variants, bcoo = sparse_variants(linear, True)
    for batch in (1, 32):
        rows += speed_case(f"linear 1024x1024, batch {batch}", variants, batch, repeats, bcoo, True)
    variants, bcoo = sparse_variants(net, True)
    rows += speed_case("MLP 784-1024-1024-10, batch 32", variants, 32, repeats, bcoo, False)
    rows += speed_case("DigitsCNN, batch 32", sparse_variants(cnn, False)[0], 32, repeats, None, False)
    print(f"{'model':<32}{'path':<20}{'weights':<12}{'ms':>9}{'dense / this':>14}")
    for label, path, name, ms, ratio in rows:
        print(f"{label:<32}{path:<20}{name:<12}{ms:>9.3f}{ratio:>13.2f}x")


def single_thread_run(argv) -> None:
    """The speed section again in a fresh process on one thread (XLA's threads start with jax)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, __file__, "--threads=1", *argv], env=env, capture_output=True, text=True)
    print(proc.stdout, end="")
    if proc.returncode:
        raise SystemExit(f"the single-thread run failed:\n{proc.stderr[-3000:]}")


# -- 2. size ----------------------------------------------------------------------------------------------

def saved_bytes(program, sparse: bool) -> int:
    folder = tempfile.mkdtemp()
    pj.save(program, os.path.join(folder, "p"), sparse=sparse)
    return os.path.getsize(os.path.join(folder, "p.safetensors"))


# -- 3. accuracy ------------------------------------------------------------------------------------------

def accuracy(program, images, labels) -> float:
    return float((np.asarray(program(images)).argmax(1) == labels).mean())


def train(model, data, epochs: int, lr: float, masks=None):
    """benchmarks/slim.py's recipe (AdamW, warm-up and cosine decay, batch 64), the optimizer
    ``decorate``d with ``masks`` when given."""
    steps = epochs * -(-len(data[1]) // 64)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, min(50, steps // 10)), steps)
    tx = optax.adamw(schedule, weight_decay=1e-4)
    trainer = pj.Trainer(model, tx if masks is None else decorate(tx, masks), progress=False)
    trainer.fit(data, epochs=epochs, batch_size=64, seed=0)
    return trainer


def size_and_accuracy(args) -> None:
    from paddlejax.models.digits import DigitsCNN

    epochs, tune_epochs = (2, 1) if args.quick else (12, 6)
    x, y = pj.data.Digits("train").arrays()
    if args.quick:  # whole batches of 64 only: a ragged last batch compiles each training step a second time
        x, y = x[:len(y) // 64 * 64], y[:len(y) // 64 * 64]
    test = pj.data.Digits("test")
    pj.nn.seed(0)
    model = DigitsCNN()
    train(model, (x, y), epochs, 3e-3)
    model.eval()
    base = pj.to_static(model, pj.InputSpec((None, 1, 8, 8)), name="DigitsCNN")
    net = pj.trace(mlp, pj.InputSpec((None, 784)), params=mlp_params((784, 1024, 1024, 10)), name="MLP")

    print("\nsaved tensor file, sparse=True vs dense (float32)")
    print(f"{'model':<12}{'weights':<9}{'dense KiB':>11}{'sparse KiB':>12}{'ratio':>8}")
    for label, prog in (("DigitsCNN", base), ("MLP", net)):
        for name, kwargs in SPARSE.items():
            pruned = prune_program(prog, **kwargs)[0]
            dense, small = saved_bytes(pruned, False), saved_bytes(pruned, True)
            print(f"{label:<12}{name:<9}{dense / 1024:>11.1f}{small / 1024:>12.1f}{small / dense:>8.2f}")

    print(f"\nDigitsCNN accuracy on the 360 test images: trained {epochs} epochs; pruned (weights of 1,024 "
          f"elements and more), then fine-tuned {tune_epochs} epochs with decorate")
    print(f"{'weights':<9}{'density':>9}{'pruned':>9}{'tuned':>9}  zeros kept")
    print(f"{'dense':<9}{1.0:>9.3f}{accuracy(base, test.images, test.labels):>9.2%}")
    for name, kwargs in SPARSE.items():
        pruned, masks = prune_program(base, **kwargs)
        layer = ProgramLayer(pruned)
        train(layer, (x, y), tune_epochs, 1e-3, masks)
        tuned = pj.to_static(layer, pj.InputSpec((None, 1, 8, 8)))
        kept = all((np.asarray(tuned.params[f"params.{k}"])[~m] == 0).all() for k, m in masks.items())
        weights = sum(np.size(base.params[k]) for k in sparsity(base))
        density = sum(d * np.size(base.params[k]) for k, d in sparsity(pruned).items()) / weights
        print(f"{name:<9}{density:>9.3f}{accuracy(pruned, test.images, test.labels):>9.2%}"
              f"{accuracy(tuned, test.images, test.labels):>9.2%}  {'yes' if kept else 'NO'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", choices=("all", "1"), default=None,
                   help="run only the speed section, at all threads or on one (default: both, then size and accuracy)")
    args = p.parse_args(argv)
    if args.threads is not None:
        speed(args)
        return 0
    print(machine())
    args.threads = "all"
    speed(args)
    single_thread_run(["--quick"] if args.quick else [])
    size_and_accuracy(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
