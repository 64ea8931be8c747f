"""Architecture search (SANAS) on scikit-learn's digits with the MobileNetV2 space, under a FLOPs
limit and under a latency limit, and how well the latency table predicts whole networks.

Each candidate trains a few epochs on 80 % of the training split and is rewarded with its accuracy
on the other 20 % (never the test split). The FLOPs limit is half the initial network's; the
latency limit is 60 % of the initial network's predicted latency at batch 32 on this machine. The
best network of each search is then trained longer on the whole training split and scored on the
test split. Reward plots are saved in ``--out``.

    python benchmarks/nas.py            # the full run (16 steps per search, a few minutes)
    python benchmarks/nas.py --quick    # tiny settings: a smoke test
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax.slim.nas import (SANAS, LatencyTable, measure_latency, network_flops, search_space,  # noqa: E402
                                train_and_score)

SPACE = [("MobileNetV2Space", {"input_size": 8, "output_size": 1, "block_num": 3, "input_channels": 1,
                               "class_dim": 10})]


def run_search(name: str, limits: dict, table: LatencyTable, args, train) -> SANAS:
    nas = SANAS(SPACE, init_temperature=args.temperature, search_steps=args.steps, seed=0, latency_table=table,
                **limits)
    (limit_name, limit), = limits.items()
    print(f"\nSANAS under {limit_name} <= {limit:,.6g} ({args.steps} steps, {args.epochs} epochs each, "
          f"init_temperature {args.temperature}, reduce_rate 0.85)")
    print(f"{'step':>4}  {'tokens':<30}{'FLOPs':>9}{'pred. ms':>10}{'reward':>9}  {'accepted':<9}{'best':>7}")
    while not nas.done:
        archs = nas.next_archs()
        tokens = nas.current_info()["current_tokens"]
        flops, ms = nas.measures()["flops"], table.predict(nas.space.blocks(tokens))
        accepted = nas.reward(train_and_score(archs[0], train, args.epochs))
        h = nas.history[-1]
        print(f"{h['step']:>4}  {str(tokens):<30}{flops:>9,}{ms:>10.3f}{h['reward']:>9.4f}  "
              f"{'yes' if accepted else 'no':<9}{h['best_reward']:>7.4f}")
    plot = nas.plot_rewards(os.path.join(args.out, f"nas_{name}_rewards.png"), title=f"SANAS, {limit_name} limit")
    print(f"reward plot: {plot}")
    return nas


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=None, help="search steps per search (default 16; 2 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs per candidate (default 3; 1 with --quick)")
    p.add_argument("--temperature", type=float, default=0.1,
                   help="initial temperature (default 0.1: rewards are accuracies, so Paddle's 100 accepts anything)")
    p.add_argument("--latency-cache", default=None, help="latency table file (default: the user cache)")
    p.add_argument("--out", default=None, help="folder for the reward plots (default: a new temporary folder)")
    args = p.parse_args(argv)
    args.steps = args.steps or (2 if args.quick else 16)
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.out = args.out or tempfile.mkdtemp(prefix="nas-")
    os.makedirs(args.out, exist_ok=True)
    repeats = 5 if args.quick else 30
    print(machine())

    train, test = pj.data.Digits("train"), pj.data.Digits("test")
    space = search_space(SPACE)
    table = LatencyTable(args.latency_cache, batch_size=32, repeats=repeats)
    init = space.init_tokens()
    init_ms = table.predict(space.blocks(init))
    init_flops = network_flops(space, init)
    print(f"latency table: {table.path} (batch 32; {table.measured} blocks measured now, "
          f"{len(table.entries) - table.measured} reused)")
    print(f"initial network {init}: {init_flops:,} FLOPs, predicted {init_ms:.3f} ms")

    searches = {"flops": run_search("flops", {"flops": init_flops // 2}, table, args, train),
                "latency": run_search("latency", {"latency": round(0.6 * init_ms, 3)}, table, args, train)}

    print("\nbest networks, trained on the whole training split "
          f"({3 * args.epochs} epochs), scored on the test split")
    print(f"{'search':<9}{'tokens':<30}{'FLOPs':>9}{'limit':>10}{'pred. ms':>10}{'limit':>8}{'test acc':>10}")
    images, labels = train.arrays()
    if args.quick:  # whole batches of 64 only: a ragged last batch compiles the training step a second time
        images, labels = images[:len(labels) // 64 * 64], labels[:len(labels) // 64 * 64]
    for name, nas in searches.items():
        best = nas.current_info()["best_tokens"]
        limit = {c.name: c.limit for c in nas.constraints}
        pj.nn.seed(0)
        model = nas.tokens2arch(best)[0]
        pj.Trainer(model, optax.adam(1e-2), progress=False).fit((images, labels), epochs=3 * args.epochs, batch_size=64)
        model.eval()
        acc = float((np.asarray(model(test.images)).argmax(1) == test.labels).mean())
        print(f"{name:<9}{str(best):<30}{network_flops(space, best):>9,}{limit.get('flops', float('nan')):>10,.0f}"
              f"{table.predict(space.blocks(best)):>10.3f}{limit.get('latency_ms', float('nan')):>8.3f}{acc:>10.2%}")

    print("\nlatency table vs the whole network, batch 32 (median of "
          f"{repeats} calls each; weights frozen, as the Predictor runs them)")
    print(f"{'tokens':<30}{'predicted ms':>13}{'measured ms':>13}{'error':>8}")
    candidates = [init] + [nas.current_info()["best_tokens"] for nas in searches.values()]
    candidates += [h["tokens"] for nas in searches.values() for h in nas.history]
    errors = []
    for tokens in list(dict.fromkeys(map(tuple, candidates)))[:3 if args.quick else 6]:
        predicted = table.predict(space.blocks(list(tokens)))
        model = space.token2arch(list(tokens))[0]
        measured = measure_latency(model, space.spaces[0].in_shape, 32, repeats)
        errors.append(predicted / measured - 1)
        print(f"{str(list(tokens)):<30}{predicted:>13.3f}{measured:>13.3f}{errors[-1]:>+8.1%}")
    print(f"mean absolute error of the prediction: {np.mean(np.abs(errors)):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
