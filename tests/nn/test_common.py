"""Linear, Embedding, Dropout, Flatten and Identity: numbers against numpy, Paddle's
padding_idx rules, and dropout's key state in training, eval and under nnx.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

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
