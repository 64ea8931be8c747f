"""Common layers: Linear, Embedding, Dropout, Flatten, Identity, Pad1D/2D/3D, Upsample.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> fc = nn.Linear(4, 3)
>>> fc.weight[...].shape, fc(jnp.ones((2, 4))).shape  # weight is [in, out], as in Paddle
((4, 3), (2, 3))
"""
from __future__ import annotations

from flax import nnx

from paddlejax import ops
from paddlejax.nn import functional as F
from paddlejax.nn.args import arg_error, choice, is_int, is_number, positive_int, probability
from paddlejax.nn.layer import Layer
from paddlejax.nn.random import RngKey
from paddlejax.ops.conv import CONV_LAYOUTS


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


class _Pad(Layer):
    """Pad1D / Pad2D / Pad3D: the number of spatial dims comes from the subclass."""

    _ndim = 2

    def __init__(self, padding, mode="constant", value=0.0, data_format=None):
        layer = type(self).__name__
        data_format = CONV_LAYOUTS[self._ndim][0] if data_format is None else data_format
        self._mode = choice(layer, "mode", mode, F.PAD_MODES)
        if not is_number(value):
            raise arg_error(layer, "value", "a number", value)
        self._value = float(value)
        self._paddings = F.pad_paddings(layer, padding, self._ndim, data_format)

    def forward(self, x):
        if x.ndim != self._ndim + 2:
            raise ValueError(f"{type(self).__name__}: input 'x' expects rank {self._ndim + 2}, got shape "
                             f"{tuple(x.shape)}")
        return ops.pad(x, paddings=self._paddings, mode=self._mode, value=self._value)


class Pad2D(_Pad):
    """Pad the spatial dims of ``[N, C, H, W]`` (or NHWC) input: ``padding`` is an int or
    ``[left, right, top, bottom]``; ``mode`` ``"constant"`` (with ``value``), ``"reflect"``
    (mirror without the edge; pads must be smaller than the dim), ``"replicate"`` (repeat the
    edge) or ``"circular"`` (wrap around).

    >>> import jax.numpy as jnp
    >>> Pad2D([1, 0, 0, 1], mode="replicate")(jnp.array([[[[1.0, 2.0]]]])).tolist()
    [[[[1.0, 1.0, 2.0], [1.0, 1.0, 2.0]]]]
    """


class Pad1D(_Pad):
    """Pad the last dim of ``[N, C, L]`` (or NLC) input: ``padding`` is an int or
    ``[left, right]``; modes as :class:`Pad2D`.

    >>> import jax.numpy as jnp
    >>> Pad1D([1, 2], mode="circular")(jnp.array([[[1.0, 2.0, 3.0]]])).tolist()
    [[[3.0, 1.0, 2.0, 3.0, 1.0, 2.0]]]
    """

    _ndim = 1


class Pad3D(_Pad):
    """Pad the spatial dims of ``[N, C, D, H, W]`` (or NDHWC) input: ``padding`` is an int or
    ``[left, right, top, bottom, front, back]``; modes as :class:`Pad2D`.

    >>> import jax.numpy as jnp
    >>> Pad3D([0, 0, 0, 0, 1, 1], value=-1.0)(jnp.zeros((1, 1, 1, 2, 2))).shape
    (1, 1, 3, 2, 2)
    """

    _ndim = 3


class Upsample(Layer):
    """Resize the spatial dims to ``size`` or by ``scale_factor`` (see
    :func:`paddlejax.nn.functional.interpolate`): ``mode`` ``"nearest"`` (default),
    ``"linear"`` (3-D input), ``"bilinear"`` (4-D) or ``"trilinear"`` (5-D), with Paddle's
    ``align_corners`` and ``align_mode``. ``data_format`` must fit the input's rank.

    >>> import jax.numpy as jnp
    >>> Upsample(scale_factor=2)(jnp.array([[[[1.0, 2.0]]]])).tolist()
    [[[[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]]]
    >>> Upsample(size=[3], mode="linear", align_corners=True, data_format="NCW")(jnp.array([[[0.0, 1.0]]])).tolist()
    [[[0.0, 0.5, 1.0]]]
    """

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=False, align_mode=0,
                 data_format="NCHW"):
        layer = type(self).__name__
        mode = mode.lower() if isinstance(mode, str) else mode
        try:  # the op checks the arguments now, so a bad one fails here
            attrs = ops.interpolate.check_attrs(dict(size=size, scale_factor=scale_factor, mode=mode,
                                                     align_corners=align_corners, align_mode=align_mode,
                                                     data_format=data_format))
        except ValueError as e:
            raise ValueError(f"{layer}: {e}") from None
        if (size is None) == (scale_factor is None):
            raise arg_error(layer, "size", "exactly one of size and scale_factor", (size, scale_factor))
        if attrs["mode"] == "nearest" and attrs["align_corners"]:
            raise arg_error(layer, "align_corners", "False with mode='nearest' (as in Paddle)", align_corners)
        self._attrs = tuple(attrs.items())

    def forward(self, x):
        return ops.interpolate(x, **dict(self._attrs))


class UpsamplingNearest2D(Upsample):
    """Nearest-neighbour resize of NCHW / NHWC input (``Upsample`` with ``mode="nearest"``).

    >>> import jax.numpy as jnp
    >>> UpsamplingNearest2D(size=[2, 4])(jnp.ones((1, 1, 1, 2))).shape
    (1, 1, 2, 4)
    """

    def __init__(self, size=None, scale_factor=None, data_format="NCHW"):
        super().__init__(size, scale_factor, "nearest", data_format=data_format)


class UpsamplingBilinear2D(Upsample):
    """Bilinear resize with ``align_corners=True`` (as Paddle's ``UpsamplingBilinear2D``).

    >>> import jax.numpy as jnp
    >>> UpsamplingBilinear2D(size=[1, 3])(jnp.array([[[[0.0, 2.0]]]])).tolist()
    [[[[0.0, 1.0, 2.0]]]]
    """

    def __init__(self, size=None, scale_factor=None, data_format="NCHW"):
        super().__init__(size, scale_factor, "bilinear", align_corners=True, data_format=data_format)
