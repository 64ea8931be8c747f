"""Conv1D, Conv2D, Conv3D and Conv2DTranspose against numpy convolutions, Paddle's parameter
layouts and padding forms, the op in the jaxpr, gradients, nnx.jit, bfloat16, the error for
data in the wrong layout, and traced programs that save and load."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numpy.lib.stride_tricks import sliding_window_view

from jax.test_util import check_grads

import paddlejax.nn as nn
import paddlejax.nn.functional as F

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def np_conv(x, w, stride=(1, 1), pads=((0, 0), (0, 0)), dil=(1, 1), groups=1):
    """NCHW / OIHW grouped convolution over explicit (dilated, strided) windows, float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
    out_c, group_c, kh, kw = w.shape
    span = ((kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1)
    win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::stride[0], ::stride[1], ::dil[0], ::dil[1]]
    n, _, ho, wo = win.shape[:4]
    win = win.reshape(n, groups, group_c, ho, wo, kh, kw)
    return np.einsum("ngchwij,gocij->ngohw", win, w.reshape(groups, out_c // groups, group_c, kh, kw)).reshape(
        n, out_c, ho, wo)


def np_conv_transpose(x, w, stride, pads, out_pad=(0, 0), groups=1):
    """Every input pixel scatters its kernel-weighted copy into the output; then crop the pads."""
    n, cin, h, wd = x.shape
    _, og, kh, kw = w.shape
    full = np.zeros((n, og * groups, (h - 1) * stride[0] + kh + out_pad[0], (wd - 1) * stride[1] + kw + out_pad[1]))
    cg = cin // groups
    for g in range(groups):
        for i in range(h):
            for j in range(wd):
                full[:, g * og:(g + 1) * og, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw] += \
                    np.einsum("nc,coab->noab", x[:, g * cg:(g + 1) * cg, i, j], w[g * cg:(g + 1) * cg])
    (t, b), (left, r) = pads
    return full[:, :, t:full.shape[2] - b, left:full.shape[3] - r]


def np_conv_nd(x, w, pads, stride):
    """Channels-first, one-group convolution in any number of spatial dims, float64."""
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
    win = sliding_window_view(xp, w.shape[2:], axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]
    out, taps = "xyz"[:nd], "ijk"[:nd]
    return np.einsum(f"nc{out}{taps},oc{taps}->no{out}", win, w)


def op_names(fn, *args):
    return [e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns]


def test_conv2d_matches_numpy_with_paddle_layout_and_padding_list():
    conv = nn.Conv2D(4, 6, (3, 2), stride=(2, 1), padding=[1, 1, 2, 0], dilation=(1, 2), groups=2)
    assert conv.weight[...].shape == (6, 2, 3, 2) and conv.bias[...].shape == (6,)
    assert [n for n, _ in conv.named_parameters()] == ["bias", "weight"]
    x = rand(2, 4, 7, 6)
    want = np_conv(x, np.asarray(conv.weight[...]), (2, 1), ((1, 1), (2, 0)), (1, 2), 2)
    np.testing.assert_allclose(conv(x), want + np.asarray(conv.bias[...])[:, None, None], rtol=1e-4, atol=1e-4)


def test_conv2d_nhwc_same_padding_and_four_pair_padding():
    x = rand(1, 3, 5, 5)
    nchw = nn.Conv2D(3, 4, 3, padding="same", bias_attr=False)
    nhwc = nn.Conv2D(3, 4, 3, padding="SAME", data_format="NHWC", weight_attr=nn.initializer.Assign(nchw.weight[...]),
                     bias_attr=False)
    np.testing.assert_allclose(nhwc(x.transpose(0, 2, 3, 1)), np.asarray(nchw(x)).transpose(0, 2, 3, 1), atol=1e-5)
    np.testing.assert_allclose(nchw(x), np_conv(x, np.asarray(nchw.weight[...]), pads=((1, 1), (1, 1))), atol=1e-4)
    pairs = nn.Conv2D(3, 4, 3, padding=[[0, 0], [0, 0], [1, 1], [1, 1]], weight_attr=nn.initializer.Assign(
        nchw.weight[...]), bias_attr=False)
    np.testing.assert_allclose(pairs(x), nchw(x), atol=1e-6)
    assert nchw.bias is None


@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")])
def test_conv2d_padding_modes_pad_the_input_first(mode, np_mode):
    conv = nn.Conv2D(2, 3, 3, padding=2, padding_mode=mode)
    x = rand(1, 2, 5, 4)
    want = np_conv(np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), mode=np_mode), np.asarray(conv.weight[...]))
    np.testing.assert_allclose(conv(x), want + np.asarray(conv.bias[...])[:, None, None], rtol=1e-4, atol=1e-4)
    assert op_names(conv, x) == ["pad", "conv2d"]


def test_conv2d_is_one_op_and_differentiates_and_jits():
    conv = nn.Conv2D(3, 4, 3, stride=2, padding=1)
    x = rand(2, 3, 6, 6)
    assert op_names(conv, x) == ["conv2d"]
    grads = nnx.grad(lambda m: jnp.sum(m(x)))(conv)
    assert np.allclose(grads["bias"][...], 2 * 3 * 3)  # d sum / d bias = N * Ho * Wo
    want = np.einsum("nchwij->cij", sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                          axis=(2, 3))[:, :, ::2, ::2])
    np.testing.assert_allclose(grads["weight"][...], np.broadcast_to(want, (4, 3, 3, 3)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(conv, x), conv(x), atol=1e-5)


def test_conv2d_transpose_matches_numpy_scatter():
    up = nn.Conv2DTranspose(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    assert up.weight[...].shape == (4, 3, 3, 3) and up.bias[...].shape == (6,)
    x = rand(2, 4, 3, 4)
    want = np_conv_transpose(x, np.asarray(up.weight[...]), (2, 2), ((1, 1), (1, 1)), (1, 1), groups=2)
    got = up(x)
    assert got.shape == (2, 6, 6, 8)
    np.testing.assert_allclose(got, want + np.asarray(up.bias[...])[:, None, None], rtol=1e-4, atol=1e-4)
    assert op_names(up, x) == ["conv2d_transpose"]


def test_conv2d_transpose_output_size_picks_the_output_padding():
    up = nn.Conv2DTranspose(2, 2, 3, stride=2, padding=1, bias_attr=False)
    x = rand(1, 2, 4, 4)
    assert up(x).shape == (1, 2, 7, 7)
    np.testing.assert_allclose(up(x, output_size=[8, 7]),
                               np_conv_transpose(x, np.asarray(up.weight[...]), (2, 2), ((1, 1), (1, 1)), (1, 0)),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"Conv2DTranspose: argument 'output_size' expects sizes from \(7, 7\) up "
                                         r"to \(8, 8\)"):
        up(x, output_size=9)


def test_conv1d_and_conv3d_match_numpy_in_both_layouts():
    conv1 = nn.Conv1D(3, 4, 3, stride=2, padding=[1, 0])
    assert conv1.weight[...].shape == (4, 3, 3) and conv1._data_format == "NCL"
    x = rand(2, 3, 8)
    want = np_conv_nd(x, np.asarray(conv1.weight[...]), ((1, 0),), (2,)) + np.asarray(conv1.bias[...])[:, None]
    np.testing.assert_allclose(conv1(x), want, rtol=1e-4, atol=1e-4)
    nlc = nn.Conv1D(3, 4, 3, stride=2, padding=[1, 0], data_format="NLC",
                    weight_attr=nn.initializer.Assign(conv1.weight[...]))
    np.testing.assert_allclose(nlc(x.transpose(0, 2, 1)), want.transpose(0, 2, 1) - np.asarray(conv1.bias[...]),
                               rtol=1e-4, atol=1e-4)
    conv3 = nn.Conv3D(2, 3, (2, 3, 1), padding=[[0, 0], [0, 0], [1, 0], [1, 1], [0, 2]], bias_attr=False)
    assert conv3.weight[...].shape == (3, 2, 2, 3, 1) and conv3.bias is None
    x3 = rand(1, 2, 3, 4, 2)
    want3 = np_conv_nd(x3, np.asarray(conv3.weight[...]), ((1, 0), (1, 1), (0, 2)), (1, 1, 1))
    np.testing.assert_allclose(conv3(x3), want3, rtol=1e-4, atol=1e-4)
    ndhwc = nn.Conv3D(2, 3, (2, 3, 1), padding=[1, 0, 1, 1, 0, 2], data_format="NDHWC", bias_attr=False,
                      weight_attr=nn.initializer.Assign(conv3.weight[...]))
    np.testing.assert_allclose(ndhwc(x3.transpose(0, 2, 3, 4, 1)), want3.transpose(0, 2, 3, 4, 1), rtol=1e-4,
                               atol=1e-4)
    assert op_names(conv1, x) == ["conv1d"] and op_names(conv3, x3) == ["conv3d"]


@pytest.mark.parametrize("padding", ["valid", "VALID", "same"])
def test_conv1d_and_conv3d_take_valid_and_same_padding(padding):
    x1, w1 = np.ones((1, 2, 10), np.float32), np.ones((3, 2, 4), np.float32)
    x3, w3 = np.ones((1, 2, 4, 5, 6), np.float32), np.ones((3, 2, 2, 3, 3), np.float32)
    same = padding == "same"
    assert nn.Conv1D(2, 3, 4, padding=padding)(x1).shape == (1, 3, 10 if same else 7)
    assert F.conv1d(x1, w1, padding=padding).shape == (1, 3, 10 if same else 7)
    assert F.conv3d(x3, w3, padding=padding).shape == ((1, 3, 4, 5, 6) if same else (1, 3, 3, 3, 4))
    if not same:  # VALID is no padding at all
        np.testing.assert_array_equal(F.conv1d(x1, w1, padding=padding), F.conv1d(x1, w1, padding=0))
        np.testing.assert_array_equal(F.conv3d(x3, w3, padding=padding, data_format="NCDHW"),
                                      F.conv3d(x3, w3, padding=0))


def test_conv1d_padding_modes_and_paddle_default_init():
    conv = nn.Conv1D(2, 8, 3, padding=2, padding_mode="circular")
    x = rand(1, 2, 5)
    want = np_conv_nd(np.pad(x, ((0, 0), (0, 0), (2, 2)), mode="wrap"), np.asarray(conv.weight[...]), ((0, 0),), (1,))
    np.testing.assert_allclose(conv(x), want + np.asarray(conv.bias[...])[:, None], rtol=1e-4, atol=1e-4)
    assert op_names(conv, x) == ["pad", "conv1d"]
    nn.seed(0)
    big = nn.Conv3D(4, 64, 3)  # Normal(0, sqrt(2 / (in_channels * prod(kernel))))
    assert abs(float(np.std(np.asarray(big.weight[...]))) - (2 / (4 * 27)) ** 0.5) < 0.01


def test_conv1d_conv3d_gradients_match_the_functional_form():
    conv = nn.Conv3D(2, 3, 2, stride=(1, 2, 1), padding=1)
    x = rand(1, 2, 3, 4, 3)
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(conv)
    want = jax.grad(lambda w, b: jnp.sum(nn.functional.conv3d(x, w, b, (1, 2, 1), 1) ** 2), argnums=(0, 1))(
        conv.weight[...], conv.bias[...])
    np.testing.assert_allclose(grads["weight"][...], want[0], rtol=1e-5)
    np.testing.assert_allclose(grads["bias"][...], want[1], rtol=1e-5)
    with jax.enable_x64(True):
        check_grads(lambda x, w: nn.functional.conv1d(x, w, dilation=2, padding="same"),
                    (jnp.asarray(rand(2, 2, 7), jnp.float64), jnp.asarray(rand(3, 2, 3), jnp.float64)), order=1,
                    modes=("rev",), atol=1e-5, rtol=1e-5)


def test_bfloat16_weights_and_input_run_in_bfloat16():
    conv = nn.Conv1D(4, 4, 3, padding="same")
    x = rand(2, 4, 6)
    want = conv(x)
    conv.weight.set_value(conv.weight[...].astype(jnp.bfloat16))
    conv.bias.set_value(conv.bias[...].astype(jnp.bfloat16))
    got = conv(x.astype(jnp.bfloat16))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), want, rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match=r"conv1d: input 'weight' expects the dtype of 'x' \(float32\)"):
        conv(x)


@pytest.mark.parametrize("layer,x,hint", [
    (lambda: nn.Conv2D(3, 8, 3), rand(2, 16, 16, 3), "pass data_format='NHWC'"),
    (lambda: nn.Conv2D(3, 8, 3, data_format="NHWC"), rand(2, 3, 16, 16), "pass data_format='NCHW'"),
    (lambda: nn.Conv1D(3, 8, 3), rand(2, 16, 3), "pass data_format='NLC'"),
    (lambda: nn.Conv3D(3, 8, 3), rand(1, 16, 6, 6, 3), "pass data_format='NDHWC'"),
    (lambda: nn.Conv2DTranspose(3, 8, 3), rand(2, 16, 16, 3), "pass data_format='NHWC'"),
])
def test_data_in_the_other_layout_names_the_channels_and_data_format(layer, x, hint):
    with pytest.raises(ValueError, match=r"input 'x' .* has 16 channels on axis .* \(data_format='N.*'\), but "
                                         r"'weight' .* takes 3.*the input looks like .* data: " + hint):
        layer()(x)


def test_a_channel_mismatch_without_a_layout_fix_names_both_counts():
    with pytest.raises(ValueError, match=r"^conv2d: input 'x' \(1, 4, 5, 5\) has 4 channels on axis 1 "
                                         r"\(data_format='NCHW'\), but 'weight' \(8, 3, 3, 3\) takes 3$"):
        nn.Conv2D(3, 8, 3)(rand(1, 4, 5, 5))


def test_conv1d_and_conv3d_models_trace_save_and_load(round_trip):
    model = nn.Sequential(nn.Conv1D(2, 4, 3, padding=1, padding_mode="reflect"), nn.ReLU(),
                          nn.Conv1D(4, 2, 1, data_format="NCL"))
    text = round_trip(model, rand(2, 2, 6), tol=1e-5)
    assert "conv1d(" in text and 'data_format="NCL"' in text
    assert "conv3d(" in round_trip(nn.Conv3D(2, 3, 2, stride=2, data_format="NDHWC"), rand(1, 4, 4, 4, 2), tol=1e-5)


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Conv3D(4, 6, (3, 3)), r"Conv3D: argument 'kernel_size' expects an int or 3 ints"),
    (lambda: nn.Conv1D(4, 6, 3, data_format="NCHW"), r"Conv1D: argument 'data_format' expects one of \['NCL', 'NLC'\]"),
    (lambda: nn.Conv1D(4, 6, 3, padding=(1, 2, 3)), r"Conv1D: conv1d: attribute 'padding' expects"),
    (lambda: nn.Conv2D(4, 6, 3, groups=4), r"Conv2D: argument 'groups' expects a divisor of out_channels \(6\)"),
    (lambda: nn.Conv2D(3, 6, 3, groups=2), r"Conv2D: argument 'groups' expects a divisor of in_channels \(3\)"),
    (lambda: nn.Conv2D(3, 6, (3, 3, 3)), r"Conv2D: argument 'kernel_size' expects an int or 2 ints"),
    (lambda: nn.Conv2D(3, 6, 3, stride=0), r"Conv2D: conv2d: attribute 'stride' expects values >= 1"),
    (lambda: nn.Conv2D(3, 6, 3, padding_mode="mirror"), r"Conv2D: argument 'padding_mode' expects one of"),
    (lambda: nn.Conv2D(3, 6, 3, padding=[1, 1], padding_mode="reflect"), r"Conv2D: argument 'padding' expects an int"),
    (lambda: nn.Conv2D(3, 6, 3, data_format="CHWN"), r"Conv2D: argument 'data_format' expects one of"),
    (lambda: nn.Conv2D(3, 6, 3, padding=[[1, 1], [0, 0], [1, 1], [1, 1]]), r"Conv2D: argument 'padding' expects "
                                                                          r"\(0, 0\) pads for the batch"),
])
def test_bad_arguments_fail_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()
