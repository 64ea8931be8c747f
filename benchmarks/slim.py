"""Structured pruning: accuracy after fine-tuning, latency and size, pruned vs unpruned, side by side.

1. DigitsCNN trained on scikit-learn's digits (the demo's recipe), pruned to -50 % FLOPs by
   ``l1_norm`` and by ``bn_scale`` with one ratio for all groups, by ``l1_norm`` keeping channel
   counts that are multiples of 8 (``round_to=8``), and by the simulated-annealing ``AutoPruner``
   (``l1_norm`` within groups; reward: cross-entropy on the last 20 % of the training split,
   never the test split, after 2 epochs of fine-tuning on the rest: accuracy straight after
   pruning predicted the fine-tuned accuracy badly) with the FLOPs target alone and with a
   measured 1.5x speed-up target too (``speedup=1.5, round_to=8``); and widths 32/32/120
   picked by hand where a latency sweep showed the time goes (the second convolution, at 8x8).
   Each pruned program is fine-tuned through the Trainer (as a ``ProgramLayer``) on the labels
   and the unpruned network's soft labels (distillation, temperature 4). Held-out accuracy of each, Predictor latency at batch 32 (frozen, tuned,
   calls interleaved) and saved size.
2. ResNet-18 (32x32, 10 classes, untrained: latency only) pruned to -50 % FLOPs: Predictor latency.
3. MobileNetV1 (scale 0.5; with ``--quick`` 0.25, 320 images and every other group's sensitivity) on
   the digits upscaled to 32x32, pruned to -50 % FLOPs uniformly
   (``l1_norm``, one ratio) and by sensitivity (each group's accuracy loss on the validation
   fifth, then the smallest loss bound whose ratios remove half the FLOPs), each fine-tuned:
   the unpruned network fine-tuned as long; held-out accuracy beside PaddleSlim's published
   ImageNet figures for the same recipe
   (MobileNetV1 -50 % FLOPs: 70.91 -> 69.83 uniform, 69.31 sensitive).

    python benchmarks/slim.py            # the full run (a few minutes)
    python benchmarks/slim.py --quick    # tiny settings: a smoke test
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
from timing import alternate, machine  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import analysis  # noqa: E402
from paddlejax.inference import Config, Predictor  # noqa: E402
from paddlejax.nn.program_layer import ProgramLayer  # noqa: E402
from paddlejax.slim import AutoPruner, prune  # noqa: E402


def train(model, data, epochs: int, lr: float, seed: int = 0, progress: bool = False, loss="cross_entropy"):
    steps = epochs * -(-len(data[1]) // 64)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, min(50, steps // 10)), steps)
    trainer = pj.Trainer(model, optax.adamw(schedule, weight_decay=1e-4), loss=loss,
                         metrics=["accuracy"] if loss == "cross_entropy" else [], progress=progress)
    trainer.fit(data, epochs=epochs, batch_size=64, seed=seed)
    return trainer


def accuracy(program, images, labels) -> float:
    return float((np.asarray(program(images)).argmax(1) == labels).mean())


def validation_loss(program, images, labels) -> float:
    """Mean cross-entropy: a smoother reward than accuracy on a few hundred images."""
    logits = np.asarray(program(images), np.float64)
    logits -= logits.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(len(labels)), labels]))


def fine_tune(program, data, epochs: int, lr: float, teacher=None):
    """``program`` trained on ``data``'s labels, and on ``teacher``'s soft labels if given."""
    if teacher is None:
        trainer = train(ProgramLayer(program), data, epochs, lr)
        return pj.to_static(trainer.current_model(), pj.InputSpec((None, *program.inputs[0].type.shape[1:])),
                            name=program.name)
    from paddlejax.slim.distill import DistillLayer, distill_loss, merge, soft_label_loss

    merged = merge(teacher, program)
    soft_label_loss(teacher.outputs[0], merged.outputs[0], merged, 4.0, 4.0, weight=4.0 ** 2)  # Hinton's T^2
    layer = DistillLayer(merged)
    train(layer, data, epochs, lr, loss=distill_loss(task_weight=1.0))
    return layer.student()


def latency(programs: dict, batch: int, repeats: int, tune: bool = True) -> dict:
    x = np.random.default_rng(0).random((batch, *next(iter(programs.values())).inputs[0].type.shape[1:]),
                                        np.float32)
    config = Config(max_batch_size=batch, batch_buckets=(batch,), progress=False, passes=None if tune else "")
    predictors = {k: Predictor(p, config) for k, p in programs.items()}
    return alternate({k: (lambda p=p: p(x)) for k, p in predictors.items()}, warmup=3, repeats=repeats)


def saved_bytes(program) -> int:
    folder = tempfile.mkdtemp()
    pj.save(program, os.path.join(folder, "p"))
    return os.path.getsize(os.path.join(folder, "p.safetensors"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--flops", type=float, default=0.5, help="fraction of FLOPs to remove (default 0.5)")
    p.add_argument("--search-steps", type=int, default=None, help="AutoPruner steps (default 30; 2 with --quick)")
    p.add_argument("--parts", default="digits,resnet,mobilenet", help="comma-separated parts to run (default: all)")
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    epochs, tune_epochs = (2, 1) if args.quick else (12, 12)
    steps = args.search_steps or (2 if args.quick else 30)
    repeats = 5 if args.quick else 40
    print(machine())

    train_set, test = pj.data.Digits("train"), pj.data.Digits("test")
    x, y = train_set.arrays()
    if args.quick:  # whole batches of 64 only: a ragged last batch compiles each training step a second time
        x, y = x[:len(y) // 64 * 64], y[:len(y) // 64 * 64]
    if "digits" in parts:
        digits(x, y, test, args.flops, epochs, tune_epochs, steps, repeats, args.quick)
    if "resnet" in parts:
        resnet(args.flops, repeats, args.quick)
    if "mobilenet" in parts:
        rows = 320 if args.quick else len(y)
        mobilenet_v1_recipe(x[:rows], y[:rows], test, args.flops, scale=0.25 if args.quick else 0.5,
                            epochs=1 if args.quick else 30, tune_epochs=1 if args.quick else 10,
                            ratios=(0.6,) if args.quick else (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                            group_step=2 if args.quick else 1)
    return 0


def digits(x, y, test, flops: float, epochs: int, tune_epochs: int, steps: int, repeats: int, quick: bool) -> None:
    search_epochs = 0 if quick else 2
    from paddlejax.models.digits import DigitsCNN

    split = int(0.8 * len(y))
    pj.nn.seed(0)
    model = DigitsCNN()
    train(model, (x, y), epochs, 3e-3)
    model.eval()
    base = pj.to_static(model, pj.InputSpec((None, 1, 8, 8)), name="DigitsCNN")
    sizes = {"b": 1}
    pruned = {"l1_norm": prune(base, flops=flops), "bn_scale": prune(base, flops=flops, criterion="bn_scale"),
              "l1_norm/8": prune(base, flops=flops, round_to=8),
              "by hand": prune(base, {"features.3.weight": 0.5, "features.7.weight": 0.0625})}

    def reward(prog):  # a --quick run scores the pruned program as it is
        tuned = fine_tune(prog, (x[:split], y[:split]), search_epochs, 2e-3) if search_epochs else prog
        return -validation_loss(tuned, x[split:], y[split:])

    found = {}
    target = 1.1 if quick else 1.5  # a quick run's barely trained net and few timings: a wide margin
    for name, options in (("auto-pruner", {}), (f"auto-pruner/{target}x", {"speedup": target, "round_to": 8})):
        found[name] = AutoPruner(base, reward, pruned_flops=flops, search_steps=steps, seed=0,
                                 progress=not quick, **options).search()
        pruned[name] = found[name].program
    programs = {"unpruned": base,
                **{k: fine_tune(p, (x, y), tune_epochs, 2e-3, teacher=base) for k, p in pruned.items()}}
    times = latency(programs, 32, repeats, tune=not quick)
    print(f"\nDigitsCNN, -{flops:.0%} FLOPs target; fine-tuned {tune_epochs} epochs after pruning (labels + "
          f"distillation); latency: Predictor, batch 32, frozen{'' if quick else ', tuned'}")
    print(f"{'program':<17}{'FLOPs':>11}{'params':>9}{'accuracy':>10}{'ms':>8}{'speed-up':>10}{'saved KiB':>11}"
          "  widths")
    for name, prog in programs.items():
        widths = "/".join(str(v.shape[0]) for v in prog.params.values() if np.ndim(v) == 4)
        print(f"{name:<17}{analysis.flops(prog, sizes):>11,}{sum(np.size(v) for v in prog.params.values()):>9,}"
              f"{accuracy(prog, test.images, test.labels):>10.2%}{times[name]:>8.3f}"
              f"{times['unpruned'] / times[name]:>9.2f}x{saved_bytes(prog) / 1024:>11.1f}  {widths}")
    for name, result in found.items():
        print(f"{name} ratios: {', '.join(f'{k}={v:.2f}' for k, v in result.ratios.items())} "
              f"({steps} steps, best reward {result.reward:.4f}"
              + (f", measured speed-up in the search {result.speedup:.2f}x)" if result.speedup else ")"))


def resnet(flops: float, repeats: int, quick: bool) -> None:
    from paddlejax.models import resnet18

    pj.nn.seed(0)
    net = resnet18(num_classes=10)
    net.eval()
    full = pj.to_static(net, pj.InputSpec((None, 3, 32, 32)), name="ResNet-18")
    small = prune(full, flops=flops)
    times = latency({"unpruned": full, "pruned": small}, 8 if quick else 32, max(3, repeats // 4), tune=not quick)
    sizes = {"b": 1}
    print(f"\nResNet-18 (32x32), -{flops:.0%} FLOPs by l1_norm: FLOPs {analysis.flops(full, sizes):,} -> "
          f"{analysis.flops(small, sizes):,}; latency {times['unpruned']:.2f} -> {times['pruned']:.2f} ms, "
          f"speed-up {times['unpruned'] / times['pruned']:.2f}x; saved {saved_bytes(full) / 2**20:.1f} -> "
          f"{saved_bytes(small) / 2**20:.1f} MiB")


def as_rgb32(images):
    """8x8 grey digits as 32x32 three-channel images (nearest upscaling)."""
    big = np.repeat(np.repeat(images, 4, axis=2), 4, axis=3)
    return np.repeat(big, 3, axis=1).astype(np.float32)


def mobilenet_v1_recipe(x, y, test, flops: float, scale: float, epochs: int, tune_epochs: int, ratios,
                        group_step: int = 1) -> None:
    """The recipe above; the sensitivity is measured on every ``group_step``-th group (each
    measurement compiles a program), the others are left whole."""
    from paddlejax.models import mobilenet_v1
    from paddlejax.slim.pruning import prune_by_sensitivity, sensitivity
    from paddlejax.slim.pruning.groups import ChannelGraph

    x32, test32 = as_rgb32(x), as_rgb32(test.images)
    split = int(0.8 * len(y))
    pj.nn.seed(0)
    net = mobilenet_v1(scale=scale, num_classes=10)
    train(net, (x32, y), epochs, 3e-3)
    net.eval()
    base = pj.to_static(net, pj.InputSpec((None, 3, 32, 32)), name="MobileNetV1")
    reward = lambda prog: accuracy(prog, x32[split:], y[split:])  # noqa: E731
    uniform = prune(base, flops=flops)
    groups = [g.producers[0] for g in ChannelGraph(base).groups()][::group_step]
    sens = sensitivity(base, reward, ratios, groups=groups, progress=False)
    sensitive, bound = prune_by_sensitivity(base, sens, flops)
    # all three train the same extra epochs, so that pruning is not credited with more training
    rows = {name: fine_tune(prog, (x32, y), tune_epochs, 2e-3)
            for name, prog in (("unpruned", base), ("uniform", uniform), ("sensitive", sensitive))}
    paddle = {"unpruned": "70.91", "uniform": "69.83", "sensitive": "69.31"}
    sizes = {"b": 1}
    print(f"\nMobileNetV1 (scale {scale}), digits at 32x32, trained {epochs} epochs; -{flops:.0%} FLOPs; each then "
          f"fine-tuned {tune_epochs} epochs (sensitive: loss bound {bound:.3f} over {len(sens)} groups)")
    print(f"{'program':<11}{'FLOPs':>12}{'test accuracy':>15}{'Paddle ImageNet top-1':>23}")
    for name, prog in rows.items():
        print(f"{name:<11}{analysis.flops(prog, sizes):>12,}{accuracy(prog, test32, test.labels):>14.2%}"
              f"{paddle[name]:>23}")


if __name__ == "__main__":
    raise SystemExit(main())
