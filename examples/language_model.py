"""Train PaddingRNN's word-level language model on the BBC News corpus and report test perplexity.

The articles are lower-cased and split into words and punctuation (``<eos>`` ends each line),
the 10,000 most frequent training words make the vocabulary, and each split's articles are
joined into one token stream cut into PTB-style windows. Training is PaddingRNN's: SGD at
learning rate 1.0 with gradients clipped to global norm 5, the rate decayed once per epoch
from ``--decay-from`` on, and the recurrent state carried from window to window.

    python examples/language_model.py --epochs 2
    python examples/language_model.py --size medium --cell gru --max-steps 200
"""
from __future__ import annotations

import argparse
import itertools
import math
import time

import jax.numpy as jnp
import optax
from flax import nnx
from tqdm import tqdm

import paddlejax as pj
from paddlejax.data import BBCNews
from paddlejax.models.rnnlm import PRESETS, build_vocab, encode, lm_batches, padding_rnn, perplexity, tokenize, \
    train_step


def token_stream(split: str) -> list[str]:
    return [token for text, _ in BBCNews(split) for token in tokenize(text)]


def learning_rate(base: float, decay: float, decay_from: int, steps_per_epoch: int):
    """PaddingRNN's schedule: ``base * decay ** max(epoch + 1 - decay_from, 0)``, epochs from 0."""
    return lambda step: base * decay ** jnp.maximum(step // steps_per_epoch + 1 - decay_from, 0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default="small")
    parser.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--lr-decay", type=float, default=0.5)
    parser.add_argument("--decay-from", type=int, default=4, help="first epoch (counted from 1) with a decayed rate")
    parser.add_argument("--max-grad-norm", type=float, default=5.0)
    parser.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many windows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    train_tokens, test_tokens = token_stream("train"), token_stream("test")
    vocab = build_vocab(train_tokens, size=10000)
    train_ids, test_ids = encode(train_tokens, vocab), encode(test_tokens, vocab)
    print(f"BBC News: {len(train_ids):,} training and {len(test_ids):,} test tokens, {len(vocab):,} words")

    pj.nn.seed(args.seed)
    model = padding_rnn(args.size, cell=args.cell, vocab_size=len(vocab))
    num_steps = model.num_steps
    steps_per_epoch = len(list(lm_batches(train_ids, args.batch_size, num_steps)))
    if args.max_steps is not None:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    schedule = learning_rate(args.lr, args.lr_decay, args.decay_from, steps_per_epoch)
    optimizer = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.sgd(schedule)),
                              wrt=nnx.Param)

    for epoch in range(1, args.epochs + 1):
        states = model.initial_states(args.batch_size)
        total = 0.0
        windows = itertools.islice(lm_batches(train_ids, args.batch_size, num_steps), steps_per_epoch)
        bar = tqdm(windows, total=steps_per_epoch, desc=f"epoch {epoch}", unit="win")
        for step, (x, y) in enumerate(bar, 1):
            loss, states = train_step(model, optimizer, x, y, states)
            total += float(loss)
            train_ppl = math.exp(total / (step * num_steps))  # the loss sums over the window's steps
            if step % 20 == 0:
                bar.set_postfix(train_ppl=f"{train_ppl:.1f}")
        test_ppl = perplexity(model, lm_batches(test_ids, args.batch_size, num_steps))
        print(f"epoch {epoch}: train perplexity {train_ppl:.2f}, "
              f"test perplexity {test_ppl:.2f} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
