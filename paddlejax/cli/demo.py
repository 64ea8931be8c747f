"""Tour paddlejax: trace a small CNN, print its IR, optimise, save, load, run, export."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def add_arguments(p) -> None:
    p.add_argument("--out", default="paddlejax-demo", help="folder for the saved files (default ./paddlejax-demo)")
    p.add_argument("--batch", type=int, default=8, help="batch size to run (default 8)")


def small_cnn():
    """A Paddle-style CNN on the op library: conv-bn-relu ×2, pooling, a linear head."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from paddlejax import ops

    class ConvBN(nnx.Module):
        def __init__(self, cin, cout, key):
            fan_in = cin * 9
            self.weight = nnx.Param(jax.random.normal(key, (cout, cin, 3, 3)) * np.sqrt(2 / fan_in))
            self.scale = nnx.Param(jnp.ones(cout))
            self.shift = nnx.Param(jnp.zeros(cout))
            self.mean = nnx.BatchStat(jax.random.normal(jax.random.fold_in(key, 1), (cout,)) * 0.1)
            self.var = nnx.BatchStat(jnp.ones(cout) * 1.5)

        def __call__(self, x):
            y = ops.conv2d(x, self.weight[...], padding=1)
            y, _, _ = ops.batch_norm(y, self.mean[...], self.var[...], self.scale[...], self.shift[...])
            return ops.relu(y)

    class SmallCNN(nnx.Module):
        def __init__(self, key=jax.random.PRNGKey(0), classes=10):
            k1, k2, k3 = jax.random.split(key, 3)
            self.block1 = ConvBN(1, 8, k1)
            self.block2 = ConvBN(8, 16, k2)
            self.head_w = nnx.Param(jax.random.normal(k3, (16, classes)) * 0.25)
            self.head_b = nnx.Param(jnp.zeros(classes))

        def __call__(self, image):
            x = ops.pool2d(self.block1(image), pooling_type="max", kernel_size=2)
            x = ops.pool2d(self.block2(x), pooling_type="avg", kernel_size=1, global_pooling=True)
            x = ops.reshape(x, shape=(0, -1))
            return ops.softmax(ops.linear(x, self.head_w[...], self.head_b[...]))

    return SmallCNN()


def main(args) -> int:
    import jax

    import paddlejax as pj

    out = Path(args.out)
    model = small_cnn()
    print("1. Trace a small CNN with a symbolic batch size")
    t = time.perf_counter()
    prog = pj.trace(model, pj.InputSpec((None, 1, 28, 28), name="image"))
    print(f"   traced in {time.perf_counter() - t:.2f} s\n")
    print(prog)

    print("\n2. Run a pass pipeline")
    pm = pj.passes.PassManager("eliminate_identity,fold_constants,cse,dce")
    opt = pm.run(prog)
    print(pm.report())

    print(f"\n3. Save to {out}/ and load back")
    pj.save(opt, out / "small_cnn")
    loaded = pj.load(out / "small_cnn")
    for f in sorted(out.iterdir()):
        print(f"   {f.name:28s} {f.stat().st_size:>9,} bytes")
    print(f"   printed IR identical after the round trip: {str(loaded) == str(opt)}")

    print(f"\n4. Run on a batch of {args.batch} and compare with the original module")
    x = np.random.default_rng(0).standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
    ref = np.asarray(model(x))
    got = np.asarray(loaded(x))
    diff = float(np.max(np.abs(ref - got)))
    print(f"   max |loaded - original| = {diff:.2e}")

    print("\n5. Export for deployment (jax.export, symbolic batch)")
    exp = pj.export(loaded, out / "small_cnn.stablehlo")
    again = np.asarray(exp.call(x[:3]))
    print(f"   {out / 'small_cnn.stablehlo'}: runs on batch 3, max diff {np.max(np.abs(again - ref[:3])):.2e}")

    ok = diff <= 1e-5 and np.allclose(again, ref[:3], atol=1e-5)
    print(f"\n{'outputs match' if ok else 'OUTPUTS DIFFER'} (jax {jax.__version__}, {jax.devices()[0].platform})")
    return 0 if ok else 1
