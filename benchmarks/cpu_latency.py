"""CPU inference latency through the user path, at 1 and 2 threads, beside plain JAX and Paddle Inference.

For each thread count a worker process is pinned to that many cores (``sched_setaffinity``
before JAX and OpenMP start, ``OMP_NUM_THREADS`` to match). In it, for SmallCNN (32x32),
the digits CNN (8x8) and ResNet-18 for 32x32 inputs (batch 32, NCHW models, random weights
and batch-norm statistics):

- ``plain JAX``: the network under ``jax.jit`` with its weights closed over (constants);
- ``Predictor, XLA kernels``: trace -> ``Predictor`` (frozen, tuned) with the oneDNN variants
  excluded (``autotune{exclude=onednn}``): what the Predictor ran before they existed;
- ``Predictor``: the default pipeline, the oneDNN kernels among the tuner's candidates;
- ``Predictor int8`` (``--int8`` models): the program quantized by ``pj.slim.quant_post`` (hist calibration on four
  random batches), then the same Predictor (int8 dataflow between the quantized convolutions);

timed side by side (calls interleaved, medians), and the Predictor's creation with an empty
autotune cache (cold) and again from the cache (warm). With ``PADDLE_PYTHON`` pointing at a
Python that has paddlepaddle, the same networks run in Paddle Inference (oneDNN on, the same
thread count) in a worker of their own, taking turns with ours, and the ``--int8`` models also
through Paddle's own post-training quantization (hist, four random batches) into its oneDNN int8
inference. Paddle is never a dependency. Ratios over 1 mean ours is faster.

    python benchmarks/cpu_latency.py                  # 1 and 2 threads, all models
    python benchmarks/cpu_latency.py --quick          # tiny: a smoke test
    PADDLE_PYTHON=/path/to/paddle-env/bin/python python benchmarks/cpu_latency.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("SmallCNN", "DigitsCNN", "ResNet-18")
SHAPES = {"SmallCNN": (3, 32, 32), "DigitsCNN": (1, 8, 8), "ResNet-18": (3, 32, 32)}


def pin(threads: int) -> None:
    """Run this process on its first ``threads`` CPUs (before JAX or OpenMP start threads)."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    os.environ["OMP_NUM_THREADS"] = str(threads)


def ours(models: list[str], int8_models: list[str], batch: int, repeats: int) -> list[dict]:
    """Rows of the paddlejax side, in this (pinned) process."""
    sys.path.insert(0, str(HERE))
    os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")
    import time

    import jax
    import numpy as np
    from flax import nnx

    import paddlejax as pj
    from paddlejax.inference import Config, Predictor
    from paddlejax.ops import onednn
    from paddlejax.passes.manager import inference_pipeline
    from timing import alternate, machine

    from cnn_models import MODELS as CNNS, randomise_statistics

    rows = [{"machine": machine(), "onednn": onednn.unavailable_reason() or "available"}]
    for name in models:
        pj.nn.seed(0)
        if name == "DigitsCNN":
            from paddlejax.models.digits import DigitsCNN
            model = DigitsCNN()
        else:
            model = CNNS[name]("NCHW", 32)
        randomise_statistics(model)
        model.eval()
        program = pj.to_static(model, pj.InputSpec((None, *SHAPES[name])), name=name)
        x = np.random.default_rng(0).random((batch, *SHAPES[name]), np.float32)
        graphdef, state = nnx.split(model)
        plain = jax.jit(lambda x: nnx.merge(graphdef, state)(x))
        tune = {"sizes": f"b={batch}", "frozen": True, "progress": False}
        start = time.perf_counter()
        predictor = Predictor(program, Config(max_batch_size=batch, batch_buckets=(batch,), progress=False))
        cold = time.perf_counter() - start
        start = time.perf_counter()
        Predictor(program, Config(max_batch_size=batch, batch_buckets=(batch,), progress=False))
        warm = time.perf_counter() - start
        xla = Predictor(program, Config(max_batch_size=batch, batch_buckets=(batch,),
                                        passes=inference_pipeline(autotune={**tune, "exclude": "onednn"})))
        calls = {"plain JAX": lambda: jax.block_until_ready(plain(x)), "Predictor, XLA kernels": lambda: xla(x),
                 "Predictor": lambda: predictor(x)}
        if name in int8_models:
            rng = np.random.default_rng(1)
            calibration = [rng.random((batch, *SHAPES[name]), np.float32) for _ in range(4)]
            int8 = Predictor(pj.slim.quant_post(program, calibration, progress=False),
                             Config(max_batch_size=batch, batch_buckets=(batch,), progress=False))
            calls["Predictor int8"] = lambda: int8(x)
        kernels = sorted({op.attrs.get("kernel") or "default" for op in predictor.program.walk()
                          if op.type in ("conv2d", "depthwise_conv2d")})
        times = alternate(calls, warmup=3, repeats=repeats)
        rows.append({"model": name, "ms": times, "cold_s": cold, "warm_s": warm, "kernels": kernels})
    return rows


PADDLE_WORKER = textwrap.dedent('''
    import json, os, sys, tempfile, time
    os.environ["FLAGS_enable_pir_api"] = "0"  # post-training quantization reads the legacy program format
    import numpy as np
    import paddle
    from paddle.static.quantization import PostTrainingQuantization
    from paddle import nn

    def block(cin, cout, pool):
        return [nn.Conv2D(cin, cout, 3, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU()] + \\
               ([nn.MaxPool2D(2)] if pool else [])

    class Basic(nn.Layer):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2D(cin, cout, 3, stride, 1, bias_attr=False), nn.BatchNorm2D(cout)
            self.c2, self.b2 = nn.Conv2D(cout, cout, 3, 1, 1, bias_attr=False), nn.BatchNorm2D(cout)
            self.short = nn.Sequential(nn.Conv2D(cin, cout, 1, stride, bias_attr=False), nn.BatchNorm2D(cout)) \\
                if stride != 1 or cin != cout else nn.Identity()
        def forward(self, x):
            y = nn.functional.relu(self.b1(self.c1(x)))
            return nn.functional.relu(self.b2(self.c2(y)) + self.short(x))

    def network(name):
        if name == "SmallCNN":
            return nn.Sequential(*block(3, 32, True), *block(32, 64, True), *block(64, 128, True), nn.Flatten(),
                                 nn.Linear(2048, 10))
        if name == "DigitsCNN":
            return nn.Sequential(*block(1, 32, False), *block(32, 64, True), *block(64, 128, True), nn.Flatten(),
                                 nn.Linear(512, 10))
        layers, cin = [nn.Conv2D(3, 64, 3, 1, 1, bias_attr=False), nn.BatchNorm2D(64), nn.ReLU()], 64
        for i, w in enumerate((64, 128, 256, 512)):
            layers += [Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)]
            cin = w
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(512, 10))

    def quantized(folder, batches):
        # Paddle's own post-training quantization, hist calibration on the batches ours sees
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        _, (feed,), _ = paddle.static.load_inference_model(os.path.join(folder, "model"), exe)
        ptq = PostTrainingQuantization(executor=exe, model_dir=folder, model_filename="model.pdmodel",
                                       params_filename="model.pdiparams", data_loader=lambda: ({feed: b} for b in batches),
                                       batch_nums=len(batches), algo="hist", onnx_format=False,
                                       quantizable_op_type=["conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2"])
        ptq.quantize()
        ptq.save_quantized_model(os.path.join(folder, "int8"), model_filename="model.pdmodel",
                                 params_filename="model.pdiparams")
        paddle.disable_static()
        return os.path.join(folder, "int8", "model")

    def timed(path, x, int8):
        config = paddle.inference.Config(path + ".pdmodel", path + ".pdiparams")
        config.disable_gpu()
        config.enable_mkldnn()
        if int8:
            config.enable_mkldnn_int8()
        config.set_cpu_math_library_num_threads(args["threads"])
        start = time.perf_counter()
        predictor = paddle.inference.create_predictor(config)
        created = time.perf_counter() - start
        handle = predictor.get_input_handle(predictor.get_input_names()[0])
        out = predictor.get_output_handle(predictor.get_output_names()[0])
        def run():
            handle.copy_from_cpu(x)
            predictor.run()
            return out.copy_to_cpu()
        for _ in range(3):
            run()
        times = []
        for _ in range(args["repeats"]):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times)), created

    args = json.loads(sys.argv[1])
    rows = [{"machine": "paddle " + paddle.__version__}]
    for name in args["models"]:
        net = network(name)
        net.eval()
        shape = [None] + args["shapes"][name]
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "model")
        paddle.jit.save(paddle.jit.to_static(net, input_spec=[paddle.static.InputSpec(shape, "float32")]), path)
        rng = np.random.default_rng(0)
        x = rng.random([args["batch"]] + args["shapes"][name], np.float32)
        ms, created = timed(path, x, int8=False)
        row = {"model": name, "ms": {"Paddle Inference": ms}, "cold_s": created}
        if name in args["int8"]:
            batches = [rng.random([args["batch"]] + args["shapes"][name], np.float32) for _ in range(4)]
            row["ms"]["Paddle Inference int8"] = timed(quantized(folder, batches), x, int8=True)[0]
        rows.append(row)
    print("ROWS " + json.dumps(rows))
''')


def worker(argv: list[str]) -> int:
    args = json.loads(argv[0])
    pin(args["threads"])
    print("ROWS " + json.dumps(ours(args["models"], args["int8"], args["batch"], args["repeats"])))
    return 0


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    from timing import run_worker  # here: a worker pins its CPUs before JAX is imported
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="SmallCNN and the digits CNN at batch 4, few repeats")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--int8", default="SmallCNN,DigitsCNN", help="the models also run int8 (default SmallCNN,DigitsCNN)")
    args = p.parse_args(argv)
    models = ["SmallCNN", "DigitsCNN"] if args.quick else args.models.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    batch, repeats = (4, 5) if args.quick else (32, 50)
    paddle = os.environ.get("PADDLE_PYTHON")
    for threads in map(int, args.threads.split(",")):
        if threads > len(os.sched_getaffinity(0)):
            print(f"skipping {threads} threads: this process may use {len(os.sched_getaffinity(0))} CPUs")
            continue
        job = {"models": models, "int8": args.int8.split(","), "batch": batch, "repeats": repeats, "threads": threads,
               "shapes": {k: list(v) for k, v in SHAPES.items()}}
        rows = run_worker(sys.executable, [__file__, "--worker"], job, threads)
        if paddle:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(PADDLE_WORKER)
            paddle_rows = run_worker(paddle, [f.name], job, threads)
            for row, theirs in zip(rows[1:], paddle_rows[1:]):
                row["ms"].update(theirs["ms"])
                row["paddle_create_s"] = theirs["cold_s"]
        report(rows, threads, batch, paddle_rows[0]["machine"] if paddle else None)
    return 0


def report(rows: list[dict], threads: int, batch: int, paddle: str | None) -> None:
    print(f"\n{rows[0]['machine']}\n{threads} thread{'s' * (threads > 1)}, batch {batch}, float32, NCHW models; "
          f"oneDNN kernels: {rows[0]['onednn']}" + (f"; {paddle}" if paddle else ""))
    columns = list(dict.fromkeys(c for row in rows[1:] for c in row["ms"]))
    print(f"{'model':<11}" + "".join(f"{c:>24}" for c in columns) + f"{'fp32 vs best other':>20}"
          f"{'int8 vs fp32':>14}{'int8 vs Paddle int8':>21}{'created cold / warm':>22}  conv kernels")
    for row in rows[1:]:
        ms = row["ms"]
        best_other = min(v for k, v in ms.items()
                         if "int8" not in k and (not k.startswith("Predictor") or k == "Predictor, XLA kernels"))
        int8 = f"{ms['Predictor'] / ms['Predictor int8']:.2f}x" if "Predictor int8" in ms else "-"
        theirs = (f"{ms['Paddle Inference int8'] / ms['Predictor int8']:.2f}x"
                  if "Predictor int8" in ms and "Paddle Inference int8" in ms else "-")
        print(f"{row['model']:<11}" + "".join(f"{ms[c]:>21.3f} ms" if c in ms else f"{'-':>24}" for c in columns)
              + f"{best_other / ms['Predictor']:>19.2f}x{int8:>14}{theirs:>21}"
              + f"{row['cold_s']:>13.1f} s / {row['warm_s']:.1f} s  {', '.join(row['kernels'])}")


if __name__ == "__main__":
    raise SystemExit(main())
