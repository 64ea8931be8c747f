"""Cold autotuning: how long a first ``Predictor`` takes with an empty autotune cache, and how
fast the program it tunes runs, against the exhaustive search (every kernel of every op timed,
the ops tuned in both layouts: ``autotune{top_k=0, layout=search}``).

Each configuration runs in a fresh process with its own empty cache (nothing compiled or
tuned before it), pinned to the same CPUs, and saves the program it tuned; this process then
times the tuned programs side by side, interleaved, frozen as the Predictor runs them.

    python benchmarks/autotune_cold.py                 # ResNet-18 and SmallCNN, batch 32, 2 threads
    python benchmarks/autotune_cold.py --threads 1 --models SmallCNN
    python benchmarks/autotune_cold.py --quick          # the digits CNN, batch 4: a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = {"SmallCNN": (3, 32, 32), "ResNet-18": (3, 32, 32), "DigitsCNN": (1, 8, 8)}
CONFIGS = {"default": {}, "exhaustive": {"top_k": 0, "layout": "search"}, "no Winograd": {"exclude": "winograd"}}


def worker(args: dict) -> list[dict]:
    """In a pinned process: build the model, create a Predictor with ``args["autotune"]`` and an
    empty cache, save what it tuned."""
    os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")
    sys.path.insert(0, str(HERE))
    import paddlejax as pj
    from paddlejax.inference import Config, Predictor
    from paddlejax.passes.manager import inference_pipeline

    from cnn_models import MODELS as CNNS, randomise_statistics

    pj.nn.seed(0)
    if args["model"] == "DigitsCNN":
        from paddlejax.models.digits import DigitsCNN
        model = DigitsCNN()
    else:
        model = CNNS[args["model"]]("NCHW", 32)
    randomise_statistics(model)
    model.eval()
    program = pj.to_static(model, pj.InputSpec((None, *SHAPES[args["model"]])), name=args["model"])
    batch = args["batch"]
    tune = {"sizes": f"b={batch}", "frozen": True, "progress": False, **args["autotune"]}
    start = time.perf_counter()
    predictor = Predictor(program, Config(max_batch_size=batch, batch_buckets=(batch,), progress=False,
                                          passes=inference_pipeline(autotune=tune)))
    seconds = time.perf_counter() - start
    pj.save(predictor.program, args["out"])
    kernels = sorted({op.attrs.get("kernel") or "default" for op in predictor.program.walk() if "conv" in op.type})
    return [{"seconds": seconds, "kernels": kernels}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="ResNet-18,SmallCNN", help="comma-separated (ResNet-18, SmallCNN, DigitsCNN)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="CPUs every process is pinned to")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="the digits CNN alone, batch 4, few repeats (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batch, args.repeats = "DigitsCNN", 4, 5
    threads = min(args.threads, len(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    os.environ["OMP_NUM_THREADS"] = str(threads)
    sys.path.insert(0, str(HERE))
    import numpy as np

    from paddlejax.inference import Config, Predictor
    from timing import alternate, machine, run_worker

    print(machine())
    print(f"batch {args.batch}, {threads} thread(s); each configuration cold in its own process")
    print(f"{'model':<11}{'configuration':<14}{'created in':>12}{'ms/batch':>10}{'latency vs exhaustive':>23}"
          "  conv kernels")
    folder = tempfile.mkdtemp()
    for name in args.models.split(","):
        rows, predictors = {}, {}
        for config, options in CONFIGS.items():
            out = os.path.join(folder, f"{name}-{config}")
            rows[config] = run_worker(sys.executable, [__file__, "--worker"],
                                      {"model": name, "batch": args.batch, "autotune": options, "out": out},
                                      threads=threads)[0]
            # already tuned and laid out: no passes, frozen as the Predictor freezes them
            predictors[config] = Predictor(out, Config(max_batch_size=args.batch, batch_buckets=(args.batch,),
                                                       progress=False, passes=""))
        x = np.random.default_rng(0).random((args.batch, *SHAPES[name]), np.float32)
        ms = alternate({k: (lambda p=p: p(x)) for k, p in predictors.items()}, warmup=3, repeats=args.repeats)
        for config, row in rows.items():
            print(f"{name:<11}{config:<14}{row['seconds']:>10.1f} s{ms[config]:>10.2f}"
                  f"{ms[config] / ms['exhaustive']:>22.3f}x  {', '.join(row['kernels'])}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print("ROWS " + json.dumps(worker(json.loads(sys.argv[2]))))
        raise SystemExit(0)
    raise SystemExit(main())
