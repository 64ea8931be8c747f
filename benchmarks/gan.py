"""GANs on scikit-learn's digits, trained on this machine's CPU: a class-conditional DCGAN whose
samples the zoo's digits CNN must recognise as the class asked for (the bar: 80 %), Pix2Pix
drawing digits from their edge maps (held-out L1 against baselines that need no training) and
CycleGAN learning the same translation from unpaired halves of the two domains.

Data: the 1,437 training digits enlarged to 16x16 (bilinear) in [-1, 1]
(``pj.data.DigitImages``), edge maps by a morphological gradient (``pj.data.DigitEdges``).
The classifier is ``DigitsCNN``, which takes 8x8 images: it is trained on the real 16x16 training
digits shrunk back to 8x8 (2x2 means), and the samples go through the same shrinking.

    python benchmarks/gan.py --out runs/gan     # the full run (a few minutes on 2 cores)
    python benchmarks/gan.py --quick --out /tmp/gan   # tiny models, an epoch or two: a smoke test

It prints the recognition rate of the generated digits per requested class and overall, the
Pix2Pix and CycleGAN held-out L1 next to the baselines', and writes the loss curves and sample
grids as PNGs into ``--out``.

Measured (2-core AMD EPYC, jax 0.10.2, the defaults; about 4 minutes in all): the classifier
98.89 % on the real held-out digits; DCGAN samples recognised as the requested class 97.5 % overall
(per class 92-100 %, lowest for 1 and 8) after 40 epochs (880 steps); held-out edges -> digit
mean absolute error: the edge map itself 0.4255, blurred 0.3981, the mean training digit 0.3063,
CycleGAN (unpaired, 10 epochs) 0.2555, Pix2Pix (10 epochs) 0.0656.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402

import paddlejax as pj  # noqa: E402
from paddlejax import nn  # noqa: E402
from paddlejax.data import DigitEdges, DigitImages  # noqa: E402
from paddlejax.models import (CycleGANGenerator, CycleGANObjective, DCGANDiscriminator, DCGANGenerator,  # noqa: E402
                              DCGANObjective, DigitsCNN, PatchGANDiscriminator, Pix2PixGenerator, Pix2PixObjective)
from paddlejax.train.gan import GANTrainer, sample_grid  # noqa: E402

BAR = 0.80


def to_classifier(images: np.ndarray) -> np.ndarray:
    """[-1, 1] images of any multiple of 8 a side as DigitsCNN's input: 8x8 block means in [0, 1]."""
    n, c, h, w = images.shape
    k = h // 8
    return ((images.reshape(n, c, 8, k, 8, k).mean((3, 5)) + 1) / 2).astype(np.float32)


def train_classifier(images, labels, test_images, test_labels, epochs: int, progress, eval_batch: int = 256):
    nn.seed(0)
    model = DigitsCNN()
    steps = epochs * -(-len(labels) // 64)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, min(50, steps // 10)), steps)
    trainer = pj.Trainer(model, optax.adamw(schedule, weight_decay=1e-4), metrics=["accuracy"], ema=0.99,
                         progress=progress)
    trainer.fit((to_classifier(images), labels), epochs=epochs, batch_size=64)
    accuracy = trainer.evaluate((to_classifier(test_images), test_labels), batch_size=eval_batch)["acc"]
    return trainer, accuracy


def l1(a, b) -> float:
    return float(np.mean(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def blurred(images: np.ndarray) -> np.ndarray:
    """A 3x3 box blur (edges replicated): the edge map's outline spread over the stroke."""
    h, w = images.shape[2:]
    padded = np.pad(images, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    return np.mean([padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=0)


def in_batches(fn, x, size=256):
    return np.concatenate([np.asarray(fn(x[i:i + size])) for i in range(0, len(x), size)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models, one or two epochs: a smoke test")
    p.add_argument("--out", default="gan_out", help="folder for the PNGs")
    p.add_argument("--size", type=int, default=16, help="image side: 16 or 32")
    p.add_argument("--dcgan-epochs", type=int, default=40)
    p.add_argument("--pix2pix-epochs", type=int, default=10)
    p.add_argument("--cyclegan-epochs", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100, help="DCGAN samples per class to classify")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.dcgan_epochs, args.pix2pix_epochs, args.cyclegan_epochs, args.per_class = 2, 1, 1, 10
    width = 8 if args.quick else 64
    progress = False if args.quick else "epoch"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(machine())

    train, test = DigitImages("train", args.size), DigitImages("test", args.size)
    print(f"digits: {len(train)} training and {len(test)} held-out images, {args.size}x{args.size}, in [-1, 1]")

    # -- the judge ---------------------------------------------------------------------------------
    images, labels = train.arrays()
    # with --quick, whole batches of 64 and the held-out digits in one batch: a ragged batch compiles a step again
    if args.quick:
        images, labels = images[:len(labels) // 64 * 64], labels[:len(labels) // 64 * 64]
    classifier, accuracy = train_classifier(images, labels, *test.arrays(), 2 if args.quick else 12, progress,
                                            eval_batch=len(test) if args.quick else 256)
    print(f"DigitsCNN (on 8x8 block means): held-out accuracy on real digits {accuracy:.2%}")

    # -- conditional DCGAN ---------------------------------------------------------------------------
    nn.seed(args.seed)
    generator = DCGANGenerator(latent_dim=64, num_classes=10, image_size=args.size, base_channels=width)
    discriminator = DCGANDiscriminator(num_classes=10, image_size=args.size, base_channels=width, spectral_norm=True,
                                       condition="projection")
    dcgan = GANTrainer(generator, discriminator, DCGANObjective("hinge"), optax.adam(2e-4, b1=0.5, b2=0.999),
                       optax.adam(2e-4, b1=0.5, b2=0.999), ema=0.999, seed=args.seed, progress=progress)
    print(f"\nconditional DCGAN (hinge loss, spectral norm, projection discriminator, generator EMA 0.999): "
          f"{args.dcgan_epochs} epoch(s) of {len(train) // 64} steps, batch 64")
    dcgan.fit(train.arrays(), epochs=args.dcgan_epochs, batch_size=64, seed=args.seed)
    sampler = dcgan.generator_model()
    requested = np.repeat(np.arange(10, dtype=np.int32), args.per_class)
    samples = np.asarray(jax.jit(sampler.sample)(jax.random.key(args.seed + 1), requested))
    predicted = classifier.predict(to_classifier(samples)).argmax(1)
    hits = predicted == requested
    print(f"\nDCGAN samples recognised as the class asked for ({args.per_class} per class):")
    print(f"{'class':>7}{'recognised':>12}")
    for c in range(10):
        print(f"{c:>7}{hits[requested == c].mean():>12.1%}")
    overall = hits.mean()
    print(f"{'all':>7}{overall:>12.1%}   bar {BAR:.0%}: {'PASS' if overall >= BAR else 'FAIL'}")
    shown = np.concatenate([samples[requested == c][:10] for c in range(10)])
    sample_grid(shown, str(out / "dcgan_samples.png"), nrow=10, row_labels=[str(c) for c in range(10)],
                title="DCGAN samples, one row per requested class")
    dcgan.plot(str(out / "dcgan_losses.png"))

    # -- Pix2Pix: edges -> digit, paired -------------------------------------------------------------
    pairs, held_out = DigitEdges("train", args.size), DigitEdges("test", args.size)
    downs = int(np.log2(args.size))
    nn.seed(args.seed)
    unet = Pix2PixGenerator(1, 1, num_downs=downs, base_channels=width // 2)
    patch = PatchGANDiscriminator(2, base_channels=width // 2, n_layers=2)
    pix2pix = GANTrainer(unet, patch, Pix2PixObjective(l1_weight=100.0), seed=args.seed, progress=progress)
    print(f"\nPix2Pix (U-Net, {downs} levels; PatchGAN, 2 layers; L1 weight 100): {args.pix2pix_epochs} epoch(s), "
          f"batch 32")
    pix2pix.fit(pairs.arrays(), epochs=args.pix2pix_epochs, batch_size=32, seed=args.seed)
    edges, digits = held_out.arrays()
    batch = len(edges) if args.quick else 256
    drawn = in_batches(jax.jit(pix2pix.generator_model()), edges, batch)

    # -- CycleGAN: the same domains, unpaired ----------------------------------------------------------
    unpaired = DigitEdges("train", args.size, paired=False, seed=args.seed)
    nn.seed(args.seed)
    generators = nn.LayerList([CycleGANGenerator(1, 1, base_channels=width // 4, n_blocks=3) for _ in range(2)])
    judges = nn.LayerList([PatchGANDiscriminator(1, base_channels=width // 4, n_layers=2, norm="instance")
                           for _ in range(2)])
    cyclegan = GANTrainer(generators, judges, CycleGANObjective(), seed=args.seed, progress=progress)
    print(f"\nCycleGAN (ResNet generators, 3 blocks; PatchGANs; cycle 10, identity 0.5): {len(unpaired)} edge maps "
          f"and {len(unpaired)} other digits, unpaired; {args.cyclegan_epochs} epoch(s), batch 16")
    cyclegan.fit(unpaired.arrays(), epochs=args.cyclegan_epochs, batch_size=16, seed=args.seed)
    translated = in_batches(jax.jit(cyclegan.generator_model()[0]), edges, batch)

    mean_digit = np.broadcast_to(pairs.digits.mean(0), digits.shape)
    print(f"\nedges -> digit on the {len(digits)} held-out pairs: mean absolute error (images in [-1, 1])")
    for name, guess in (("the edge map itself", edges), ("the edge map blurred 3x3", blurred(edges)),
                        ("the mean training digit", mean_digit), ("CycleGAN (unpaired)", translated),
                        ("Pix2Pix", drawn)):
        print(f"  {name:<26}{l1(guess, digits):>8.4f}")
    rows = np.concatenate([edges[:10], drawn[:10], translated[:10], digits[:10]])
    sample_grid(rows, str(out / "translation_samples.png"), nrow=10,
                row_labels=["edges", "Pix2Pix", "CycleGAN", "target"], title="held-out edge maps -> digits")
    pix2pix.plot(str(out / "pix2pix_losses.png"))
    cyclegan.plot(str(out / "cyclegan_losses.png"))
    print(f"\nwrote {', '.join(sorted(p.name for p in out.glob('*.png')))} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
