"""Distributed training at model scale on 8 devices: per-device memory and collectives of each mode.

One BERT encoder (the zoo's, 4 layers, hidden 256, vocabulary 8,192, sequences of 64, global
batch 32) trained through ``pj.Trainer`` under each strategy; for each, from its first step:

- per device: the bytes of parameters, of optimizer state (Adam) and of other per-device state
  (DGC's momentum and residuals, gradient-merge buffers) it holds (the shards on device 0), and
  the compiled step's temporary bytes (XLA's ``memory_analysis``: activations and workspace;
  tensor parallel 8 has dp=1, so each device runs the whole batch's activations), against plain
  data parallelism (everything replicated);
- the collectives of the compiled step: count and bytes of all-reduce, reduce-scatter,
  all-gather and all-to-all (bytes are what one device's instructions produce; XLA's CPU
  backend widens bf16 collectives to f32 when it compiles, so the bf16 row is also shown as
  written, before compilation);
- the loss of the first and last of a few steps (random labels): the exact modes give the same.

Modes: data parallel (dp=8), ZeRO-1/2/3, bf16 gradient communication, DGC at 99.9 % sparsity,
Local SGD (averaging every 4 steps), tensor parallel 2/4/8 ways (Megatron's plan on the zoo
model; dp = 8 / mp).

On CPU the 8 devices are XLA host devices sharing this machine's cores: the memory and
collective columns are what a real 8-device run holds and sends; times are not shown.

    python benchmarks/distributed_scale.py            # about two minutes on 2 CPU cores
    python benchmarks/distributed_scale.py --quick    # a smoke test
"""
from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any computation creates the CPU backend

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import optax  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402
from paddlejax.distributed import Strategy, collective_stats  # noqa: E402
from paddlejax.distributed.tensor_parallel import megatron_plan, parallelize  # noqa: E402
from paddlejax.models.bert import BertConfig, BertForSequenceClassification  # noqa: E402
from paddlejax.table import format_table  # noqa: E402
from timing import machine  # noqa: E402

MODES = {
    "data parallel (dp=8)": {},
    "ZeRO-1": {"sharding": {"stage": 1}},
    "ZeRO-2": {"sharding": {"stage": 2}},
    "ZeRO-3": {"sharding": {"stage": 3}},
    "bf16 gradients": {"comm_dtype": "bfloat16"},
    "DGC 99.9 %": {"dgc": {"sparsity": 0.999}},
    "Local SGD, k=4": {"localsgd": {"k_steps": 4}},
    "tensor parallel 2 (dp=4)": {"tensor_parallel_degree": 2},
    "tensor parallel 4 (dp=2)": {"tensor_parallel_degree": 4},
    "tensor parallel 8": {"tensor_parallel_degree": 8},
}
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")


def device_bytes(tree) -> int:
    """Bytes of ``tree``'s arrays held on the first device."""
    first = jax.devices()[0]
    return sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards
               if s.device == first)


def run(name: str, options: dict, config: BertConfig, batches: list) -> dict:
    nn.seed(0)
    model = BertForSequenceClassification(config)
    strategy = Strategy(**options)
    if strategy.tensor_parallel_degree > 1:
        parallelize(model, megatron_plan(model))
    tx = optax.sgd(1e-2) if strategy.dgc else optax.adam(1e-3)  # DGC brings its own momentum
    trainer = pj.Trainer(model, tx, loss="cross_entropy", progress=False, strategy=strategy)
    losses = [trainer.train_batch([x], y) for x, y in batches]
    placed = trainer.step_builder.place((batches[0][0],), batches[0][1])
    lowered = trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed), *placed)
    compiled = lowered.compile()
    stats, written = collective_stats(compiled), collective_stats(lowered.as_text(dialect="hlo"))
    return {"name": name, "params": device_bytes(trainer.state.params), "opt": device_bytes(trainer.state.opt),
            "other": device_bytes(trainer.state.merge),
            "temp": compiled.memory_analysis().temp_size_in_bytes, "stats": stats, "written": written,
            "loss": (losses[0], losses[-1])}


def report(rows: list[dict]) -> None:
    base = rows[0]
    mb = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    table = [("mode", "params MiB", "vs dp", "Adam state MiB", "vs dp", "other state MiB", "temp MiB", *KINDS,
              "loss first -> last")]
    for r in rows:
        coll = []
        for kind in KINDS:
            n, size = r["stats"][kind], r["stats"][f"{kind} bytes"]
            cell = f"{n} / {mb(size)}" if n else "-"
            if kind == "all-reduce" and 0 < r["written"]["all-reduce bytes"] < size:
                cell += f" ({mb(r['written']['all-reduce bytes'])} written)"
            coll.append(cell)
        ratio = lambda key: f"{r[key] / base[key]:.2f}x" if base[key] else "-"  # noqa: E731
        table.append((r["name"], mb(r["params"]), ratio("params"), mb(r["opt"]), ratio("opt"), mb(r["other"]),
                      mb(r["temp"]),
                      *coll, f"{r['loss'][0]:.3f} -> {r['loss'][1]:.3f}"))
    print(format_table(table, right_from=1))
    print("collectives: count / MiB produced per device and step")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny BERT, two modes, two steps")
    args = p.parse_args(argv)
    if args.quick:
        config = BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=8,
                            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        modes, seq, steps = dict(list(MODES.items())[:1] + list(MODES.items())[-1:]), 8, 2
    else:
        config = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                            intermediate_size=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        modes, seq, steps = MODES, 64, 4
    rng = np.random.default_rng(0)
    batches = [(rng.integers(1, config.vocab_size, (32, seq)).astype(np.int32),
                rng.integers(0, 2, 32).astype(np.int32)) for _ in range(steps)]
    print(machine())
    print(f"BERT: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocabulary {config.vocab_size}, "
          f"batch 32 x {seq}; 8 devices")
    report([run(name, options, config, batches) for name, options in modes.items()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
