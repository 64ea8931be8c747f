"""The oneDNN pooling variant of pool2d: it computes what the reference kernel computes (max
pooling exactly, int8 too; average pooling to float32 rounding) in every case the autotuner may
hand it, with the reference's derivatives, and takes the reference where it does not fit."""
import os
import re
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.ops import onednn, pool2d
from paddlejax.passes import autotune
from paddlejax.passes.base import PassContext

pytestmark = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN kernels: {onednn.unavailable_reason()}")
rng = np.random.default_rng(0)
onednn_pool = pool2d.variants["onednn"]

CASES = [  # (NCHW input shape, attributes)
    # a batch of 5: cut across two threads as 3 + 2 images
    ((5, 3, 8, 8), dict(kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)),
    ((1, 4, 9, 9), dict(kernel_size=(3, 3), stride=(2, 2), padding=((1, 1), (1, 1)), ceil_mode=False)),
    # ceil mode on odd sizes: a last partial window, as more bottom and right padding
    ((2, 3, 7, 7), dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=True)),
    ((5, 2, 7, 6), dict(kernel_size=(3, 2), stride=(2, 1), padding=((1, 0), (1, 1)), ceil_mode=True)),
    ((3, 2, 5, 5), dict(kernel_size=(2, 2), stride=(1, 1), padding="SAME", ceil_mode=False)),
]
KINDS = {"max": dict(pooling_type="max", exclusive=True), "avg": dict(pooling_type="avg", exclusive=True),
         "avg-inclusive": dict(pooling_type="avg", exclusive=False)}


def attrs(case, kind, data_format):
    return dict(CASES[case][1], **KINDS[kind], global_pooling=False, data_format=data_format)


def image(shape, data_format, dtype=jnp.float32):
    x = rng.standard_normal(shape).astype(np.float32)
    return jnp.asarray(x.transpose(0, 2, 3, 1) if data_format == "NHWC" else x, dtype)


def assert_same(got, want, kind):
    assert got.dtype == want.dtype and got.shape == want.shape
    if kind == "max":
        np.testing.assert_array_equal(got, want)
    else:  # oneDNN sums a window in another order than XLA
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def lowered(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_the_reference_kernel(case, kind, data_format):
    x, kw = image(CASES[case][0], data_format), attrs(case, kind, data_format)
    assert "paddlejax_onednn_pool2d" in lowered(lambda x: onednn_pool(x, **kw), x)
    assert_same(jax.jit(lambda x: onednn_pool(x, **kw))(x), pool2d.kernel(x, **kw), kind)


def test_runs_eagerly_and_pools_globally():
    x = image((3, 6, 5, 4), "NHWC")
    for kind in KINDS:
        kw = dict(attrs(0, kind, "NHWC"), global_pooling=True)
        got = onednn_pool(x, **kw)
        assert got.shape == (3, 1, 1, 6)
        assert_same(got, pool2d.kernel(x, **kw), kind)


def int8_image(shape, dtype=jnp.int8):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, shape)
    x[:, :3, :3] = info.min  # windows of the lowest value only, with and without padding
    x[0] = info.max
    return jnp.asarray(x, dtype)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_int8_max_pooling_is_exact(case, dtype):
    kw = attrs(case, "max", "NHWC")
    n, c, h, w = CASES[case][0]
    x = int8_image((n, h, w, c), dtype)
    got = jax.jit(lambda x: onednn_pool(x, **kw))(x)
    assert "paddlejax_onednn_pool2d" in lowered(lambda x: onednn_pool(x, **kw), x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, pool2d.kernel(x, **kw))
    # and the max of the float values, independently of the integer reference
    np.testing.assert_array_equal(np.asarray(got, np.float32), pool2d.kernel(x.astype(jnp.float32), **kw))


def test_int8_min_values_under_padding_stay_min():
    x = jnp.full((2, 3, 3, 4), -128, jnp.int8)
    kw = dict(attrs(1, "max", "NHWC"))
    got = jax.jit(lambda x: onednn_pool(x, **kw))(x)
    np.testing.assert_array_equal(got, np.full((2, 2, 2, 4), -128, np.int8))


def linear_loss(kernel, kw, ct):
    # linear in the output, so that the cotangent reaching the pooling is the same whichever
    # kernel computed the forward pass (an average rounds differently)
    return lambda x: jnp.vdot(kernel(x, **kw), ct)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", [1, 3])
def test_gradients_are_the_reference_kernels(case, kind, data_format):
    x, kw = image(CASES[case][0], data_format), attrs(case, kind, data_format)
    ct = jax.random.normal(jax.random.key(case), pool2d.kernel(x, **kw).shape)
    want = jax.grad(linear_loss(pool2d.kernel, kw, ct))(x)
    np.testing.assert_array_equal(jax.grad(linear_loss(onednn_pool, kw, ct))(x), want)
    np.testing.assert_array_equal(jax.jit(jax.grad(linear_loss(onednn_pool, kw, ct)))(x), want)
    # and through a nonlinearity after the pooling (which reads oneDNN's output), to float32 rounding
    loss = lambda kernel: lambda x: jnp.sum(jnp.sin(kernel(x, **kw)))  # noqa: E731
    assert "paddlejax_onednn_pool2d" in lowered(jax.grad(loss(onednn_pool)), x)
    np.testing.assert_allclose(jax.jit(jax.grad(loss(onednn_pool)))(x), jax.grad(loss(pool2d.kernel))(x),
                               rtol=1e-5, atol=1e-6)


def test_forward_mode_and_vmap_are_those_of_the_reference():
    kw = attrs(3, "max", "NHWC")
    x = image(CASES[3][0], "NHWC")
    dx = jax.random.normal(jax.random.key(1), x.shape)
    for got, want in zip(jax.jvp(lambda x: onednn_pool(x, **kw), (x,), (dx,)),
                         jax.jvp(lambda x: pool2d.kernel(x, **kw), (x,), (dx,))):
        np.testing.assert_array_equal(got, want)
    xs = jnp.stack([x, -x, 2 * x])  # a vmapped axis in front of the batch
    for kind in KINDS:
        kw = attrs(3, kind, "NHWC")
        assert_same(jax.jit(jax.vmap(lambda x: onednn_pool(x, **kw)))(xs),
                    jax.vmap(lambda x: pool2d.kernel(x, **kw))(xs), kind)
    grad = lambda kernel: jax.vmap(jax.grad(lambda x: jnp.sum(kernel(x, **kw) ** 2)))(xs)  # noqa: E731
    np.testing.assert_allclose(grad(onednn_pool), grad(pool2d.kernel), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("x, kw", [
    (image((2, 3, 6, 6), "NHWC", jnp.bfloat16), attrs(0, "max", "NHWC")),
    (image((2, 3, 6, 6), "NHWC", jnp.float16), attrs(1, "avg", "NHWC")),
    (jnp.asarray(rng.integers(-5, 5, (2, 6, 6, 3)), jnp.int32), attrs(0, "max", "NHWC")),
    (int8_image((2, 3, 6, 6)), attrs(1, "max", "NCHW")),  # oneDNN's is scalar code there
    (image((2, 3, 6, 6), "NCHW"), dict(attrs(0, "max", "NCHW"), padding=((2, 2), (0, 0)))),  # windows of padding
    (image((2, 3, 6, 6), "NCHW"), dict(attrs(0, "avg", "NCHW"), padding=((0, 0), (2, 2)))),
    (image((0, 3, 6, 6), "NCHW"), attrs(0, "avg", "NCHW")),
], ids=["bfloat16", "float16", "int32", "int8-nchw", "max-padding-window", "avg-padding-window", "empty"])
def test_cases_it_does_not_fit_take_the_reference(x, kw):
    assert "custom_call" not in lowered(lambda x: onednn_pool(x, **kw), x)
    got, want = jax.jit(lambda x: onednn_pool(x, **kw))(x), pool2d.kernel(x, **kw)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # nan where a window averages padding alone


def test_float64_takes_the_reference():
    with jax.enable_x64(True):
        x = jnp.asarray(rng.standard_normal((2, 5, 5, 3)))
        kw = attrs(1, "avg", "NHWC")
        assert x.dtype == jnp.float64 and "custom_call" not in lowered(lambda x: onednn_pool(x, **kw), x)
        np.testing.assert_array_equal(onednn_pool(x, **kw), pool2d.kernel(x, **kw))


def test_bad_input_gets_the_reference_kernels_errors():
    with pytest.raises(ValueError, match="pool2d: input 'x'.*floating values for average pooling"):
        onednn_pool(int8_image((2, 6, 6, 3)), **attrs(0, "avg", "NHWC"))
    with pytest.raises(ValueError, match="pool2d.*kernel_size"):
        onednn_pool(image((1, 3, 4, 4), "NHWC"), **dict(attrs(0, "max", "NHWC"), kernel_size=(6, 6)))


def test_a_program_with_the_kernel_chosen_runs_and_saves(tmp_path):
    def net(x):
        y = pj.ops.pool2d(x, pooling_type="max", kernel_size=2, stride=2, data_format="NHWC")
        return pj.ops.pool2d(jnp.tanh(y), pooling_type="avg", kernel_size=3, stride=2, padding=1, ceil_mode=True,
                             data_format="NHWC")

    prog = pj.trace(net, pj.InputSpec((None, 10, 10, 4)))
    tuned = prog.clone()
    for op in tuned.walk():
        if op.type == "pool2d":
            op.attrs["kernel"] = "onednn"
    x = np.asarray(image((5, 4, 10, 10), "NHWC"))
    assert jax.jit(tuned.apply).lower(tuned.params, x).as_text().count("custom_call @paddlejax_onednn_pool2d(") == 2
    np.testing.assert_allclose(tuned(x), prog(x), rtol=1e-6, atol=1e-6)
    pj.save(tuned, tmp_path / "p")
    np.testing.assert_allclose(pj.load(tmp_path / "p")(x), prog(x), rtol=1e-6, atol=1e-6)


def test_the_autotuner_times_it_and_keeps_it_where_it_wins(tmp_path, monkeypatch):
    assert "onednn" in autotune.candidates("pool2d")
    timed = []

    def measure(candidate, fn, args, **kwargs):
        timed.append(candidate)
        fn(*args)  # the compiled candidate runs
        return {"onednn": 1e-4}.get(candidate, 3e-4)

    monkeypatch.setattr(autotune, "measure", measure)
    prog = pj.trace(lambda x: pj.ops.pool2d(x, kernel_size=2, stride=2, data_format="NHWC"),
                    pj.InputSpec((None, 8, 8, 16)))
    tuned = prog.clone()
    tune = pj.passes.get_pass("autotune", sizes="b=4", cache=str(tmp_path / "c.json"), check=False, layout="keep")
    assert tune.apply(tuned, PassContext()).stats["tuned"] == 1
    assert sorted(timed) == ["default", "onednn"]
    assert [op.attrs.get("kernel") for op in tuned.walk() if op.type == "pool2d"] == ["onednn"]
    x = np.asarray(image((4, 16, 8, 8), "NHWC"))
    np.testing.assert_array_equal(tuned(x), prog(x))


def test_the_cost_model_ranks_it_first_on_a_cpu_and_skips_what_it_does_not_fit():
    sig = {"op": "pool2d", "shapes": [[32, 16, 16, 64]], "dtypes": ["float32"],
           "attrs": {"kernel_size": {"tuple": [2, 2]}, "stride": {"tuple": [2, 2]}, "data_format": "NHWC"}}
    assert autotune.predicted_speedups(sig, "cpu")["onednn"] > 1
    assert autotune.predicted_speedups(sig, "gpu")["onednn"] is None
    assert autotune.predicted_speedups({**sig, "dtypes": ["bfloat16"]}, "cpu")["onednn"] is None
    int8_nchw = {**sig, "shapes": [[32, 64, 16, 16]], "dtypes": ["int8"],
                 "attrs": {**sig["attrs"], "data_format": "NCHW"}}
    assert autotune.predicted_speedups(int8_nchw, "cpu")["onednn"] is None


def test_different_poolings_run_at_once_from_several_threads():
    # no lock and no shared scratchpad: XLA's thread pool runs independent ops together
    cases = [(image(shape, fmt), attrs(case, kind, fmt)) for shape, case, kind, fmt in (
        ((8, 16, 16, 16), 0, "max", "NHWC"), ((4, 8, 12, 12), 1, "avg", "NCHW"), ((6, 32, 9, 9), 2, "avg", "NHWC"))]
    calls = [jax.jit(lambda x, kw=kw: onednn_pool(x, **kw)) for _, kw in cases]
    wants = [np.asarray(pool2d.kernel(x, **kw)) for x, kw in cases]
    errors = []

    def work(i):
        for _ in range(20):
            if not np.allclose(calls[i](cases[i][0]), wants[i], rtol=1e-6, atol=1e-6):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="cutting a pooling needs two CPUs")
def test_on_two_cpus_the_batch_is_cut_and_one_image_runs_whole():
    code = """
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import jax, jax.numpy as jnp, numpy as np
from paddlejax.ops import pool2d
kw = dict(pooling_type="max", kernel_size=(3, 3), stride=(2, 2), padding=((1, 1), (1, 1)), ceil_mode=False,
          global_pooling=False, exclusive=True, data_format="NHWC")
for n in (5, 1):
    x = jnp.asarray(np.random.default_rng(n).standard_normal((n, 9, 9, 4)), jnp.float32)
    got = jax.jit(lambda x: pool2d.variants["onednn"](x, **kw))(x)
    np.testing.assert_array_equal(got, pool2d.kernel(x, **kw))
print("ok")
"""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
    batches = re.findall(r",exec,cpu,pooling,.*,mb(\d+)ic4_ih9oh5kh3", out.stdout)
    assert sorted(map(int, batches)) == [1, 2, 3]


def test_without_the_extension_the_variant_is_the_reference():
    code = """
import jax.numpy as jnp, numpy as np
from paddlejax.ops import onednn, pool2d
from paddlejax.passes import autotune
assert not onednn.available() and "onednn" not in autotune.candidates("pool2d")
x = jnp.arange(50.0).reshape(2, 5, 5, 1)
kw = dict(pooling_type="avg", kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=True,
          global_pooling=False, exclusive=True, data_format="NHWC")
np.testing.assert_array_equal(pool2d.variants["onednn"](x, **kw), pool2d.kernel(x, **kw))
print("ok")
"""
    env = {**os.environ, "PADDLEJAX_ONEDNN": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
