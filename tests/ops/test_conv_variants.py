"""The winograd and lax_bf16 conv variants: each computes the op's function (winograd to float32
rounding, lax_bf16 to bfloat16's), winograd only where it applies and lax.conv elsewhere."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import paddlejax.ops as ops
from paddlejax.ops.conv import winograd_applies

rng = np.random.default_rng(3)


def rand(*shape):
    return np.asarray(rng.normal(size=shape), np.float32)


def conv_inputs(h, w, cin=5, cout=4, k=3, groups=1, data_format="NCHW"):
    x = rand(2, cin, h, w) if data_format == "NCHW" else rand(2, h, w, cin)
    return x, rand(cout, cin // groups, k, k), rand(cout)


def run_variant(op, name, x, w, b, attrs):
    """The variant's output, eager and jitted (they must agree), with the op's full attributes."""
    full = op.check_attrs(attrs)
    kernel = op.variants[name]
    eager = np.asarray(kernel(x, w, b, **full))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda *a: kernel(*a, **full))(x, w, b)), eager,
                               rtol=1e-5, atol=1e-5)
    return eager


def assert_relative(got, want, tol):
    """``got`` equals ``want`` to ``tol`` of the output's largest magnitude."""
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * float(np.abs(want).max()))


def lax_convs(op, name, x, w, b, attrs):
    """How many lax convolutions the variant's jaxpr holds."""
    kernel, full = op.variants[name], op.check_attrs(attrs)
    return str(jax.make_jaxpr(lambda *a: kernel(*a, **full))(x, w, b)).count("conv_general_dilated")


WINOGRAD_CASES = [  # (height, width, attributes): odd and even output sizes, every padding form
    (8, 8, dict(padding=1)),
    (7, 9, dict(padding="SAME", act="relu")),
    (7, 6, dict(padding="VALID")),
    (6, 7, dict(padding=((2, 0), (0, 1)), act="leaky_relu", act_alpha=0.2)),
    (5, 5, dict(padding=((-1, 1), (1, 1)))),
    (3, 3, dict()),
]


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("h, w, attrs", WINOGRAD_CASES)
def test_winograd_equals_the_reference(data_format, h, w, attrs):
    attrs = {**attrs, "data_format": data_format}
    x, weight, bias = conv_inputs(h, w, data_format=data_format)
    want = np.asarray(ops.conv2d(x, weight, bias, **attrs))
    assert lax_convs(ops.conv2d, "winograd", x, weight, bias, attrs) == 0  # computed by Winograd
    assert_relative(run_variant(ops.conv2d, "winograd", x, weight, bias, attrs), want, 1e-4)


def test_winograd_is_accurate_with_many_channels():
    x, weight, bias = conv_inputs(10, 10, cin=64, cout=32)
    want = np.asarray(ops.conv2d(x, weight, bias, padding=1))
    assert_relative(run_variant(ops.conv2d, "winograd", x, weight, bias, dict(padding=1)), want, 1e-5)


@pytest.mark.parametrize("k, attrs", [
    (3, dict(groups=5, padding=1)),
    (3, dict(stride=2, padding=1)),
    (3, dict(dilation=2, padding=2, data_format="NHWC")),
    (5, dict(padding="SAME")),
])
def test_winograd_falls_back_to_lax_conv_elsewhere(k, attrs):
    groups = attrs.get("groups", 1)
    x, weight, bias = conv_inputs(9, 8, cin=5, cout=5, k=k, groups=groups, data_format=attrs.get("data_format", "NCHW"))
    want = np.asarray(ops.conv2d(x, weight, bias, **attrs))
    assert lax_convs(ops.conv2d, "winograd", x, weight, bias, attrs) == 1
    assert_relative(run_variant(ops.conv2d, "winograd", x, weight, bias, attrs), want, 1e-6)


def test_winograd_falls_back_for_half_precision():
    x, weight, bias = (a.astype(np.float16) for a in conv_inputs(6, 6))
    assert not winograd_applies(weight.shape, (1, 1), (1, 1), 1, x.dtype)
    assert lax_convs(ops.conv2d, "winograd", x, weight, bias, dict(padding=1)) == 1


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("attrs", [dict(padding="SAME", act="relu"), dict(padding=((2, 0), (1, 1)), stride=2),
                                   dict(groups=5, padding=1)])
def test_lax_bf16_conv2d_equals_the_reference_to_bfloat16_rounding(data_format, attrs):
    attrs = {**attrs, "data_format": data_format}
    x, weight, bias = conv_inputs(7, 9, cin=5, cout=5, groups=attrs.get("groups", 1), data_format=data_format)
    want = np.asarray(ops.conv2d(x, weight, bias, **attrs))
    got = run_variant(ops.conv2d, "lax_bf16", x, weight, bias, attrs)
    assert_relative(got, want, 1e-2)
    assert np.abs(got - want).max() > 1e-5 * np.abs(want).max()  # really computed in bfloat16


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_lax_bf16_depthwise_equals_the_reference_to_bfloat16_rounding(data_format):
    x, weight, bias = conv_inputs(7, 8, cin=3, cout=6, groups=3, data_format=data_format)
    attrs = dict(padding=1, act="relu6", data_format=data_format)
    want = np.asarray(ops.depthwise_conv2d(x, weight, bias, **attrs))
    assert_relative(run_variant(ops.depthwise_conv2d, "lax_bf16", x, weight, bias, attrs), want, 1e-2)


def test_only_lax_bf16_is_reduced_precision():
    assert ops.conv2d.reduced_precision == {"lax_bf16"}
    assert ops.depthwise_conv2d.reduced_precision == {"lax_bf16"}
    assert "winograd" in ops.conv2d.variants and "winograd" not in ops.depthwise_conv2d.variants
