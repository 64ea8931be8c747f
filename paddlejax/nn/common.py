"""Common layers: Linear, Embedding, Dropout, Flatten, Identity.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> fc = nn.Linear(4, 3)
>>> fc.weight[...].shape, fc(jnp.ones((2, 4))).shape  # weight is [in, out], as in Paddle
((4, 3), (2, 3))
"""
from __future__ import annotations

from flax import nnx

from paddlejax import ops
from paddlejax.nn.args import arg_error, choice, is_int, positive_int, probability
from paddlejax.nn.layer import Layer
from paddlejax.nn.random import RngKey


class Linear(Layer):
    """``y = x @ weight + bias`` with ``weight [in_features, out_features]`` and ``bias
    [out_features]`` (``bias_attr=False``: no bias).

    Default initialisers (Paddle's): weight XavierUniform (fan_in = in_features, fan_out =
    out_features), bias zeros.

    >>> import jax.numpy as jnp
    >>> Linear(3, 2, bias_attr=False)(jnp.ones((5, 3))).shape
    (5, 2)
    """

    def __init__(self, in_features, out_features, weight_attr=None, bias_attr=None, *, rngs: nnx.Rngs | None = None):
        shape = (positive_int("Linear", "in_features", in_features), positive_int("Linear", "out_features", out_features))
        if weight_attr is False:
            raise arg_error("Linear", "weight_attr", "None, an Initializer or a ParamAttr (a weight is required)",
                            weight_attr)
        self.weight = self.create_parameter(shape, weight_attr, rngs=rngs, arg="weight_attr")
        self.bias = self.create_parameter(shape[1:], bias_attr, is_bias=True, rngs=rngs, arg="bias_attr")

    def forward(self, x):
        if self.bias is None:
            return ops.linear(x, self.weight[...])
        return ops.linear(x, self.weight[...], self.bias[...])


class Embedding(Layer):
    """Rows of ``weight [num_embeddings, embedding_dim]`` looked up by integer ids.

    The ``padding_idx`` row (negative counts from the end) starts at zero, always reads as
    zero and gets no gradient, as in Paddle. ``sparse`` is accepted for compatibility;
    gradients are dense. Default initialiser: weight XavierUniform.

    >>> import jax.numpy as jnp
    >>> emb = Embedding(10, 4, padding_idx=0)
    >>> out = emb(jnp.array([[0, 3]]))
    >>> out.shape, out[0, 0].tolist()
    ((1, 2, 4), [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, sparse=False, weight_attr=None, *,
                 rngs: nnx.Rngs | None = None):
        num = positive_int("Embedding", "num_embeddings", num_embeddings)
        dim = positive_int("Embedding", "embedding_dim", embedding_dim)
        if padding_idx is not None and not (is_int(padding_idx) and -num <= padding_idx < num):
            raise arg_error("Embedding", "padding_idx", f"None or an index in [{-num}, {num})", padding_idx)
        if not isinstance(sparse, bool):
            raise arg_error("Embedding", "sparse", "a bool", sparse)
        self.padding_idx = None if padding_idx is None else int(padding_idx) % num
        self.weight = self.create_parameter((num, dim), weight_attr, rngs=rngs, arg="weight_attr")
        if self.padding_idx is not None:
            self.weight.set_value(self.weight[...].at[self.padding_idx].set(0))

    def forward(self, x):
        return ops.embedding(x, self.weight[...], padding_idx=self.padding_idx)


class Dropout(Layer):
    """Zero elements with probability ``p`` while training (Paddle's modes:
    ``"upscale_in_train"`` scales kept ones by ``1 / (1 - p)`` and is the identity in eval;
    ``"downscale_in_infer"`` scales by ``1 - p`` in eval). ``axis`` shares the mask along
    the other axes.

    The layer holds its own key (:class:`~paddlejax.nn.RngKey`, seeded from the global
    stream or ``rngs``) and advances it with the ``split_key`` op on each training call,
    eagerly or under ``nnx.jit``, so two calls draw different masks.

    >>> import jax.numpy as jnp
    >>> drop = Dropout(0.5)
    >>> a, b = drop(jnp.ones(8)), drop(jnp.ones(8))
    >>> sorted(set(a.tolist())), bool((a != b).any())
    ([0.0, 2.0], True)
    >>> drop.eval(); drop(jnp.ones(3)).tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self, p=0.5, axis=None, mode="upscale_in_train", *, rngs: nnx.Rngs | None = None):
        self.p = probability("Dropout", "p", p)
        if axis is not None and not is_int(axis) and not (isinstance(axis, (list, tuple))
                                                          and all(is_int(a) for a in axis)):
            raise arg_error("Dropout", "axis", "None, an int or a list of ints", axis)
        self.axis = None if axis is None else tuple(int(a) for a in ((axis,) if is_int(axis) else axis))
        self.mode = choice("Dropout", "mode", mode, ("upscale_in_train", "downscale_in_infer"))
        self.key = RngKey.fresh(rngs)

    def forward(self, x):
        if self.p == 0 or (not self.training and self.mode == "upscale_in_train"):
            return x
        key = self.key[...]
        if self.training:
            new_key, key = ops.split_key(key)
            self.key.set_value(new_key)
        return ops.dropout(x, key, p=self.p, training=self.training, mode=self.mode, axis=self.axis)


class Flatten(Layer):
    """Merge axes ``start_axis`` .. ``stop_axis`` (inclusive) into one.

    >>> import jax.numpy as jnp
    >>> Flatten()(jnp.ones((2, 3, 4, 5))).shape, Flatten(0, 1)(jnp.ones((2, 3, 4))).shape
    ((2, 60), (6, 4))
    """

    def __init__(self, start_axis=1, stop_axis=-1):
        if not is_int(start_axis):
            raise arg_error("Flatten", "start_axis", "an int", start_axis)
        if not is_int(stop_axis):
            raise arg_error("Flatten", "stop_axis", "an int", stop_axis)
        self.start_axis, self.stop_axis = int(start_axis), int(stop_axis)

    def forward(self, x):
        start, stop = (a % x.ndim if -x.ndim <= a < x.ndim else None for a in (self.start_axis, self.stop_axis))
        if start is None or stop is None or start > stop:
            raise ValueError(f"Flatten: start_axis {self.start_axis} and stop_axis {self.stop_axis} do not name "
                             f"an axis range of a rank-{x.ndim} input")
        # leading 0s copy the input dims; the -1 absorbs the flattened ones
        return ops.reshape(x, shape=(0,) * start + (-1,) + tuple(x.shape[stop + 1:]))


class Identity(Layer):
    """Returns its input unchanged (extra constructor arguments are ignored, as in Paddle).

    >>> Identity(54, unused="x")(3.0)
    3.0
    """

    def __init__(self, *args, **kwargs):
        pass

    def forward(self, x):
        return x
