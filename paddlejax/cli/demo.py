"""Tour paddlejax: train a CNN on sklearn's digits, save program + checkpoint, plot, reload, export."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def add_arguments(p) -> None:
    p.add_argument("--out", default="paddlejax-demo", help="folder for the saved files (default ./paddlejax-demo)")
    p.add_argument("--epochs", type=int, default=12, help="training epochs (default 12)")
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="mixed precision (default off)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args) -> int:
    import jax
    import optax

    import paddlejax as pj
    from paddlejax.models.digits import DigitsCNN

    if args.epochs < 1:
        raise ValueError(f"--epochs must be positive, got {args.epochs}")
    out = Path(args.out)
    tic = time.perf_counter()
    train, test = pj.data.Digits("train"), pj.data.Digits("test")
    print(f"1. sklearn digits: {len(train)} train / {len(test)} test images, 8x8, 10 classes")

    pj.nn.seed(0)
    model = DigitsCNN()
    steps = args.epochs * -(-len(train) // 64)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, min(50, steps // 10), steps)
    trainer = pj.Trainer(model, optax.inject_hyperparams(optax.adamw)(learning_rate=schedule, weight_decay=1e-4),
                         metrics=["accuracy"], amp=args.amp, ema=0.99, progress=not args.no_progress,
                         log_dir=str(out / "logs"), checkpoint_dir=str(out / "checkpoints"), checkpoint_every=100,
                         keep_checkpoints=2, resume=False)
    print(f"\n2. Train DigitsCNN ({sum(np.size(v) for v in trainer.model_state.values.values()):,} values) "
          f"for {args.epochs} epochs{' with ' + args.amp + ' AMP' if args.amp else ''}")
    trainer.fit(pj.data.DataLoader(train, batch_size=64, shuffle=True, seed=0),
                eval=pj.data.DataLoader(test, batch_size=360), epochs=args.epochs)
    acc = trainer.history.last("eval", "acc")
    print(f"   held-out accuracy {acc:.2%} after {trainer.step} steps; "
          f"checkpoints at steps {trainer.checkpoints.all_steps()} in {out / 'checkpoints'}")

    curves = trainer.plot(str(out / "curves.png"))
    print(f"   training curves: {curves}; TensorBoard logs: {out / 'logs'}")

    print("\n3. The model as a static program (eval mode, EMA weights), saved and loaded back")
    prog = trainer.inference_program()
    print("   " + "\n   ".join(str(prog).splitlines()[:12]) + "\n   ...")
    pj.save(prog, out / "digits_cnn")
    loaded = pj.load(out / "digits_cnn")
    x, y = test.images, test.labels
    logits = np.asarray(loaded(x))
    loaded_acc = float(np.mean(logits.argmax(1) == y))
    same = np.allclose(logits, trainer.predict(x), atol=1e-4)
    print(f"   {out / 'digits_cnn'}.json/.safetensors: accuracy {loaded_acc:.2%}, "
          f"{'same outputs as the trainer' if same else 'OUTPUTS DIFFER from the trainer'}")

    print("\n4. Export for deployment (jax.export, symbolic batch)")
    exp = pj.export(loaded, out / "digits_cnn.stablehlo")
    again = np.asarray(exp.call(x[:5]))
    exported_ok = np.allclose(again, logits[:5], atol=1e-4)
    print(f"   {out / 'digits_cnn.stablehlo'}: runs on batch 5, max diff {np.max(np.abs(again - logits[:5])):.2e}")

    ok = same and exported_ok and loaded_acc == acc
    elapsed = time.perf_counter() - tic
    print(f"\n{'outputs match' if ok else 'OUTPUTS DIFFER'}; accuracy {acc:.2%}; {elapsed:.0f} s "
          f"(jax {jax.__version__}, {jax.devices()[0].platform})")
    return 0 if ok else 1
