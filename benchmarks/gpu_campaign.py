"""GPU campaign: the figures that need an accelerator, measured in one run and printed as one table.

    python benchmarks/gpu_campaign.py                   # full sizes: about 8 minutes on one H100
    python benchmarks/gpu_campaign.py --quick           # tiny sizes on any device: a smoke test
    python benchmarks/gpu_campaign.py --json rows.json  # the rows as JSON too

Sections, in the order they run. Every timing synchronises the device; variants of one section
alternate call by call (medians), so that they share the machine's state. A section that fails
prints its error and the campaign goes on; one that would start past ``--budget`` seconds is
skipped, so a run always ends with its table.

1. **GEMM** ``n x n x n`` (8192): bf16 (cuBLAS accumulates in f32) against int8 x int8 -> int32
   and float8 e4m3 x e4m3 -> bf16 through ``lax.dot_general``, and the ``quantized_linear`` and
   ``fp8_linear`` ops as a converted program calls them (the fp8 op quantizes its activation at
   run time). TFLOP/s (TOP/s for int8), speed-up over bf16, and the relative error against the
   float32 product of the unquantized operands.
2. **Attention** at BERT-base shapes (batch 32, 512 tokens, 12 heads of 64), bf16, forward and
   backward: the ``scaled_dot_product_attention`` op with ``implementation`` None (written out
   with a float32 softmax, fused by XLA), ``"xla"`` and ``"cudnn"`` (cuDNN's flash attention),
   and cuDNN with a padding mask (boolean, ``[batch, 1, 1, keys]``, the last eighth masked).
3. **ResNet-50 training**, 224x224, batch 256, SGD with momentum, bf16 AMP, through
   ``Trainer.train_batch``: images/s (target >= 3,000), beside the same step written by hand
   under ``jax.jit``.
4. **BERT-base training** (sequence classification), 512 tokens, batch 32, bf16 AMP, attention
   dropout 0 (so that attention is the fused op): tokens/s and model FLOPs utilisation, with
   ``6 N + 12 L s h`` FLOPs per token (N: the weights that multiply, L layers, s tokens, h
   hidden) against the data sheet's dense bf16 peak (target >= 50 %); XLA's own FLOP count of
   the compiled step beside it; with the default attention kernel and with
   ``fuse_attention{implementation=cudnn}``.
5. **Remat**: the BERT-base step with ``Strategy(recompute=True)`` (checkpoint segments the
   ``remat`` pass plans), and with the segments' inputs offloaded to host memory
   (``recompute_offload=True``), against ``Strategy(recompute=False)``: XLA's temp bytes (what
   the backward pass keeps on the device) and step time.
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax import nn, ops
from paddlejax.distributed import Strategy
from paddlejax.models.bert import BertConfig, BertForSequenceClassification
from paddlejax.models.resnet import resnet18, resnet50
from hand_written import jax_train_step
from timing import alternate, dense_rate, machine, peak_bf16


class Table:
    """Rows printed as they are measured, and again as one markdown table at the end."""

    COLUMNS = ("section", "run", "figure", "unit", "vs", "note")

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, section: str, run: str, figure: float | None, unit: str = "", vs: str = "", note: str = ""):
        row = dict(section=section, run=run, figure=figure, unit=unit, vs=vs, note=note)
        self.rows.append(row)
        print("  " + self._line(row), flush=True)

    @staticmethod
    def _line(row: dict) -> str:
        figure = row["figure"]
        text = "" if figure is None else f"{figure:,.1f}" if abs(figure) >= 10 else f"{figure:.3g}"
        return " | ".join([row["section"], row["run"], text, row["unit"], row["vs"], row["note"]])

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.COLUMNS) + " |", "|" + "---|" * len(self.COLUMNS)]
        return "\n".join(lines + ["| " + self._line(r) + " |" for r in self.rows])


def rel_error(out, reference) -> float:
    out, reference = np.asarray(out, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))


# -- 1. GEMM ------------------------------------------------------------------------------------------

def gemm(table: Table, n: int, warmup: int, repeats: int) -> None:
    section = f"GEMM {n}^3"
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = jax.random.normal(ka, (n, n), jnp.float32), jax.random.normal(kb, (n, n), jnp.float32)
    reference = jax.jit(lambda a, b: jnp.matmul(a, b, precision="highest"))(a, b)
    a_scale, b_scale = jnp.max(jnp.abs(a)), jnp.max(jnp.abs(b), axis=0)
    a8 = jnp.round(a / a_scale * 127).astype(jnp.int8)
    b8 = jnp.round(b / b_scale * 127).astype(jnp.int8)
    a_f8, b_f8 = a.astype(jnp.float8_e4m3fn), b.astype(jnp.float8_e4m3fn)
    b_fp8 = (b / b_scale * 448).astype(jnp.float8_e4m3fn)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    dot = lambda out: jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=out))  # noqa: E731
    runs = {  # name: (jitted function, its arguments, how its output maps back to a @ b)
        "bf16 x bf16 -> bf16": (dot(jnp.bfloat16), (a16, b16), lambda o: o),
        "int8 x int8 -> int32 (lax.dot)": (dot(jnp.int32), (a8, b8), lambda o: o * (a_scale * b_scale / 127 ** 2)),
        "fp8 e4m3 x e4m3 -> bf16 (lax.dot)": (dot(jnp.bfloat16), (a_f8, b_f8), lambda o: o),
        "quantized_linear op (int8)": (jax.jit(lambda *xs: ops.quantized_linear(*xs)), (a8, b8, a_scale, b_scale),
                                       lambda o: o),
        "fp8_linear op (bf16 in and out)": (jax.jit(lambda *xs: ops.fp8_linear(*xs)), (a16, b_fp8, b_scale),
                                            lambda o: o),
    }
    working, notes = {}, {}
    for name, (fn, args, back) in runs.items():
        try:
            error = rel_error(back(fn(*args)), reference)
            # the library call XLA chose (a cuBLAS(Lt) custom call on GPUs), else its own fusion
            text = fn.lower(*args).compile().as_text()
            kernels = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text))) or ["XLA fusion"]
            notes[name] = f"rel. error {error:.1e}; {', '.join(kernels)}"
            working[name] = lambda fn=fn, args=args: fn(*args)
        except Exception as e:  # an operand type this backend's dot cannot take
            table.add(section, name, None, note=f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    ms = alternate(working, warmup, repeats)
    base = ms.get("bf16 x bf16 -> bf16")
    for name, t in ms.items():
        unit = "TOP/s" if "int8" in name else "TFLOP/s"
        vs = f"{base / t:.2f}x bf16" if base else ""
        table.add(section, name, 2 * n ** 3 / (t / 1e3) / 1e12, unit, vs, f"{t:.3f} ms; {notes[name]}")


# -- 2. attention -------------------------------------------------------------------------------------

def attention(table: Table, batch: int, seq: int, heads: int, dim: int, warmup: int, repeats: int) -> None:
    section = f"attention fwd+bwd {batch}x{seq}x{heads}x{dim} bf16"
    q, k, v = (jax.random.normal(key, (batch, seq, heads, dim), jnp.bfloat16)
               for key in jax.random.split(jax.random.key(1), 3))
    keep = jnp.broadcast_to(jnp.arange(seq) < seq - seq // 8, (batch, 1, 1, seq))
    runs, outputs = {}, {}
    for impl, mask in ((None, None), ("xla", None), ("cudnn", None), (None, keep), ("cudnn", keep)):
        name = f"implementation={impl}" + (", padding mask" if mask is not None else "")
        try:
            def loss(q, k, v, impl=impl, mask=mask):
                out = ops.scaled_dot_product_attention(q, k, v, mask, implementation=impl)
                return jnp.mean(out.astype(jnp.float32) ** 2)

            step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
            outputs[name] = step(q, k, v)
            runs[name] = lambda step=step: step(q, k, v)
        except Exception as e:
            table.add(section, name, None, note=f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    ms = alternate(runs, warmup, repeats)
    flop = 3 * 4 * batch * heads * seq * seq * dim  # two matmuls forward, twice that backward
    base = ms.get("implementation=None")
    for name, t in ms.items():
        reference = outputs[name.replace("implementation=cudnn", "implementation=None")
                            .replace("implementation=xla", "implementation=None")]
        err = rel_error(outputs[name][1][0].astype(jnp.float32), reference[1][0].astype(jnp.float32))
        table.add(section, name, t, "ms", f"{base / t:.2f}x written-out" if base else "",
                  f"{flop / (t / 1e3) / 1e12:.3g} TFLOP/s; dq rel. diff {err:.1e}")


# -- 3 and 4. training through the Trainer -----------------------------------------------------------

def train(table: Table, section: str, build, inputs: tuple, labels, items: int, unit: str, warmup: int,
          repeats: int, model_flops: float | None = None, peak: float | None = None, dense: float | None = None,
          variants: dict | None = None) -> None:
    """Trainer.train_batch (bf16 AMP, SGD momentum), and with each of ``variants`` (label: its
    ``passes``), beside a hand-written jax.jit step."""
    tx = optax.sgd(0.01, momentum=0.9)
    runs, compiled = {}, {}
    nn.seed(0)
    model = build()  # every run starts from a copy of the same initial weights (building one takes seconds)
    for label, passes in {"Trainer": (), **(variants or {})}.items():
        try:
            trainer = pj.Trainer(nnx.clone(model), tx, amp="bf16", progress=False, passes=passes)
            start = time.perf_counter()
            executable = trainer.compiled_step(inputs, labels)
        except Exception as e:
            table.add(section, label, None, note=f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        cost = executable.cost_analysis()
        compiled[label] = (time.perf_counter() - start, float((cost[0] if isinstance(cost, (list, tuple))
                                                               else cost).get("flops", 0.0)))
        runs[label] = lambda t=trainer: t.train_batch(inputs, labels)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params, rest = jax.tree.map(jnp.copy, (params, rest))  # the step donates them: the clones above share them
    step = jax.jit(jax_train_step(graphdef, tx, jnp.bfloat16), donate_argnums=(0, 1, 2))
    carry = [params, tx.init(params), rest]

    def reference_step():
        *state, loss = step(*carry, inputs, labels)
        carry[:] = state
        return loss

    runs["jax.jit by hand"] = reference_step
    ms = alternate(runs, warmup, repeats)
    for name, t in ms.items():
        vs = f"time {t / ms['jax.jit by hand']:.3f}x hand-written" if name in compiled else ""
        note = f"{t:.1f} ms/step"
        if name in compiled:
            compile_s, xla_flops = compiled[name]
            note += f"; compile {compile_s:.0f} s; XLA {xla_flops / (t / 1e3) / 1e12:.3g} TFLOP/s"
            if model_flops:
                achieved = model_flops / (t / 1e3)
                note += f"; model {achieved / 1e12:.3g} TFLOP/s"
                note += f", MFU {achieved / peak:.1%}" if peak else f", {achieved / dense:.1%} of the measured matmul"
        table.add(section, name, items / (t / 1e3), unit, vs, note)


def resnet(table: Table, quick: bool, batch: int, image: int, warmup: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.normal(size=(batch, image, image, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 1000, batch), jnp.int32)
    depth, build = (18, resnet18) if quick else (50, resnet50)
    train(table, f"ResNet-{depth} train {image}x{image} b{batch} bf16", lambda: build(data_format="NHWC"),
          (images,), labels, batch, "images/s", warmup, repeats)


def bert_config(quick: bool) -> BertConfig:
    if quick:
        return BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, attention_probs_dropout_prob=0.0)
    return BertConfig.from_name("bert-base-uncased", attention_probs_dropout_prob=0.0)


def bert_flops(model, config: BertConfig, tokens: int, seq: int) -> float:
    """Model FLOPs of one training step: ``6 N + 12 L s h`` per token, N the weights that
    multiply (every parameter but the embeddings, biases and norms)."""
    n = sum(int(np.size(v)) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
            if "embeddings" not in "/".join(map(str, path)) and np.ndim(v) == 2)
    return tokens * (6 * n + 12 * config.num_hidden_layers * seq * config.hidden_size)


def bert(table: Table, quick: bool, batch: int, seq: int, warmup: int, repeats: int, peak: float | None,
         dense: float) -> None:
    config = bert_config(quick)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, config.vocab_size, (batch, seq)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 2, batch), jnp.int32)
    build = lambda: BertForSequenceClassification(config, num_classes=2)  # noqa: E731
    model_flops = bert_flops(nnx.eval_shape(build), config, batch * seq, seq)
    train(table, f"BERT{'-tiny' if quick else '-base'} train s{seq} b{batch} bf16", build, (ids,), labels,
          batch * seq, "tokens/s", warmup, repeats, model_flops, peak, dense,
          variants={"Trainer, cuDNN attention": "fuse_attention{implementation=cudnn}"})


def remat(table: Table, quick: bool, batch: int, seq: int, warmup: int, repeats: int) -> None:
    config = bert_config(quick)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, config.vocab_size, (batch, seq)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 2, batch), jnp.int32)
    section = f"remat BERT{'-tiny' if quick else '-base'} s{seq} b{batch} bf16"
    trainers, temp = {}, {}
    strategies = {"recompute=False": Strategy(), "recompute=True": Strategy(recompute=True),
                  "recompute, offloaded": Strategy(recompute=True, recompute_offload=True)}
    nn.seed(0)
    model = BertForSequenceClassification(config, num_classes=2)  # each strategy trains a copy of it
    for name, strategy in strategies.items():
        trainer = pj.Trainer(nnx.clone(model), optax.sgd(0.01, momentum=0.9), amp="bf16", progress=False,
                             strategy=strategy)
        try:
            memory = trainer.compiled_step([ids], labels).memory_analysis()
        except ValueError as e:  # a backend without pinned_host memory
            table.add(section, name, None, note=f"n/a: {str(e).splitlines()[0][:120]}")
            continue
        trainers[name], temp[name] = trainer, memory.temp_size_in_bytes
    ms = alternate({k: lambda t=t: t.train_batch([ids], labels) for k, t in trainers.items()}, warmup, repeats)
    for name, t in ms.items():
        table.add(section, name, temp[name] / 2 ** 20, "MiB temp",
                  f"{temp[name] / temp['recompute=False']:.2f}x memory", f"{t:.1f} ms/step, "
                  f"{t / ms['recompute=False']:.2f}x time")


# -- main ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test on any device)")
    p.add_argument("--budget", type=float, default=540, help="seconds; sections that would start later are skipped")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--sections", default="gemm,attention,resnet,bert,remat",
                   help="comma-separated sections to run (default: all)")
    args = p.parse_args(argv)
    quick = args.quick
    start = time.perf_counter()
    # a compiled step is compiled once: compiled_step's executable serves train_batch's first call too
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="paddlejax-campaign-"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    print(machine())
    peak, kind = peak_bf16()
    dense = dense_rate("bf16", 256 if quick else 8192)
    print(f"device kind: {kind}; data-sheet dense bf16 peak: "
          f"{f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown'}; bf16 matmul measured: {dense / 1e12:.1f} TFLOP/s\n")
    warmup, repeats = (1, 3) if quick else (3, 20)
    table = Table()
    sections = [  # (name, seconds it needs at full size, run)
        ("gemm", 30, lambda: gemm(table, 256 if quick else 8192, warmup, repeats)),
        ("attention", 30, lambda: attention(table, *((2, 64, 2, 32) if quick else (32, 512, 12, 64)), warmup, repeats)),
        ("resnet", 150, lambda: resnet(table, quick, *((4, 32) if quick else (256, 224)), warmup, repeats)),
        ("bert", 120, lambda: bert(table, quick, *((4, 32) if quick else (32, 512)), warmup, repeats, peak, dense)),
        ("remat", 120, lambda: remat(table, quick, *((4, 32) if quick else (32, 512)), warmup, repeats)),
    ]
    for name, needs, run in sections:
        if name not in args.sections.split(","):
            continue
        elapsed = time.perf_counter() - start
        if not quick and elapsed + needs > args.budget:
            table.add(name, "skipped", None, note=f"{elapsed:.0f} s spent of a {args.budget:.0f} s budget")
            continue
        print(f"[{elapsed:5.0f} s] {name}", flush=True)
        try:
            run()
        except Exception as e:
            traceback.print_exc()
            table.add(name, "failed", None, note=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    print(f"\n{machine()}\ndevice kind {kind}; {time.perf_counter() - start:.0f} s in all\n")
    print(table.markdown())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "device_kind": kind, "rows": table.rows}, f, indent=1)
    return 0 if not any(r["run"] == "failed" for r in table.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
