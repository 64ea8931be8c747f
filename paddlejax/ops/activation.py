"""Activation ops, prelu, softmax and log_softmax (Paddle names and defaults).

>>> import jax.numpy as jnp
>>> from paddlejax.ops.activation import gelu, leaky_relu
>>> leaky_relu(jnp.array([-1.0, 2.0])).tolist()
[-0.009999999776482582, 2.0]
>>> round(float(gelu(jnp.float32(1.0))), 4)  # exact (erf) form by default, as in Paddle
0.8413

Ops that compute into an activation (conv2d, linear, elementwise binaries) carry it as a fused
``act`` attribute, applied by :func:`fused_activation`:

>>> fused_activation(jnp.array([-1.0, 2.0]), "leaky_relu", 0.5).tolist()
[-0.5, 2.0]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from paddlejax.ops.registry import Attr, Input, define, elementwise_flops
from paddlejax.ops.traits import Traits
from paddlejax.ops.common import channel_axis, input_error, norm_axis


def _activation(name: str, kernel, traits: Traits | None = None, **attrs):
    traits = traits or Traits(pointwise=True, channels="identity")
    return define(name, kernel, inputs=[Input("x", dtype="float")], attrs=attrs, flops=elementwise_flops,
                  traits=traits)


# softmax mixes the elements along its axis: not pointwise, and it ends a channel group
_NORMALISING = Traits(amp="black")


def _relu(x):
    """max(x, 0)."""
    return jax.nn.relu(x)


def _relu6(x):
    """min(max(x, 0), 6)."""
    return jnp.clip(x, 0, 6)


def _gelu(x, *, approximate):
    """Gaussian error linear unit: exact erf form, or the tanh approximation if ``approximate``."""
    return jax.nn.gelu(x, approximate=approximate)


def _sigmoid(x):
    """1 / (1 + exp(-x))."""
    return jax.nn.sigmoid(x)


def _tanh(x):
    """Hyperbolic tangent."""
    return jnp.tanh(x)


def _silu(x):
    """x * sigmoid(x)."""
    return jax.nn.silu(x)


def _leaky_relu(x, *, negative_slope):
    """x where positive, negative_slope * x elsewhere."""
    return jnp.where(x >= 0, x, negative_slope * x)


def _hard_swish(x):
    """Paddle's hard_swish: x * relu6(x + 3) / 6."""
    return x * jnp.clip(x + 3, 0, 6) / 6


def _hard_sigmoid(x, *, slope, offset):
    """Paddle's hardsigmoid: clip(slope * x + offset, 0, 1)."""
    return jnp.clip(slope * x + offset, 0, 1)


def _softmax(x, *, axis):
    """exp(x) / sum(exp(x)) along ``axis``."""
    return jax.nn.softmax(x, axis=norm_axis("softmax", "axis", axis, x.ndim))


def _log_softmax(x, *, axis):
    """log(softmax(x)) along ``axis``, computed stably."""
    return jax.nn.log_softmax(x, axis=norm_axis("log_softmax", "axis", axis, x.ndim))


def _prelu(x, weight, *, data_format):
    """x where positive, weight * x elsewhere; ``weight`` has one element, or one per channel
    (on ``data_format``'s channel axis)."""
    if weight.shape != (1,):
        axis = channel_axis(data_format, x.ndim)
        if x.ndim < 2 or weight.shape != (x.shape[axis],):
            channels = f"{x.shape[axis]} channels on axis {axis}" if x.ndim >= 2 else "no channel axis"
            raise input_error("prelu", "weight", f"shape (1,) or one slope per channel (x {tuple(x.shape)} has "
                              f"{channels}, data_format={data_format!r})", tuple(weight.shape))
        weight = weight.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return jnp.where(x > 0, x, weight.astype(x.dtype) * x)


relu = _activation("relu", _relu, Traits(pointwise=True, channels="identity", saved_for_backward=("mask",),
                                         nonnegative=True))
relu6 = _activation("relu6", _relu6, Traits(pointwise=True, channels="identity", saved_for_backward=("new", "new"),
                                            nonnegative=True))
gelu = _activation("gelu", _gelu, approximate=Attr("bool", False))
sigmoid = _activation("sigmoid", _sigmoid, Traits(pointwise=True, channels="identity", nonnegative=True))
tanh = _activation("tanh", _tanh)
silu = _activation("silu", _silu)
leaky_relu = _activation("leaky_relu", _leaky_relu, negative_slope=Attr("float", 0.01))
hard_swish = _activation("hard_swish", _hard_swish)
hard_sigmoid = _activation("hard_sigmoid", _hard_sigmoid,
                           Traits(pointwise=True, channels="identity", nonnegative=True),
                           slope=Attr("float", 0.1666667), offset=Attr("float", 0.5))
softmax = _activation("softmax", _softmax, _NORMALISING, axis=Attr("int", -1))
log_softmax = _activation("log_softmax", _log_softmax, _NORMALISING, axis=Attr("int", -1))
prelu = define("prelu", _prelu, inputs=[Input("x", dtype="float"), Input("weight", rank=1, dtype="float")],
               attrs={"data_format": Attr("str", "NCHW", choices=("NC", "NCL", "NCHW", "NCDHW", "NLC", "NHWC",
                                                                  "NDHWC"))},
               flops=elementwise_flops,
               # one slope per channel: the channel axis, not the layout, pairs it with x
               traits=Traits(layout_sensitive=True, channels="identity"))


# Activations an op can apply to its own result (its ``act`` attribute). "gelu_tanh" is gelu
# with ``approximate=True``; ``act_alpha`` is leaky_relu's negative slope.
_FUSED = {"relu": _relu, "relu6": _relu6, "gelu": lambda x: _gelu(x, approximate=False),
          "gelu_tanh": lambda x: _gelu(x, approximate=True), "silu": _silu, "sigmoid": _sigmoid,
          "tanh": _tanh, "hard_swish": _hard_swish}
FUSED_ACTIVATIONS = (*_FUSED, "leaky_relu")
_LEAKY_SLOPE = leaky_relu.attrs["negative_slope"].default


def nonnegative_act(attrs: dict) -> bool:
    """Whether an op's fused activation (its ``act`` attribute) leaves no negative value: its
    ``nonnegative`` trait.

    >>> nonnegative_act({"act": "relu6"}), nonnegative_act({"act": "gelu"}), nonnegative_act({})
    (True, False, False)
    """
    return attrs.get("act") in ("relu", "relu6", "sigmoid")


def fused_activation_attrs() -> dict[str, Attr]:
    """The ``act`` / ``act_alpha`` attributes of an op with a fused activation (None: no activation).

    >>> sorted(fused_activation_attrs())
    ['act', 'act_alpha']
    """
    return {"act": Attr("str", None, choices=FUSED_ACTIVATIONS, optional=True,
                        doc="activation applied to the result"),
            "act_alpha": Attr("float", None, optional=True, doc="leaky_relu's negative slope")}


def fused_activation(x, act: str | None, act_alpha: float | None = None):
    """``x`` through the activation named by a fused ``act`` attribute (unchanged for None).

    >>> fused_activation(jnp.array([-1.0, 7.0]), "relu6").tolist()
    [0.0, 6.0]
    """
    if act is None:
        return x
    if act == "leaky_relu":
        return _leaky_relu(x, negative_slope=_LEAKY_SLOPE if act_alpha is None else act_alpha)
    return _FUSED[act](x)


def as_fused_activation(op_type: str, attrs: dict) -> dict | None:
    """The ``act`` / ``act_alpha`` attributes equivalent to activation op ``op_type`` with
    ``attrs``, or None if it cannot be fused.

    >>> as_fused_activation("gelu", {"approximate": True})
    {'act': 'gelu_tanh', 'act_alpha': None}
    """
    if op_type == "leaky_relu":
        return {"act": "leaky_relu", "act_alpha": float(attrs.get("negative_slope", _LEAKY_SLOPE))}
    if op_type == "gelu":
        return {"act": "gelu_tanh" if attrs.get("approximate") else "gelu", "act_alpha": None}
    return {"act": op_type, "act_alpha": None} if op_type in _FUSED else None
