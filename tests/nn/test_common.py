"""Linear, Embedding, Dropout, Flatten, Identity, Pad1D/2D/3D and Upsample: numbers against
numpy (padding and resizing by Paddle's formulas), Paddle's padding_idx rules, dropout's key
state in training, eval and under nnx.jit, gradients, bfloat16 and saved programs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import paddlejax as pj
import paddlejax.nn as nn

rng = np.random.default_rng(0)


def op_names(layer, *args):
    """Primitives in the layer's jaxpr, traced functionally (nnx forbids mutating a layer's
    state, such as dropout's key, from inside a plain jax trace)."""
    graphdef, state = nnx.split(layer)
    return [e.primitive.name for e in jax.make_jaxpr(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, *args).eqns]


def test_linear_is_x_at_w_plus_b_and_one_op():
    fc = nn.Linear(3, 2)
    assert fc.weight[...].shape == (3, 2) and fc.bias[...].shape == (2,)
    x = rng.normal(size=(4, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(fc(x), x @ np.asarray(fc.weight[...]) + np.asarray(fc.bias[...]), rtol=1e-5, atol=1e-6)
    assert op_names(fc, x) == ["linear"]
    grads = nnx.grad(lambda m: jnp.sum(m(x)))(fc)
    np.testing.assert_allclose(grads["weight"][...], np.broadcast_to(x.sum((0, 1))[:, None], (3, 2)), rtol=1e-5)
    with pytest.raises(ValueError, match="Linear: argument 'weight_attr' expects None, an Initializer or a ParamAttr"):
        nn.Linear(3, 2, weight_attr=False)


def test_embedding_lookup_and_paddle_padding_idx():
    emb = nn.Embedding(6, 3, padding_idx=-2)  # row 4
    table = np.asarray(emb.weight[...])
    assert not table[4].any() and table[3].any()
    ids = np.array([[1, 4], [5, 0]], np.int32)
    np.testing.assert_allclose(emb(ids), table[ids])
    emb.weight.set_value(jnp.ones((6, 3)))  # even a nonzero padding row reads as zeros
    assert not np.asarray(emb(ids))[0, 1].any()
    grads = nnx.grad(lambda m: jnp.sum(m(ids)))(emb)["weight"][...]
    assert grads[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]  # no gradient into the padding row
    assert op_names(emb, ids) == ["embedding"]
    with pytest.raises(ValueError, match=r"Embedding: argument 'padding_idx' expects None or an index in \[-6, 6\)"):
        nn.Embedding(6, 3, padding_idx=6)


def test_dropout_masks_scale_and_differ_between_training_calls():
    drop = nn.Dropout(0.25)
    x = jnp.ones((200, 100))
    key0 = np.asarray(drop.key[...])
    a, b = np.asarray(drop(x)), np.asarray(drop(x))
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.01 and (a != b).any()
    assert (np.asarray(drop.key[...]) != key0).any()  # advanced eagerly
    assert op_names(drop, x) == ["split_key", "dropout"]


def test_dropout_in_eval_and_its_modes():
    x = jnp.full((4, 5), 2.0)
    up, down = nn.Dropout(0.5), nn.Dropout(0.5, mode="downscale_in_infer")
    assert set(np.unique(down(x))) <= {0.0, 2.0}
    up.eval(), down.eval()
    key = np.asarray(up.key[...])
    assert (np.asarray(up(x)) == 2.0).all() and (np.asarray(down(x)) == 1.0).all()
    assert (np.asarray(up.key[...]) == key).all()
    assert op_names(up, x) == []
    assert (np.asarray(nn.Dropout(0.0)(x)) == 2.0).all() and not np.asarray(nn.Dropout(1.0)(x)).any()


def test_dropout_axis_shares_the_mask_along_other_axes():
    y = np.asarray(nn.Dropout(0.5, axis=[0, 2])(jnp.ones((8, 3, 6))))
    assert (y == y[:, :1, :]).all() and (y == 0).any() and (y == 2).any()


def test_dropout_key_advances_under_nnx_jit_and_follows_rngs():
    drop = nn.Dropout(0.5, rngs=nnx.Rngs(dropout=3))
    twin = nn.Dropout(0.5, rngs=nnx.Rngs(dropout=3))
    x = jnp.ones(64)
    step = nnx.jit(lambda m, x: m(x))
    first, second = np.asarray(step(drop, x)), np.asarray(step(drop, x))
    assert (first != second).any()
    np.testing.assert_array_equal(first, twin(x))
    np.testing.assert_array_equal(second, twin(x))
    np.testing.assert_array_equal(drop.key[...], twin.key[...])


def test_flatten_and_identity():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(nn.Flatten()(x), x.reshape(2, -1))
    np.testing.assert_array_equal(nn.Flatten(1, 2)(x), x.reshape(2, 12, 5))
    np.testing.assert_array_equal(nn.Flatten(-2)(x), x.reshape(2, 3, 20))
    assert op_names(nn.Flatten(), x) == ["reshape"]
    with pytest.raises(ValueError, match="Flatten: start_axis 2 and stop_axis 1 do not name an axis range"):
        nn.Flatten(2, 1)(x)
    assert nn.Identity(3, bias=False)(x) is x


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Dropout(1.5), r"Dropout: argument 'p' expects a probability in \[0, 1\], got 1.5"),
    (lambda: nn.Dropout(0.5, mode="scale"), r"Dropout: argument 'mode' expects one of"),
    (lambda: nn.Dropout(0.5, axis="0"), r"Dropout: argument 'axis' expects None, an int or a list of ints"),
    (lambda: nn.Linear(0, 2), r"Linear: argument 'in_features' expects an int >= 1, got 0"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def np_resize_axis(x, axis, out, mode, align_corners=False, align_mode=0, scale=None):
    """One axis resized by Paddle's documented formulas: source ``ratio * j`` (the half-pixel
    ``ratio * (j + 0.5) - 0.5``, clamped at 0, for align_mode 0 without align_corners); nearest
    takes ``int(src)``, linear interpolates between ``int(src)`` and the next index."""
    n = x.shape[axis]
    ratio = ((n - 1) / (out - 1) if align_corners else (1 / scale if scale else n / out)) if out > 1 else 0
    rows = []
    for j in range(out):
        if mode == "nearest":
            rows.append(np.take(x, min(int(ratio * j), n - 1), axis=axis))
            continue
        src = max(ratio * (j + 0.5) - 0.5, 0) if align_mode == 0 and not align_corners else ratio * j
        lo = int(src)
        rows.append((1 - (src - lo)) * np.take(x, lo, axis) + (src - lo) * np.take(x, min(lo + 1, n - 1), axis))
    return np.stack(rows, axis=axis)


@pytest.mark.parametrize("mode,np_mode", [("constant", "constant"), ("reflect", "reflect"),
                                          ("replicate", "edge"), ("circular", "wrap")])
def test_pad2d_modes_match_numpy_and_pad_left_right_top_bottom(mode, np_mode):
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    kwargs = {"constant_values": 1.5} if mode == "constant" else {}
    want = np.pad(x, ((0, 0), (0, 0), (3, 0), (1, 2)), mode=np_mode, **kwargs)  # [left, right, top, bottom]
    np.testing.assert_allclose(nn.Pad2D([1, 2, 3, 0], mode=mode, value=1.5)(x), want)
    nhwc = nn.Pad2D([1, 2, 3, 0], mode=mode, value=1.5, data_format="NHWC")(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(nhwc, want.transpose(0, 2, 3, 1))
    assert op_names(nn.Pad2D(1, mode=mode), x) == ["pad"]


def test_pad1d_and_pad3d_and_padding_gradients():
    x = rng.normal(size=(1, 2, 3, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(nn.Pad3D([0, 1, 2, 0, 1, 1], mode="replicate")(x),
                               np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 0), (0, 1)), mode="edge"))
    np.testing.assert_allclose(nn.Pad1D(2, mode="reflect")(x[:, :, 0, 0]),
                               np.pad(x[:, :, 0, 0], ((0, 0), (0, 0), (2, 2)), mode="reflect"))
    # reflect pads copy interior elements, so those collect several gradients
    grad = jax.grad(lambda v: jnp.sum(nn.Pad1D([2, 0], mode="reflect")(v)))(jnp.ones((1, 1, 4)))
    assert grad.tolist() == [[[1.0, 2.0, 2.0, 1.0]]]
    half = nn.Pad2D(1, mode="circular")(x[:, :, 0].astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16 and half.shape == (1, 2, 5, 6)


@pytest.mark.parametrize("kwargs,shape,ref", [
    ({"scale_factor": 2}, (2, 3, 6, 10),
     lambda x: np_resize_axis(np_resize_axis(x, 2, 6, "nearest", scale=2), 3, 10, "nearest", scale=2)),
    ({"size": [5, 3]}, (2, 3, 5, 3),
     lambda x: np_resize_axis(np_resize_axis(x, 2, 5, "nearest"), 3, 3, "nearest")),
    ({"size": [7, 4], "mode": "bilinear"}, (2, 3, 7, 4),
     lambda x: np_resize_axis(np_resize_axis(x, 2, 7, "linear"), 3, 4, "linear")),
    ({"scale_factor": [1.5, 0.5], "mode": "BILINEAR", "align_mode": 1}, (2, 3, 4, 2),
     lambda x: np_resize_axis(np_resize_axis(x, 2, 4, "linear", align_mode=1, scale=1.5), 3, 2, "linear",
                              align_mode=1, scale=0.5)),
    ({"size": [5, 9], "mode": "bilinear", "align_corners": True}, (2, 3, 5, 9),
     lambda x: np_resize_axis(np_resize_axis(x, 2, 5, "linear", True), 3, 9, "linear", True)),
], ids=["nearest-scale", "nearest-size", "bilinear", "bilinear-align-mode-1", "bilinear-align-corners"])
def test_upsample_matches_paddle_formulas(kwargs, shape, ref):
    x = rng.normal(size=(2, 3, 3, 5)).astype(np.float32)
    got = nn.Upsample(**kwargs)(x)
    assert got.shape == shape
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    nhwc = nn.Upsample(**kwargs, data_format="NHWC")(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(nhwc, np.asarray(got).transpose(0, 2, 3, 1), rtol=1e-6, atol=1e-6)


def test_bilinear_upsampling_agrees_with_jax_image_resize():
    # half-pixel linear upsampling (align_mode 0) is what jax.image.resize computes
    x = rng.normal(size=(1, 2, 4, 3)).astype(np.float32)
    want = jax.image.resize(x, (1, 2, 9, 7), "linear", antialias=False)
    np.testing.assert_allclose(nn.Upsample(size=[9, 7], mode="bilinear")(x), want, rtol=1e-5, atol=1e-6)


def test_resize_to_one_reads_index_zero_and_same_size_copies_as_paddle_does():
    x = np.arange(35.0, dtype=np.float32).reshape(1, 1, 5, 7)
    # Paddle's ratio is 0 for an output axis of size 1: row 0 / column 0, not the centre
    assert nn.Upsample(size=[1, 1], mode="bilinear")(x).tolist() == [[[[0.0]]]]
    assert nn.Upsample(size=[1, 7], mode="bilinear")(x).tolist() == [[[x[0, 0, 0].tolist()]]]
    assert nn.Upsample(scale_factor=0.2, mode="bilinear")(x[:, :, :, :5]).tolist() == [[[[0.0]]]]
    # a scale that rounds down to the input's size copies the input
    np.testing.assert_array_equal(nn.Upsample(scale_factor=1.1, mode="bilinear")(x), x)
    np.testing.assert_array_equal(nn.Upsample(scale_factor=1.1)(x), x)


def test_upsample_of_symbolic_spatial_sizes_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"interpolate: input 'x' expects fixed spatial sizes \(NCHW; the batch size "
                                         r"may be symbolic\), got \(1, 3, d2, d3\)"):
        pj.trace(nn.Upsample(size=[4, 4], mode="bilinear"), pj.InputSpec((1, 3, None, None)))
    program = pj.trace(nn.Upsample(scale_factor=2), pj.InputSpec((None, 3, 2, 2)))
    assert "f32[b,3,4,4]" in str(program)


def test_linear_and_trilinear_upsample_gradients_and_bfloat16():
    x = rng.normal(size=(1, 2, 2, 3, 2)).astype(np.float32)
    tri = nn.Upsample(scale_factor=[2, 1, 1.5], mode="trilinear", data_format="NCDHW")
    want = x.astype(np.float64)
    for axis, out, s in ((2, 4, 2), (3, 3, 1), (4, 3, 1.5)):
        want = np_resize_axis(want, axis, out, "linear", scale=s)
    np.testing.assert_allclose(tri(x), want, rtol=1e-5, atol=1e-6)
    up = nn.UpsamplingBilinear2D(scale_factor=2)
    with jax.enable_x64(True):
        check_grads(up, (jnp.asarray(x[:, :, 0], jnp.float64),), order=1, modes=("rev",))
        check_grads(nn.Upsample(size=[5], mode="linear", data_format="NWC"), (jnp.asarray(x[:, 0, 0], jnp.float64),),
                    order=1, modes=("rev",))
    half = up(x[:, :, 0].astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(half), up(x[:, :, 0]), rtol=2e-2, atol=2e-2)
    assert nn.UpsamplingNearest2D(size=[4, 4])(x[:, :, 0]).shape == (1, 2, 4, 4)


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Pad2D([1, 2, 3]), r"Pad2D: argument 'padding' expects an int or 4 ints >= 0"),
    (lambda: nn.Pad2D(1, mode="edge"), r"Pad2D: argument 'mode' expects one of \['constant', 'reflect', "),
    (lambda: nn.Pad1D(1, data_format="NCHW"), r"Pad1D: argument 'data_format' expects one of \['NCL', 'NLC'\]"),
    (lambda: nn.Pad2D(3, mode="reflect")(np.zeros((1, 1, 3, 3), np.float32)), r"pad: attribute 'paddings' expects "
                                                                                r"pads that fit"),
    (lambda: nn.Pad2D(1)(np.zeros((1, 3, 3), np.float32)), r"Pad2D: input 'x' expects rank 4"),
    (lambda: nn.Upsample(), r"Upsample: argument 'size' expects exactly one of size and scale_factor"),
    (lambda: nn.Upsample(scale_factor=2, mode="bicubic"), r"Upsample: interpolate: attribute 'mode' expects one of"),
    (lambda: nn.Upsample(scale_factor=2, mode="linear")(np.zeros((1, 1, 3, 3), np.float32)),
     r"interpolate: attribute 'mode' expects 'nearest' or 'bilinear' for a rank-4 input, got 'linear'"),
    (lambda: nn.Upsample(size=3)(np.zeros((1, 1, 3), np.float32)),
     r"interpolate: attribute 'data_format' expects a layout of rank 3 \(NCW, NWC\), got 'NCHW'"),
    (lambda: nn.Upsample(scale_factor=2, align_corners=True),  # refused when built, not on the first call
     r"Upsample: argument 'align_corners' expects False with mode='nearest' \(as in Paddle\), got True"),
])
def test_pad_and_upsample_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_pad_and_upsample_model_traces_saves_and_loads(round_trip):
    model = nn.Sequential(nn.Pad2D([1, 0, 2, 1], mode="reflect"), nn.Upsample(scale_factor=1.5, mode="bilinear"),
                          nn.Pad2D(1, value=-1.0))
    text = round_trip(model, rng.normal(size=(2, 3, 4, 4)).astype(np.float32), tol=1e-5)
    assert 'interpolate(' in text and 'mode="reflect"' in text
