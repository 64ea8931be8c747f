"""Transformer layers as in Paddle: MultiHeadAttention, TransformerEncoderLayer /
TransformerEncoder and TransformerDecoderLayer / TransformerDecoder.

Inputs are ``[batch, seq, embed]``. Attention masks are Paddle's: boolean (True keeps a
position; an int mask is read as ``!= 0``) or an additive float, broadcastable to
``[batch, heads, q_len, k_len]``.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
>>> encoder = nn.TransformerEncoder(layer, num_layers=2)
>>> encoder(jnp.ones((2, 5, 8))).shape
(2, 5, 8)
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, positive_int, probability
from paddlejax.nn.common import Dropout, Linear
from paddlejax.nn.layer import Layer, LayerList
from paddlejax.nn.norm import LayerNorm

_ACTIVATIONS = {"relu": ops.relu, "gelu": ops.gelu, "silu": ops.silu, "swish": ops.silu, "tanh": ops.tanh,
                "sigmoid": ops.sigmoid, "relu6": ops.relu6, "leaky_relu": ops.leaky_relu, "hardswish": ops.hard_swish}


def _as_mask(mask):
    """Paddle's mask forms in the attention op's: bool stays, an int mask keeps nonzeros,
    a float mask is additive."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    return mask if jnp.issubdtype(mask.dtype, jnp.floating) or mask.dtype == jnp.bool_ else mask != 0


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
    biases). Call as ``layer(query, key=None, value=None, attn_mask=None)``; key and value
    default to the query. With ``need_weights`` it returns ``(out, weights [batch, heads,
    q_len, k_len])``. Attention uses the ``scaled_dot_product_attention`` op unless weights
    are requested or attention dropout is active.

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

    def _heads(self, proj, x):
        return ops.reshape(proj(x), shape=(0, 0, self.num_heads, self.head_dim))

    def forward(self, query, key=None, value=None, attn_mask=None):
        key = query if key is None else key
        value = query if value is None else value
        q, k, v = self._heads(self.q_proj, query), self._heads(self.k_proj, key), self._heads(self.v_proj, value)
        mask = _as_mask(attn_mask)
        weights = None
        if self.need_weights or (self.attn_dropout is not None and self.training):
            weights, out = self._explicit_attention(q, k, v, mask)
        else:
            out = ops.scaled_dot_product_attention(q, k, v, mask)
        out = self.out_proj(ops.reshape(out, shape=(0, 0, self.embed_dim)))
        return (out, weights) if self.need_weights else out

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
    Call as ``layer(tgt, memory, tgt_mask=None, memory_mask=None)``.

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

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        tgt = _residual(tgt, self.norm1, self.normalize_before,
                        lambda x: self.dropout1(self.self_attn(x, x, x, tgt_mask)))
        tgt = _residual(tgt, self.norm2, self.normalize_before,
                        lambda x: self.dropout2(self.cross_attn(x, memory, memory, memory_mask)))
        return _residual(tgt, self.norm3, self.normalize_before, lambda x: self.dropout3(_feed_forward(self, x)))


def _residual(x, norm, normalize_before, block):
    """``x + block(x)`` with ``norm`` applied before the block (pre-norm) or after the sum."""
    if normalize_before:
        return x + block(norm(x))
    return norm(x + block(x))


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
    final ``norm``. Call as ``decoder(tgt, memory, tgt_mask=None, memory_mask=None)``.

    >>> import jax.numpy as jnp
    >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16), 2, norm=LayerNorm(8))
    >>> dec(jnp.ones((1, 3, 8)), jnp.ones((1, 4, 8))).shape
    (1, 3, 8)
    """

    def __init__(self, decoder_layer, num_layers, norm=None, *, rngs: nnx.Rngs | None = None):
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise arg_error("TransformerDecoder", "decoder_layer", "a TransformerDecoderLayer", decoder_layer)
        self.layers = _stack("TransformerDecoder", decoder_layer, num_layers, rngs)
        self.num_layers = len(self.layers)
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        for layer in self.layers:
            tgt = layer(tgt, memory, tgt_mask, memory_mask)
        return tgt if self.norm is None else self.norm(tgt)
