"""Auto-compression of the fine-tuned MiniLM BBC News classifier, from its saved program and
unlabelled texts only: each candidate's speed-up and drift, then the chosen program's held-out
accuracy against the original's (labels are used for that report only, never by the search).

The classifier is the hub's ``minilm_bbc_news`` module (all-MiniLM-L6-v2 fine-tuned on the
BBC News train split; built from its recipe on first use, which fine-tunes for a few minutes).
Samples are the train split's articles, tokenized to 128 word pieces; accuracy is on the test
split.

    python benchmarks/auto_compress.py            # the full run (tens of minutes on 2 cores)
    python benchmarks/auto_compress.py --quick    # a tiny MiniLM-shaped classifier: a smoke test
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402

import paddlejax as pj  # noqa: E402


def tokenized(processor, texts, length: int) -> list[np.ndarray]:
    """The program's int32 inputs for ``texts``, every row padded to ``length``."""
    arrays = processor(texts)
    out = []
    for name in processor.inputs:
        a = np.asarray(arrays[name], np.int32)[:, :length]
        out.append(np.pad(a, ((0, 0), (0, length - a.shape[1]))))
    return out


def accuracy(program, inputs, labels, batch: int = 32) -> float:
    right = 0
    for i in range(0, len(labels), batch):
        logits = np.asarray(program(*[a[i:i + batch] for a in inputs]))
        right += int((logits.argmax(1) == labels[i:i + batch]).sum())
    return right / len(labels)


def tiny_classifier():
    """A 2-layer, 64-wide BERT classifier on random weights and random token ids: the smoke test's
    stand-in (its accuracy figures mean nothing)."""
    from flax import nnx

    from paddlejax.models.bert import BertConfig, BertForSequenceClassification

    config = BertConfig.from_name("minilm-l6-h384", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=100, max_position_embeddings=32)
    model = BertForSequenceClassification(config, num_classes=5, rngs=nnx.Rngs(0))
    model.eval()
    program = pj.trace(model, pj.InputSpec((None, 16), "int32", name="input_ids"))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 100, (96, 16)).astype(np.int32)
    labels = np.asarray(program(ids)).argmax(1)
    return program, [ids[:64]], ([ids[64:]], labels[64:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--target-speedup", type=float, default=1.5)
    p.add_argument("--epochs", type=int, default=3, help="distillation epochs of the training strategies (default 3)")
    p.add_argument("--prune-flops", type=float, default=None,
                   help="fraction of FLOPs pruning removes (default: 1 - 1/target speed-up)")
    p.add_argument("--length", type=int, default=128, help="word pieces per article")
    p.add_argument("--strategies", default=None, help="comma-separated (default: all; ptq,prune_distill with --quick)")
    p.add_argument("--plot", default=None, help="save the speed-up vs drift plot here")
    args = p.parse_args(argv)
    print(machine())
    if args.quick:
        program, samples, (test_inputs, test_labels) = tiny_classifier()
        # a quarter held out: 48 training rows, whole batches of 8 (a ragged one compiles the training step again)
        options = dict(epochs=1, batch_size=8, holdout=0.25, repeats=3, learning_rate=1e-3, progress=False,
                       strategies=("ptq", "prune_distill"))
    else:
        from paddlejax.data import BBCNews

        module = pj.hub.Module(name="minilm_bbc_news")
        program = module.program
        train, test = BBCNews("train"), BBCNews("test")
        samples = tokenized(module.text, [train[i][0] for i in range(len(train))], args.length)
        test_inputs = tokenized(module.text, [test[i][0] for i in range(len(test))], args.length)
        test_labels = np.asarray([test[i][1] for i in range(len(test))])
        options = dict(epochs=args.epochs, batch_size=32, repeats=10, learning_rate=1e-4, prune_flops=args.prune_flops)
    print(f"program {program.name}: {program.num_params():,} parameters; {samples[0].shape[0]} unlabelled samples "
          f"of {samples[0].shape[1:]} tokens")
    if args.strategies:
        options["strategies"] = tuple(args.strategies.split(","))
    result = pj.slim.auto_compress(program, samples, args.target_speedup, **options)
    print(result.table())
    print(f"\nheld-out accuracy (test split, {len(test_labels)} articles; labels used for this report only):")
    base = accuracy(program, test_inputs, test_labels)
    for c in result.candidates:
        acc = accuracy(c.program, test_inputs, test_labels)
        print(f"  {c.name:<20}{acc:>8.2%}  ({100 * (acc - base):+.2f} points){'  <- chosen' if c.name == result.chosen else ''}")
    plot = args.plot or str(Path(tempfile.mkdtemp()) / "auto_compress.png")
    result.plot(plot)
    print(f"plot: {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
