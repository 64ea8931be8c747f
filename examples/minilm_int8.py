"""Int8 all-MiniLM-L6-v2 by post-training quantization, measured on BBC News.

Sentence embeddings: the sentence-embedding model is captured as a program with a symbolic
batch and a symbolic sequence length (input ids only: the model derives the attention mask
from the padding and the token types are all zero for single texts), quantized by
``pj.slim.quant_post`` and compared with the float program, sentence by sentence, by cosine
similarity of the embeddings.

- Sentences: every line of every article of ``BBCNews("all")``, cut after each ". ", stripped;
  empty pieces dropped and repeated sentences kept once, in corpus order (:func:`corpus_sentences`).
- Calibration: ``--calib`` sentences drawn (seeded) from the sentences of the *train* split's
  articles; they are left out of the sentences evaluated.
- Quantized: the linear layers (``--ops``) but the feed-forward down-projections (``--skip``),
  weights per output channel, activations per tensor (``--asymmetric``: with zero points).
  With asymmetric activations (``--algo min_max``) the down-projections can be int8 too.
- Batches hold sentences of similar length, padded to a multiple of 16 word pieces (at most
  ``--max-length``), so the programs compile for a few shapes only.

With ``--classifier PATH`` (a program saved by ``bbc_finetune.py``) it quantizes the fine-tuned
news classifier instead, calibrated on the first ``--calib`` train articles, and prints its
float and int8 accuracy on the held-out articles of ``BBCNews("test")``.

    python examples/minilm_int8.py                                  # all sentences of the corpus
    python examples/minilm_int8.py --limit 512 --algo abs_max       # a quick check
    python examples/minilm_int8.py --classifier bbc-minilm/bbc_minilm
"""
from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator, Sequence

import numpy as np

import paddlejax as pj
from paddlejax.data import BBCNews
from paddlejax.ir.core import Program
from paddlejax.models.minilm import MAX_SEQ_LENGTH, all_minilm_l6_v2, minilm_path
from paddlejax.models.tokenizer import BertTokenizer

LENGTH_MULTIPLE = 16  # batches are padded to a multiple of this many word pieces
# The feed-forward down-projections stay in float: their inputs, GELU outputs, have a few huge
# values, and a per-tensor int8 scale that covers them leaves the rest too few levels.
SKIP = r"\.linear2\."


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``: each line cut after every ". ", stripped, empty pieces dropped.

    >>> split_sentences("Title\\n\\nOne. Two.  Three?\\n")
    ['Title', 'One.', 'Two.', 'Three?']
    """
    return [s.strip() for line in text.splitlines() for s in re.split(r"(?<=\.) ", line) if s.strip()]


def corpus_sentences(news: BBCNews) -> list[str]:
    """The sentences of all articles of ``news``, each distinct sentence once, in corpus order."""
    return list(dict.fromkeys(s for text in news.texts for s in split_sentences(text)))


def sentence_program(encoder) -> Program:
    """The sentence-embedding model of ``encoder`` (a SentenceEncoder) as a program over int32
    input ids ``[batch, seq]`` padded with the pad id, both sizes symbolic."""
    program = pj.to_static(encoder.model, pj.InputSpec((None, "seq"), "int32"))
    return pj.passes.run(program, "dce")  # the unused [CLS] pooler of the BERT body


def sentence_batches(tokenizer: BertTokenizer, sentences: Sequence[str], batch_size: int,
                     max_length: int = MAX_SEQ_LENGTH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(rows, input_ids)`` batches covering ``sentences``: rows of similar token length,
    their ids cut to ``max_length`` and padded to the batch's longest, rounded up to a
    multiple of 16."""
    ids = tokenizer(list(sentences), max_length=max_length, truncation=True)["input_ids"]
    lengths = (ids != tokenizer.pad_token_id).sum(1)
    order = np.argsort(-lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = min(ids.shape[1], -(-int(lengths[rows].max()) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
        yield rows, ids[rows, :width]


def embed(program: Program, tokenizer: BertTokenizer, sentences: Sequence[str], *, batch_size: int = 64,
          max_length: int = MAX_SEQ_LENGTH, progress: bool = False, desc: str = "embedding") -> np.ndarray:
    """The embeddings ``[len(sentences), dim]`` that ``program`` (:func:`sentence_program`, or
    its int8 version) gives, in order."""
    out = None
    batches = sentence_batches(tokenizer, sentences, batch_size, max_length)
    for rows, ids in _bar(batches, progress, desc, -(-len(sentences) // batch_size)):
        vectors = np.asarray(program(ids))
        if out is None:
            out = np.zeros((len(sentences), vectors.shape[1]), np.float32)
        out[rows] = vectors
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``[n, dim]`` arrays.

    >>> cosines(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 0.0], [-1.0, -1.0]])).round(4).tolist()
    [1.0, -1.0]
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def quantize_sentence_program(program: Program, tokenizer: BertTokenizer, calib_sentences: Sequence[str], *,
                              algo: str = "hist", ops: str = "linear", skip: str = SKIP, batch_size: int = 32,
                              act_symmetric: bool = True, max_length: int = MAX_SEQ_LENGTH,
                              progress: bool = False) -> Program:
    """The int8 version of a :func:`sentence_program`, calibrated on ``calib_sentences``;
    ``ops``, ``skip`` and ``act_symmetric`` as for ``pj.slim.quant_post``."""
    calib = [ids for _, ids in sentence_batches(tokenizer, calib_sentences, batch_size, max_length)]
    return pj.slim.quant_post(program, calib, algo=algo, ops=ops, skip=skip, act_symmetric=act_symmetric,
                              progress=progress)


def calibration_split(seed: int, size: int) -> tuple[list[str], set[str]]:
    """``size`` sentences drawn with ``seed`` from the train split's articles, and that set."""
    train = corpus_sentences(BBCNews("train", seed=seed))
    picked = np.random.default_rng(seed).choice(len(train), size=min(size, len(train)), replace=False)
    calib = [train[i] for i in sorted(picked)]
    return calib, set(calib)


def compare_embeddings(args) -> dict[str, float]:
    """Part (a): cosine of int8 to float embeddings over the corpus sentences."""
    encoder = all_minilm_l6_v2()
    calib, calib_set = calibration_split(args.seed, args.calib)
    sentences = [s for s in corpus_sentences(BBCNews("all", seed=args.seed)) if s not in calib_set]
    sentences = sentences[:args.limit]
    program = sentence_program(encoder)
    start = time.perf_counter()
    int8 = quantize_sentence_program(program, encoder.tokenizer, calib, algo=args.algo, ops=args.ops,
                                     skip=args.skip, act_symmetric=not args.asymmetric, max_length=args.max_length,
                                     progress=args.progress)
    quantized = sum(op.type.startswith("quantized_") for op in int8.walk())
    print(f"int8 program: {quantized} int8 ops ({_choice(args)}), calibrated on {len(calib)} "
          f"train-split sentences in {time.perf_counter() - start:.1f} s")
    timings = {}
    vectors = {}
    for name, prog in (("fp32", program), ("int8", int8)):
        start = time.perf_counter()
        vectors[name] = embed(prog, encoder.tokenizer, sentences, batch_size=args.batch_size,
                              max_length=args.max_length, progress=args.progress, desc=f"embedding ({name})")
        timings[name] = time.perf_counter() - start
    cos = cosines(vectors["fp32"], vectors["int8"])
    print(f"{len(sentences)} BBC News sentences (at most {args.max_length} word pieces): cosine of int8 to fp32 "
          f"embeddings mean {cos.mean():.5f}, min {cos.min():.5f}; embedding took {timings['fp32']:.0f} s fp32, "
          f"{timings['int8']:.0f} s int8")
    return {"sentences": len(sentences), "mean": float(cos.mean()), "min": float(cos.min())}


def classify(program: Program, ids: np.ndarray, batch_size: int, progress: bool, desc: str) -> np.ndarray:
    """The predicted classes of ``program`` for the rows of ``ids``."""
    chunks = [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
    return np.concatenate([np.asarray(program(chunk)).argmax(-1) for chunk in _bar(chunks, progress, desc)])


def compare_classifier(args) -> dict[str, float]:
    """Part (b): float and int8 held-out accuracy of a classifier saved by bbc_finetune.py."""
    program = pj.load(args.classifier)
    length = program.inputs[0].type.shape[1]
    if not isinstance(length, int):
        raise ValueError(f"--classifier: {args.classifier} takes ids of a symbolic length {length}; "
                         "expected a program saved by bbc_finetune.py (a fixed number of word pieces)")
    tokenizer = BertTokenizer.from_pretrained(minilm_path(), model_max_length=MAX_SEQ_LENGTH)
    train, test = BBCNews("train", seed=args.seed), BBCNews("test", seed=args.seed)

    def ids(news: BBCNews, n: int) -> np.ndarray:
        return tokenizer(news.texts[:n], max_length=length, padding="max_length", truncation=True)["input_ids"]

    calib = ids(train, args.calib)
    x_test, y_test = ids(test, args.limit or len(test)), test.labels[:args.limit or len(test)]
    start = time.perf_counter()
    int8 = pj.slim.quant_post(program, [calib[i:i + 32] for i in range(0, len(calib), 32)], algo=args.algo,
                              ops=args.ops, skip=args.skip, act_symmetric=not args.asymmetric, progress=args.progress)
    print(f"int8 classifier: {sum(op.type.startswith('quantized_') for op in int8.walk())} int8 ops ({_choice(args)}), "
          f"calibrated on {len(calib)} train articles in {time.perf_counter() - start:.1f} s")
    accuracy = {}
    for name, prog in (("fp32", program), ("int8", int8)):
        predicted = classify(prog, x_test, args.batch_size, args.progress, f"classifying ({name})")
        accuracy[name] = 100 * float((predicted == y_test).mean())
    print(f"held-out accuracy on {len(y_test)} BBC News articles ({length} word pieces): "
          f"fp32 {accuracy['fp32']:.2f} %, int8 {accuracy['int8']:.2f} %, "
          f"difference {accuracy['int8'] - accuracy['fp32']:+.2f} points")
    return accuracy


def _choice(args) -> str:
    skip = f" but {args.skip}" if args.skip else ""
    return f"ops {args.ops}{skip}, algo {args.algo}" + (", asymmetric" if args.asymmetric else "")


def _bar(items, show: bool, desc: str, total: int | None = None):
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total)


def main(argv=None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classifier", default=None, help="a saved bbc_finetune.py program to quantize instead")
    p.add_argument("--algo", default="hist", help="calibration algorithm (pj.slim.quant.OBSERVERS)")
    p.add_argument("--ops", default="linear", help="op types to quantize, e.g. linear or linear:matmul")
    p.add_argument("--skip", default=SKIP, help="regular expression: weights of the ops left in float ('' for none)")
    p.add_argument("--asymmetric", action="store_true", help="asymmetric activations (with --algo min_max)")
    p.add_argument("--calib", type=int, default=256, help="calibration sentences (or articles)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N sentences (or test articles)")
    p.add_argument("--max-length", type=int, default=MAX_SEQ_LENGTH, help="word pieces kept per sentence")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="the BBC News split and the calibration draw")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    return compare_classifier(args) if args.classifier else compare_embeddings(args)


if __name__ == "__main__":
    main()
