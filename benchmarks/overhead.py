"""Overhead of a traced paddlejax program against the function it was traced from.

For each case, the original function under ``jax.jit`` and the program traced from it,
run as ``jax.jit(prog.apply)``, are measured side by side in one process:

* step time: median over many alternating calls (original, traced, original, ...) after
  warm-up, each call waited on with ``block_until_ready``;
* compile time: ``jax.jit(f).lower(...).compile()`` with fresh wrappers and
  ``jax.clear_caches()`` before each, alternating as well;
* HLO instructions in the optimised module (``compiled.as_text()``);
* separately, the time ``pj.trace`` takes on a 100-layer MLP;
* and a ``Predictor`` call on a NumPy batch against a call of the executable it wraps on the
  same batch (SmallCNN of ``cnn_models.py``, batch 32, 32x32, alternating calls).

Cases: a ResNet-style CNN (NHWC) and a transformer block, each for inference and for one
training step (``value_and_grad`` of a loss w.r.t. the parameters plus an SGD update).
Batch-norm statistics are frozen (inference mode) and closed over by both versions.

    python benchmarks/overhead.py            # full sizes (a few minutes on 2 CPU cores)
    python benchmarks/overhead.py --quick    # tiny sizes, few repeats: a smoke test
    python benchmarks/overhead.py --dump-hlo out/hlo   # also write both HLO texts per case
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import paddlejax as pj
from paddlejax import ops
from timing import alternate, machine

STEP_RATIO, COMPILE_RATIO, TRACE_SECONDS = 1.03, 1.3, 2.0


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 32              # ResNet
    image: int = 32
    widths: tuple = (16, 32, 64)  # one stage per width; every stage after the first halves H, W
    blocks_per_stage: int = 2
    seq_batch: int = 8           # transformer
    seq: int = 128
    hidden: int = 256
    heads: int = 4
    mlp_depth: int = 100         # tracing benchmark
    mlp_width: int = 256
    warmup: int = 5
    step_repeats: int = 100
    compile_repeats: int = 7
    compile_warmup: int = 1      # unrecorded rounds of compiles before those
    trace_repeats: int = 5


QUICK = Config(batch=2, image=8, widths=(4, 8), blocks_per_stage=1, seq_batch=2, seq=8, hidden=16, heads=2,
               mlp_depth=10, mlp_width=16, warmup=1, step_repeats=3, compile_repeats=1, compile_warmup=0,
               trace_repeats=1)


# ---------------------------------------------------------------------------------------
# Models (Paddle layouts: OIHW conv weights, [in, out] linear weights)

def _normal(key, shape, fan_in):
    return jax.random.normal(key, shape) * np.sqrt(2 / fan_in)


class ConvBN(nnx.Module):
    """conv2d + inference batch_norm in NHWC (no activation)."""

    def __init__(self, cin, cout, key, kernel=3, stride=1):
        self.weight = nnx.Param(_normal(key, (cout, cin, kernel, kernel), cin * kernel * kernel))
        self.scale = nnx.Param(jnp.ones(cout))
        self.shift = nnx.Param(jnp.zeros(cout))
        self.mean = nnx.BatchStat(jax.random.normal(jax.random.fold_in(key, 1), (cout,)) * 0.1)
        self.var = nnx.BatchStat(jnp.ones(cout) * 1.5)
        self.stride, self.padding = stride, kernel // 2

    def __call__(self, x):
        y = ops.conv2d(x, self.weight[...], stride=self.stride, padding=self.padding, data_format="NHWC")
        y, _, _ = ops.batch_norm(y, self.mean[...], self.var[...], self.scale[...], self.shift[...],
                                 data_format="NHWC")
        return y


class BasicBlock(nnx.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)); a 1x1 projection when the shape changes."""

    def __init__(self, cin, cout, key, stride=1):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = ConvBN(cin, cout, k1, stride=stride)
        self.conv2 = ConvBN(cout, cout, k2)
        self.shortcut = ConvBN(cin, cout, k3, kernel=1, stride=stride) if stride != 1 or cin != cout else None

    def __call__(self, x):
        y = self.conv2(ops.relu(self.conv1(x)))
        return ops.relu(ops.elementwise_add(y, x if self.shortcut is None else self.shortcut(x)))


class ResNet(nnx.Module):
    def __init__(self, cfg: Config, key, classes=10):
        keys = iter(jax.random.split(key, 2 + len(cfg.widths) * cfg.blocks_per_stage))
        self.stem = ConvBN(3, cfg.widths[0], next(keys))
        blocks, cin = [], cfg.widths[0]
        for stage, width in enumerate(cfg.widths):
            for i in range(cfg.blocks_per_stage):
                blocks.append(BasicBlock(cin, width, next(keys), stride=2 if stage and not i else 1))
                cin = width
        self.blocks = nnx.List(blocks)
        self.head_w = nnx.Param(_normal(next(keys), (cin, classes), cin))
        self.head_b = nnx.Param(jnp.zeros(classes))

    def __call__(self, image):
        x = ops.relu(self.stem(image))
        for block in self.blocks:
            x = block(x)
        x = ops.pool2d(x, pooling_type="avg", kernel_size=1, global_pooling=True, data_format="NHWC")
        x = ops.reshape(x, shape=(0, -1))
        return ops.linear(x, self.head_w[...], self.head_b[...])


class TransformerBlock(nnx.Module):
    """Pre-norm block: x + proj(attention(ln(x))), then x + mlp(ln(x)) with gelu."""

    def __init__(self, hidden, heads, key, mlp_ratio=4):
        k = iter(jax.random.split(key, 4))
        dense = lambda i, o: (nnx.Param(_normal(next(k), (i, o), i)), nnx.Param(jnp.zeros(o)))  # noqa: E731
        self.heads = heads
        self.ln1_w, self.ln1_b = nnx.Param(jnp.ones(hidden)), nnx.Param(jnp.zeros(hidden))
        self.ln2_w, self.ln2_b = nnx.Param(jnp.ones(hidden)), nnx.Param(jnp.zeros(hidden))
        self.qkv_w, self.qkv_b = dense(hidden, 3 * hidden)
        self.out_w, self.out_b = dense(hidden, hidden)
        self.fc1_w, self.fc1_b = dense(hidden, mlp_ratio * hidden)
        self.fc2_w, self.fc2_b = dense(mlp_ratio * hidden, hidden)

    def __call__(self, x):
        hidden = x.shape[-1]
        y = ops.layer_norm(x, self.ln1_w[...], self.ln1_b[...])
        qkv = ops.reshape(ops.linear(y, self.qkv_w[...], self.qkv_b[...]),
                          shape=(0, 0, 3, self.heads, hidden // self.heads))
        q, k, v = (ops.reshape(t, shape=(0, 0, self.heads, hidden // self.heads))
                   for t in ops.split(qkv, num_or_sections=3, axis=2))
        a = ops.reshape(ops.scaled_dot_product_attention(q, k, v), shape=(0, 0, hidden))
        x = ops.elementwise_add(x, ops.linear(a, self.out_w[...], self.out_b[...]))
        y = ops.layer_norm(x, self.ln2_w[...], self.ln2_b[...])
        y = ops.linear(ops.gelu(ops.linear(y, self.fc1_w[...], self.fc1_b[...])), self.fc2_w[...], self.fc2_b[...])
        return ops.elementwise_add(x, y)


class MLP(nnx.Module):
    def __init__(self, width, depth, key):
        rngs = nnx.Rngs(key)
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

    def __call__(self, x):
        for layer in self.layers:
            x = ops.relu(layer(x))
        return x


# ---------------------------------------------------------------------------------------
# The two implementations of each case

def as_function(model):
    """``(fn(params, x), params)``: the module as a plain function of its nnx.Params.

    Everything else (batch-norm statistics) is closed over, so it is a constant in both the
    original and the traced program.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return (lambda p, x: nnx.merge(graphdef, p, rest)(x)), nnx.to_pure_dict(params)


def train_step(apply, loss_fn, lr=1e-3):
    """One SGD step: ``step(params, x, target) -> (loss, new_params)``."""
    def step(params, x, target):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(apply(p, x), target))(params)
        return loss, jax.tree.map(lambda p, g: p - lr * g, params, grads)

    return step


def cases(cfg: Config):
    """``(name, original, traced)`` for each case; an implementation is ``(fn, args)``."""
    rng = np.random.default_rng(0)
    image = rng.standard_normal((cfg.batch, cfg.image, cfg.image, 3)).astype(np.float32)
    labels = rng.integers(0, 10, cfg.batch).astype(np.int32)
    tokens = rng.standard_normal((cfg.seq_batch, cfg.seq, cfg.hidden)).astype(np.float32)
    models = [("resnet", ResNet(cfg, jax.random.PRNGKey(0)), image, labels,
               lambda logits, y: ops.cross_entropy(logits, y)),
              ("transformer", TransformerBlock(cfg.hidden, cfg.heads, jax.random.PRNGKey(1)), tokens,
               np.ones_like(tokens), lambda out, y: jnp.mean((out - y) ** 2))]
    for name, model, x, target, loss_fn in models:
        fn, params = as_function(model)
        prog = pj.trace(fn, x, params=params)
        yield (f"{name}/infer", (fn, (params, x)), (prog.apply, (prog.params, x)))
        yield (f"{name}/train", (train_step(fn, loss_fn), (params, x, target)),
               (train_step(prog.apply, loss_fn), (prog.params, x, target)))


# ---------------------------------------------------------------------------------------
# Measuring

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+\s+=\s")


def hlo_instructions(text: str) -> int:
    """Instructions in an HLO module's text (``name = op(...)`` lines, all computations)."""
    return sum(1 for line in text.splitlines() if _INSTRUCTION.match(line))


def compile_times(impls: dict, repeats: int, warmup: int = 1) -> tuple[dict, dict, dict]:
    """Seconds to lower and to lower + compile each implementation (alternating, after
    ``warmup`` unrecorded rounds), and its optimised HLO text."""
    lower_s, total_s, hlo = {k: [] for k in impls}, {k: [] for k in impls}, {}
    for r in range(repeats + warmup):
        for k, (fn, args) in impls.items():
            jax.clear_caches()
            gc.collect()
            start = time.perf_counter()
            lowered = jax.jit(fn).lower(*args)
            lowered_at = time.perf_counter()
            compiled = lowered.compile()
            if r >= warmup:
                lower_s[k].append(lowered_at - start)
                total_s[k].append(time.perf_counter() - start)
            hlo[k] = compiled.as_text()
    return lower_s, total_s, hlo


def step_times(impls: dict, warmup: int, repeats: int) -> tuple[dict, dict]:
    """Seconds per call of each jitted implementation (alternating), and its first output."""
    jitted = {k: jax.jit(fn) for k, (fn, _) in impls.items()}
    first = {k: jax.block_until_ready(jitted[k](*args)) for k, (_, args) in impls.items()}
    for _ in range(warmup):
        for k, (_, args) in impls.items():
            jax.block_until_ready(jitted[k](*args))
    seconds = {k: [] for k in impls}
    gc.collect()
    for _ in range(repeats):
        for k, (_, args) in impls.items():
            start = time.perf_counter()
            jax.block_until_ready(jitted[k](*args))
            seconds[k].append(time.perf_counter() - start)
    return seconds, first


def max_difference(a, b) -> float:
    """Largest difference between the first output leaves (logits, or the loss) and the
    sums of all output leaves (which also covers the updated parameters)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    first = float(np.max(np.abs(np.asarray(la[0]) - np.asarray(lb[0]))))
    total = abs(sum(float(np.sum(x)) for x in la) - sum(float(np.sum(x)) for x in lb))
    return max(first, total / max(1.0, sum(float(np.sum(np.abs(x))) for x in la)))


@dataclasses.dataclass
class Result:
    case: str
    step: dict          # implementation -> median seconds
    compile: dict       # implementation -> median seconds (trace, lower and compile)
    lower: dict         # implementation -> median seconds (trace and lower only)
    hlo: dict           # implementation -> instruction count
    hlo_text: dict
    difference: float

    def ratio(self, metric: str) -> float:
        values = getattr(self, metric)
        return values["traced"] / values["original"]


def compare(name: str, original, traced, cfg: Config) -> Result:
    """Measure both implementations of one case, interleaved, in this process."""
    impls = {"original": original, "traced": traced}
    lower_s, compile_s, hlo = compile_times(impls, cfg.compile_repeats, cfg.compile_warmup)
    step_s, outputs = step_times(impls, cfg.warmup, cfg.step_repeats)
    median = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return Result(name, median(step_s), median(compile_s), median(lower_s),
                  {k: hlo_instructions(t) for k, t in hlo.items()}, hlo,
                  max_difference(outputs["original"], outputs["traced"]))


def trace_time(cfg: Config) -> tuple[float, int]:
    """Median seconds of ``pj.trace`` on the MLP, and the number of ops in the program."""
    model = MLP(cfg.mlp_width, cfg.mlp_depth, jax.random.PRNGKey(2))
    spec = pj.InputSpec((None, cfg.mlp_width))
    times = []
    for _ in range(cfg.trace_repeats):
        gc.collect()
        start = time.perf_counter()
        prog = pj.trace(model, spec)
        times.append(time.perf_counter() - start)
    return statistics.median(times), sum(1 for _ in prog.walk())


# ---------------------------------------------------------------------------------------
# Reporting

def table(results: list[Result]) -> str:
    rows = [("case", "metric", "original", "traced", "ratio", "target"), None]
    for r in results:
        rows += [(r.case, "step (ms)", f"{r.step['original'] * 1e3:.2f}", f"{r.step['traced'] * 1e3:.2f}",
                  f"{r.ratio('step'):.3f}", f"<= {STEP_RATIO}"),
                 (r.case, "compile (s)", f"{r.compile['original']:.3f}", f"{r.compile['traced']:.3f}",
                  f"{r.ratio('compile'):.3f}", f"<= {COMPILE_RATIO}"),
                 (r.case, "  of which lowering", f"{r.lower['original']:.3f}", f"{r.lower['traced']:.3f}",
                  f"{r.ratio('lower'):.3f}", ""),
                 (r.case, "HLO instructions", str(r.hlo["original"]), str(r.hlo["traced"]),
                  f"{r.ratio('hlo'):.3f}", "equal"),
                 (r.case, "max |difference|", f"{r.difference:.1e}", "", "", "")]
    widths = [max(len(row[i]) for row in rows if row) for i in range(6)]
    line = lambda row: "  ".join(c.rjust(w) if i in (2, 3, 4) else c.ljust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    return "\n".join(line(row) if row else "-" * (sum(widths) + 10) for row in rows)


def verdicts(results: list[Result], trace_s: float, depth: int) -> list[tuple[bool, str]]:
    worst = lambda metric: max(results, key=lambda r: r.ratio(metric))  # noqa: E731
    step, comp = worst("step"), worst("compile")
    unequal = [f"{r.case} {r.hlo['original']} vs {r.hlo['traced']}" for r in results
               if r.hlo["original"] != r.hlo["traced"]]
    return [
        (step.ratio("step") <= STEP_RATIO,
         f"step time traced/original <= {STEP_RATIO} (worst {step.ratio('step'):.3f}, {step.case})"),
        (comp.ratio("compile") <= COMPILE_RATIO,
         f"compile time traced/original <= {COMPILE_RATIO} (worst {comp.ratio('compile'):.3f}, {comp.case})"),
        (not unequal, "HLO instruction counts equal" + (f" (differ: {'; '.join(unequal)})" if unequal else "")),
        (trace_s < TRACE_SECONDS, f"pj.trace of a {depth}-layer MLP < {TRACE_SECONDS} s ({trace_s:.3f} s)"),
    ]


def dump_hlo(results: list[Result], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in results:
        for impl, text in r.hlo_text.items():
            (folder / f"{r.case.replace('/', '_')}.{impl}.hlo.txt").write_text(text)


def predictor_overhead(repeats: int) -> dict:
    """Median ms of a Predictor call and of its compiled executable, both on one NumPy batch."""
    from cnn_models import MODELS
    from paddlejax.inference import Config as PredictorConfig, Predictor

    pj.nn.seed(0)
    model = MODELS["SmallCNN"](data_format="NCHW", image=32)
    model.eval()
    predictor = Predictor(pj.to_static(model, pj.InputSpec((None, 3, 32, 32))),
                          PredictorConfig(max_batch_size=32, batch_buckets=(32,), progress=False))
    x = np.random.default_rng(0).random((32, 3, 32, 32), np.float32)
    (executable,) = predictor._executables.values()
    return alternate({"Predictor": lambda: predictor(x), "executable": lambda: np.asarray(executable(x))},
                     warmup=10, repeats=repeats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (a smoke test)")
    parser.add_argument("--dump-hlo", type=Path, metavar="DIR", help="write both optimised HLO texts per case")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target fails")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else Config()

    print(machine())
    print(f"sizes: resnet batch {cfg.batch} {cfg.image}x{cfg.image}x3 NHWC widths {cfg.widths}; transformer "
          f"batch {cfg.seq_batch} seq {cfg.seq} hidden {cfg.hidden} heads {cfg.heads}; repeats: "
          f"{cfg.step_repeats} steps, {cfg.compile_repeats} compiles{' (quick)' if args.quick else ''}\n")
    results = []
    for name, original, traced in cases(cfg):
        print(f"measuring {name} ...", flush=True)
        results.append(compare(name, original, traced, cfg))
    trace_s, n_ops = trace_time(cfg)
    print()
    print(table(results))
    print(f"\npj.trace of a {cfg.mlp_depth}-layer MLP (nnx.Linear {cfg.mlp_width}->{cfg.mlp_width} + relu, "
          f"{n_ops} ops): median {trace_s:.3f} s over {cfg.trace_repeats}")
    calls = predictor_overhead(20 if args.quick else 300)
    print(f"Predictor call on a NumPy batch (SmallCNN, batch 32): {calls['Predictor']:.3f} ms; its executable "
          f"{calls['executable']:.3f} ms; ratio {calls['Predictor'] / calls['executable']:.3f}")
    if args.dump_hlo:
        dump_hlo(results, args.dump_hlo)
        print(f"HLO texts written to {args.dump_hlo}/")
    print()
    checks = verdicts(results, trace_s, cfg.mlp_depth)
    for ok, text in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if args.quick:
        print("(quick mode: sizes too small for the timing targets to mean much)")
    return 1 if args.strict and not all(ok for ok, _ in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
