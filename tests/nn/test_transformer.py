"""MultiHeadAttention and the Transformer layers against numpy references of Paddle's
formulas, mask forms, dropout in training, layer stacking, gradients and nnx.jit; decoding
with Paddle's caches, growing and fixed-capacity, against the full causal decoder."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import paddlejax.nn as nn

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def val(param):
    return np.asarray(param[...], np.float64)


def np_linear(layer, x):
    return x @ val(layer.weight) + val(layer.bias)


def np_mha(mha, q_in, k_in, v_in, mask=None):
    """Paddle's attention: per-head softmax(q k^T / sqrt(d) + mask) v, then the output projection;
    a boolean mask adds -1e9 where False."""
    def heads(proj, x):
        b, s, _ = x.shape
        return np_linear(proj, x).reshape(b, s, mha.num_heads, -1).transpose(0, 2, 1, 3)

    q, k, v = heads(mha.q_proj, q_in), heads(mha.k_proj, k_in), heads(mha.v_proj, v_in)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits + (np.where(mask, 0.0, -1e9) if mask.dtype == bool else mask)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(q_in.shape[0], q_in.shape[1], -1)
    return np_linear(mha.out_proj, out), weights


def np_layer_norm(norm, x):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * val(norm.weight) + val(norm.bias)


def np_feed_forward(layer, x):
    return np_linear(layer.linear2, np.maximum(np_linear(layer.linear1, x), 0))


def np_encoder_layer(layer, x, mask=None):
    if layer.normalize_before:
        x = x + np_mha(layer.self_attn, *[np_layer_norm(layer.norm1, x)] * 3, mask)[0]
        return x + np_feed_forward(layer, np_layer_norm(layer.norm2, x))
    x = np_layer_norm(layer.norm1, x + np_mha(layer.self_attn, x, x, x, mask)[0])
    return np_layer_norm(layer.norm2, x + np_feed_forward(layer, x))


def np_decoder_layer(layer, tgt, memory, tgt_mask=None, memory_mask=None):
    x = np_layer_norm(layer.norm1, tgt + np_mha(layer.self_attn, tgt, tgt, tgt, tgt_mask)[0])
    x = np_layer_norm(layer.norm2, x + np_mha(layer.cross_attn, x, memory, memory, memory_mask)[0])
    return np_layer_norm(layer.norm3, x + np_feed_forward(layer, x))


def op_names(fn, *args):
    return [e.primitive.name for e in jax.make_jaxpr(fn)(*args).eqns]


causal = np.tril(np.ones((4, 4), bool))


@pytest.mark.parametrize("mask", [None, causal, causal.astype(np.int32), rand(2, 1, 4, 4)],
                         ids=["none", "bool", "int", "additive"])
def test_attention_matches_numpy_and_uses_the_attention_op(mask):
    mha = nn.MultiHeadAttention(8, 2)
    x = rand(2, 4, 8)
    want = np_mha(mha, x, x, x, None if mask is None else (mask.astype(bool) if mask.dtype == np.int32 else mask))[0]
    np.testing.assert_allclose(mha(x, attn_mask=mask), want, rtol=1e-4, atol=1e-4)
    names = op_names(lambda x: mha(x, attn_mask=mask), x)
    assert "scaled_dot_product_attention" in names and names.count("linear") == 4


def test_attention_weights_cross_attention_and_kdim_vdim():
    mha = nn.MultiHeadAttention(8, 4, kdim=6, vdim=5, need_weights=True)
    assert mha.k_proj.weight[...].shape == (6, 8) and mha.v_proj.weight[...].shape == (5, 8)
    q, k, v = rand(2, 3, 8), rand(2, 7, 6), rand(2, 7, 5)
    mask = rng.random((2, 1, 3, 7)) > 0.3
    out, weights = mha(q, k, v, mask)
    want_out, want_weights = np_mha(mha, q, k, v, mask)
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-4, atol=1e-5)
    assert "scaled_dot_product_attention" not in op_names(lambda *a: mha(*a, mask), q, k, v)


def test_attention_dropout_only_while_training():
    mha = nn.MultiHeadAttention(8, 2, dropout=0.5)
    x = rand(2, 4, 8)
    assert not np.allclose(mha(x), mha(x))
    mha.eval()
    np.testing.assert_allclose(mha(x), np_mha(mha, x, x, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_matches_numpy(normalize_before):
    layer = nn.TransformerEncoderLayer(8, 2, 16, normalize_before=normalize_before)
    layer.eval()
    x = rand(2, 4, 8)
    np.testing.assert_allclose(layer(x, causal), np_encoder_layer(layer, x, causal), rtol=1e-4, atol=1e-4)


def test_encoder_stacks_fresh_layers_of_the_same_configuration():
    first = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", normalize_before=True)
    encoder = nn.TransformerEncoder(first, 3, norm=nn.LayerNorm(8))
    layers = list(encoder.layers)
    assert layers[0] is first and encoder.num_layers == 3
    assert all(layer.normalize_before and layer.activation == "gelu" for layer in layers)
    assert not np.allclose(layers[1].linear1.weight[...], layers[2].linear1.weight[...])
    x = rand(2, 4, 8)
    want = x
    for layer in layers:
        want = layer(want)
    np.testing.assert_allclose(encoder(x), encoder.norm(want), rtol=1e-5, atol=1e-5)


def test_decoder_layer_matches_numpy_and_decoder_stacks():
    layer = nn.TransformerDecoderLayer(8, 2, 16)
    layer.eval()
    tgt, memory = rand(2, 4, 8), rand(2, 5, 8)
    memory_mask = np.ones((1, 1, 1, 5), bool)
    memory_mask[..., 3] = False
    got = layer(tgt, memory, causal, memory_mask)
    np.testing.assert_allclose(got, np_decoder_layer(layer, tgt, memory, causal, memory_mask), rtol=1e-4, atol=1e-4)
    decoder = nn.TransformerDecoder(layer, 2)
    assert len(decoder.layers) == 2 and decoder.layers[1].cross_attn.q_proj.weight[...].shape == (8, 8)
    assert decoder(tgt, memory, causal, memory_mask).shape == (2, 4, 8)


def test_training_under_nnx_jit_updates_dropout_keys_and_reaches_every_parameter():
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2), 1)
    x = rand(2, 4, 8)
    keys = [np.asarray(k[...]) for k in jax.tree.leaves(nnx.state(encoder, nn.RngKey))]

    @nnx.jit
    def grads(model):
        return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)

    g = grads(encoder)
    assert all(np.abs(leaf).sum() > 0 for leaf in jax.tree.leaves(g))
    assert len(jax.tree.leaves(g)) == len(encoder.parameters())
    new_keys = [np.asarray(k[...]) for k in jax.tree.leaves(nnx.state(encoder, nn.RngKey))]
    assert all((a != b).any() for a, b in zip(keys, new_keys))


@pytest.mark.parametrize("make,match", [
    (lambda: nn.MultiHeadAttention(8, 3), r"MultiHeadAttention: argument 'num_heads' expects a divisor of embed_dim"),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, activation="elu"),
     r"TransformerEncoderLayer: argument 'activation' expects one of"),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, weight_attr=[None] * 3),
     r"TransformerEncoderLayer: argument 'weight_attr' expects one attribute or a list of 2"),
    (lambda: nn.TransformerEncoder(nn.Linear(2, 2), 2),
     r"TransformerEncoder: argument 'encoder_layer' expects a TransformerEncoderLayer"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def causal_mask(n):
    return np.tril(np.ones((n, n), bool))


def full_and_stepwise(decoder, tgt, memory, memory_mask, max_length):
    """The decoder's causal output over ``tgt`` at once, and position by position from a cache."""
    full = decoder(tgt, memory, causal_mask(tgt.shape[1]), memory_mask)
    cache = decoder.gen_cache(memory, max_length=max_length)
    steps = []
    for i in range(tgt.shape[1]):
        out, cache = decoder(tgt[:, i:i + 1], memory, None, memory_mask, cache)
        steps.append(out)
    return full, np.concatenate(steps, axis=1), cache


@pytest.mark.parametrize("max_length", [None, 6], ids=["growing", "fixed"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
def test_cached_decoding_step_by_step_equals_the_full_causal_decoder(max_length, normalize_before):
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, normalize_before=normalize_before), 2,
                                    norm=nn.LayerNorm(8) if normalize_before else None)
    decoder.eval()
    tgt, memory = rand(2, 4, 8), rand(2, 5, 8)
    memory_mask = np.ones((2, 1, 1, 5), bool)
    memory_mask[1, ..., 3:] = False
    full, stepwise, cache = full_and_stepwise(decoder, tgt, memory, memory_mask, max_length)
    np.testing.assert_allclose(stepwise, full, rtol=1e-5, atol=1e-5)
    own, static = cache[1]
    assert own.k.shape == (2, 4 if max_length is None else 6, 2, 4)
    assert (own.length is None) == (max_length is None) and (max_length is None or int(own.length) == 4)
    keys = np_linear(decoder.layers[1].cross_attn.k_proj, memory).reshape(2, 5, 2, 4)
    np.testing.assert_allclose(static.k, keys, rtol=1e-5, atol=1e-5)


def test_fixed_capacity_cache_keeps_its_shapes_through_a_jitted_while_loop():
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2)
    decoder.eval()
    tgt, memory = rand(3, 5, 8), rand(3, 4, 8)

    @nnx.jit
    def decode(decoder, tgt, memory):
        def step(i, carry):
            outs, cache = carry
            out, cache = decoder(jax.lax.dynamic_slice_in_dim(tgt, i, 1, axis=1), memory, cache=cache)
            return jax.lax.dynamic_update_slice_in_dim(outs, out, i, axis=1), cache

        return jax.lax.fori_loop(0, 5, step, (jnp.zeros_like(tgt), decoder.gen_cache(memory, max_length=5)))[0]

    np.testing.assert_allclose(decode(decoder, tgt, memory), decoder(tgt, memory, causal_mask(5)), rtol=1e-5,
                               atol=1e-5)


def test_attention_caches_static_given_and_fixed_with_weights_and_additive_masks():
    mha = nn.MultiHeadAttention(8, 2, need_weights=True)
    q, memory = rand(2, 1, 8), rand(2, 5, 8)
    bias = rand(2, 1, 1, 5)
    static = mha.gen_cache(memory, type=nn.MultiHeadAttention.StaticCache)
    out, weights, same = mha(q, memory, memory, bias, static)
    want_out, want_weights = mha(q, memory, memory, bias)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
    assert same is static

    given = mha.gen_cache(static.k, static.v)  # already projected keys and values become the cache
    out, _, grown = mha(q, attn_mask=np.zeros((2, 1, 1, 6), np.float32), cache=given)
    assert grown.k.shape == (2, 6, 2, 4) and grown.length is None

    fixed = mha.gen_cache(q, max_length=4)
    for i in range(2):
        out, weights, fixed = mha(q, attn_mask=np.zeros((1, 4), np.float32), cache=fixed)
    assert int(fixed.length) == 2 and weights.shape == (2, 2, 1, 4)
    np.testing.assert_allclose(weights[..., :2], 0.5, rtol=1e-5)  # the same query and key twice; 2 slots unwritten
    np.testing.assert_array_equal(weights[..., 2:], 0.0)


def test_decoder_gen_cache_zips_per_kind_as_paddle():
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 3)
    caches, statics = decoder.gen_cache(rand(2, 5, 8), do_zip=True)
    assert [type(c).__name__ for c in caches] == ["Cache"] * 3
    assert [type(c).__name__ for c in statics] == ["StaticCache"] * 3
    assert caches[0].k.shape == (2, 0, 2, 4) and statics[2].v.shape == (2, 5, 2, 4)


@pytest.mark.parametrize("call,match", [
    (lambda mha, x: mha.gen_cache(x, type=tuple),
     r"MultiHeadAttention.gen_cache: argument 'type' expects MultiHeadAttention.Cache or StaticCache"),
    (lambda mha, x: mha.gen_cache(x, max_length=0), r"gen_cache: argument 'max_length' expects an int >= 1"),
    (lambda mha, x: mha(x, cache=(x, x)), r"MultiHeadAttention: argument 'cache' expects None, a "),
])
def test_bad_cache_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(nn.MultiHeadAttention(8, 2), rand(1, 3, 8))


def test_decoder_refuses_a_cache_for_another_number_of_layers():
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2)
    cache = decoder.gen_cache(rand(1, 3, 8))[:1]
    with pytest.raises(ValueError, match=r"TransformerDecoder: argument 'cache' expects one entry per layer \(2\)"):
        decoder(rand(1, 1, 8), rand(1, 3, 8), cache=cache)
