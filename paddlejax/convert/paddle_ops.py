"""Paddle ops as calls of the op library and of jax.numpy: one handler per op.

Ops are named as Paddle 3 names them (``add``, ``matmul``, ``reshape``); :func:`handles`
declares, once per op, its input names in PIR's positional order and the legacy op types that
mean the same thing (``elementwise_add``, ``matmul_v2``, ``reshape2``) with their renamed
attributes. A handler gets an :class:`OpContext` and returns the op's main result (a list for
ops that return a vector, a tuple for several results). Ops whose inputs are all known are
computed in NumPy (see :mod:`paddlejax.convert.values`), so shape arithmetic stays known.

>>> SIGNATURES["conv2d"], LEGACY["elementwise_add"][0]
(('input', 'filter'), 'add')
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax import ops
from paddlejax.convert.errors import ConversionError
from paddlejax.convert.values import Weight, as_tensor, is_known, is_static, shape_array, shape_of
from paddlejax.ops.conv import same_padding

HANDLERS: dict[str, Callable] = {}
SIGNATURES: dict[str, tuple[str, ...]] = {}
LEGACY: dict[str, tuple[str, dict[str, str]]] = {}
# slices to "the end" are written with huge bounds
_HUGE = 2 ** 30


def handles(*names: str, inputs: str = "x", legacy: dict[str, dict[str, str] | None] | None = None):
    """Registers a handler for the Paddle 3 ops ``names``, whose inputs are ``inputs`` in
    order; ``legacy`` maps legacy op types meaning the first of ``names`` to their renames
    (legacy attribute or slot -> Paddle 3 name)."""

    def register(fn):
        for n in names:
            HANDLERS[n] = fn
            SIGNATURES[n] = tuple(inputs.split())
        for old, renames in (legacy or {}).items():
            LEGACY[old] = (names[0], renames or {})
        return fn

    return register


class OpContext:
    """One op's view of the conversion: its inputs by name, its attributes."""

    def __init__(self, node, env: dict, params):
        self.node = node
        self.type = node.type
        self._env = env
        self._params = params

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"from_paddle: {self.node.label}: {message}")

    def attr(self, name: str, default=None):
        value = self.node.attrs.get(name)
        return default if value is None else value

    def has(self, name: str) -> bool:
        return bool(self.node.inputs.get(name))

    def _lookup(self, ref: str):
        if ref not in self._env:
            raise self.error(f"reads '{ref}', which no earlier op produces (or which is a result the importer "
                             "does not compute)")
        return self._env[ref]

    def raws(self, name: str) -> list:
        """All values of an input that holds several (a PIR vector or a legacy slot's list)."""
        refs = self.node.inputs.get(name) or []
        if len(refs) == 1 and isinstance(self._lookup(refs[0]), list):
            return self._lookup(refs[0])
        return [self._lookup(r) for r in refs]

    def raw(self, name: str):
        if not self.has(name):
            raise self.error(f"input '{name}' is missing")
        values = self.raws(name)
        if len(values) != 1:
            raise self.error(f"input '{name}' holds {len(values)} values, one was expected")
        return values[0]

    def tensor(self, name: str):
        return as_tensor(self.raw(name), self._params)

    def tensors(self, name: str) -> list:
        return [as_tensor(v, self._params) for v in self.raws(name)]

    def value(self, name: str):
        """A known input as it is (NumPy), anything else as a tensor."""
        v = self.raw(name)
        return v if is_known(v) else as_tensor(v, self._params)

    def weight_array(self, name: str):
        v = self.raw(name) if self.has(name) else None
        return v.array if isinstance(v, Weight) else None

    def known(self, name: str) -> np.ndarray:
        """An input that must be known while converting; a legacy tensor list is concatenated."""
        parts = []
        for v in self.raws(name):
            if isinstance(v, Weight):
                v = v.array
            if not is_known(v):
                raise self.error(f"input '{name}' must be known while converting, but it is computed from the "
                                 "model's inputs")
            parts.append(np.asarray(v).reshape(-1))
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def ints(self, name: str, default=None) -> list | None:
        """Integers from the input ``name`` if the op has it, else from the attribute."""
        if self.has(name):
            return [d if not isinstance(d, np.integer) else int(d) for d in self.known(name)]
        value = self.attr(name, default)
        return None if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]

    def number(self, name: str, default=None):
        """A scalar from the input ``name`` if the op has it, else from the attribute."""
        if self.has(name):
            return self.known(name).reshape(-1)[0].item()
        return self.attr(name, default)

    def all_known(self) -> bool:
        return all(is_known(v) for name in self.node.inputs for v in self.raws(name))


def run_node(ctx: OpContext) -> list:
    """The op's results in the order of ``ctx.node.outputs``."""
    result = HANDLERS[ctx.type](ctx)
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, list) and len(ctx.node.outputs) > 1:
        return result  # a legacy op's list of outputs (split)
    return [result]


def as_output(v, params):
    if isinstance(v, list):
        raise ConversionError("from_paddle: a program output is a vector of tensors, which is not supported")
    return as_tensor(v, params)


# -- structure ---------------------------------------------------------------------------------
@handles("combine")
def _combine(ctx):
    return ctx.raws("x")


@handles("unpack")
def _unpack(ctx):
    return tuple(ctx.raws("x"))


def _np_dtype(name: str) -> np.dtype:
    if not isinstance(name, str):
        raise ConversionError(f"from_paddle: {name!r} is not a dtype name")
    if name == "bfloat16":
        return jnp.dtype(jnp.bfloat16)
    return np.dtype(name)


@handles("full", legacy={"fill_constant": None})
def _full(ctx):
    shape = ctx.ints("shape", [])
    dtype = _np_dtype(ctx.attr("dtype", "float32"))
    value = ctx.number("value", None)
    if value is None or ctx.attr("str_value"):
        value = float(ctx.attr("str_value") or 0)
    if is_static(shape) and math.prod(shape) <= 1024:
        return np.full(shape, value, dtype)
    return jnp.full(shape, value, dtype)


@handles("full_int_array")
def _full_int_array(ctx):
    return np.asarray(ctx.attr("value", []), _np_dtype(ctx.attr("dtype", "int64")))


@handles("assign_value", legacy={"assign_value": None})
def _assign_value(ctx):
    dtype = _np_dtype(ctx.attr("dtype", "float32"))
    values = ctx.attr("values")
    if not values:
        values = next((ctx.attr(k) for k in ("fp32_values", "int32_values", "int64_values", "bool_values",
                                                "fp64_values") if ctx.attr(k)), [])
    return np.asarray(values, dtype).reshape(ctx.ints("shape", [len(values)]))


@handles("full_like", inputs="x value", legacy={"fill_any_like": None})
def _full_like(ctx):
    x = ctx.raw("x")
    dtype = ctx.attr("dtype")
    dtype = _np_dtype(dtype) if isinstance(dtype, str) and dtype not in ("undefined", "") else None
    value = ctx.number("value", 0.0)
    if is_known(x) and is_static(x.shape):
        return np.full(x.shape, value, dtype or x.dtype)
    x = as_tensor(x, ctx._params)
    return jnp.full(x.shape, value, dtype or x.dtype)


@handles("assign", legacy={"assign": None, "share_data": None})
def _assign(ctx):
    return ctx.raw("x")


@handles("shape", "shape64", inputs="input", legacy={"shape": None})
def _shape(ctx):
    return shape_array(shape_of(ctx.raw("input")))


@handles("cast", legacy={"cast": {"out_dtype": "dtype"}})
def _cast(ctx):
    dtype = _np_dtype(ctx.attr("dtype"))
    x = ctx.raw("x")
    if is_known(x) and x.dtype != object:
        return x.astype(dtype)
    if is_known(x) and dtype.kind in "iu":
        return x  # symbolic sizes stay sizes
    return ctx.tensor("x").astype(jnp.dtype(dtype) if dtype.kind != "i" or dtype.itemsize <= 4 else jnp.int32)


# -- elementwise -------------------------------------------------------------------------------
def _align(x, y, axis: int):
    """Legacy broadcasting: with ``axis`` set, ``y``'s dims line up with ``x``'s from ``axis`` on."""
    sx, sy = shape_of(x), shape_of(y)
    if axis == -1 or len(sx) == len(sy):
        return x, y
    small, big = (y, sx) if len(sy) < len(sx) else (x, sy)
    s = shape_of(small)
    while s and s[-1] == 1 and len(s) > len(big) - axis:  # Paddle drops trailing 1s beyond the span
        s = s[:-1]
    target = (*s, *(1,) * (len(big) - axis - len(s)))
    small = small.reshape(target) if is_known(small) else jnp.reshape(small, target)
    return (x, small) if len(sy) < len(sx) else (small, y)


def _floor_div(a, b):
    return a // b


def _binary(np_fn, jnp_fn):
    def handler(ctx):
        x, y = _align(ctx.value("x"), ctx.value("y"), int(ctx.attr("axis", -1)))
        if is_known(x) and is_known(y):
            return np.asarray(np_fn(x, y))
        x, y = as_tensor(x, None), as_tensor(y, None)
        if jnp.issubdtype(x.dtype, jnp.floating) != jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else y
            x = x.astype(y.dtype)
        return jnp_fn(x, y)

    return handler


def _divide(a, b):
    if np.asarray(a).dtype.kind in "iuO" and np.asarray(b).dtype.kind in "iuO":
        return a // b
    return a / b


_BINARY = {
    "add": ("elementwise_add", np.add, jnp.add), "subtract": ("elementwise_sub", np.subtract, jnp.subtract),
    "multiply": ("elementwise_mul", np.multiply, jnp.multiply), "divide": ("elementwise_div", _divide, jnp.divide),
    "elementwise_pow": ("elementwise_pow", np.power, jnp.power),
    "maximum": ("elementwise_max", np.maximum, jnp.maximum), "minimum": ("elementwise_min", np.minimum, jnp.minimum),
    "floor_divide": ("elementwise_floordiv", _floor_div, jnp.floor_divide),
    "remainder": ("elementwise_mod", np.mod, jnp.mod),
    "equal": ("equal", np.equal, jnp.equal), "not_equal": ("not_equal", np.not_equal, jnp.not_equal),
    "less_than": ("less_than", np.less, jnp.less), "less_equal": ("less_equal", np.less_equal, jnp.less_equal),
    "greater_than": ("greater_than", np.greater, jnp.greater),
    "greater_equal": ("greater_equal", np.greater_equal, jnp.greater_equal),
    "logical_and": ("logical_and", np.logical_and, jnp.logical_and),
    "logical_or": ("logical_or", np.logical_or, jnp.logical_or),
}
for _name, (_old, _np_fn, _jnp_fn) in _BINARY.items():
    handles(_name, inputs="x y", legacy={_old: None})(_binary(_np_fn, _jnp_fn))


def _unary(jnp_fn, np_fn=None):
    def handler(ctx):
        if np_fn is not None and ctx.all_known():
            return np.asarray(np_fn(np.asarray(ctx.raw("x"))))
        return jnp_fn(ctx.tensor("x"))

    return handler


_UNARY = {
    "relu": ops.relu, "sigmoid": ops.sigmoid, "tanh": ops.tanh, "silu": ops.silu, "exp": jnp.exp,
    "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "erf": lax.erf, "sin": jnp.sin, "cos": jnp.cos,
    "square": jnp.square, "reciprocal": jnp.reciprocal, "softplus": jax.nn.softplus, "softsign": jax.nn.soft_sign,
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
}
_KNOWN_UNARY = {"abs": (jnp.abs, np.abs), "floor": (jnp.floor, np.floor), "ceil": (jnp.ceil, np.ceil),
                "sign": (jnp.sign, np.sign), "logical_not": (jnp.logical_not, np.logical_not),
                "round": (jnp.round, np.round)}
for _name, _fn in _UNARY.items():
    handles(_name, legacy={_name: None})(_unary(_fn))
for _name, (_fn, _np_fn) in _KNOWN_UNARY.items():
    handles(_name, legacy={_name: None})(_unary(_fn, _np_fn))


@handles("scale", inputs="x scale")
def _scale(ctx):
    s, b = ctx.number("scale", 1.0), float(ctx.attr("bias", 0.0))
    x = ctx.value("x")
    if not is_known(x) and s == 1.0 and b == 0.0:
        return x
    if ctx.attr("bias_after_scale", True):
        out = x * s + b
    else:
        out = (x + b) * s
    if is_known(x):
        return np.asarray(out).astype(x.dtype) if x.dtype != object else np.asarray(out)
    return out.astype(x.dtype)


@handles("pow", legacy={"pow": {"factor": "y"}})
def _pow(ctx):
    y = float(ctx.number("y", 1.0))
    x = ctx.tensor("x")
    return lax.integer_pow(x, int(y)) if y == int(y) and abs(y) <= 4 else jnp.power(x, y)


@handles("clip", inputs="x min max")
def _clip(ctx):
    lo, hi = ctx.number("min"), ctx.number("max")
    x = ctx.tensor("x")
    if jnp.issubdtype(x.dtype, jnp.floating) and lo == 0.0 and hi == 6.0:
        return ops.relu6(x)
    return jnp.clip(x, lo, hi)


@handles("relu6", legacy={"relu6": None})
def _relu6(ctx):
    threshold = float(ctx.attr("threshold", 6.0))
    x = ctx.tensor("x")
    return ops.relu6(x) if threshold == 6.0 else jnp.clip(x, 0.0, threshold)


@handles("hardswish", legacy={"hard_swish": None})
def _hardswish(ctx):
    threshold, scale, offset = (float(ctx.attr(k, d)) for k, d in (("threshold", 6.0), ("scale", 6.0), ("offset", 3.0)))
    x = ctx.tensor("x")
    if (threshold, scale, offset) == (6.0, 6.0, 3.0):
        return ops.hard_swish(x)
    return x * jnp.clip(x + offset, 0.0, threshold) / scale


@handles("hardsigmoid", legacy={"hard_sigmoid": None})
def _hardsigmoid(ctx):
    return ops.hard_sigmoid(ctx.tensor("x"), slope=float(ctx.attr("slope", 0.1666667)),
                            offset=float(ctx.attr("offset", 0.5)))


@handles("swish", legacy={"swish": None})
def _swish(ctx):
    beta = float(ctx.attr("beta", 1.0))
    x = ctx.tensor("x")
    return ops.silu(x) if beta == 1.0 else x * jax.nn.sigmoid(beta * x)


@handles("gelu", legacy={"gelu": None})
def _gelu(ctx):
    return ops.gelu(ctx.tensor("x"), approximate=bool(ctx.attr("approximate", False)))


@handles("leaky_relu", legacy={"leaky_relu": None})
def _leaky_relu(ctx):
    return ops.leaky_relu(ctx.tensor("x"), negative_slope=float(ctx.attr("negative_slope", ctx.attr("alpha", 0.02))))


@handles("prelu", inputs="x alpha", legacy={"prelu": None})
def _prelu(ctx):
    x, alpha = ctx.tensor("x"), ctx.tensor("alpha")
    layout = ctx.attr("data_format", "NCHW")
    if ctx.attr("mode", "all") in ("all", "channel") and x.ndim == 4:
        return ops.prelu(x, alpha.reshape(-1), data_format=layout)
    channel_last = layout.endswith("C")
    if ctx.attr("mode", "all") == "channel":
        shape = [1] * x.ndim
        shape[-1 if channel_last else 1] = -1
        alpha = alpha.reshape(shape)
    elif ctx.attr("mode") == "element":
        alpha = alpha.reshape(x.shape[1:])
    return jnp.where(x > 0, x, alpha * x)


@handles("where", inputs="condition x y", legacy={"where": None})
def _where(ctx):
    if ctx.all_known():
        return np.where(ctx.known("condition"), ctx.known("x"), ctx.known("y"))
    return jnp.where(ctx.tensor("condition"), ctx.tensor("x"), ctx.tensor("y"))


@handles("dropout", inputs="x seed_tensor p", legacy={"dropout": {"dropout_prob": "p",
                                                                   "dropout_implementation": "mode"}})
def _dropout(ctx):
    if ctx.attr("is_test") is False:
        raise ctx.error("is_test=False: only inference programs are converted")
    if ctx.attr("mode", "upscale_in_train") == "upscale_in_train":
        return ctx.raw("x")
    return ctx.tensor("x") * (1.0 - float(ctx.number("p", 0.5)))


@handles("softmax", legacy={"softmax": None})
def _softmax(ctx):
    return ops.softmax(ctx.tensor("x"), axis=int(ctx.attr("axis", -1)))


@handles("log_softmax", legacy={"log_softmax": None})
def _log_softmax(ctx):
    return ops.log_softmax(ctx.tensor("x"), axis=int(ctx.attr("axis", -1)))


# -- matrix products ---------------------------------------------------------------------------
@handles("matmul", inputs="x y", legacy={"matmul_v2": {"trans_x": "transpose_x", "trans_y": "transpose_y"},
                                         "matmul": {"transpose_X": "transpose_x", "transpose_Y": "transpose_y"}})
def _matmul(ctx):
    x, y = ctx.tensor("x"), ctx.tensor("y")
    tx, ty = bool(ctx.attr("transpose_x", False)), bool(ctx.attr("transpose_y", False))
    w = ctx.weight_array("y")
    if w is not None and w.ndim == 2 and x.ndim >= 2 and not tx:
        out = ops.linear(x, y.T if ty else y)  # a layer's weight: the op quantization and fusion look for
    else:
        out = ops.matmul(x, y, transpose_x=tx, transpose_y=ty)
    alpha = float(ctx.attr("alpha", 1.0))
    return out if alpha == 1.0 else out * alpha


@handles("mul", inputs="x y", legacy={"mul": None})
def _mul(ctx):
    x, y = ctx.tensor("x"), ctx.tensor("y")
    xd, yd = int(ctx.attr("x_num_col_dims", 1)), int(ctx.attr("y_num_col_dims", 1))
    x2 = jnp.reshape(x, (math.prod(x.shape[:xd]), -1))
    y2 = jnp.reshape(y, (math.prod(y.shape[:yd]), -1))
    out = ops.linear(x2, y2) if ctx.weight_array("y") is not None else ops.matmul(x2, y2)
    return jnp.reshape(out, (*x.shape[:xd], *y.shape[yd:]))


@handles("embedding", inputs="x weight", legacy={"lookup_table_v2": {"Ids": "x", "W": "weight"}})
def _embedding(ctx, ids=None):
    ids = ctx.tensor("x") if ids is None else ids
    padding = int(ctx.attr("padding_idx", -1))
    return ops.embedding(ids.astype(jnp.int32), ctx.tensor("weight"), padding_idx=None if padding < 0 else padding)


@handles("lookup_table", inputs="x weight", legacy={"lookup_table": {"Ids": "x", "W": "weight"}})
def _lookup_table(ctx):
    ids = ctx.tensor("x")
    return _embedding(ctx, ids[..., 0] if ids.shape[-1:] == (1,) else ids)  # v1 takes ids with a trailing 1


# -- convolution, normalisation, pooling -------------------------------------------------------
def _pads(ctx, spatial, kernel, strides, dilations):
    """(lo, hi) per spatial axis from Paddle's ``paddings`` and ``padding_algorithm``."""
    algorithm = ctx.attr("padding_algorithm", "EXPLICIT")
    n = len(kernel)
    if algorithm == "VALID":
        return ((0, 0),) * n
    if algorithm == "SAME":
        if not is_static(spatial):
            raise ctx.error(f"padding 'SAME' needs static spatial sizes, got {tuple(spatial)}; fix them with "
                            "from_paddle(..., input_shapes=...)")
        return same_padding(spatial, kernel, strides, dilations)
    p = [int(v) for v in ctx.attr("paddings", [0] * n)]
    if len(p) == n:
        return tuple((v, v) for v in p)
    if len(p) == 2 * n:
        return tuple((p[2 * i], p[2 * i + 1]) for i in range(n))
    raise ctx.error(f"paddings {p} do not fit a {n}-D window")


def _layout(ctx, key="data_format"):
    layout = ctx.attr(key, ctx.attr("data_layout", "NCHW"))
    return "NCHW" if layout in ("AnyLayout", "") else layout


def _spatial(x, layout):
    return x.shape[1:-1] if layout.endswith("C") else x.shape[2:]


@handles("conv2d", "depthwise_conv2d", inputs="input filter",
         legacy={"conv2d": None, "depthwise_conv2d": None})
def _conv2d(ctx):
    x, w = ctx.tensor("input"), ctx.tensor("filter")
    layout = _layout(ctx)
    strides = tuple(int(s) for s in ctx.attr("strides", (1, 1)))
    dilations = tuple(int(d) for d in ctx.attr("dilations", (1, 1)))
    pads = _pads(ctx, _spatial(x, layout), w.shape[2:], strides, dilations)
    bias = ctx.tensor("bias") if ctx.has("bias") else None
    return ops.conv2d(x, w, bias, stride=strides, padding=pads, dilation=dilations,
                      groups=int(ctx.attr("groups", 1)), data_format=layout)


@handles("conv2d_transpose", "depthwise_conv2d_transpose", inputs="x filter output_size",
         legacy={"conv2d_transpose": {"Input": "x"}, "depthwise_conv2d_transpose": {"Input": "x"}})
def _conv2d_transpose(ctx):
    x, w = ctx.tensor("x"), ctx.tensor("filter")
    layout = _layout(ctx)
    if layout != "NCHW":
        raise ctx.error(f"data_format {layout} is not supported for transposed convolutions")
    strides = tuple(int(s) for s in ctx.attr("strides", (1, 1)))
    dilations = tuple(int(d) for d in ctx.attr("dilations", (1, 1)))
    out_pad = tuple(int(p) for p in ctx.attr("output_padding", ()) or (0, 0))
    pads = _pads(ctx, x.shape[2:], w.shape[2:], strides, dilations)
    size = ctx.ints("output_size", [])
    if size:
        out_pad = tuple(t - ((n - 1) * s - lo - hi + (k - 1) * d + 1)
                        for t, n, s, (lo, hi), k, d in zip(size, x.shape[2:], strides, pads, w.shape[2:], dilations))
    return ops.conv2d_transpose(x, w, None, stride=strides, padding=pads, dilation=dilations,
                                output_padding=out_pad, groups=int(ctx.attr("groups", 1)), data_format="NCHW")


@handles("batch_norm", inputs="x mean variance scale bias", legacy={"batch_norm": None})
def _batch_norm(ctx):
    x = ctx.tensor("x")
    layout = _layout(ctx)
    if x.ndim == 2:
        layout = "NC"
    out = ops.batch_norm(x, ctx.tensor("mean"), ctx.tensor("variance"), ctx.tensor("scale"), ctx.tensor("bias"),
                         epsilon=float(ctx.attr("epsilon", 1e-5)), data_format=layout)
    return out[0]


@handles("layer_norm", inputs="x scale bias", legacy={"layer_norm": None})
def _layer_norm(ctx):
    x = ctx.tensor("x")
    axis = int(ctx.attr("begin_norm_axis", 1)) % x.ndim
    normalized = x.shape[axis:]

    def param(name):
        return jnp.reshape(ctx.tensor(name), normalized) if ctx.has(name) else None

    return ops.layer_norm(x, param("scale"), param("bias"), epsilon=float(ctx.attr("epsilon", 1e-5)),
                          begin_norm_axis=axis)


@handles("group_norm", inputs="x scale bias", legacy={"group_norm": None})
def _group_norm(ctx):
    x = ctx.tensor("x")
    return ops.group_norm(x, ctx.tensor("scale") if ctx.has("scale") else None,
                          ctx.tensor("bias") if ctx.has("bias") else None, groups=int(ctx.attr("groups")),
                          epsilon=float(ctx.attr("epsilon", 1e-5)), data_format=_layout(ctx))


@handles("instance_norm", inputs="x scale bias", legacy={"instance_norm": None})
def _instance_norm(ctx):
    x = ctx.tensor("x")
    return ops.group_norm(x, ctx.tensor("scale") if ctx.has("scale") else None,
                          ctx.tensor("bias") if ctx.has("bias") else None, groups=x.shape[1],
                          epsilon=float(ctx.attr("epsilon", 1e-5)), data_format="NCHW")


@handles("pool2d", inputs="x kernel_size", legacy={"pool2d": {"ksize": "kernel_size"}})
def _pool2d(ctx):
    x = ctx.tensor("x")
    layout = _layout(ctx)
    kind = ctx.attr("pooling_type", "max")
    kernel = tuple(ctx.ints("kernel_size"))
    if ctx.attr("global_pooling", False) or ctx.attr("adaptive", False) and kernel == (1, 1):
        return ops.pool2d(x, pooling_type=kind, global_pooling=True, data_format=layout)
    if ctx.attr("adaptive", False):
        return ops.adaptive_pool2d(x, output_size=kernel, pooling_type=kind, data_format=layout)
    strides = tuple(int(s) for s in ctx.attr("strides", kernel))
    pads = _pads(ctx, _spatial(x, layout), kernel, strides, (1, 1))
    return ops.pool2d(x, pooling_type=kind, kernel_size=kernel, stride=strides, padding=pads,
                      ceil_mode=bool(ctx.attr("ceil_mode", False)), exclusive=bool(ctx.attr("exclusive", True)),
                      data_format=layout)


@handles("bilinear_interp", "nearest_interp", "bicubic_interp", inputs="x out_size size_tensor scale_tensor",
         legacy={"bilinear_interp_v2": {"OutSize": "out_size", "SizeTensor": "size_tensor",
                                        "Scale": "scale_tensor"},
                 "nearest_interp_v2": {"OutSize": "out_size", "SizeTensor": "size_tensor", "Scale": "scale_tensor"},
                 "bicubic_interp_v2": {"OutSize": "out_size", "SizeTensor": "size_tensor", "Scale": "scale_tensor"}})
def _interp(ctx):
    x = ctx.tensor("x")
    layout = _layout(ctx, "data_layout") if ctx.attr("data_layout") else _layout(ctx)
    mode = ctx.attr("interp_method") or ctx.type.split("_")[0]
    size = ctx.ints("out_size") or ctx.ints("size_tensor")
    if not size and int(ctx.attr("out_h", -1)) > 0:
        size = [int(ctx.attr("out_h")), int(ctx.attr("out_w"))]
    scale = None
    if not size:
        scale = [float(s) for s in (ctx.known("scale_tensor") if ctx.has("scale_tensor") else ctx.attr("scale", []))]
        if not scale or all(s <= 0 for s in scale):
            raise ctx.error("neither an output size nor a scale is given")
        scale = tuple(scale * 2 if len(scale) == 1 else scale)
    return ops.interpolate(x, size=tuple(size) if size else None, scale_factor=scale, mode=mode,
                           align_corners=bool(ctx.attr("align_corners", False)),
                           align_mode=int(ctx.attr("align_mode", 1)), data_format=layout)


@handles("pad3d", inputs="x paddings", legacy={"pad3d": {"Paddings": "paddings"}})
def _pad3d(ctx):
    x = ctx.tensor("x")
    p = ctx.ints("paddings")
    layout = ctx.attr("data_format", "NCDHW")
    # Paddle lists (left, right, top, bottom, front, back): last spatial axis first
    spatial = [(p[4], p[5]), (p[2], p[3]), (p[0], p[1])]
    widths = [(0, 0), *spatial, (0, 0)] if layout == "NDHWC" else [(0, 0), (0, 0), *spatial]
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        return jnp.pad(x, widths, constant_values=float(ctx.attr("value", 0.0)))
    return jnp.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


@handles("pad", legacy={"pad": None})
def _pad(ctx):
    p = ctx.ints("paddings")
    return jnp.pad(ctx.tensor("x"), [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)],
                   constant_values=float(ctx.attr("pad_value", 0.0)))


# -- shapes ------------------------------------------------------------------------------------
def _reshape_any(x, shape):
    return x.reshape(shape) if is_known(x) else jnp.reshape(x, shape)


@handles("reshape", inputs="x shape", legacy={"reshape2": None, "reshape": None})
def _reshape(ctx):
    x = ctx.value("x")
    in_shape = shape_of(x)
    shape = [in_shape[i] if isinstance(d, (int, np.integer)) and d == 0 else d
             for i, d in enumerate(ctx.ints("shape"))]
    return _reshape_any(x, shape)


@handles("transpose", legacy={"transpose2": {"axis": "perm"}, "transpose": {"axis": "perm"}})
def _transpose(ctx):
    x, perm = ctx.value("x"), [int(p) for p in ctx.attr("perm")]
    return np.transpose(x, perm) if is_known(x) else jnp.transpose(x, perm)


@handles("flatten", legacy={"flatten_contiguous_range": None})
def _flatten(ctx):
    x = ctx.value("x")
    shape = list(shape_of(x))
    if not shape:
        return _reshape_any(x, (1,))
    start, stop = int(ctx.attr("start_axis", 1)) % len(shape), int(ctx.attr("stop_axis", -1)) % len(shape)
    return _reshape_any(x, (*shape[:start], math.prod(shape[start:stop + 1]), *shape[stop + 1:]))


@handles("unsqueeze", inputs="x axis", legacy={"unsqueeze2": {"AxesTensor": "axis", "AxesTensorList": "axis",
                                                              "axes": "axis"}})
def _unsqueeze(ctx):
    x = ctx.value("x")
    shape = list(shape_of(x))
    for a in ctx.ints("axis"):  # Paddle inserts one axis at a time
        shape.insert(a + len(shape) + 1 if a < 0 else a, 1)
    return _reshape_any(x, shape)


@handles("squeeze", inputs="x axis", legacy={"squeeze2": {"axes": "axis"}})
def _squeeze(ctx):
    x = ctx.value("x")
    shape = list(shape_of(x))
    axes = [a % len(shape) for a in ctx.ints("axis", [])] or [i for i, d in enumerate(shape) if d == 1]
    return _reshape_any(x, [d for i, d in enumerate(shape) if not (i in axes and d == 1)])


@handles("concat", inputs="x axis", legacy={"concat": None})
def _concat(ctx):
    axis = int(ctx.number("axis", 0))
    values = ctx.raws("x")
    if all(is_known(v) for v in values):
        parts = [np.asarray(v) for v in values]
        if any(p.dtype == object for p in parts):  # symbolic sizes among known ones
            parts = [p.astype(object) for p in parts]
        return np.concatenate(parts, axis)
    parts = ctx.tensors("x")
    if len(parts) > 1 and all(jnp.issubdtype(p.dtype, jnp.floating) for p in parts):
        return ops.concat(*parts, axis=axis)
    return jnp.concatenate(parts, axis)


@handles("stack", legacy={"stack": None})
def _stack(ctx):
    axis = int(ctx.attr("axis", 0))
    values = ctx.raws("x")
    if all(is_known(v) for v in values):
        return np.stack([np.asarray(v) for v in values], axis)
    return jnp.stack(ctx.tensors("x"), axis)


@handles("split", inputs="x sections axis", legacy={"split": {"AxisTensor": "axis", "SectionsTensorList": "sections"}})
def _split(ctx):
    x = ctx.value("x")
    axis = int(ctx.number("axis", 0)) % len(shape_of(x))
    size = shape_of(x)[axis]
    num = int(ctx.attr("num", 0))
    sections = ctx.ints("sections", []) if not num else [size // num] * num
    if -1 in sections:
        sections[sections.index(-1)] = size - sum(s for s in sections if s != -1)
    bounds = np.cumsum(sections)[:-1].tolist()
    parts = np.split(x, bounds, axis) if is_known(x) else jnp.split(x, bounds, axis)
    return list(parts)


@handles("split_with_num", inputs="x axis")
def _split_with_num(ctx):
    return _split(ctx)


@handles("slice", inputs="input starts ends", legacy={"slice": None})
def _slice(ctx):
    x = ctx.value("input")
    shape = shape_of(x)
    index = [slice(None)] * len(shape)
    for axis, start, end in zip(ctx.ints("axes"), ctx.ints("starts"), ctx.ints("ends")):
        axis %= len(shape)
        end = None if isinstance(end, int) and end >= _HUGE else end
        index[axis] = slice(start, end)
    out = x[tuple(index)]
    decrease = [a % len(shape) for a in ctx.ints("decrease_axis", [])]
    if decrease:
        out = _reshape_any(out, [d for i, d in enumerate(shape_of(out)) if i not in decrease])
    return out


@handles("strided_slice", inputs="x starts ends strides", legacy={"strided_slice": {"Input": "x"}})
def _strided_slice(ctx):
    x = ctx.value("x")
    shape = shape_of(x)
    index = [slice(None)] * len(shape)
    for axis, start, end, step in zip(ctx.ints("axes"), ctx.ints("starts"), ctx.ints("ends"), ctx.ints("strides")):
        end = None if isinstance(end, int) and abs(end) >= _HUGE else end
        index[axis % len(shape)] = slice(start, end, step)
    return x[tuple(index)]


@handles("gather", inputs="x index axis", legacy={"gather": {"Index": "index", "Axis": "axis"}})
def _gather(ctx):
    axis = int(ctx.number("axis", 0))
    x, index = ctx.value("x"), ctx.value("index")
    if is_known(x) and is_known(index):
        return np.take(x, index, axis)
    return jnp.take(as_tensor(x, None), as_tensor(index, None).astype(jnp.int32), axis=axis)


@handles("expand", inputs="x shape", legacy={"expand_v2": None})
def _expand(ctx):
    x = ctx.value("x")
    shape = ctx.ints("shape")
    in_shape = (1,) * (len(shape) - len(shape_of(x))) + tuple(shape_of(x))
    target = [i if isinstance(s, int) and s == -1 else s for s, i in zip(shape, in_shape)]
    return np.broadcast_to(x, target).copy() if is_known(x) else jnp.broadcast_to(x, target)


@handles("tile", inputs="x repeat_times", legacy={"tile": None})
def _tile(ctx):
    x = ctx.value("x")
    reps = ctx.ints("repeat_times")
    return np.tile(x, reps) if is_known(x) else jnp.tile(x, reps)


@handles("arange", inputs="start end step", legacy={"range": None})
def _arange(ctx):
    start, end, step = (ctx.known(n).reshape(-1)[0] for n in ("start", "end", "step"))
    dtype = _np_dtype(ctx.attr("dtype") or np.result_type(*(np.asarray(v).dtype for v in (start, step))).name)
    if all(isinstance(v, (np.integer, np.floating, int, float)) for v in (start, end, step)):
        return np.arange(start, end, step, dtype=dtype)
    # a symbolic end (a sequence length): an iota of a symbolic size
    count = (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // -step
    out = lax.iota(jnp.int32 if dtype.kind in "iu" else jnp.float32, count)
    return out * int(step) + int(start) if (step, start) != (1, 0) else out


_REDUCTIONS = {"mean": ("reduce_mean", ops.reduce_mean, np.mean), "sum": ("reduce_sum", ops.reduce_sum, np.sum),
               "max": ("reduce_max", ops.reduce_max, np.max), "min": ("reduce_min", jnp.min, np.min),
               "prod": ("reduce_prod", jnp.prod, np.prod)}


def _reduce(ctx):
    _, fn, np_fn = _REDUCTIONS[ctx.type]
    x = ctx.value("x")
    axis = None if ctx.attr("reduce_all", False) else ctx.ints("axis", [])
    axis = tuple(axis) if axis else None
    keep = bool(ctx.attr("keepdim", False))
    if is_known(x):
        return np.asarray(np_fn(x, axis=axis, keepdims=keep))
    if fn in (jnp.min, jnp.prod):
        return fn(x, axis=axis, keepdims=keep)
    return fn(x, axis=axis, keepdim=keep)


for _name, (_old, _fn, _np_fn) in _REDUCTIONS.items():
    handles(_name, inputs="x axis", legacy={_old: {"dim": "axis", "keep_dim": "keepdim"}})(_reduce)


def _arg(fn):
    def handler(ctx):
        x = ctx.tensor("x")
        if ctx.attr("flatten", False):
            return fn(x.reshape(-1)).astype(jnp.int32)
        return fn(x, axis=int(ctx.number("axis", -1)), keepdims=bool(ctx.attr("keepdims", False))).astype(jnp.int32)

    return handler


handles("argmax", inputs="x axis", legacy={"arg_max": None})(_arg(jnp.argmax))
handles("argmin", inputs="x axis", legacy={"arg_min": None})(_arg(jnp.argmin))
