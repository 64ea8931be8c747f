"""CPU inference latency through the user path, at 1 and 2 threads, beside plain JAX and Paddle Inference.

For SmallCNN (32x32), the digits CNN (8x8) and ResNet-18 for 32x32 inputs (batch 32, NCHW
models, random weights and batch-norm statistics), each configuration runs in a process of its
own, pinned to the thread count's cores (``OMP_NUM_THREADS`` to match):

- ``plain JAX``: the network under ``jax.jit`` with its weights closed over (constants);
- ``Predictor, XLA kernels``: trace -> ``Predictor`` (frozen, tuned) with the oneDNN variants
  excluded (``autotune{exclude=onednn}``): what the Predictor ran before they existed;
- ``Predictor``: the default pipeline, the oneDNN kernels among the tuner's candidates, created
  with an empty autotune cache (cold) and again from the cache (warm);
- ``Predictor int8`` (``--int8`` models): the program quantized by ``pj.slim.quant_post`` (hist
  calibration on four random batches), then the same Predictor (int8 dataflow between the
  quantized convolutions);
- with ``PADDLE_PYTHON`` pointing at a Python that has paddlepaddle: ``Paddle Inference``
  (oneDNN on, the same thread count) and, for the ``--int8`` models, ``Paddle Inference int8``
  (Paddle's own post-training quantization, hist on four random batches, into its oneDNN int8
  inference). Paddle is never a dependency.

The processes take turns: each round asks every one, one at a time, for a block of calls (at
least five, for at least 0.3 s) and takes the block's median; a row shows the median over the
rounds. Taking turns lets the machine's noise hit all alike; a process of its own keeps each
one's thread pools to itself, as a deployed model has them (in one process, XLA's pool and
oneDNN's OpenMP threads left spinning by the previous model slowed the next by up to 1.6x),
and a pause between turns lets the last one's threads go to sleep.
Ratios over 1 mean ours is faster.

    python benchmarks/cpu_latency.py                  # 1 and 2 threads, all models
    python benchmarks/cpu_latency.py --quick          # tiny: a smoke test
    PADDLE_PYTHON=/path/to/paddle-env/bin/python python benchmarks/cpu_latency.py --int8 SmallCNN,DigitsCNN,ResNet-18
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("SmallCNN", "DigitsCNN", "ResNet-18")
SHAPES = {"SmallCNN": (3, 32, 32), "DigitsCNN": (1, 8, 8), "ResNet-18": (3, 32, 32)}
OURS = ("plain JAX", "Predictor, XLA kernels", "Predictor", "Predictor, async dispatch")
BLOCK_CALLS, BLOCK_SECONDS = 5, 0.3
# between turns: Intel OpenMP's threads (Paddle's) spin 200 ms after their last work
# (KMP_BLOCKTIME), and would slow whichever process came next
SETTLE_SECONDS = 0.3


def pin(threads: int) -> None:
    """Run this process on its first ``threads`` CPUs (before JAX or OpenMP start threads)."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    os.environ["OMP_NUM_THREADS"] = str(threads)


def serve(info: dict, call, block_seconds: float) -> None:
    """The worker's side of :class:`timing.StepWorker`: warm ``call`` up, print ``READY <info>``,
    then for each request the median seconds of a block of consecutive calls."""
    for _ in range(3):
        call()
    print("READY", json.dumps(info), flush=True)
    for _ in sys.stdin:
        times, began = [], time.perf_counter()
        while len(times) < BLOCK_CALLS or time.perf_counter() - began < block_seconds:
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        print("STEP", statistics.median(times), 0, flush=True)


def our_worker(args: dict) -> None:
    """One of our configurations for one model, in this pinned process, served block by block."""
    pin(args["threads"])
    sys.path.insert(0, str(HERE))
    os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")
    from paddlejax.dispatch import set_cpu_dispatch

    name, config, batch = args["model"], args["config"], args["batch"]
    set_cpu_dispatch("async" if config == "Predictor, async dispatch" else "sync")  # before JAX's first call
    import jax
    import numpy as np
    from flax import nnx

    import paddlejax as pj
    from paddlejax.inference import Config, Predictor
    from paddlejax.ops import onednn
    from paddlejax.passes.manager import inference_pipeline
    from timing import machine

    from cnn_models import MODELS as CNNS, randomise_statistics

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
    info = {"name": config}
    buckets = dict(max_batch_size=batch, batch_buckets=(batch,), progress=False)
    if config == "plain JAX":
        graphdef, state = nnx.split(model)
        plain = jax.jit(lambda x: nnx.merge(graphdef, state)(x))
        call = lambda: jax.block_until_ready(plain(x))  # noqa: E731
    elif config == "Predictor, XLA kernels":
        tune = {"sizes": f"b={batch}", "frozen": True, "progress": False, "exclude": "onednn"}
        call = Predictor(program, Config(**buckets, passes=inference_pipeline(autotune=tune)))
    elif config == "Predictor":
        start = time.perf_counter()
        predictor = Predictor(program, Config(**buckets))
        info["cold_s"] = time.perf_counter() - start
        start = time.perf_counter()
        Predictor(program, Config(**buckets))
        info["warm_s"] = time.perf_counter() - start
        info["kernels"] = sorted({op.attrs.get("kernel") or "default" for op in predictor.program.walk()
                                  if op.type in ("conv2d", "depthwise_conv2d", "conv2d_pool")})
        info["machine"], info["onednn"] = machine(), onednn.unavailable_reason() or "available"
        call = predictor
    elif config == "Predictor, async dispatch":
        call = Predictor(program, Config(**buckets))
    else:
        rng = np.random.default_rng(1)
        calibration = [rng.random((batch, *SHAPES[name]), np.float32) for _ in range(4)]
        call = Predictor(pj.slim.quant_post(program, calibration, progress=False), Config(**buckets))
    serve(info, (lambda: call(x)) if config != "plain JAX" else call, args["block_seconds"])


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

    def predictor_call(path, x, int8):
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
        return run, created

    args = json.loads(sys.argv[1])
    name = args["model"]
    net = network(name)
    net.eval()
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "model")
    paddle.jit.save(paddle.jit.to_static(net, input_spec=[paddle.static.InputSpec([None] + args["shapes"][name],
                                                                                  "float32")]), path)
    rng = np.random.default_rng(0)
    x = rng.random([args["batch"]] + args["shapes"][name], np.float32)
    if args["int8"]:
        path = quantized(folder, [rng.random([args["batch"]] + args["shapes"][name], np.float32) for _ in range(4)])
    run, created = predictor_call(path, x, args["int8"])
    for _ in range(3):
        run()
    print("READY", json.dumps({"name": "Paddle Inference" + " int8" * args["int8"], "cold_s": created,
                               "machine": "paddle " + paddle.__version__}), flush=True)
    for _ in sys.stdin:  # a block of calls per request, as the paddlejax workers time theirs
        times, began = [], time.perf_counter()
        while len(times) < args["block_calls"] or time.perf_counter() - began < args["block_seconds"]:
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        print("STEP", float(np.median(times)), 0, flush=True)
''')


def measure(model: str, threads: int, args, paddle: str | None) -> dict:
    """One model's row: every configuration in a process of its own, taking turns."""
    from timing import StepWorker

    job = {"model": model, "batch": args.batch, "threads": threads, "block_seconds": args.block_seconds}
    configs = [*OURS, *(["Predictor int8"] if model in args.int8 else [])]
    workers = []
    try:
        for config in configs:
            workers.append(StepWorker(sys.executable, [__file__, "--worker"], {**job, "config": config}, threads))
        if paddle:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(PADDLE_WORKER)
            for int8 in (False, True)[:1 + (model in args.int8)]:
                workers.append(StepWorker(paddle, [f.name], {**job, "int8": int8, "block_calls": BLOCK_CALLS,
                                                             "shapes": {k: list(v) for k, v in SHAPES.items()}},
                                          threads))
            os.unlink(f.name)  # the workers have read it by the time they are READY
        infos = [json.loads(w.name) for w in workers]
        seconds = {info["name"]: [] for info in infos}
        for _ in range(args.rounds):
            for worker, info in zip(workers, infos):
                time.sleep(args.settle_seconds)
                seconds[info["name"]].append(worker.step()[0])
    finally:
        for worker in workers:
            worker.__exit__()
    row = next(info for info in infos if info["name"] == "Predictor")
    row.update(model=model, ms={k: 1e3 * statistics.median(v) for k, v in seconds.items()},
               paddle=next((info["machine"] for info in infos if info["name"] == "Paddle Inference"), None))
    return row


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        our_worker(json.loads(sys.argv[2]))
        return 0
    sys.path.insert(0, str(HERE))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="SmallCNN and the digits CNN at batch 4, 2 threads, few rounds")
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; 2 with --quick)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--int8", default="SmallCNN,DigitsCNN", help="the models also run int8 (default SmallCNN,DigitsCNN)")
    p.add_argument("--rounds", type=int, default=15, help="turns each configuration takes")
    args = p.parse_args(argv)
    models = ["SmallCNN", "DigitsCNN"] if args.quick else args.models.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    args.int8 = args.int8.split(",")
    args.batch, args.rounds = (4, 3) if args.quick else (32, args.rounds)
    args.block_seconds, args.settle_seconds = (0.02, 0.02) if args.quick else (BLOCK_SECONDS, SETTLE_SECONDS)
    paddle = os.environ.get("PADDLE_PYTHON")
    for threads in map(int, (args.threads or ("2" if args.quick else "1,2")).split(",")):
        if threads > len(os.sched_getaffinity(0)):
            print(f"skipping {threads} threads: this process may use {len(os.sched_getaffinity(0))} CPUs")
            continue
        report([measure(model, threads, args, paddle) for model in models], threads, args.batch)
    return 0


def report(rows: list[dict], threads: int, batch: int) -> None:
    paddle = rows[0]["paddle"]
    print(f"\n{rows[0]['machine']}\n{threads} thread{'s' * (threads > 1)}, batch {batch}, float32, NCHW models; "
          f"oneDNN kernels: {rows[0]['onednn']}" + (f"; {paddle}" if paddle else ""))
    columns = list(dict.fromkeys(c for row in rows for c in row["ms"]))
    width = {c: max(24, len(c) + 2) for c in columns}
    print(f"{'model':<11}" + "".join(f"{c:>{width[c]}}" for c in columns) + f"{'fp32 vs best other':>20}"
          f"{'int8 vs fp32':>14}{'int8 vs Paddle int8':>21}{'created cold / warm':>22}  conv kernels")
    for row in rows:
        ms = row["ms"]
        best_other = min(v for k, v in ms.items()
                         if "int8" not in k and (not k.startswith("Predictor") or k == "Predictor, XLA kernels"))
        int8 = f"{ms['Predictor'] / ms['Predictor int8']:.2f}x" if "Predictor int8" in ms else "-"
        theirs = (f"{ms['Paddle Inference int8'] / ms['Predictor int8']:.2f}x"
                  if "Predictor int8" in ms and "Paddle Inference int8" in ms else "-")
        print(f"{row['model']:<11}" + "".join(f"{ms[c]:>{width[c] - 3}.3f} ms" if c in ms else f"{'-':>{width[c]}}" for c in columns)
              + f"{best_other / ms['Predictor']:>19.2f}x{int8:>14}{theirs:>21}"
              + f"{row['cold_s']:>13.1f} s / {row['warm_s']:.1f} s  {', '.join(row['kernels'])}")


if __name__ == "__main__":
    raise SystemExit(main())
