"""The oneDNN convolution variant: it computes what the reference kernel computes, in every case
the autotuner may hand it, and the program still runs where the compiled part is missing."""
import os
import platform
import re
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.ops import batch_norm, conv2d, depthwise_conv2d, onednn
from paddlejax.passes import autotune

needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN kernels: {onednn.unavailable_reason()}")
rng = np.random.default_rng(0)


def f32(*shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="built on Linux x86-64")
def test_the_install_builds_and_loads_the_kernels():
    assert onednn.available(), onednn.unavailable_reason()
    assert "onednn" in autotune.candidates("conv2d") and "onednn" in autotune.candidates("depthwise_conv2d")


CASES = [  # (input NCHW shape, weight shape, attributes)
    ((2, 3, 9, 9), (8, 3, 3, 3), dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)),
    ((2, 4, 10, 7), (6, 4, 3, 2), dict(stride=(2, 1), padding=((1, 0), (2, 1)), dilation=(1, 2), groups=1)),
    ((1, 8, 6, 6), (4, 4, 1, 1), dict(stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=2)),
    ((2, 5, 8, 8), (5, 1, 3, 3), dict(stride=(2, 2), padding="SAME", dilation=(1, 1), groups=5)),
    # cut across two threads: a batch of 5 into 3 + 2; one image into bands of rows with halos
    ((5, 4, 7, 6), (6, 4, 3, 3), dict(stride=(1, 1), padding=((2, 0), (1, 1)), dilation=(2, 1), groups=1)),
    ((1, 3, 11, 5), (4, 3, 3, 3), dict(stride=(2, 1), padding=((2, 1), (0, 1)), dilation=(2, 1), groups=1)),
]


@needs_onednn
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("act", [None, "relu", "leaky_relu", "relu6", "sigmoid", "tanh", "gelu", "gelu_tanh",
                                 "silu", "hard_swish"])
def test_matches_the_reference_kernel(data_format, case, act):
    xs, ws, attrs = CASES[case]
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    if data_format == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    op = depthwise_conv2d if attrs["groups"] == xs[1] and ws[1] == 1 else conv2d
    kw = dict(attrs, data_format=data_format, act=act, act_alpha=0.2 if act == "leaky_relu" else None)
    if op is depthwise_conv2d:
        kw.pop("groups")
    for bias in (b, None):
        want = op.kernel(x, w, bias, **kw)
        got = jax.jit(lambda x, w, bias: op.variants["onednn"](x, w, bias, **kw))(x, w, bias)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_new_weights_of_the_same_shape_are_used_every_call():
    # the kernel keeps the weights it reordered; a new value (even in a reused buffer) must not
    # meet the old one
    x = f32(2, 8, 6, 6)
    call = jax.jit(lambda x, w: conv2d.variants["onednn"](x, w, stride=(1, 1), padding=((1, 1), (1, 1)),
                                                          dilation=(1, 1), data_format="NCHW", groups=1))
    for step in range(6):
        w = f32(16, 8, 3, 3)
        np.testing.assert_allclose(call(x, w), conv2d.kernel(x, w, stride=(1, 1), padding=((1, 1), (1, 1)),
                                                             dilation=(1, 1), data_format="NCHW", groups=1),
                                   rtol=1e-4, atol=1e-4, err_msg=f"call {step}")
        del w


@needs_onednn
def test_executables_with_other_frozen_weights_of_one_shape_each_compute_their_own():
    # frozen weights are trusted by a hash of their content instead of a byte comparison every
    # call: an executable freed and the next compiled with other constants (perhaps at the same
    # address) must not meet the old reordered weights
    from paddlejax.ops.quant import quantized_conv2d

    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NHWC")
    x, x_q = f32(2, 6, 6, 8), int8(2, 6, 6, 8)
    scales = (jnp.float32(2.0), jnp.float32(0.5))
    for step in range(6):
        w, w_q = f32(8, 8, 3, 3), int8(8, 8, 3, 3)
        run = jax.jit(lambda x, x_q: (conv2d.variants["onednn"](x, w, **kw),
                                      quantized_conv2d.variants["onednn"](x_q, w_q, *scales, **kw)))
        got, got_q = run(x, x_q)
        np.testing.assert_allclose(got, conv2d.kernel(x, w, **kw), rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        np.testing.assert_allclose(got_q, quantized_conv2d.kernel(x_q, w_q, *scales, **kw), rtol=1e-5, atol=1e-4)
        del run, w, w_q


def test_the_hash_of_frozen_weights_tells_content_dtype_and_shape_apart_and_arguments_have_none():
    a = np.arange(8, dtype=np.float32)
    ids = {onednn._weights_id(v) for v in (a, a + 1, a.reshape(2, 4), a.view(np.int32), a.astype(np.float64))}
    assert len(ids) == 5 and 0 not in ids
    assert onednn._weights_id(jnp.asarray(a)) == onednn._weights_id(a.copy())
    seen = []
    jax.jit(lambda w: seen.append(onednn._weights_id(w)) or w)(a)
    assert seen == [0]  # an argument: compared byte by byte every call instead


def _nhwc(x, data_format):
    return x.transpose(0, 2, 3, 1) if data_format == "NHWC" else x


@needs_onednn
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("act", [None, "relu", "leaky_relu", "relu6", "gelu"])
def test_gradients_are_those_of_the_reference(data_format, case, act):
    # relu and its kin take their slope from the fused output, the others from the output
    # before the activation; strides that leave input rows uncovered need zeros there
    shape, wshape, attrs = CASES[case]
    x, w, b = _nhwc(f32(*shape), data_format), f32(*wshape), f32(wshape[0])
    kw = dict(attrs, data_format=data_format, act=act)

    def loss(kernel):
        return lambda x, w, b: jnp.sum(jnp.sin(kernel(x, w, b, **kw)))

    want = jax.grad(loss(conv2d.kernel), argnums=(0, 1, 2))(x, w, b)
    got = jax.jit(jax.grad(loss(conv2d.variants["onednn"]), argnums=(0, 1, 2)))(x, w, b)
    for name, g, r in zip("xwb", got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=f"d/d{name}")


@needs_onednn
def test_reverse_mode_runs_the_onednn_backward_kernels():
    x, w = f32(2, 3, 6, 6), f32(4, 3, 3, 3)
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), data_format="NCHW", groups=1)
    hlo = jax.jit(jax.grad(lambda x, w: jnp.sum(conv2d.variants["onednn"](x, w, **kw) ** 2), argnums=(0, 1))
                  ).lower(x, w).as_text()
    for target in ("paddlejax_onednn_conv2d", "paddlejax_onednn_conv2d_backward_data",
                   "paddlejax_onednn_conv2d_backward_weights"):
        assert f"custom_call @{target}(" in hlo
    assert "convolution" not in hlo  # no XLA convolution left


@needs_onednn
def test_forward_mode_second_order_and_vmap_are_those_of_the_reference():
    x, w, b = f32(2, 3, 6, 6), f32(4, 3, 3, 3), f32(4)
    kw = dict(stride=(2, 1), padding=((1, 1), (0, 1)), dilation=(1, 1), data_format="NCHW", groups=1, act="tanh")
    ours, ref = conv2d.variants["onednn"], conv2d.kernel
    tangents = (f32(*x.shape), f32(*w.shape), f32(4))
    for got, want in zip(jax.jvp(lambda *a: ours(*a, **kw), (x, w, b), tangents),
                         jax.jvp(lambda *a: ref(*a, **kw), (x, w, b), tangents)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    def hvp(kernel):  # a Hessian-vector product: forward over reverse, through every transpose
        grad = jax.grad(lambda x, w: jnp.sum(kernel(x, w, b, **kw) ** 3), argnums=(0, 1))
        return jax.jvp(grad, (x, w), tangents[:2])[1]

    for got, want in zip(jax.jit(lambda: hvp(ours))(), hvp(ref)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    xs = f32(3, 2, 3, 6, 6)  # a vmapped axis in front of the batch
    batched = jax.vmap(jax.grad(lambda x: jnp.sum(ours(x, w, b, **kw) ** 2)))(xs)
    np.testing.assert_allclose(batched, jax.vmap(jax.grad(lambda x: jnp.sum(ref(x, w, b, **kw) ** 2)))(xs),
                               rtol=1e-4, atol=1e-4)


def _agree_from_threads(calls, wants, repeats):
    """Runs ``calls[i]`` ``repeats`` times on thread i, all at once; every result must be ``wants[i]``."""
    errors = []

    def work(i):
        for _ in range(repeats):
            if not np.allclose(calls[i](), wants[i], rtol=1e-4, atol=1e-4):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


@needs_onednn
def test_concurrent_calls_with_different_weights_do_not_mix():
    x = f32(4, 16, 8, 8)
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), data_format="NHWC", groups=1)
    x = x.transpose(0, 2, 3, 1)
    call = jax.jit(lambda x, w: conv2d.variants["onednn"](x, w, **kw))
    weights = [f32(32, 16, 3, 3) for _ in range(4)]
    wants = [np.asarray(conv2d.kernel(x, w, **kw)) for w in weights]
    _agree_from_threads([lambda w=w: call(x, w) for w in weights], wants, repeats=20)


@needs_onednn
def test_different_convolutions_run_at_once_from_several_threads():
    # XLA's thread pool runs independent ops together; each oneDNN primitive needs a scratchpad
    # of its own then (a shared one crashed in the channels-first im2col)
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), data_format="NCHW", groups=1)
    cases = [(f32(4, c, s, s), f32(2 * c, c, 3, 3)) for c, s in ((3, 32), (8, 24), (16, 16), (32, 8))]
    calls = [jax.jit(lambda x, w: conv2d.variants["onednn"](x, w, **kw)) for _ in cases]
    wants = [np.asarray(conv2d.kernel(x, w, **kw)) for x, w in cases]
    _agree_from_threads([lambda i=i: calls[i](*cases[i]) for i in range(len(cases))], wants, repeats=30)


def int8(*shape):
    return jnp.asarray(rng.integers(-127, 128, shape), jnp.int8)


@needs_onednn
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_convolution_matches_the_reference(data_format, case, act, per_channel):
    from paddlejax.ops.quant import quantized_conv2d

    xs, ws, attrs = CASES[case]
    x, w = int8(*xs), int8(*ws)
    if data_format == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    x_scale = jnp.float32(3.0)
    w_scale = jnp.asarray(rng.uniform(0.5, 2.0, ws[0]) if per_channel else 1.25, jnp.float32)
    kw = dict(attrs, data_format=data_format, act=act)
    kernel = jax.jit(lambda *a: quantized_conv2d.variants["onednn"](*a, **kw))
    for bias in (f32(ws[0]), None):
        want = quantized_conv2d.kernel(x, w, x_scale, w_scale, bias, **kw)
        np.testing.assert_allclose(kernel(x, w, x_scale, w_scale, bias), want, rtol=1e-5, atol=1e-3)
    # requantized to int8 (the int8 dataflow): one level apart at most, where the float
    # rescale rounds a tie the other way
    out_scale = jnp.float32(np.abs(np.asarray(want)).max() / 2)  # half the range saturates
    bias = f32(ws[0])
    want = quantized_conv2d.kernel(x, w, x_scale, w_scale, bias, out_scale, **kw)
    got = kernel(x, w, x_scale, w_scale, bias, out_scale)
    assert got.dtype == want.dtype == jnp.int8
    diff = np.abs(np.asarray(got, np.int32) - np.asarray(want, np.int32))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@needs_onednn
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("residual_read_again", [False, True])
def test_an_int8_residual_is_added_as_the_reference_adds_it(data_format, case, act, residual_read_again):
    """The residual connection the int8 dataflow fuses: with a relu, oneDNN adds it in place
    (its sum post-op, writing over the residual's buffer unless something reads it again);
    without, the float result takes the residual before the requantize."""
    from paddlejax.ops.quant import quantized_conv2d

    xs, ws, attrs = CASES[case]
    x, w = int8(*xs), int8(*ws)
    if data_format == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    kw = dict(attrs, data_format=data_format, act=act)
    scales = (jnp.float32(3.0), jnp.asarray(rng.uniform(0.5, 2.0, ws[0]), jnp.float32), f32(ws[0]))
    float_out = quantized_conv2d.kernel(x, w, *scales, **kw)
    residual = int8(*float_out.shape)
    operands = (x, w, *scales, jnp.float32(np.abs(np.asarray(float_out)).max()), residual, jnp.float32(40.0))
    want = quantized_conv2d.kernel(*operands, **kw)
    variant = lambda *a: quantized_conv2d.variants["onednn"](*a, **kw)  # noqa: E731
    if residual_read_again:
        got, again = jax.jit(lambda *a: (variant(*a), a[6].astype(jnp.int32) + 1))(*operands)
        np.testing.assert_array_equal(again, np.asarray(residual, np.int32) + 1)  # not overwritten
    else:
        got = jax.jit(variant)(*operands)
    assert got.dtype == want.dtype == jnp.int8
    diff = np.abs(np.asarray(got, np.int32) - np.asarray(want, np.int32))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@needs_onednn
def test_a_residual_of_the_wrong_shape_or_without_its_scale_is_refused_by_name():
    from paddlejax.ops.quant import quantized_conv2d

    xs, ws, attrs = CASES[0]
    kw = dict(attrs, data_format="NCHW", act="relu")
    x, w, s = int8(*xs), int8(*ws), jnp.float32(2.0)
    with pytest.raises(ValueError, match="input 'residual' expects the output's shape"):
        quantized_conv2d.variants["onednn"](x, w, s, s, None, s, int8(2, 8, 9, 8), s, **kw)
    with pytest.raises(ValueError, match="an int8 'residual' needs its 'residual_scale'"):
        quantized_conv2d.variants["onednn"](x, w, s, s, None, s, int8(2, 8, 9, 9), **kw)


def test_cases_it_does_not_fit_take_the_reference():
    x, w = jnp.ones((1, 2, 5, 5), jnp.bfloat16), jnp.ones((3, 2, 3, 3), jnp.bfloat16)
    assert not onednn.conv2d_fits(x, w, "NCHW", None)
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), data_format="NCHW", groups=1)
    got = conv2d.variants["onednn"](x, w, **kw)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, conv2d.kernel(x, w, **kw))


@needs_onednn
def test_a_program_with_the_kernel_chosen_runs_and_saves(tmp_path):
    def net(p, x):
        return pj.ops.conv2d(pj.ops.relu(pj.ops.conv2d(x, p["a"], p["b"], padding=1)), p["c"], padding=1)

    params = {"a": np.asarray(f32(8, 3, 3, 3)), "b": np.asarray(f32(8)), "c": np.asarray(f32(4, 8, 3, 3))}
    prog = pj.trace(net, pj.InputSpec((None, 3, 8, 8)), params=params)
    tuned = prog.clone()
    for op in tuned.walk():
        if op.type == "conv2d":
            op.attrs["kernel"] = "onednn"
    x = np.asarray(f32(2, 3, 8, 8))
    assert "paddlejax_onednn_conv2d" in jax.jit(tuned.apply).lower(tuned.params, x).as_text()
    pj.save(tuned, tmp_path / "p")
    np.testing.assert_allclose(pj.load(tmp_path / "p")(x), prog(x), rtol=1e-4, atol=1e-4)


def test_without_the_extension_everything_still_runs():
    code = """
import jax.numpy as jnp, numpy as np
from paddlejax.ops import batch_norm, conv2d, onednn
from paddlejax.passes import autotune
assert not onednn.available() and "PADDLEJAX_ONEDNN=0" in onednn.unavailable_reason()
assert "onednn" not in autotune.candidates("conv2d")
x, w = jnp.ones((1, 2, 5, 5)), jnp.ones((3, 2, 3, 3))
kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), data_format="NCHW", groups=1)
np.testing.assert_array_equal(conv2d.variants["onednn"](x, w, **kw), conv2d.kernel(x, w, **kw))
bn = dict(epsilon=1e-5, momentum=0.9, training=True, data_format="NCHW")
for got, want in zip(batch_norm.variants["onednn"](x, jnp.zeros(2), jnp.ones(2), **bn),
                     batch_norm.kernel(x, jnp.zeros(2), jnp.ones(2), **bn)):
    np.testing.assert_array_equal(got, want)
try:
    onednn.conv2d(x, w, None, stride=(1, 1), pads=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW")
except RuntimeError as e:
    assert "PADDLEJAX_ONEDNN=0" in str(e)
else:
    raise AssertionError("no error")
print("ok")
"""
    env = {**os.environ, "PADDLEJAX_ONEDNN": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@needs_onednn
def test_convolutions_of_one_shape_each_keep_their_reordered_weights():
    # ResNet-18 has four 64x64x3x3 convolutions: they share one primitive, and each frozen
    # weight must stay reordered across calls (one slot reordered every weight every call)
    code = """
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])  # one CPU: each call one primitive
import jax, jax.numpy as jnp, numpy as np
from paddlejax.ops import conv2d
rng = np.random.default_rng(0)
weights = [jnp.asarray(rng.standard_normal((16, 16, 3, 3)), jnp.float32) for _ in range(6)]
kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NHWC")

def net(x):
    for w in weights:  # compiled in as constants, as a frozen Predictor has them
        x = jnp.tanh(conv2d.variants["onednn"](x, w, **kw))
    return x

x = jnp.asarray(rng.standard_normal((2, 8, 8, 16)), jnp.float32)
want = jax.jit(lambda x: [x := jnp.tanh(conv2d.kernel(x, w, **kw)) for w in weights][-1])(x)
run = jax.jit(net)
for _ in range(4):
    np.testing.assert_allclose(run(x), want, rtol=1e-4, atol=1e-4)
print("ok")
"""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
    executed = [line for line in out.stdout.splitlines() if line.startswith("onednn_verbose,") and ",exec," in line]
    convolutions = [line for line in executed if ",convolution," in line]
    weight_reorders = [line for line in executed if ",reorder," in line and "16x16x3x3" in line]
    assert len(convolutions) == 6 * 4
    assert 1 <= len(weight_reorders) <= 6  # once per weight (none where the primitive takes them plain)


@needs_onednn
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="cutting a convolution needs two CPUs")
def test_on_two_cpus_a_convolution_is_cut_by_batch_or_into_bands_of_rows():
    """XLA's thread pool runs the parts at once, each a one-thread primitive: a batch of 5
    as 3 + 2 images; one image as two bands of 3 output rows, each reading its rows, halo and
    the padding that falls in it (13 rows, stride 2, dilation 2, padding 1 and 2: 8 rows each)."""
    code = """
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import jax, jax.numpy as jnp, numpy as np
from paddlejax.ops import conv2d
rng = np.random.default_rng(0)
kw = dict(stride=(2, 1), padding=((1, 2), (1, 1)), dilation=(2, 1), groups=1, data_format="NHWC")
w = jnp.asarray(rng.standard_normal((8, 4, 3, 3)), jnp.float32)
for n in (5, 1):
    x = jnp.asarray(rng.standard_normal((n, 13, 6, 4)), jnp.float32)
    got = jax.jit(lambda x: conv2d.variants["onednn"](x, w, **kw))(x)
    np.testing.assert_allclose(got, conv2d.kernel(x, w, **kw), rtol=1e-4, atol=1e-4)
print("ok")
"""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
    problems = re.findall(r"mb(\d+)_ic4oc8_ih(\d+)oh(\d+)kh3sh2dh1ph(\d+)", out.stdout)
    assert {tuple(map(int, p)) for p in problems} == {(3, 13, 6, 1), (2, 13, 6, 1), (1, 8, 3, 1), (1, 8, 3, 0)}


@needs_onednn
@pytest.mark.parametrize("pads", [((1, 5), (0, 0)), ((4, 0), (2, 2))])
def test_a_band_of_rows_that_reads_only_padding_is_computed_too(pads):
    # one input row, padding wider than it: the lower band's window starts past the input,
    # so the convolution is not cut into bands (it runs whole) and still equals the reference
    x, w = f32(1, 1, 7, 4), f32(6, 4, 1, 3)
    kw = dict(stride=(1, 1), padding=pads, dilation=(1, 1), groups=1, data_format="NHWC")
    got = jax.jit(lambda x, w: conv2d.variants["onednn"](x, w, **kw))(x, w)
    np.testing.assert_allclose(got, conv2d.kernel(x, w, **kw), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_more_convolutions_of_one_shape_than_kept_weights_still_compute_each_their_own():
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NHWC")
    weights = [f32(8, 8, 3, 3) for _ in range(11)]
    x = f32(2, 6, 6, 8)

    def net(conv, x):
        outs = []
        for w in weights:
            x = jnp.tanh(conv(x, w, **kw))
            outs.append(x)
        return outs

    run = jax.jit(lambda x: net(conv2d.variants["onednn"], x))
    want = jax.jit(lambda x: net(conv2d.kernel, x))(x)
    for _ in range(3):
        for got, expected in zip(run(x), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_a_library_built_from_another_source_than_the_one_beside_it_warns(tmp_path):
    # the build is optional: a failed compile keeps the last library, whose old kernels would
    # otherwise run without a word
    import ctypes
    import warnings
    from pathlib import Path

    library = ctypes.CDLL(str(onednn._extension()))
    source = tmp_path / "onednn.cc"
    source.write_text("// edited since the build\n")
    with pytest.warns(RuntimeWarning, match="built from another onednn.cc"):
        onednn._warn_if_stale(library, source)
    source.write_bytes((Path(onednn.__file__).parent / "onednn.cc").read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        onednn._warn_if_stale(library, source)  # the source it was built from
        onednn._warn_if_stale(library, tmp_path / "absent.cc")  # an installed wheel: no source to compare


@needs_onednn
def test_a_jaxlib_that_refuses_the_kernels_leaves_them_unavailable_with_the_reason(monkeypatch):
    # an extension built against a newer XLA FFI than the installed jaxlib's is refused when
    # registered: the kernels are then unavailable, not an import error
    def refuse(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: the handler's API version (0.5) is incompatible")

    monkeypatch.setattr(jax.ffi, "register_ffi_target", refuse)
    reason = onednn._load.__wrapped__()
    assert reason.startswith("cannot register the oneDNN kernels with this jaxlib") and "API version" in reason


# -- batch norm in training --------------------------------------------------------------------

BN_CASES = [((4, 5, 6, 3), "NHWC"), ((4, 3, 5, 6), "NCHW"), ((8, 3), "NC"), ((2, 3, 7), "NCL"), ((2, 7, 3), "NLC"),
            ((2, 3, 2, 3, 4), "NDHWC")]


def _bn_operands(shape, data_format, affine=True):
    x = f32(*shape) * 3 + 2  # a mean far from 0: the statistics must not lose digits
    c = shape[-1] if data_format.endswith("C") and len(shape) > 2 else shape[1]
    weight, bias = (f32(c) + 1, f32(c)) if affine else (None, None)
    return x, f32(c), jnp.abs(f32(c)) + 0.5, weight, bias


BN = dict(epsilon=1e-5, momentum=0.9, training=True)


@needs_onednn
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("case", range(len(BN_CASES)))
def test_batch_norm_matches_the_reference_with_its_running_statistics(case, affine):
    shape, data_format = BN_CASES[case]
    operands = _bn_operands(shape, data_format, affine)
    got = jax.jit(lambda *a: batch_norm.variants["onednn"](*a, **BN, data_format=data_format))(*operands)
    for name, g, want in zip(("out", "mean_out", "variance_out"), got,
                             batch_norm.kernel(*operands, **BN, data_format=data_format)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5, err_msg=name)


def _bn_loss(kernel, data_format, ct):
    # the output through a ReLU, and the running statistics too (their derivative is rarely
    # asked for, but must be right)
    def loss(x, running_mean, running_var, weight, bias):
        out, mean, var = kernel(x, running_mean, running_var, weight, bias, **BN, data_format=data_format)
        return jnp.vdot(jax.nn.relu(out), ct) + jnp.sum(mean ** 2) + jnp.sum(jnp.sin(var))
    return loss


@needs_onednn
@pytest.mark.parametrize("case", range(len(BN_CASES)))
def test_batch_norm_gradients_are_those_of_the_reference(case):
    shape, data_format = BN_CASES[case]
    operands = _bn_operands(shape, data_format)
    ct = f32(*shape)
    argnums = (0, 3, 4)
    got = jax.jit(jax.grad(_bn_loss(batch_norm.variants["onednn"], data_format, ct), argnums))(*operands)
    want = jax.grad(_bn_loss(batch_norm.kernel, data_format, ct), argnums)(*operands)
    for name, g, w in zip(("x", "weight", "bias"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"d/d{name}")


@needs_onednn
def test_batch_norm_reverse_mode_runs_the_onednn_backward_kernel():
    x, *rest = _bn_operands((4, 6, 6, 8), "NHWC")
    loss = lambda x: jnp.sum(batch_norm.variants["onednn"](x, *rest, **BN, data_format="NHWC")[0] ** 2)  # noqa: E731
    hlo = jax.jit(jax.grad(loss)).lower(x).as_text()
    for target in ("paddlejax_onednn_batch_norm_training", "paddlejax_onednn_batch_norm_backward"):
        assert f"custom_call @{target}(" in hlo


@needs_onednn
def test_batch_norm_forward_mode_second_order_and_vmap_are_those_of_the_reference():
    operands = _bn_operands((4, 3, 5, 5), "NCHW")
    kw = dict(**BN, data_format="NCHW")
    ours, ref = batch_norm.variants["onednn"], batch_norm.kernel
    tangents = tuple(f32(*a.shape) for a in operands)
    for got, want in zip(jax.jvp(lambda *a: ours(*a, **kw), operands, tangents)[1],
                         jax.jvp(lambda *a: ref(*a, **kw), operands, tangents)[1]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    def hvp(kernel):  # forward over reverse: through the tangent map's transpose and back
        grad = jax.grad(lambda x, w: jnp.sum(kernel(x, *operands[1:3], w, operands[4], **kw)[0] ** 3),
                        argnums=(0, 1))
        return jax.jvp(grad, (operands[0], operands[3]), (tangents[0], tangents[3]))[1]

    for got, want in zip(jax.jit(lambda: hvp(ours))(), hvp(ref)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    xs = jnp.stack([operands[0], 2 * operands[0] + 1])  # a vmapped axis in front of the batch
    grad = lambda kernel: jax.vmap(jax.grad(  # noqa: E731
        lambda x: jnp.sum(jnp.tanh(kernel(x, *operands[1:], **kw)[0]))))(xs)
    np.testing.assert_allclose(grad(ours), grad(ref), rtol=1e-4, atol=1e-4)


def test_batch_norm_cases_it_does_not_fit_take_the_reference():
    x, *rest = _bn_operands((4, 3, 5, 5), "NCHW")
    for xs, training in ((x.astype(jnp.bfloat16), True), (x, False)):
        assert not (training and onednn.batch_norm_fits(xs, "NCHW"))
        for got, want in zip(batch_norm.variants["onednn"](xs, *rest, **{**BN, "training": training},
                                                           data_format="NCHW"),
                             batch_norm.kernel(xs, *rest, **{**BN, "training": training}, data_format="NCHW")):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


@needs_onednn
def test_batch_norm_wrong_shapes_are_refused_by_name():
    x, mean, var, weight, bias = _bn_operands((4, 5, 5, 3), "NHWC")
    with pytest.raises(ValueError, match="weight"):
        batch_norm.variants["onednn"](x, mean, var, jnp.ones(4), bias, **BN, data_format="NHWC")


@needs_onednn
def test_batch_norms_of_different_shapes_run_at_once_from_several_threads():
    cases = [_bn_operands(shape, "NHWC") for shape in ((8, 16, 16, 8), (8, 8, 8, 16), (4, 4, 4, 32))]
    calls = [jax.jit(jax.grad(lambda x, *rest: jnp.sum(jnp.tanh(batch_norm.variants["onednn"](
        x, *rest, **BN, data_format="NHWC")[0])))) for _ in cases]
    wants = [np.asarray(jax.grad(lambda x, *rest: jnp.sum(jnp.tanh(batch_norm.kernel(
        x, *rest, **BN, data_format="NHWC")[0])))(*c)) for c in cases]
    _agree_from_threads([lambda i=i: calls[i](*cases[i]) for i in range(len(cases))], wants, repeats=20)
