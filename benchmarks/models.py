"""Throughput of zoo models: ResNet-50 and MobileNetV2 (images/s), BERT-base (tokens/s).

For each model, side by side in one process (alternating calls, medians):

- **forward**, eval mode: the model under ``jax.jit`` (``nnx.merge`` of its state) and its
  static program (``pj.to_static``, compiled), both with the weights as arguments;
- **train step** (SGD with momentum, cross entropy): ``Trainer.train_batch`` and a
  hand-written ``jax.jit`` step (``jax.value_and_grad`` + optax, donated state).

With ``--amp`` the program and the Trainer go through the ``amp`` pass, and the hand-written
functions cast the parameters to the low-precision dtype inside the step (f32 master weights).

The FLOPs of each compiled computation come from XLA's ``cost_analysis``; achieved FLOP/s is
set against the rate of a large dense matmul measured in the same process (f32 on CPU; with
``--amp bf16``, bf16 with f32 accumulation), and on GPUs also against the device's peak dense
bf16 rate (model FLOPs utilisation).

    python benchmarks/models.py                  # ResNet-50, MobileNetV2 at 224x224, BERT-base at 128 tokens
    python benchmarks/models.py --amp bf16       # mixed precision (the default on GPUs)
    python benchmarks/models.py --quick          # tiny sizes: a smoke test
"""
from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax import nn
from paddlejax.models.bert import BertConfig, BertForSequenceClassification
from paddlejax.models.mobilenet import mobilenet_v2
from paddlejax.models.resnet import resnet18, resnet50
from hand_written import cast, jax_train_step
from timing import alternate, dense_rate, machine, peak_bf16


@dataclasses.dataclass
class Case:
    name: str
    build: object          # () -> model
    inputs: tuple          # model inputs (one batch)
    labels: np.ndarray
    items: int             # images or tokens per batch
    unit: str


def cases(quick: bool, batch: int, image: int, seq: int, data_format: str) -> list[Case]:
    rng = np.random.default_rng(0)
    shape = (batch, 3, image, image) if data_format == "NCHW" else (batch, image, image, 3)
    images = rng.normal(size=shape).astype(np.float32)
    classes = rng.integers(0, 1000, batch).astype(np.int32)
    bert = (BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128) if quick else BertConfig.from_name("bert-base-uncased"))
    tokens = rng.integers(1, bert.vocab_size, (batch, seq)).astype(np.int32)
    return [
        Case("ResNet-18" if quick else "ResNet-50", lambda: (resnet18 if quick else resnet50)(data_format=data_format),
             (images,), classes, batch, "images/s"),
        Case("MobileNetV2", lambda: mobilenet_v2(scale=0.35 if quick else 1.0, data_format=data_format),
             (images,), classes, batch, "images/s"),
        Case("BERT-base" if not quick else "BERT (tiny)", lambda: BertForSequenceClassification(bert, num_classes=2),
             (tokens,), classes % 2, batch * seq, "tokens/s"),
    ]


def flops(fn, *args) -> float:
    """FLOPs of one call of the jitted ``fn`` as XLA compiles it (the executable that its calls
    with these shapes then reuse: jitting ``fn`` again would compile it a second time)."""
    cost = fn.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0))


def measure(case: Case, amp: str | None, warmup: int, repeats: int) -> dict:
    dtype = {"bf16": jnp.bfloat16, "fp16": jnp.float16}.get(amp)
    inputs = [jnp.asarray(x) for x in case.inputs]
    labels = jnp.asarray(case.labels)
    nn.seed(0)
    model = case.build()
    model.eval()
    program = pj.to_static(model, *[pj.InputSpec((None, *x.shape[1:]), x.dtype) for x in inputs])
    if amp:
        program = pj.passes.run(program, f"amp{{dtype={amp}}}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forward = jax.jit(lambda params, *xs: nnx.merge(graphdef, cast(params, dtype), rest)(*xs))
    forward_flops = flops(forward, params, *inputs)
    fwd = alternate({"jax.jit": lambda: forward(params, *inputs), "program": lambda: program(*inputs)},
                    warmup, repeats)

    tx = optax.sgd(0.01, momentum=0.9)
    nn.seed(0)
    trainer = pj.Trainer(case.build(), tx, amp=amp, progress=False)
    nn.seed(0)
    reference = case.build()
    graphdef, params, rest = nnx.split(reference, nnx.Param, ...)
    step = jax.jit(jax_train_step(graphdef, tx, dtype), donate_argnums=(0, 1, 2))
    train_flops = flops(step, params, tx.init(params), rest, inputs, labels)
    carry = [params, tx.init(params), rest]

    def reference_step():
        params, opt_state, rest, loss = step(*carry, inputs, labels)
        carry[:] = [params, opt_state, rest]
        return loss

    train = alternate({"Trainer": lambda: trainer.train_batch(inputs, labels), "jax.jit": reference_step},
                      warmup, repeats)
    return {"forward": fwd, "train": train, "forward_flops": forward_flops, "train_flops": train_flops}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models and sizes, few repeats (smoke test)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 8; 2 with --quick)")
    p.add_argument("--amp", choices=["bf16", "fp16"], default=None,
                   help="mixed precision for both forward and train (default: bf16 on GPUs, none on CPUs)")
    p.add_argument("--data-format", choices=["NCHW", "NHWC"], default="NHWC")
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args(argv)

    gpu = jax.devices()[0].platform == "gpu"
    amp = args.amp or ("bf16" if gpu else None)
    batch = args.batch or (2 if args.quick else 8)
    image, seq = (32, 16) if args.quick else (224, 128)
    repeats = args.repeats or (3 if args.quick else 10)
    warmup = 1 if args.quick else 2
    print(machine())
    rate = dense_rate(amp, 256 if args.quick else 2048)
    peak, kind = peak_bf16()
    print(f"precision: {amp or 'fp32'}; batch {batch}; images {image}x{image} ({args.data_format}); "
          f"sequences of {seq} tokens")
    print(f"dense matmul rate measured here: {rate / 1e9:.0f} GFLOP/s"
          + (f"; {kind} data-sheet bf16 peak {peak / 1e12:.0f} TFLOP/s" if peak else "") + "\n")

    header = (f"{'model':<13}{'phase':<9}{'impl':<10}{'ms':>9}{'throughput':>14}  {'unit':<9}{'GFLOP':>9}"
              f"{'GFLOP/s':>10}{'of dense':>10}" + (f"{'MFU':>8}" if peak else ""))
    print(header)
    print("-" * len(header))
    for case in cases(args.quick, batch, image, seq, args.data_format):
        r = measure(case, amp, warmup, repeats)
        for phase, impls, gflop in (("forward", r["forward"], r["forward_flops"] / 1e9),
                                    ("train", r["train"], r["train_flops"] / 1e9)):
            for impl, ms in impls.items():
                achieved = gflop / (ms / 1e3)
                line = (f"{case.name:<13}{phase:<9}{impl:<10}{ms:>9.1f}{case.items / (ms / 1e3):>14.1f}  "
                        f"{case.unit:<9}{gflop:>9.2f}{achieved:>10.1f}{achieved * 1e9 / rate:>10.1%}")
                print(line + (f"{achieved * 1e9 / peak:>8.1%}" if peak else ""))
        fwd, train = r["forward"], r["train"]
        print(f"{case.name}: ratio program / jax.jit = {fwd['program'] / fwd['jax.jit']:.3f} (forward), "
              f"Trainer / jax.jit = {train['Trainer'] / train['jax.jit']:.3f} (train step)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
