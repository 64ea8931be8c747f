"""Distributed training at model scale on 8 devices: per-device memory and collectives of each mode.

One BERT encoder (the zoo's, 4 layers, hidden 256, vocabulary 8,192, sequences of 64, global
batch 32) trained through ``pj.Trainer`` under each strategy; for each, from its first step:

- per device: the bytes of parameters, of optimizer state (Adam) and of other per-device state
  (DGC's momentum and residuals, gradient-merge buffers) it holds in device memory between steps
  (the shards on device 0), what it holds in host memory (the offloaded optimizer state), and
  the compiled step's temporary bytes (XLA's ``memory_analysis``: activations and workspace;
  tensor parallel 8 has dp=1, so each device runs the whole batch's activations), against plain
  data parallelism (everything replicated);
- the collectives of the compiled step: count and bytes of all-reduce, reduce-scatter,
  all-gather and all-to-all (bytes are what one device's instructions produce; XLA's CPU
  backend widens bf16 collectives to f32 when it compiles, so the bf16 row is also shown as
  written, before compilation);
- the loss of the first and last of a few steps (random labels): the exact modes give the same.

Modes: data parallel (dp=8), ZeRO-1/2/3, bf16 gradient communication, the optimizer state
offloaded to host memory, DGC at 99.9 % sparsity,
Local SGD (averaging every 4 steps), tensor parallel 2/4/8 ways (Megatron's plan on the zoo
model; dp = 8 / mp), and 3-D: the encoder layers pipelined over 2 stages, 2 data-parallel
replicas, tensor parallel 2 ways.

Then a mixture-of-experts network (an MoE feed-forward block of 8 experts between two linears)
data parallel with every expert on every device, and expert parallel with one expert a device
(``expert_parallel_degree=8``): the same columns. Last, the all-to-all that carries an MoE
layer's tokens to their experts inside ``shard_map`` (``MoELayer.expert_parallel``), on 8
devices seen as 2 nodes of 4: flat, and hierarchical (within each node, then across); its
instructions, their groups and bytes, and the messages each device sends to the other node.

Last, a DeepFM click-through model whose two embedding tables (hashed ids, 2**20 rows: the wide
one 64 MiB) are trained end to end with lazy Adam on generated Criteo-shaped logs, on one device
and with the tables split by rows over the 8 (``shard_embeddings``: each device holds an eighth
of them and of their moments, ids and rows travel by all-to-all): per-device bytes, collectives,
and the held-out AUC each reaches.

The activations the same BERT keeps for its backward pass (the ``remat`` pass's cost model,
per device) without recompute, with recompute, and with recompute and the segments' inputs
offloaded to host memory (``recompute_offload``), with XLA's temporary bytes beside them.

And streaming inference (``pj.StreamingPredictor``) of the same BERT with its parameters in host
memory and a device budget of half of them (its word embeddings alone are 40 %): the segments, the parameter bytes on the device
at once, and the time per call against the whole program on the device (one device; median of
interleaved calls).

On CPU the 8 devices are XLA host devices sharing this machine's cores: the memory and
collective columns are what a real 8-device run holds and sends; times are not shown.

    python benchmarks/distributed_scale.py            # about four minutes on 2 CPU cores
    python benchmarks/distributed_scale.py --quick    # a smoke test
"""
from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any computation creates the CPU backend

import argparse  # noqa: E402
import re  # noqa: E402

import jax.numpy as jnp  # noqa: E402

import numpy as np  # noqa: E402
import optax  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402
from paddlejax.distributed import MoELayer, Strategy, collective_stats  # noqa: E402
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
    "Adam state offloaded": {"offload_optimizer": True},
    "DGC 99.9 %": {"dgc": {"sparsity": 0.999}},
    "Local SGD, k=4": {"localsgd": {"k_steps": 4}},
    "tensor parallel 2 (dp=4)": {"tensor_parallel_degree": 2},
    "tensor parallel 4 (dp=2)": {"tensor_parallel_degree": 4},
    "3-D: pp 2 x dp 2 x mp 2": {"pp_degree": 2, "tensor_parallel_degree": 2,
                                "pipeline": {"stages": 2, "micro_batches": 2}},
    "tensor parallel 8": {"tensor_parallel_degree": 8},
}
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")


def device_bytes(tree, memory: str = "device") -> int:
    """Bytes of ``tree``'s arrays the first device holds in its ``memory`` kind."""
    first = jax.devices()[0]
    return sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards
               if s.device == first and (leaf.sharding.memory_kind or "device") == memory)


class MoENet(nn.Layer):
    """Linear -> MoE (residual) -> Linear over tokens; returns (logits, load-balancing loss)."""

    def __init__(self, width: int, experts: int):
        self.inp, self.out = nn.Linear(64, width), nn.Linear(width, 10)
        self.moe = MoELayer(width, 4 * width, num_experts=experts, top_k=2)

    def forward(self, x):
        h = self.inp(x)
        y, aux = self.moe(h)
        return self.out(h + y), aux


def moe_loss(outputs, labels):
    logits, aux = outputs
    return jnp.mean(nn.functional.cross_entropy(logits, labels, reduction="none")) + 0.01 * aux


def run(name: str, options: dict, make, batches: list, loss="cross_entropy") -> dict:
    nn.seed(0)
    model = make()
    strategy = Strategy(**options)
    if strategy.tensor_parallel_degree > 1:
        parallelize(model, megatron_plan(model))
    tx = optax.sgd(1e-2) if strategy.dgc else optax.adam(1e-3)  # DGC brings its own momentum
    trainer = pj.Trainer(model, tx, loss=loss, progress=False, strategy=strategy)
    losses = [trainer.train_batch([x], y) for x, y in batches]
    placed = trainer.step_builder.place((batches[0][0],), batches[0][1])
    lowered = trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed), *placed)
    compiled = lowered.compile()
    stats, written = collective_stats(compiled), collective_stats(lowered.as_text(dialect="hlo"))
    return {"name": name, "params": device_bytes(trainer.state.params), "opt": device_bytes(trainer.state.opt),
            "other": device_bytes(trainer.state.merge), "host": device_bytes(trainer.state, "pinned_host"),
            "temp": compiled.memory_analysis().temp_size_in_bytes, "stats": stats, "written": written,
            "narrow": strategy.comm_dtype is not None, "program": trainer.train_program,
            "loss": (losses[0], losses[-1])}


def report(rows: list[dict]) -> None:
    base = rows[0]
    mb = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    table = [("mode", "params MiB", "vs dp", "Adam state MiB", "vs dp", "other state MiB", "host MiB", "temp MiB",
              *KINDS, "loss first -> last")]
    for r in rows:
        coll = []
        for kind in KINDS:
            n, size = r["stats"][kind], r["stats"][f"{kind} bytes"]
            cell = f"{n} / {mb(size)}" if n else "-"
            if kind == "all-reduce" and r["narrow"]:  # sent narrow as written; the CPU backend widens it
                cell += f" ({mb(r['written']['all-reduce bytes'])} written)"
            coll.append(cell)
        ratio = lambda key: f"{r[key] / base[key]:.2f}x" if base[key] else "-"  # noqa: E731
        table.append((r["name"], mb(r["params"]), ratio("params"), mb(r["opt"]), ratio("opt"), mb(r["other"]),
                      mb(r["host"]), mb(r["temp"]),
                      *coll, f"{r['loss'][0]:.3f} -> {r['loss'][1]:.3f}"))
    print(format_table(table, right_from=1))
    print("collectives: count / MiB produced per device and step")


def all_to_all_table(experts: int, capacity: int, width: int) -> None:
    """The flat and hierarchical exchange of one MoE layer's routed tokens, from compiled HLO."""
    from jax.sharding import Mesh, PartitionSpec as P

    nn.seed(0)
    layer = MoELayer(width, 4 * width, num_experts=experts, top_k=2, capacity_factor=1.0)
    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("inter", "intra"))
    axes = ("inter", "intra")
    tokens = capacity * experts // 2  # top-2 at capacity factor 1: each expert's buffer just full
    x = jnp.zeros((8 * tokens, width), jnp.float32)
    rows = [("exchange", "all-to-all", "MiB per device", "groups", "messages to the other node")]
    for hierarchical in (False, True):
        step = jax.jit(jax.shard_map(lambda x, w: layer.expert_parallel(x, w, axes, hierarchical)[0], mesh=mesh,
                                     in_specs=(P(axes), P(axes)), out_specs=P(axes)))
        hlo = step.lower(x, layer.weights()).compile().as_text()
        stats = collective_stats(hlo)
        groups = sorted({len(g.split(",")) for g in re.findall(r"all-to-all\(.*?replica_groups=\{\{([\d,]+)\}", hlo)})
        # flat: a message to each of the other node's 4 devices; hierarchical: one, to its peer there
        rows.append(("hierarchical" if hierarchical else "flat", str(stats["all-to-all"]),
                     f"{stats['all-to-all bytes'] / 2**20:.2f}", " and ".join(map(str, groups)) or "-",
                     str(2 if hierarchical else 8)))
    print(f"\nMoE token exchange: {experts} experts, {tokens} tokens x {width} per device, 2 nodes x 4 devices "
          "(there and back)")
    print(format_table(rows, right_from=1))


def ctr_table(rows: int, samples: int) -> None:
    """DeepFM with its tables on one device and split by rows over 8, trained end to end."""
    from paddlejax.data import SyntheticCriteo
    from paddlejax.optimizer import lazy_adam
    from paddlejax.train.metrics import Auc

    train, test = SyntheticCriteo(samples).arrays(), SyntheticCriteo(samples // 4, split="test").arrays()
    table = [("tables", "table MiB", "Adam state MiB", "all-to-all", "all-reduce", "held-out AUC", "loss")]
    for name, strategy in (("one device", None), ("split over 8 devices", Strategy(shard_embeddings=True))):
        nn.seed(0)
        model = pj.models.DeepFM(sparse_feature_number=rows, sparse_feature_dim=16, layer_sizes=(128, 64))
        trainer = pj.Trainer(model, lazy_adam(2e-3), loss="bce_with_logits", metrics=[Auc(from_logits=True)],
                             progress=False, strategy=strategy)
        trainer.fit(train, epochs=2, batch_size=1024, shuffle=False)
        result = trainer.evaluate(test, batch_size=1024)
        tables = {n: v for n, v in trainer.state.params.items() if n in ("first.weight", "embedding.weight")}
        moments = [{n: state.mu[n] for n in tables} | {f"{n}.nu": state.nu[n] for n in tables}
                   for state in jax.tree.leaves(trainer.state.opt, is_leaf=lambda x: hasattr(x, "mu"))
                   if hasattr(state, "mu")]
        batch = tuple(jnp.asarray(a[:1024]) for a in train)
        placed = trainer.step_builder.place(batch[:2], batch[2])
        stats = collective_stats(trainer._train_step.lower(trainer.state, trainer._zero_sums(*placed),
                                                           *placed).compile())
        cell = lambda kind: f"{stats[kind]} / {stats[f'{kind} bytes'] / 2**20:.2f}" if stats[kind] else "-"  # noqa: E731
        table.append((name, f"{device_bytes(tables) / 2**20:.2f}", f"{device_bytes(moments) / 2**20:.2f}",
                      cell("all-to-all"), cell("all-reduce"), f"{result['auc']:.4f}", f"{result['loss']:.4f}"))
    print(f"\nDeepFM, tables of {rows:,} hashed rows (x 1 and x 16), lazy Adam, {samples:,} generated Criteo-shaped "
          f"logs x 2 epochs, batch 1024; per device")
    print(format_table(table, right_from=1))
    print("collectives: count / MiB produced per device and step")


def streaming_table(config, seq: int) -> None:
    """BERT inference streamed from host memory under half of its parameters, against resident."""
    import time

    nn.seed(0)
    model = BertForSequenceClassification(config)
    model.eval()
    program = pj.to_static(model, pj.InputSpec((None, seq), "int32"))
    total = sum(int(v.nbytes) for v in program.params.values())
    streaming = pj.StreamingPredictor(program, device_budget_mb=total / 2 / 2**20)
    resident = jax.jit(program.apply)
    ids = np.random.default_rng(0).integers(1, config.vocab_size, (8, seq)).astype(np.int32)
    np.testing.assert_allclose(streaming(ids), np.asarray(resident(program.params, ids)), rtol=1e-4, atol=1e-5)
    times = {"resident": [], "streamed": []}
    for _ in range(7):
        for name, call in (("resident", lambda: np.asarray(resident(program.params, ids))),
                           ("streamed", lambda: streaming(ids))):
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    rows = [("run", "segments", "params on device MiB", "vs resident", "ms per call (batch 8)", "vs resident"),
            ("resident", "1", f"{total / 2**20:.2f}", "1.00x", f"{ms['resident']:.1f}", "1.00x"),
            ("streamed, budget 1/2", str(streaming.num_segments), f"{streaming.peak_param_bytes / 2**20:.2f}",
             f"{streaming.peak_param_bytes / total:.2f}x", f"{ms['streamed']:.1f}",
             f"{ms['streamed'] / ms['resident']:.2f}x")]
    print(f"\nStreaming inference: the BERT above, parameters in pinned_host memory, one device")
    print(format_table(rows, right_from=1))


def activation_table(config, batches: list, plain: dict) -> None:
    """The BERT above with recompute, its kept activations on the device and offloaded to host,
    against ``plain``: its data-parallel run above (no recompute), not trained a second time."""
    from paddlejax.passes.memory import offloaded_bytes, stored_bytes

    modes = {"recompute": {"recompute": True},
             "recompute, activations offloaded": {"recompute": True, "recompute_offload": True}}
    runs = [{**plain, "name": "no recompute"}] + [run(name, options, lambda: BertForSequenceClassification(config),
                                                      batches) for name, options in modes.items()]
    sizes = {"b": len(batches[0][0]) // jax.device_count()}
    mb = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    rows = [("run", "kept on device MiB", "vs no recompute", "kept in host memory MiB", "XLA temp MiB", "loss")]
    base = stored_bytes(runs[0]["program"], sizes)
    for r in runs:
        device = stored_bytes(r["program"], sizes)
        rows.append((r["name"], mb(device), f"{device / base:.2f}x", mb(offloaded_bytes(r["program"], sizes)),
                     mb(r["temp"]), f"{r['loss'][-1]:.4f}"))
    print("\nActivations kept for the backward pass, per device (the remat cost model's bytes; XLA's temp "
          "bytes beside them)")
    print(format_table(rows, right_from=1))
    if jax.default_backend() == "cpu":
        print("on CPU host and device memory are one: XLA drops the copies, so its temp bytes cannot show the offload")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny BERT, two modes, two steps")
    args = p.parse_args(argv)
    if args.quick:
        config = BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=8,
                            intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
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
    bert = [run(name, options, lambda: BertForSequenceClassification(config), batches)
            for name, options in modes.items()]
    report(bert)
    width = 32 if args.quick else 256
    moe_batches = [(rng.normal(size=(32, 16, 64)).astype(np.float32), rng.integers(0, 10, (32, 16)).astype(np.int32))
                   for _ in range(steps)]
    print(f"\nMoE network: 8 experts of {width} -> {4 * width} -> {width}, top-2, batch 32 x 16 tokens")
    report([run(name, options, lambda: MoENet(width, 8), moe_batches, loss=moe_loss)
            for name, options in {"data parallel (dp=8)": {}, "expert parallel 8": {"expert_parallel_degree": 8}
                                  }.items()])
    activation_table(config, batches, bert[0])
    all_to_all_table(8, 8 if args.quick else 64, width)
    ctr_table(2**12 if args.quick else 2**20, 4096 if args.quick else 100_000)
    streaming_table(config, seq)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
