"""conv2d_pool: every kernel computes pool2d(conv2d(...)); the oneDNN one in one call for
channels-last float32 (batches cut across threads, chunks that do not divide a part), the
reference elsewhere, with the unfused ops' derivatives."""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paddlejax.ops import conv2d, conv2d_pool, onednn, pool2d

rng = np.random.default_rng(0)
fused = conv2d_pool.variants["onednn"]
needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN kernels: {onednn.unavailable_reason()}")

CASES = [  # (NCHW input shape, out channels, conv attributes, pool attributes, bias)
    # a batch of 5: cut across two threads as 3 + 2 images
    ((5, 3, 8, 8), 6, dict(padding=1, act="relu"), dict(pool_size=2, pool_stride=2), True),
    ((1, 4, 9, 9), 5, dict(stride=2, padding=1), dict(pool_size=3, pool_stride=2, pool_padding=1), False),
    ((3, 3, 11, 10), 4, dict(padding=((1, 0), (0, 1)), act="relu"),
     dict(pool_size=3, pool_stride=2, ceil_mode=True), False),
    # 32x32x64 float32 convolution outputs: a 1 MiB chunk is 4 of them, parts of 6 and 5 images
    # run 4 + 2 and 4 + 1 (uncut, 4 + 4 + 3)
    ((11, 3, 32, 32), 64, dict(padding=1, act="relu"), dict(pool_size=2, pool_stride=2), True),
    ((2, 4, 9, 9), 8, dict(stride=2, padding=1, groups=2), dict(pool_size=2, pool_stride=1), True),
]
KINDS = {"max": dict(pooling_type="max"), "avg": dict(pooling_type="avg", exclusive=True),
         "avg-inclusive": dict(pooling_type="avg", exclusive=False)}


def operands(case, data_format):
    shape, out_c, conv, _, has_bias = CASES[case]
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((out_c, shape[1] // conv.get("groups", 1), 3, 3)).astype(np.float32)
    b = rng.standard_normal(out_c).astype(np.float32) if has_bias else None
    return (x.transpose(0, 2, 3, 1) if data_format == "NHWC" else x), w, b


def attrs(case, kind, data_format):
    _, _, conv, pool, _ = CASES[case]
    return conv2d_pool.check_attrs({**conv, **pool, **KINDS[kind], "data_format": data_format})


def unfused(x, w, b, a):
    """pool2d(conv2d(...)) by the two ops."""
    y = conv2d(x, w, b, stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=a["groups"],
               act=a["act"], data_format=a["data_format"])
    return pool2d(y, pooling_type=a["pooling_type"], kernel_size=a["pool_size"], stride=a["pool_stride"],
                  padding=a["pool_padding"], ceil_mode=a["ceil_mode"], exclusive=a["exclusive"],
                  data_format=a["data_format"])


def call(kernel, x, w, b, a):
    return kernel(x, w, **a) if b is None else kernel(x, w, b, **a)


def lowered(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


@needs_onednn
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_onednn_kernel_equals_pool_of_conv(case, kind, data_format):
    x, w, b = operands(case, data_format)
    a = attrs(case, kind, data_format)
    got = jax.jit(lambda x, w, b: call(fused, x, w, b, a))(x, w, b)
    np.testing.assert_allclose(got, unfused(x, w, b, a), rtol=2e-5, atol=2e-5)
    # channels last runs the one call; channels first the reference
    text = lowered(lambda x, w, b: call(fused, x, w, b, a), x, w, b)
    assert text.count("custom_call @paddlejax_onednn_conv2d_pool(") == (data_format == "NHWC")


@needs_onednn
def test_uncut_the_chunks_run_on_the_callers_openmp_team():
    """With cutting off (PADDLEJAX_ONEDNN_SPLIT=0) on two CPUs, one call convolves and pools every
    chunk with primitives planned for the calling thread's OpenMP team of two."""
    code = f"""
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import jax, numpy as np
from paddlejax.ops import conv2d_pool
import {__name__.rsplit(".", 1)[-1]} as t
for kind in ("max", "avg"):
    x, w, b = t.operands(3, "NHWC")
    a = t.attrs(3, kind, "NHWC")
    got = jax.jit(lambda x, w, b: t.call(t.fused, x, w, b, a))(x, w, b)
    np.testing.assert_allclose(got, t.unfused(x, w, b, a), rtol=2e-5, atol=2e-5)
print("ok")
"""
    env = {**os.environ, "PADDLEJAX_ONEDNN_SPLIT": "0", "OMP_NUM_THREADS": "2", "ONEDNN_VERBOSE": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    # the chunks' convolutions: 4, 4 and 3 images of the whole batch of 11, no slices of it
    assert set(re.findall(r"convolution,.*?mb(\d+)_ic3oc64_ih32", out.stdout)) == {"4", "3"}


@pytest.mark.parametrize("variant", ["default", *conv2d_pool.variants])
def test_every_variant_equals_the_reference(variant):
    x, w, b = operands(0, "NHWC")
    a = attrs(0, "avg", "NHWC")
    kernel = conv2d_pool.kernel if variant == "default" else conv2d_pool.variants[variant]
    tol = 3e-2 if variant in conv2d_pool.reduced_precision else 2e-5
    np.testing.assert_allclose(jax.jit(lambda *v: call(kernel, *v, a))(x, w, b), unfused(x, w, b, a),
                               rtol=tol, atol=tol)


def test_variants_are_conv2ds_and_the_fused_one():
    assert set(conv2d_pool.variants) == set(conv2d.variants)
    assert conv2d_pool.reduced_precision == conv2d.reduced_precision
    assert set(conv2d_pool.requires) == {"onednn"}
    assert conv2d_pool.traits.weight is None  # not quantized: the passes that quantize see conv2d


@needs_onednn
@pytest.mark.parametrize("case, kind", [(0, "max"), (1, "avg-inclusive"), (2, "avg")])
def test_gradients_are_the_unfused_ops(case, kind):
    x, w, b = operands(case, "NHWC")
    a = attrs(case, kind, "NHWC")
    loss = lambda f: lambda *v: jnp.sum(jnp.sin(call(f, *v, a)))  # noqa: E731
    argnums = (0, 1) if b is None else (0, 1, 2)
    got = jax.jit(jax.grad(loss(fused), argnums))(x, w, b)
    want = jax.grad(lambda *v: jnp.sum(jnp.sin(unfused(*v, a))), argnums)(x, w, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    # forward mode too
    dx = rng.standard_normal(x.shape).astype(np.float32)
    _, tangent = jax.jvp(lambda x: call(fused, x, w, b, a), (x,), (dx,))
    _, want_tangent = jax.jvp(lambda x: unfused(x, w, b, a), (x,), (dx,))
    np.testing.assert_allclose(tangent, want_tangent, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_vmap_and_frozen_weights():
    x, w, b = operands(0, "NHWC")
    a = attrs(0, "max", "NHWC")
    xs = np.stack([x, x[::-1]])
    got = jax.vmap(lambda x: call(fused, x, w, b, a))(xs)
    np.testing.assert_allclose(got, np.stack([unfused(v, w, b, a) for v in xs]), rtol=2e-5, atol=2e-5)
    frozen = jax.jit(lambda x: call(fused, x, w, b, a))  # the weight a constant of the executable
    np.testing.assert_allclose(frozen(x), unfused(x, w, b, a), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(frozen(x[::-1]), unfused(x[::-1], w, b, a), rtol=2e-5, atol=2e-5)


def test_the_op_is_one_equation_and_runs_eagerly():
    x, w, b = operands(2, "NCHW")
    a = attrs(2, "max", "NCHW")
    jaxpr = jax.make_jaxpr(lambda x, w: conv2d_pool(x, w, **a))(x, w)
    assert [e.primitive.name for e in jaxpr.eqns] == ["conv2d_pool"]
    np.testing.assert_allclose(conv2d_pool(x, w, **a), unfused(x, w, None, a), rtol=2e-5, atol=2e-5)


@needs_onednn
@pytest.mark.parametrize("change", [dict(dtype=np.float64), dict(pool_size=2, pool_padding=((2, 0), (0, 0)))],
                         ids=["float64", "a window over padding alone"])
def test_cases_it_does_not_fit_take_the_reference(change):
    x, w, b = operands(0, "NHWC")
    a = conv2d_pool.check_attrs({**attrs(0, "max", "NHWC"), **{k: v for k, v in change.items() if k != "dtype"}})
    with jax.enable_x64(True):
        x, w, b = (jnp.asarray(v, change.get("dtype", np.float32)) for v in (x, w, b))
        assert "paddlejax_onednn_conv2d_pool" not in lowered(lambda x, w, b: call(fused, x, w, b, a), x, w, b)
        np.testing.assert_array_equal(call(fused, x, w, b, a), call(conv2d_pool.kernel, x, w, b, a))


def test_bad_input_is_named():
    x, w, _ = operands(0, "NCHW")
    with pytest.raises(ValueError, match="conv2d_pool: attribute 'pool_size' is required"):
        conv2d_pool(x, w)
    with pytest.raises(ValueError, match="conv2d_pool: input 'x'.*data_format='NHWC'"):
        fused(x, w, **attrs(0, "max", "NHWC"))
    with pytest.raises(ValueError, match="conv2d_pool: attribute 'pooling_type'"):
        conv2d_pool(x, w, pool_size=2, pooling_type="min")


def test_flops_and_the_cost_model():
    a = {"padding": 1, "pooling_type": "max", "pool_size": 2, "data_format": "NHWC"}
    shapes, dtypes = [(8, 16, 16, 32), (32, 32, 3, 3)], ["float32"] * 2
    conv_flops = 2 * 8 * 16 * 16 * 32 * 32 * 9
    assert conv2d_pool.flops(shapes, [(8, 8, 8, 32)], a) == conv_flops + 8 * 8 * 8 * 32 * 4
    default = conv2d_pool.estimate("default", shapes, dtypes, a, "cpu")
    assert conv2d_pool.estimate("onednn", shapes, dtypes, a, "cpu") < default
    assert default > conv2d.estimate("default", shapes, dtypes, conv2d.check_attrs({"padding": 1, "data_format": "NHWC"}),
                                          "cpu")
    nchw = {**a, "data_format": "NCHW"}
    assert conv2d_pool.estimate("onednn", [(8, 32, 16, 16), (32, 32, 3, 3)], dtypes, nchw, "cpu") is None
    assert conv2d_pool.estimate("lax_nhwc", shapes, dtypes, a, "cpu") is None  # computes as the reference
    with_bias = [*shapes, (32,)], [*dtypes, "float32"]
    assert conv2d_pool.estimate("onednn", *with_bias, a, "cpu") < conv2d_pool.estimate("default", *with_bias, a,
                                                                                        "cpu")
