"""Distributed training on 8 CPU devices: all-reduce fusion, pipeline bubble, data-parallel scaling, ZeRO.

Three tables:

- all-reduce count and bytes per data-parallel step of an MLP with many parameter tensors,
  without fusion and with buckets of several sizes: in the lowered HLO (our collectives, before
  XLA's optimisations) and in the compiled HLO (after XLA's CPU all-reduce combiner, which
  merges them into one instruction over a tuple of buffers whatever we do);
- the pipeline bubble of 4 stages for GPipe and 1F1B: theory ``(S-1)/(M+S-1)`` against the idle
  share each stage recorded while running, and a pipeline step's time against the sequential
  step on one device;
- step time of a fixed global batch on 1, 2, 4 and 8 devices, and ZeRO stages 0-3 with their
  per-device optimizer state and parameter bytes and their collectives;
- gradient merge: collectives per update with k = 1 and 4 micro-steps (below ZeRO-2 the gradient
  all-reduce runs only on the k-th), and the time per micro-step.

The 8 devices are XLA host devices (``jax_num_cpu_devices``) that share this machine's cores,
so the times measure the overhead of splitting the work, not a speed-up: 8 devices on 2 cores
cannot run faster than 1 device on 2 cores.

    python benchmarks/distributed.py            # a few minutes on 2 CPU cores
    python benchmarks/distributed.py --quick    # a smoke test
"""
from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any computation creates the CPU backend

import argparse  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax.distributed import DataParallel, Strategy, collective_stats  # noqa: E402
from paddlejax.distributed.pipeline import PipelineRunner, bubble  # noqa: E402
from paddlejax.passes.pipeline import split_stages  # noqa: E402
from timing import alternate, machine  # noqa: E402

STAGES = 4


def mlp_params(layers: int, width: int, seed: int = 0) -> dict:
    """``layers`` square tanh layers: a kernel and a bias each (2 x ``layers`` tensors)."""
    rng = np.random.default_rng(seed)
    p = {}
    for i in range(layers):
        p[f"w{i}"] = jnp.asarray(rng.normal(size=(width, width)) / np.sqrt(width), jnp.float32)
        p[f"b{i}"] = jnp.zeros(width, jnp.float32)
    return p


def mlp(p, x):
    for i in range(len(p) // 2):
        x = pj.ops.linear(x, p[f"w{i}"], p[f"b{i}"], act="tanh")
    return x


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def mlp_loss(p, batch):
    x, y = batch
    return mse(mlp(p, x), y)


def batch_of(size: int, width: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=(size, width)), jnp.float32) for _ in range(2))


def stepper(dp: DataParallel, params, tx, batch):
    """A no-argument function running one step of ``dp`` (the state lives in the closure, as
    steps donate it), for :func:`timing.alternate`."""
    state, step = dp.init(params, tx), dp.train_step(mlp_loss, tx)
    batch = dp.shard_batch(batch)
    box = [state]

    def run():
        box[0], loss = step(box[0], batch)
        return loss

    return run


def per_device_bytes(tree) -> int:
    """Bytes that device 0 holds of ``tree``'s arrays."""
    return sum(next(s.data.nbytes for s in leaf.addressable_shards if s.device == jax.devices()[0])
               for leaf in jax.tree.leaves(tree))


def fusion_table(params, batch, buckets_mb, timing) -> None:
    n = len(params)
    mb = sum(p.size for p in params.values()) * 4 / 2**20
    print(f"(a) gradient all-reduce per step: {len(params) // 2}-layer MLP, {n} parameter tensors, {mb:.2f} MB "
          f"of gradients, data parallel over 8 devices")
    print("    lowered = our program before XLA's passes; compiled = after XLA's CPU all-reduce combiner")
    print(f"  {'all-reduce':<34}{'lowered':>9}{'lowered MB':>12}{'compiled':>10}{'buffers':>9}"
          f"{'compiled MB':>13}{'step ms':>9}")
    tx = optax.sgd(0.1)
    variants = {"one per gradient (no fusion)": Strategy()}
    for size in buckets_mb:
        variants[f"fused, buckets of {size:g} MB"] = Strategy(fuse_all_reduce=True, fuse_grad_size_in_MB=size)
    variants[f"fused {buckets_mb[0]:g} MB, hierarchical 2x4"] = Strategy(
        fuse_all_reduce=True, fuse_grad_size_in_MB=buckets_mb[0], hierarchical_allreduce=True,
        hierarchical_allreduce_inter_nranks=2)
    rows, runs = {}, {}
    for name, strategy in variants.items():
        dp = DataParallel(strategy)
        lowered = dp.train_step(mlp_loss, tx).lower(dp.init(params, tx), batch)
        rows[name] = (collective_stats(lowered.as_text(dialect="hlo")), collective_stats(lowered.compile()))
        runs[name] = stepper(dp, params, tx, batch)
    ms = alternate(runs, *timing)
    for name, (low, comp) in rows.items():
        print(f"  {name:<34}{low['all-reduce']:>9}{low['all-reduce bytes'] / 2**20:>12.3f}{comp['all-reduce']:>10}"
              f"{comp['all-reduce buffers']:>9}{comp['all-reduce bytes'] / 2**20:>13.3f}{ms[name]:>9.2f}")
    print("    (each count includes the all-reduce of the loss; bytes are the reduced arrays' sizes)\n")


def pipeline_table(layers: int, width: int, batch_size: int, micro: tuple, timing) -> None:
    params = mlp_params(layers, width, seed=2)
    x, y = batch_of(batch_size, width, seed=3)
    split = split_stages(pj.trace(mlp, pj.InputSpec((None, width)), params=params), STAGES)
    sequential = jax.jit(jax.value_and_grad(lambda p, x, y: mse(mlp(p, x), y)))
    print(f"(b) pipeline: {layers}-layer MLP (width {width}, batch {batch_size}) in {STAGES} stages on 4 devices; "
          "sequential = the same loss and gradients jitted on one device")
    print("    measured idle share = ticks each stage recorded as idle while running / all ticks")
    print(f"  {'schedule':<8}{'M':>4}{'ticks':>7}{'theory':>8}  {'measured idle share per stage':<32}"
          f"{'pipeline ms':>12}{'sequential ms':>15}{'ratio':>7}")
    for schedule in ("gpipe", "1f1b"):
        for m in micro:
            runner = PipelineRunner(split, mse, micro_batches=m, schedule=schedule)
            run = jax.jit(runner.run)
            _, _, work = run(params, x, y)
            b = bubble(runner.schedule, work)
            times = alternate({"pipeline": lambda: run(params, x, y), "sequential": lambda: sequential(params, x, y)},
                              *timing)
            shares = " ".join(f"{s:.3f}" for s in b.idle_share)
            print(f"  {schedule:<8}{m:>4}{runner.schedule.ticks:>7}{b.theory:>8.3f}  {shares:<32}"
                  f"{times['pipeline']:>12.2f}{times['sequential']:>15.2f}{times['pipeline'] / times['sequential']:>7.2f}")
    print("    (the 4 stage devices share this machine's cores: a pipeline cannot beat one device here; the\n"
          "     ratio shows what the schedule's ticks, switches and permutes cost)\n")


def scaling_table(params, batch, timing) -> None:
    tx = optax.adam(1e-3)
    print(f"(c) data parallel step (adam), global batch {batch[0].shape[0]} split over n devices")
    runs = {n: stepper(DataParallel(Strategy(), mesh=Mesh(np.array(jax.devices()[:n]), ("dp",))), params, tx, batch)
            for n in (1, 2, 4, 8)}
    ms = alternate(runs, *timing)
    print(f"  {'devices':>8}{'step ms':>10}{'vs 1 device':>13}")
    for n, t in ms.items():
        print(f"  {n:>8}{t:>10.2f}{t / ms[1]:>12.2f}x")
    print(f"    (not a scaling figure: the devices are {jax.device_count()} XLA host devices sharing the machine's "
          "cores)\n")
    print("    ZeRO stages on 8 devices: per-device bytes of device 0; collectives in the compiled step "
          "(all-reduce / reduce-scatter / all-gather)")
    runs, sizes, counts = {}, {}, {}
    for stage in range(4):
        dp = DataParallel(Strategy(sharding={"stage": stage}))
        state = dp.init(params, tx)
        sizes[stage] = (per_device_bytes(state["opt"]), per_device_bytes(state["params"]))
        stats = collective_stats(dp.train_step(mlp_loss, tx).lower(state, batch))
        counts[stage] = "/".join(str(stats[op]) for op in ("all-reduce", "reduce-scatter", "all-gather"))
        runs[stage] = stepper(dp, params, tx, batch)
    ms = alternate(runs, *timing)
    print(f"  {'stage':>8}{'step ms':>10}{'opt state KB':>14}{'params KB':>11}{'collectives':>13}")
    for stage, t in ms.items():
        opt, par = sizes[stage]
        print(f"  {stage:>8}{t:>10.2f}{opt / 1024:>14.1f}{par / 1024:>11.1f}{counts[stage]:>13}")
    print("    (ZeRO-2/3 reduce-scatter one bucket per parameter unless fuse_all_reduce packs them)\n")


def merge_table(params, batch, timing, k: int = 4) -> None:
    tx = optax.adam(1e-3)
    print(f"(d) gradient merge on 8 devices: {k} micro-batches of {batch[0].shape[0]} per update; bytes all-reduced "
          "or reduce-scattered per device, from the compiled HLO")
    print(f"  {'strategy':<22}{'MB every micro-step':>21}{'MB on the k-th only':>21}{'MB per update':>15}"
          f"{'ms / micro-step':>17}")
    runs, rows = {}, {}
    for stage in (0, 2):
        for steps in (1, k):
            name = f"ZeRO-{stage}, k_steps={steps}"
            dp = DataParallel(Strategy(sharding={"stage": stage}, gradient_merge={"k_steps": steps}))
            s = collective_stats(dp.train_step(mlp_loss, tx).lower(dp.init(params, tx), batch))
            ops = ("all-reduce", "reduce-scatter")
            conditional = sum(s[f"{op} conditional bytes"] for op in ops) / 2**20
            every = sum(s[f"{op} bytes"] for op in ops) / 2**20 - conditional
            rows[name] = (every, conditional, every * k + conditional * (k // steps))  # over k micro-steps
            runs[name] = stepper(dp, params, tx, batch)
    ms = alternate(runs, *timing)
    for name, (every, conditional, per_update) in rows.items():
        print(f"  {name:<22}{every:>21.3f}{conditional:>21.3f}{per_update:>15.3f}{ms[name]:>17.2f}")
    print("    (ZeRO-2 reduce-scatters every micro-step so that its merge buffer stays a slice)\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models, few repeats")
    args = p.parse_args(argv)
    layers, width, batch_size = (8, 16, 32) if args.quick else (8, 256, 256)
    timing = (1, 3) if args.quick else (3, 30)
    print(machine())
    print(f"timings: median ms of {timing[1]} interleaved calls after {timing[0]} warm-up\n")
    params, batch = mlp_params(layers, width), batch_of(batch_size, width)
    fusion_table(params, batch, (32.0, 1.0, 0.01) if not args.quick else (32.0, 0.001), timing)
    pipeline_table(layers, width, batch_size, (4,) if args.quick else (4, 8, 16), timing)
    scaling_table(params, batch, timing)
    merge_table(params, batch, timing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
