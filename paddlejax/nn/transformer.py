"""Transformer layers as in Paddle: MultiHeadAttention, TransformerEncoderLayer /
TransformerEncoder and TransformerDecoderLayer / TransformerDecoder.

Inputs are ``[batch, seq, embed]``. Attention masks are Paddle's: boolean (True keeps a
position; an int mask is read as ``!= 0``) or an additive float, broadcastable to
``[batch, heads, q_len, k_len]``.

Decoding one position at a time uses Paddle's caches: ``decoder.gen_cache(memory)`` gives
each layer a :class:`Cache` of its self-attention keys and values so far and a
:class:`StaticCache` of its cross-attention keys and values (projected once), and
``decoder(tgt, memory, cache=cache)`` returns ``(output, new_cache)``. ``max_length=n``
makes fixed-capacity caches, so a decoding loop keeps its shapes and can run under
``lax.while_loop``.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
>>> encoder = nn.TransformerEncoder(layer, num_layers=2)
>>> encoder(jnp.ones((2, 5, 8))).shape
(2, 5, 8)
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax.numpy as jnp
from flax import nnx
from jax import lax

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, positive_int, probability
from paddlejax.nn.common import Dropout, Linear
from paddlejax.nn.layer import Layer, LayerList
from paddlejax.nn.norm import LayerNorm

# "gelu_new" is the tanh approximation under the name Hugging Face BERT configs give it
_ACTIVATIONS = {"relu": ops.relu, "gelu": ops.gelu, "gelu_new": functools.partial(ops.gelu, approximate=True),
                "silu": ops.silu, "swish": ops.silu, "tanh": ops.tanh, "sigmoid": ops.sigmoid, "relu6": ops.relu6,
                "leaky_relu": ops.leaky_relu, "hardswish": ops.hard_swish}


def _as_mask(mask):
    """Paddle's mask forms in the attention op's: bool stays, an int mask keeps nonzeros,
    a float mask is additive."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    return mask if jnp.issubdtype(mask.dtype, jnp.floating) or mask.dtype == jnp.bool_ else mask != 0


def _restrict(mask, keep):
    """``mask`` (None, boolean or additive) that also hides the key positions where ``keep`` is False."""
    if mask is None:
        return keep
    if mask.dtype == jnp.bool_:
        return mask & keep
    return jnp.where(keep, mask, jnp.asarray(-1e9, mask.dtype))


class Cache(NamedTuple):
    """Self-attention keys and values of the positions decoded so far (Paddle's
    ``MultiHeadAttention.Cache``), shaped ``[batch, positions, heads, head_dim]`` -- the
    attention op's layout, where Paddle's is ``[batch, heads, positions, head_dim]``.

    With ``length`` None the cache grows: each call appends its keys and values, as in Paddle.
    A fixed-capacity cache (``gen_cache(..., max_length=n)``) has ``n`` slots and ``length``,
    the number of slots written (an int32 scalar): each call writes its keys and values from
    slot ``length`` on, and attention sees the written slots only. Its shapes never change, so
    a decoding loop can carry it through ``lax.while_loop``; writing past ``n`` slots is not
    detected under tracing (``lax.dynamic_update_slice`` clamps), so size it for the longest
    decode.

    >>> import jax.numpy as jnp
    >>> mha = MultiHeadAttention(8, 2)
    >>> cache = mha.gen_cache(jnp.ones((3, 5, 8)), max_length=4)
    >>> cache.k.shape, int(cache.length)
    ((3, 4, 2, 4), 0)
    >>> out, cache = mha(jnp.ones((3, 1, 8)), cache=cache)
    >>> out.shape, int(cache.length)
    ((3, 1, 8), 1)
    """

    k: Any
    v: Any
    length: Any = None


class StaticCache(NamedTuple):
    """Keys and values projected once from a fixed ``key`` / ``value`` -- the encoder output
    in cross-attention (Paddle's ``MultiHeadAttention.StaticCache``), shaped ``[batch,
    k_len, heads, head_dim]``.

    >>> import jax.numpy as jnp
    >>> mha = MultiHeadAttention(8, 2)
    >>> memory = jnp.ones((3, 5, 8))
    >>> static = mha.gen_cache(memory, memory, type=MultiHeadAttention.StaticCache)
    >>> bool(jnp.allclose(mha(jnp.ones((3, 1, 8)), memory, memory, cache=static)[0],
    ...                   mha(jnp.ones((3, 1, 8)), memory, memory)))
    True
    """

    k: Any
    v: Any


def _extend(cache: Cache, k, v, mask):
    """``cache`` with the new keys and values added, and ``mask`` limited to its filled slots."""
    if cache.length is None:
        return Cache(ops.concat(cache.k, k, axis=1), ops.concat(cache.v, v, axis=1)), mask
    keys = lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype), cache.length, axis=1)
    values = lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype), cache.length, axis=1)
    length = cache.length + k.shape[1]
    return Cache(keys, values, length), _restrict(mask, jnp.arange(keys.shape[1]) < length)


def _attr_list(layer, arg, attr, n):
    """Paddle's per-sub-layer attributes: a list of ``n`` (True meaning default), or one for all."""
    if isinstance(attr, (list, tuple)):
        if len(attr) != n:
            raise arg_error(layer, arg, f"one attribute or a list of {n}", attr)
        return [None if a is True else a for a in attr]
    return [None if attr is True else attr] * n


class MultiHeadAttention(Layer):
    """Multi-head attention with projections ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``
    (Linear layers, so their default initialisers are Linear's: XavierUniform weights, zero
    biases). Call as ``layer(query, key=None, value=None, attn_mask=None, cache=None)``; key
    and value default to the query. With ``need_weights`` it returns ``(out, weights [batch,
    heads, q_len, k_len])``. Attention uses the ``scaled_dot_product_attention`` op unless
    weights are requested or attention dropout is active.

    With a ``cache`` (from :meth:`gen_cache`) the result also ends with the updated cache, as
    in Paddle: a :class:`StaticCache` replaces the key and value projections; a :class:`Cache`
    gets the new keys and values added, and attention covers every cached position.

    >>> import jax.numpy as jnp
    >>> mha = MultiHeadAttention(8, 2, need_weights=True)
    >>> out, weights = mha(jnp.ones((2, 3, 8)), attn_mask=jnp.tril(jnp.ones((3, 3), bool)))
    >>> out.shape, weights.shape, weights[0, 0, 0].tolist()
    ((2, 3, 8), (2, 2, 3, 3), [1.0, 0.0, 0.0])
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, kdim=None, vdim=None, need_weights=False,
                 weight_attr=None, bias_attr=None, *, rngs: nnx.Rngs | None = None):
        self.embed_dim = positive_int("MultiHeadAttention", "embed_dim", embed_dim)
        self.num_heads = positive_int("MultiHeadAttention", "num_heads", num_heads)
        if self.embed_dim % self.num_heads:
            raise arg_error("MultiHeadAttention", "num_heads", f"a divisor of embed_dim ({embed_dim})", num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.kdim = self.embed_dim if kdim is None else positive_int("MultiHeadAttention", "kdim", kdim)
        self.vdim = self.embed_dim if vdim is None else positive_int("MultiHeadAttention", "vdim", vdim)
        self.dropout = probability("MultiHeadAttention", "dropout", dropout)
        if not isinstance(need_weights, bool):
            raise arg_error("MultiHeadAttention", "need_weights", "a bool", need_weights)
        self.need_weights = need_weights
        for name, in_dim in (("q_proj", self.embed_dim), ("k_proj", self.kdim), ("v_proj", self.vdim),
                             ("out_proj", self.embed_dim)):
            setattr(self, name, Linear(in_dim, self.embed_dim, weight_attr, bias_attr, rngs=rngs))
        self.attn_dropout = Dropout(self.dropout, rngs=rngs) if self.dropout > 0 else None

    Cache = Cache
    StaticCache = StaticCache

    def _heads(self, proj, x):
        return ops.reshape(proj(x), shape=(0, 0, self.num_heads, self.head_dim))

    def gen_cache(self, key, value=None, type=Cache, max_length=None):  # noqa: A002  (Paddle's name)
        """A cache for decoding (Paddle's ``gen_cache``). ``type=StaticCache``: ``key`` and
        ``value`` (default: ``key``) projected once. ``type=Cache``: an empty cache for
        ``key``'s batch size -- growing, or with ``max_length`` slots -- or, given ``value``,
        ``key`` and ``value`` themselves as the cache (already projected, ``[batch, positions,
        heads, head_dim]``).

        >>> import jax.numpy as jnp
        >>> MultiHeadAttention(8, 2).gen_cache(jnp.ones((3, 5, 8))).k.shape
        (3, 0, 2, 4)
        """
        if type is StaticCache:
            return StaticCache(self._heads(self.k_proj, key), self._heads(self.v_proj, key if value is None else value))
        if type is not Cache:
            raise arg_error("MultiHeadAttention.gen_cache", "type", "MultiHeadAttention.Cache or StaticCache", type)
        if value is not None:
            return Cache(key, value)
        slots = 0 if max_length is None else positive_int("MultiHeadAttention.gen_cache", "max_length", max_length)
        empty = jnp.zeros((key.shape[0], slots, self.num_heads, self.head_dim), key.dtype)
        return Cache(empty, empty, None if max_length is None else jnp.zeros((), jnp.int32))

    def forward(self, query, key=None, value=None, attn_mask=None, cache=None):
        key = query if key is None else key
        value = query if value is None else value
        mask = _as_mask(attn_mask)
        q = self._heads(self.q_proj, query)
        if isinstance(cache, StaticCache):
            k, v = cache.k, cache.v
        else:
            k, v = self._heads(self.k_proj, key), self._heads(self.v_proj, value)
        if isinstance(cache, Cache):
            cache, mask = _extend(cache, k, v, mask)
            k, v = cache.k, cache.v
        elif cache is not None and not isinstance(cache, StaticCache):
            raise arg_error("MultiHeadAttention", "cache", "None, a MultiHeadAttention.Cache or StaticCache",
                            type(cache))
        weights = None
        if self.need_weights or (self.attn_dropout is not None and self.training):
            weights, out = self._explicit_attention(q, k, v, mask)
        else:
            out = ops.scaled_dot_product_attention(q, k, v, mask)
        out = self.out_proj(ops.reshape(out, shape=(0, 0, self.embed_dim)))
        outs = (out,) + ((weights,) if self.need_weights else ()) + ((cache,) if cache is not None else ())
        return outs if len(outs) > 1 else out

    def _explicit_attention(self, q, k, v, mask):
        """Attention written out, for its weights and for dropout on them (Paddle's form:
        a masked position gets -1e9 added to its logit)."""
        q, k, v = (ops.transpose(t, perm=(0, 2, 1, 3)) for t in (q, k, v))  # [batch, heads, seq, head_dim]
        logits = ops.matmul(q * (1 / math.sqrt(self.head_dim)), k, transpose_y=True)
        if mask is not None:
            bias = jnp.where(mask, 0.0, -1e9).astype(logits.dtype) if mask.dtype == jnp.bool_ else mask
            logits = ops.elementwise_add(logits, bias)
        weights = ops.softmax(logits, axis=-1)
        dropped = weights if self.attn_dropout is None else self.attn_dropout(weights)
        return weights, ops.transpose(ops.matmul(dropped, v), perm=(0, 2, 1, 3))


class _Stackable(Layer):
    """A layer that remembers its constructor arguments, so that an encoder or decoder can
    build more layers of the same configuration (Paddle's ``_config``)."""

    def _remember(self, arguments: dict):
        """Keep ``locals()`` as taken first thing in ``__init__`` (all but ``self`` and ``rngs``)."""
        config = {k: v for k, v in arguments.items() if k not in ("self", "rngs", "__class__")}
        self._config = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items())

    def fresh_copy(self, rngs: nnx.Rngs | None = None):
        """A new, freshly initialised layer with the same configuration."""
        return type(self)(**dict(self._config), rngs=rngs)


def _activation(layer, name):
    return choice(layer, "activation", name, tuple(_ACTIVATIONS))


class TransformerEncoderLayer(_Stackable):
    """Self-attention and a feed-forward block, each with a residual connection and a
    LayerNorm after it (or before it, with ``normalize_before``). ``attn_dropout`` and
    ``act_dropout`` default to ``dropout``. Call as ``layer(src, src_mask=None)``.

    Sub-layers: ``self_attn``, ``linear1``, ``linear2``, ``norm1``, ``norm2``, ``dropout``,
    ``dropout1``, ``dropout2``; ``weight_attr`` / ``bias_attr`` may be lists of 2 (attention,
    feed-forward).

    >>> import jax.numpy as jnp
    >>> TransformerEncoderLayer(8, 2, 16, normalize_before=True)(jnp.ones((1, 4, 8))).shape
    (1, 4, 8)
    """

    def __init__(self, d_model, nhead, dim_feedforward, dropout=0.1, activation="relu", attn_dropout=None,
                 act_dropout=None, normalize_before=False, weight_attr=None, bias_attr=None, layer_norm_eps=1e-5, *,
                 rngs: nnx.Rngs | None = None):
        self._remember(locals())
        weights = _attr_list("TransformerEncoderLayer", "weight_attr", weight_attr, 2)
        biases = _attr_list("TransformerEncoderLayer", "bias_attr", bias_attr, 2)
        self.normalize_before = normalize_before
        self.activation = _activation("TransformerEncoderLayer", activation)
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout if attn_dropout is None else attn_dropout,
                                            weight_attr=weights[0], bias_attr=biases[0], rngs=rngs)
        self.linear1 = Linear(d_model, dim_feedforward, weights[1], biases[1], rngs=rngs)
        self.dropout = Dropout(dropout if act_dropout is None else act_dropout, rngs=rngs)
        self.linear2 = Linear(dim_feedforward, d_model, weights[1], biases[1], rngs=rngs)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, rngs=rngs)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, rngs=rngs)
        self.dropout1 = Dropout(dropout, rngs=rngs)
        self.dropout2 = Dropout(dropout, rngs=rngs)

    def forward(self, src, src_mask=None):
        src = _residual(src, self.norm1, self.normalize_before,
                        lambda x: self.dropout1(self.self_attn(x, x, x, src_mask)))
        return _residual(src, self.norm2, self.normalize_before, lambda x: self.dropout2(_feed_forward(self, x)))


class TransformerDecoderLayer(_Stackable):
    """Self-attention, cross-attention over ``memory`` and a feed-forward block, each with a
    residual connection and LayerNorm (post- or pre-norm as in :class:`TransformerEncoderLayer`).
    Call as ``layer(tgt, memory, tgt_mask=None, memory_mask=None, cache=None)``; with a
    ``cache`` from :meth:`gen_cache` it returns ``(output, new_cache)``.

    Sub-layers: ``self_attn``, ``cross_attn``, ``linear1``, ``linear2``, ``norm1``-``norm3``,
    ``dropout``, ``dropout1``-``dropout3``; ``weight_attr`` / ``bias_attr`` may be lists of 3.

    >>> import jax.numpy as jnp
    >>> TransformerDecoderLayer(8, 2, 16)(jnp.ones((1, 3, 8)), jnp.ones((1, 5, 8))).shape
    (1, 3, 8)
    """

    def __init__(self, d_model, nhead, dim_feedforward, dropout=0.1, activation="relu", attn_dropout=None,
                 act_dropout=None, normalize_before=False, weight_attr=None, bias_attr=None, layer_norm_eps=1e-5, *,
                 rngs: nnx.Rngs | None = None):
        self._remember(locals())
        weights = _attr_list("TransformerDecoderLayer", "weight_attr", weight_attr, 3)
        biases = _attr_list("TransformerDecoderLayer", "bias_attr", bias_attr, 3)
        attn_p = dropout if attn_dropout is None else attn_dropout
        self.normalize_before = normalize_before
        self.activation = _activation("TransformerDecoderLayer", activation)
        self.self_attn = MultiHeadAttention(d_model, nhead, attn_p, weight_attr=weights[0], bias_attr=biases[0],
                                            rngs=rngs)
        self.cross_attn = MultiHeadAttention(d_model, nhead, attn_p, weight_attr=weights[1], bias_attr=biases[1],
                                             rngs=rngs)
        self.linear1 = Linear(d_model, dim_feedforward, weights[2], biases[2], rngs=rngs)
        self.dropout = Dropout(dropout if act_dropout is None else act_dropout, rngs=rngs)
        self.linear2 = Linear(dim_feedforward, d_model, weights[2], biases[2], rngs=rngs)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, rngs=rngs)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, rngs=rngs)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, rngs=rngs)
        self.dropout1 = Dropout(dropout, rngs=rngs)
        self.dropout2 = Dropout(dropout, rngs=rngs)
        self.dropout3 = Dropout(dropout, rngs=rngs)

    def gen_cache(self, memory, max_length=None):
        """``(Cache, StaticCache)``: an empty self-attention cache (growing, or with
        ``max_length`` slots) and the cross-attention keys and values of ``memory``.

        >>> import jax.numpy as jnp
        >>> layer = TransformerDecoderLayer(8, 2, 16)
        >>> incremental, static = layer.gen_cache(jnp.ones((1, 5, 8)), max_length=3)
        >>> incremental.k.shape, static.k.shape
        ((1, 3, 2, 4), (1, 5, 2, 4))
        """
        return (self.self_attn.gen_cache(memory, type=Cache, max_length=max_length),
                self.cross_attn.gen_cache(memory, memory, type=StaticCache))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, cache=None):
        self_cache, static_cache = (None, None) if cache is None else cache
        x = _pre(tgt, self.norm1, self.normalize_before)
        out, self_cache = _attend(self.self_attn, x, x, tgt_mask, self_cache)
        tgt = _post(tgt, self.dropout1(out), self.norm1, self.normalize_before)
        x = _pre(tgt, self.norm2, self.normalize_before)
        out, static_cache = _attend(self.cross_attn, x, memory, memory_mask, static_cache)
        tgt = _post(tgt, self.dropout2(out), self.norm2, self.normalize_before)
        tgt = _residual(tgt, self.norm3, self.normalize_before, lambda x: self.dropout3(_feed_forward(self, x)))
        return tgt if cache is None else (tgt, (self_cache, static_cache))


def _attend(attention, query, memory, mask, cache):
    """``(attention output, updated cache or None)`` of ``query`` over ``memory``."""
    if cache is None:
        return attention(query, memory, memory, mask), None
    return attention(query, memory, memory, mask, cache)


def _pre(x, norm, normalize_before):
    """The input of a residual block: ``norm(x)`` in pre-norm, ``x`` in post-norm."""
    return norm(x) if normalize_before else x


def _post(x, y, norm, normalize_before):
    """The residual sum ``x + y``, normalised in post-norm."""
    return x + y if normalize_before else norm(x + y)


def _residual(x, norm, normalize_before, block):
    """``x + block(x)`` with ``norm`` applied before the block (pre-norm) or after the sum."""
    return _post(x, block(_pre(x, norm, normalize_before)), norm, normalize_before)


def _feed_forward(layer, x):
    return layer.linear2(layer.dropout(_ACTIVATIONS[layer.activation](layer.linear1(x))))


def _stack(name, first, num_layers, rngs):
    """``first`` and ``num_layers - 1`` freshly initialised layers of its configuration (Paddle)."""
    num_layers = positive_int(name, "num_layers", num_layers)
    return LayerList([first] + [first.fresh_copy(rngs) for _ in range(num_layers - 1)])


class TransformerEncoder(Layer):
    """``num_layers`` encoder layers: ``encoder_layer`` itself first, then fresh layers of
    its configuration (each initialised anew, as in Paddle), and an optional final ``norm``.
    Call as ``encoder(src, src_mask=None)``.

    >>> import jax.numpy as jnp
    >>> enc = TransformerEncoder(TransformerEncoderLayer(8, 2, 16), 3)
    >>> len(enc.layers), bool((enc.layers[0].linear1.weight[...] != enc.layers[1].linear1.weight[...]).any())
    (3, True)
    """

    def __init__(self, encoder_layer, num_layers, norm=None, *, rngs: nnx.Rngs | None = None):
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise arg_error("TransformerEncoder", "encoder_layer", "a TransformerEncoderLayer", encoder_layer)
        self.layers = _stack("TransformerEncoder", encoder_layer, num_layers, rngs)
        self.num_layers = len(self.layers)
        self.norm = norm

    def forward(self, src, src_mask=None):
        for layer in self.layers:
            src = layer(src, src_mask)
        return src if self.norm is None else self.norm(src)


class TransformerDecoder(Layer):
    """``num_layers`` decoder layers built like :class:`TransformerEncoder`'s, and an optional
    final ``norm``. Call as ``decoder(tgt, memory, tgt_mask=None, memory_mask=None,
    cache=None)``; with a ``cache`` from :meth:`gen_cache` (one entry per layer) it returns
    ``(output, new_cache)``, so each call can decode just the next position.

    >>> import jax.numpy as jnp
    >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16), 2, norm=LayerNorm(8))
    >>> dec.eval()
    >>> tgt, memory = jnp.ones((1, 3, 8)), jnp.ones((1, 4, 8))
    >>> full = dec(tgt, memory, jnp.tril(jnp.ones((3, 3), bool)))
    >>> cache = dec.gen_cache(memory, max_length=3)
    >>> for i in range(3):
    ...     step, cache = dec(tgt[:, i:i + 1], memory, cache=cache)
    >>> full.shape, bool(jnp.allclose(step[:, 0], full[:, 2], atol=1e-5))
    ((1, 3, 8), True)
    """

    def __init__(self, decoder_layer, num_layers, norm=None, *, rngs: nnx.Rngs | None = None):
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise arg_error("TransformerDecoder", "decoder_layer", "a TransformerDecoderLayer", decoder_layer)
        self.layers = _stack("TransformerDecoder", decoder_layer, num_layers, rngs)
        self.num_layers = len(self.layers)
        self.norm = norm

    def gen_cache(self, memory, do_zip=False, max_length=None):
        """One ``(Cache, StaticCache)`` per layer (see :meth:`TransformerDecoderLayer.gen_cache`);
        ``do_zip`` regroups them as ``[all Caches, all StaticCaches]``, as in Paddle.

        >>> import jax.numpy as jnp
        >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16), 3)
        >>> len(dec.gen_cache(jnp.ones((1, 4, 8)))), len(dec.gen_cache(jnp.ones((1, 4, 8)), do_zip=True))
        (3, 2)
        """
        cache = [layer.gen_cache(memory, max_length) for layer in self.layers]
        return list(zip(*cache)) if do_zip else cache

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, cache=None):
        if cache is not None and len(cache) != self.num_layers:
            raise arg_error("TransformerDecoder", "cache", f"one entry per layer ({self.num_layers})",
                            f"{len(cache)} entries")
        new_cache = []
        for i, layer in enumerate(self.layers):
            if cache is None:
                tgt = layer(tgt, memory, tgt_mask, memory_mask)
            else:
                tgt, layer_cache = layer(tgt, memory, tgt_mask, memory_mask, cache[i])
                new_cache.append(layer_cache)
        tgt = tgt if self.norm is None else self.norm(tgt)
        return tgt if cache is None else (tgt, new_cache)
