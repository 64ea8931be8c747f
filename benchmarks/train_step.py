"""Training-step speed of the Trainer, eager speed of paddlejax.nn, and what Paddle's initialisers buy.

All comparisons run side by side in one process (alternating calls, medians):

1. ``Trainer.train_batch`` vs a hand-written ``nnx.jit`` train step (``nnx.Optimizer``) on the
   same paddlejax.nn model (the digits CNN) and data;
2. eager (un-jitted) forward of paddlejax.nn layers vs the same Flax NNX layers (NHWC both);
3. ResNet-18 for 32x32 inputs (3x3 stem, no max-pool, 64/128/256/512), batch 64, SGD with
   momentum: Trainer step in float32, with bf16 AMP, and in float32 with ``passes=[autotune]``
   (kernels chosen for training, oneDNN's among them; tuned from a cold cache during the first
   step, whose time includes the tuning), beside the same network in plain Flax
   NNX + ``jax.jit`` (Flax's default initialisers), all on one fixed batch; the losses after
   ``--steps`` steps show what Paddle's initialisers change.

With ``TORCH_PYTHON`` pointing at a Python that has PyTorch, the same ResNet-18 step also runs in
PyTorch eager (channels-last) in a process of its own, its steps interleaved with ours (one
process runs at a time). PyTorch is never a dependency.

    python benchmarks/train_step.py            # full sizes (a few minutes on 2 CPU cores)
    TORCH_PYTHON=/path/to/torch-env/bin/python python benchmarks/train_step.py
    python benchmarks/train_step.py --quick    # tiny sizes: a smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import paddlejax as pj
from paddlejax import nn
from paddlejax.models.digits import DigitsCNN
from timing import StepWorker, alternate, machine


# -- 1. Trainer vs nnx.jit ---------------------------------------------------------------------------

def trainer_vs_nnx_jit(batch: int, warmup: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, 1, 8, 8)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, batch), jnp.int32)
    nn.seed(0)
    trainer = pj.Trainer(DigitsCNN(), optax.sgd(0.01, momentum=0.9), progress=False)
    nn.seed(0)
    model = DigitsCNN()
    optimizer = nnx.Optimizer(model, optax.sgd(0.01, momentum=0.9), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_fn(m):
            return pj.ops.cross_entropy(m(x), y)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return alternate({"Trainer.train_batch": lambda: trainer.train_batch([x], y),
                      "nnx.jit step": lambda: step(model, optimizer, x, y)}, warmup, repeats)


# -- 2. eager layers ---------------------------------------------------------------------------------

def eager_layers(batch: int, repeats: int) -> dict:
    x = jnp.asarray(np.random.default_rng(0).normal(size=(batch, 32, 32, 16)), jnp.float32)
    nn.seed(0)
    ours = nn.Sequential(nn.Conv2D(16, 32, 3, padding=1, data_format="NHWC"), nn.BatchNorm2D(32, data_format="NHWC"),
                         nn.ReLU(), nn.MaxPool2D(2, data_format="NHWC"), nn.Flatten(), nn.Linear(32 * 16 * 16, 10))
    rngs = nnx.Rngs(0)
    theirs = nnx.Sequential(nnx.Conv(16, 32, (3, 3), padding=1, rngs=rngs), nnx.BatchNorm(32, rngs=rngs),
                            nnx.relu, lambda h: nnx.max_pool(h, (2, 2), (2, 2)),
                            lambda h: h.reshape(h.shape[0], -1), nnx.Linear(32 * 16 * 16, 10, rngs=rngs))
    ours.eval()
    theirs.eval()
    return alternate({"paddlejax.nn": lambda: ours(x), "flax.nnx": lambda: theirs(x)}, 3, repeats)


# -- 3. ResNet-18 ------------------------------------------------------------------------------------

class BasicBlock(nn.Layer):
    def __init__(self, cin, cout, stride, fmt):
        self.conv1 = nn.Conv2D(cin, cout, 3, stride, 1, bias_attr=False, data_format=fmt)
        self.bn1 = nn.BatchNorm2D(cout, data_format=fmt)
        self.conv2 = nn.Conv2D(cout, cout, 3, 1, 1, bias_attr=False, data_format=fmt)
        self.bn2 = nn.BatchNorm2D(cout, data_format=fmt)
        self.relu = nn.ReLU()
        self.short = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2D(cin, cout, 1, stride, bias_attr=False, data_format=fmt),
                                       nn.BatchNorm2D(cout, data_format=fmt))

    def __call__(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.short(x))


class ResNet18(nn.Layer):
    """ResNet-18 for 32x32 inputs on paddlejax.nn (Paddle's initialisers)."""

    def __init__(self, classes=10, widths=(64, 128, 256, 512), fmt="NHWC"):
        self.stem = nn.Sequential(nn.Conv2D(3, widths[0], 3, 1, 1, bias_attr=False, data_format=fmt),
                                  nn.BatchNorm2D(widths[0], data_format=fmt), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2, fmt), BasicBlock(w, w, 1, fmt)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2D(1, data_format=fmt)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(cin, classes)

    def __call__(self, x):
        return self.fc(self.flatten(self.pool(self.blocks(self.stem(x)))))


class FlaxBlock(nnx.Module):
    def __init__(self, cin, cout, stride, rngs):
        conv = lambda i, o, k, s: nnx.Conv(i, o, (k, k), (s, s), padding=k // 2, use_bias=False, rngs=rngs)  # noqa
        self.conv1, self.bn1 = conv(cin, cout, 3, stride), nnx.BatchNorm(cout, rngs=rngs)
        self.conv2, self.bn2 = conv(cout, cout, 3, 1), nnx.BatchNorm(cout, rngs=rngs)
        self.short = nnx.data(None)
        if stride != 1 or cin != cout:
            self.short = nnx.Sequential(conv(cin, cout, 1, stride), nnx.BatchNorm(cout, rngs=rngs))

    def __call__(self, x):
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nnx.relu(y + (x if self.short is None else self.short(x)))


class FlaxResNet18(nnx.Module):
    """The same network in plain Flax NNX with Flax's default initialisers."""

    def __init__(self, classes=10, widths=(64, 128, 256, 512), rngs=None):
        rngs = rngs or nnx.Rngs(0)
        self.stem = nnx.Conv(3, widths[0], (3, 3), padding=1, use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(widths[0], rngs=rngs)
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [FlaxBlock(cin, w, 1 if i == 0 else 2, rngs), FlaxBlock(w, w, 1, rngs)]
            cin = w
        self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks
        self.fc = nnx.Linear(cin, classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.stem(x)))
        for b in self.blocks:
            x = b(x)
        return self.fc(x.mean(axis=(1, 2)))


def count_params(model) -> int:
    return sum(int(np.size(v)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def resnet18(batch: int, steps: int, widths: tuple, image: int, tune_cache: str | None,
             peer: StepWorker | None = None) -> dict:
    """Step times and loss curves on one fixed batch (the same batch for every run); the
    tuned Trainer only with a ``tune_cache`` file; ``peer``'s steps (PyTorch's) interleaved
    with ours."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, image, image, 3)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, batch), jnp.int32)
    runs, times, losses, params = {}, {}, {}, {}
    autotune = pj.passes.get_pass("autotune", cache=tune_cache or "", progress=False)
    for name, amp, passes in (("Trainer fp32", None, []), ("Trainer bf16", "bf16", []),
                              *([("Trainer fp32 tuned", None, [autotune])] if tune_cache else [])):
        nn.seed(0)
        model = ResNet18(widths=widths)
        params["paddlejax.nn"] = count_params(model)
        trainer = pj.Trainer(model, optax.sgd(0.1, momentum=0.9), amp=amp, progress=False, passes=passes)
        runs[name] = lambda t=trainer: t.train_batch([x], y)
    flax_model = FlaxResNet18(widths=widths)
    params["flax"] = count_params(flax_model)
    optimizer = nnx.Optimizer(flax_model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

    @nnx.jit
    def flax_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(model)
        optimizer.update(model, grads)
        return loss

    runs["Flax + jax.jit"] = lambda: flax_step(flax_model, optimizer, x, y)
    for name in [*runs, *([peer.name] if peer else [])]:
        times[name], losses[name] = [], []
    for _ in range(steps):  # interleaved, so that machine noise hits every run alike
        for name, run in runs.items():
            t = time.perf_counter()
            loss = float(run())
            times[name].append(time.perf_counter() - t)
            losses[name].append(loss)
        if peer:
            seconds, loss = peer.step()
            times[peer.name].append(seconds)
            losses[peer.name].append(loss)
    return {"first_ms": {k: 1e3 * v[0] for k, v in times.items()},
            "step_ms": {k: 1e3 * statistics.median(v[2:] or v) for k, v in times.items()},
            "losses": losses, "params": params}


# The same ResNet-18 step in PyTorch eager (channels-last, oneDNN), run by TORCH_PYTHON's Python.
TORCH_WORKER = textwrap.dedent('''
    import json, platform, sys, time
    import numpy as np, torch
    from torch import nn
    args = json.loads(sys.argv[1])
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.short(x))

    widths, layers, cin = args["widths"], [], args["widths"][0]
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    model = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                          *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))
    model = model.to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(args["batch"], 3, args["image"], args["image"])).astype(np.float32))
    x = x.to(memory_format=torch.channels_last)
    y = torch.from_numpy(rng.integers(0, 10, args["batch"]))
    print("READY", f"PyTorch {torch.__version__} eager", flush=True)
    for _ in sys.stdin:  # one step per request
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss = float(loss)
        print("STEP", time.perf_counter() - start, loss, flush=True)
''')


def torch_worker(python: str, batch: int, widths: tuple, image: int) -> StepWorker:
    """PyTorch's ResNet-18 step in ``python``'s process, ready to step."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TORCH_WORKER)
    try:
        return StepWorker(python, [f.name], {"batch": batch, "widths": list(widths), "image": image})
    finally:
        os.unlink(f.name)  # the worker has read it by the time it is READY


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test)")
    p.add_argument("--steps", type=int, default=13, help="ResNet-18 steps per run (default 13)")
    args = p.parse_args(argv)
    quick = args.quick
    print(machine() + "\n")

    t = trainer_vs_nnx_jit(batch=64, warmup=3 if quick else 10, repeats=5 if quick else 200)
    ratio1 = t["Trainer.train_batch"] / t["nnx.jit step"]
    print("1. digits CNN train step, batch 64 (median ms)")
    for k, v in t.items():
        print(f"   {k:22s} {v:8.3f}")
    print(f"   ratio Trainer / nnx.jit = {ratio1:.3f}  (target <= 1.05)\n")

    e = eager_layers(batch=2 if quick else 16, repeats=5 if quick else 100)
    ratio2 = e["paddlejax.nn"] / e["flax.nnx"]
    print("2. eager forward, conv-bn-relu-pool-flatten-linear, 32x32x16 NHWC (median ms)")
    for k, v in e.items():
        print(f"   {k:22s} {v:8.3f}")
    print(f"   ratio paddlejax.nn / flax.nnx = {ratio2:.3f}  (target <= 1.2)\n")

    # --quick: one width throughout, so that Flax's initialisers compile a sampler for fewer shapes
    widths, batch, image = ((8, 8, 8, 8), 8, 16) if quick else ((64, 128, 256, 512), 64, 32)
    steps = 3 if quick else args.steps
    torch_python = os.environ.get("TORCH_PYTHON")
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        peer = stack.enter_context(torch_worker(torch_python, batch, widths, image)) if torch_python else None
        # a cold tuning cache: "first ms" includes the tuning; --quick leaves the tuned run out: at
        # tiny sizes tuning is all compiling (~1 minute)
        r = resnet18(batch, steps, widths, image, None if quick else os.path.join(folder, "autotune.json"), peer)
    print(f"3. ResNet-18 ({r['params']['paddlejax.nn'] / 1e6:.2f} M parameters; Flax copy "
          f"{r['params']['flax'] / 1e6:.2f} M), {image}x{image}, batch {batch}, SGD momentum, {steps} steps "
          "on one fixed batch")
    print(f"   {'run':26s} {'step ms':>9s} {'first ms':>9s} {'loss@1':>8s} {'loss@' + str(steps):>9s}")
    for k in r["step_ms"]:
        print(f"   {k:26s} {r['step_ms'][k]:9.0f} {r['first_ms'][k]:9.0f} {r['losses'][k][0]:8.4f} "
              f"{r['losses'][k][-1]:9.4f}")
    base = r["step_ms"]["Flax + jax.jit"]
    for k in [k for k in r["step_ms"] if k.startswith("Trainer")]:
        print(f"   ratio {k} / Flax + jax.jit = {r['step_ms'][k] / base:.3f}")
    for k in [k for k in r["step_ms"] if k.startswith("PyTorch") and "Trainer fp32 tuned" in r["step_ms"]]:
        print(f"   ratio Trainer fp32 tuned / {k} = {r['step_ms']['Trainer fp32 tuned'] / r['step_ms'][k]:.3f}"
              "  (its own process, steps interleaved)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
