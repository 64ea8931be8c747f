"""ONNX ops as calls of the op library and of jax.numpy: one handler per ONNX op type.

A handler gets a :class:`NodeContext` and returns the node's output value(s). Values are
traced arrays, or NumPy arrays known while converting (constants and the shape arithmetic
built on them, whose symbolic sizes are JAX dimension expressions), or :class:`Weight` s
(read as a parameter of the program). Ops whose inputs are all known are computed in NumPy,
so ``Shape → Gather → Concat → Reshape`` gives ``Reshape`` a known target shape.

>>> sorted(HANDLERS)[:4]
['Abs', 'Acos', 'Add', 'And']
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from paddlejax import ops
from paddlejax.convert.errors import ConversionError
from paddlejax.convert.onnx_import import _onnx
from paddlejax.convert.values import Weight, as_tensor, is_known, is_static, shape_array
from paddlejax.convert.values import runtime_dtype as _runtime_dtype
from paddlejax.convert.values import shape_of as _shape_of
from paddlejax.ops.conv import same_padding

HANDLERS: dict[str, Callable] = {}
# ONNX's "to the end" slice bound, and its negative twin
_INT_MAX = 2 ** 62
# the op library's channel-first layout of each rank (ONNX's tensors are channel-first)
_CHANNEL_FIRST = {2: "NC", 3: "NCL", 4: "NCHW", 5: "NCDHW"}


def handles(*op_types: str):
    def register(fn):
        for t in op_types:
            HANDLERS[t] = fn
        return fn

    return register


class NodeContext:
    """One node's view of the conversion: its inputs (by position), its attributes, the opset."""

    def __init__(self, node, label: str, opset: int, env: dict, params, pretransposed: frozenset = frozenset()):
        self.node = node
        self.label = label
        self.opset = opset
        self._env = env
        self._params = params
        self._attrs = None
        # weights stored transposed at import (Gemm's transB), so that ``linear`` reads a parameter
        self.pretransposed = pretransposed

    @property
    def attrs(self) -> dict[str, Any]:
        if self._attrs is None:
            onnx = _onnx()
            from onnx import numpy_helper

            decoded = {}
            for a in self.node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    decoded[a.name] = numpy_helper.to_array(a.t)
                elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    raise self.error(f"attribute '{a.name}' holds a subgraph, which is not supported")
                else:
                    value = onnx.helper.get_attribute_value(a)
                    if isinstance(value, bytes):
                        value = value.decode()
                    elif isinstance(value, list):
                        value = [v.decode() if isinstance(v, bytes) else v for v in value]
                    decoded[a.name] = value
            self._attrs = decoded
        return self._attrs

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"from_onnx: {self.label} ({self.node.op_type}): {message}")

    # -- inputs ---------------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def raw(self, i: int):
        if not self.has(i):
            raise self.error(f"input {i} is missing")
        name = self.node.input[i]
        if name not in self._env:
            raise self.error(f"input '{name}' is produced by no earlier node (is the graph sorted?)")
        return self._env[name]

    def raw_output(self):
        return self._env[self.node.output[0]]

    def tensor(self, i: int):
        return as_tensor(self.raw(i), self._params)

    def value(self, i: int):
        """A known input as it is (NumPy), anything else as a tensor."""
        v = self.raw(i)
        return v if is_known(v) else self.tensor(i)

    def is_constant(self, i: int) -> bool:
        """Whether input ``i`` can be read with :meth:`known` (a known value or a Weight)."""
        return self.has(i) and isinstance(self.raw(i), (np.ndarray, Weight))

    def known(self, i: int, what: str) -> np.ndarray:
        v = self.raw(i)
        if isinstance(v, Weight):
            return v.array
        if not isinstance(v, np.ndarray):
            raise self.error(f"{what} (input {i}, '{self.node.input[i]}') must be known while converting, "
                             "but it is computed from the model's inputs")
        return v

    def ints(self, i: int, what: str) -> list:
        """A known 1-D integer input as Python ints (symbolic sizes kept)."""
        return [d if not isinstance(d, np.integer) else int(d) for d in np.asarray(self.known(i, what)).reshape(-1)]

    def all_known(self) -> bool:
        return all(is_known(self.raw(i)) for i in range(self.num_inputs) if self.has(i))

    def weight_array(self, i: int) -> np.ndarray | None:
        v = self.raw(i)
        return v.array if isinstance(v, Weight) else None


# -- elementwise ---------------------------------------------------------------------------
def _numpy_div(a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        q = np.floor_divide(a, b)
        # ONNX divides integers toward zero, NumPy's // rounds down
        return q + ((q < 0) & (q * b != a)).astype(q.dtype)
    if a.dtype == object or b.dtype == object:
        return a // b
    return np.divide(a, b).astype(np.result_type(a, b))


def _binary(np_fn, jnp_fn):
    def handler(ctx):
        if ctx.all_known():
            return np.asarray(np_fn(np.asarray(ctx.raw(0)), np.asarray(ctx.raw(1))))
        return jnp_fn(ctx.tensor(0), ctx.tensor(1))

    return handler


def _jnp_div(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(a, b.astype(a.dtype)))
    return a / b


def _pow(ctx):
    exponent = ctx.raw(1)
    if is_known(exponent) and exponent.size == 1 and float(exponent) == int(float(exponent)) \
            and abs(float(exponent)) <= 4 and not ctx.all_known():
        return lax.integer_pow(ctx.tensor(0), int(float(exponent)))
    return _binary(np.power, lambda a, b: jnp.power(a, b.astype(a.dtype)))(ctx)


HANDLERS.update({
    "Add": _binary(np.add, jnp.add), "Sub": _binary(np.subtract, jnp.subtract),
    "Mul": _binary(np.multiply, jnp.multiply), "Div": _binary(_numpy_div, _jnp_div),
    "Pow": _pow, "Equal": _binary(np.equal, jnp.equal), "Less": _binary(np.less, jnp.less),
    "LessOrEqual": _binary(np.less_equal, jnp.less_equal), "Greater": _binary(np.greater, jnp.greater),
    "GreaterOrEqual": _binary(np.greater_equal, jnp.greater_equal), "And": _binary(np.logical_and, jnp.logical_and),
    "Or": _binary(np.logical_or, jnp.logical_or), "Xor": _binary(np.logical_xor, jnp.logical_xor),
})


@handles("Mod")
def _mod(ctx):
    fmod = bool(ctx.attr("fmod", 0))
    return _binary(np.fmod if fmod else np.mod, jnp.fmod if fmod else jnp.mod)(ctx)


@handles("Max", "Min", "Sum", "Mean")
def _variadic(ctx):
    np_fn, jnp_fn = {"Max": (np.maximum, jnp.maximum), "Min": (np.minimum, jnp.minimum),
                     "Sum": (np.add, jnp.add), "Mean": (np.add, jnp.add)}[ctx.node.op_type]
    known = ctx.all_known()
    values = [np.asarray(ctx.raw(i)) if known else ctx.tensor(i) for i in range(ctx.num_inputs)]
    out = values[0]
    for v in values[1:]:
        out = (np_fn if known else jnp_fn)(out, v)
    return out / len(values) if ctx.node.op_type == "Mean" else out


def _unary(np_fn, jnp_fn):
    def handler(ctx):
        if np_fn is not None and ctx.all_known():
            return np.asarray(np_fn(np.asarray(ctx.raw(0))))
        return jnp_fn(ctx.tensor(0))

    return handler


HANDLERS.update({
    "Relu": _unary(None, ops.relu), "Sigmoid": _unary(None, ops.sigmoid), "Tanh": _unary(None, ops.tanh),
    "HardSwish": _unary(None, ops.hard_swish), "Exp": _unary(None, jnp.exp), "Log": _unary(None, jnp.log),
    "Sqrt": _unary(None, jnp.sqrt), "Reciprocal": _unary(None, lambda x: 1 / x), "Erf": _unary(None, lax.erf),
    "Sin": _unary(None, jnp.sin), "Cos": _unary(None, jnp.cos), "Tan": _unary(None, jnp.tan),
    "Asin": _unary(None, jnp.arcsin), "Acos": _unary(None, jnp.arccos), "Atan": _unary(None, jnp.arctan),
    "Sinh": _unary(None, jnp.sinh), "Cosh": _unary(None, jnp.cosh), "Softplus": _unary(None, jax.nn.softplus),
    "Softsign": _unary(None, jax.nn.soft_sign), "Mish": _unary(None, lambda x: x * jnp.tanh(jax.nn.softplus(x))),
    "Neg": _unary(np.negative, jnp.negative), "Abs": _unary(np.abs, jnp.abs), "Sign": _unary(np.sign, jnp.sign),
    "Floor": _unary(np.floor, jnp.floor), "Ceil": _unary(np.ceil, jnp.ceil), "Round": _unary(np.round, jnp.round),
    "Not": _unary(np.logical_not, jnp.logical_not), "IsNaN": _unary(np.isnan, jnp.isnan),
    "Identity": lambda ctx: ctx.raw(0),
    # read before the graph runs (onnx_import._constants)
    "Constant": lambda ctx: ctx.raw_output(),
})


@handles("Dropout")
def _dropout(ctx):
    if ctx.has(2) and bool(np.asarray(ctx.known(2, "training_mode"))):
        raise ctx.error("training_mode=True: only inference graphs are converted")
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        return ctx.raw(0), jnp.ones(jnp.shape(ctx.tensor(0)), bool)
    return ctx.raw(0)


@handles("IsInf")
def _isinf(ctx):
    x = ctx.tensor(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    return jnp.isinf(x) & (((x > 0) & bool(pos)) | ((x < 0) & bool(neg)))


@handles("Where")
def _where(ctx):
    if ctx.all_known():
        return np.where(*(np.asarray(ctx.raw(i)) for i in range(3)))
    return jnp.where(ctx.tensor(0), ctx.tensor(1), ctx.tensor(2))


@handles("LeakyRelu")
def _leaky_relu(ctx):
    return ops.leaky_relu(ctx.tensor(0), negative_slope=float(ctx.attr("alpha", 0.01)))


@handles("HardSigmoid")
def _hard_sigmoid(ctx):
    return ops.hard_sigmoid(ctx.tensor(0), slope=float(ctx.attr("alpha", 0.2)), offset=float(ctx.attr("beta", 0.5)))


@handles("Elu", "Selu", "Celu", "ThresholdedRelu")
def _parametric_unary(ctx):
    x, t = ctx.tensor(0), ctx.node.op_type
    if t == "Elu":
        return jax.nn.elu(x, float(ctx.attr("alpha", 1.0)))
    if t == "Celu":
        return jax.nn.celu(x, float(ctx.attr("alpha", 1.0)))
    if t == "Selu":
        alpha, gamma = float(ctx.attr("alpha", 1.67326319217681884765625)), float(ctx.attr("gamma", 1.05070102214813232421875))
        return gamma * jnp.where(x > 0, x, alpha * (jnp.exp(x) - 1))
    return jnp.where(x > float(ctx.attr("alpha", 1.0)), x, 0)


@handles("Gelu")
def _gelu(ctx):
    return ops.gelu(ctx.tensor(0), approximate=ctx.attr("approximate", "none") == "tanh")


@handles("PRelu")
def _prelu(ctx):
    x, slope = ctx.tensor(0), ctx.tensor(1)
    layout = _CHANNEL_FIRST.get(x.ndim)
    # ONNX broadcasts the slope numpy-style: (C, 1, 1) or, for 2-D inputs, (C,) is one per channel
    per_channel = slope.shape[:1] == x.shape[1:2] and (
        slope.ndim == x.ndim - 1 and all(d == 1 for d in slope.shape[1:]) or x.ndim == 2 and slope.ndim == 1)
    if layout and (slope.size == 1 or per_channel):
        return ops.prelu(x, slope.reshape(-1), data_format=layout)
    return jnp.where(x > 0, x, slope * x)


@handles("Clip")
def _clip(ctx):
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo = float(np.asarray(ctx.known(1, "min"))) if ctx.has(1) else None
        hi = float(np.asarray(ctx.known(2, "max"))) if ctx.has(2) else None
    if ctx.all_known():
        return np.clip(np.asarray(ctx.raw(0)), lo, hi)
    x = ctx.tensor(0)
    if jnp.issubdtype(x.dtype, jnp.floating) and lo == 0.0:
        if hi == 6.0:
            return ops.relu6(x)
        if hi is None or math.isinf(hi):
            return ops.relu(x)
    return jnp.clip(x, lo, hi)


@handles("Cast", "CastLike")
def _cast(ctx):
    if ctx.node.op_type == "Cast":
        dtype = np.dtype(_onnx().helper.tensor_dtype_to_np_dtype(ctx.attr("to")))
    else:
        target = ctx.raw(1)
        dtype = np.dtype(target.array.dtype if isinstance(target, Weight) else target.dtype)
    x = ctx.raw(0)
    if is_known(x) and x.dtype != object:
        return x.astype(dtype)
    if is_known(x) and dtype.kind in "iu":
        return x  # symbolic sizes stay sizes
    return ctx.tensor(0).astype(_runtime_dtype(dtype))


# -- shapes ------------------------------------------------------------------------------
@handles("Shape")
def _shape(ctx):
    shape = shape_array(_shape_of(ctx.raw(0)))
    start, end = ctx.attr("start", 0), ctx.attr("end")
    return shape[start:end]


@handles("Size")
def _size(ctx):
    shape = shape_array(_shape_of(ctx.raw(0)))
    return np.array(math.prod(shape.tolist()), dtype=shape.dtype)


def _target_shape(ctx, shape, in_shape, allowzero: bool):
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, (int, np.integer)) and int(d) == 0 and not allowzero:
            if i >= len(in_shape):
                raise ctx.error(f"shape {shape} copies dim {i} (0), which the input {tuple(in_shape)} lacks")
            out.append(in_shape[i])
        else:
            out.append(int(d) if isinstance(d, (int, np.integer)) else d)
    return out


def _reshape_any(x, shape):
    if is_known(x):
        return x.reshape(shape)
    return jnp.reshape(x, shape)


@handles("Reshape")
def _reshape(ctx):
    x = ctx.value(0)
    shape = ctx.ints(1, "shape") if ctx.opset >= 5 else list(ctx.attr("shape"))
    return _reshape_any(x, _target_shape(ctx, shape, _shape_of(x), bool(ctx.attr("allowzero", 0))))


@handles("Flatten")
def _flatten(ctx):
    x = ctx.value(0)
    shape = _shape_of(x)
    axis = ctx.attr("axis", 1) % (len(shape) + 1) if shape else 0
    return _reshape_any(x, (math.prod(shape[:axis]), -1) if axis < len(shape) else (math.prod(shape), 1))


def _axes(ctx, input_index: int):
    if ctx.has(input_index) and ctx.opset >= 13:
        return ctx.ints(input_index, "axes")
    value = ctx.attr("axes")
    return None if value is None else list(value)


@handles("Squeeze")
def _squeeze(ctx):
    x = ctx.value(0)
    axes = _axes(ctx, 1)
    ndim = len(_shape_of(x))
    axes = None if axes is None else tuple(a % ndim for a in axes)
    return np.squeeze(x, axes) if is_known(x) else jnp.squeeze(x, axes)


@handles("Unsqueeze")
def _unsqueeze(ctx):
    x = ctx.value(0)
    axes = _axes(ctx, 1)
    rank = len(_shape_of(x)) + len(axes)
    shape = list(_shape_of(x))
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    return _reshape_any(x, shape)


@handles("Transpose")
def _transpose(ctx):
    x = ctx.value(0)
    perm = ctx.attr("perm")
    return np.transpose(x, perm) if is_known(x) else jnp.transpose(x, perm)


@handles("Concat")
def _concat(ctx):
    axis = ctx.attr("axis")
    if ctx.all_known():
        parts = [np.asarray(ctx.raw(i)) for i in range(ctx.num_inputs) if ctx.has(i)]
        if any(p.dtype == object for p in parts):
            parts = [p.astype(object) for p in parts]
        return np.concatenate(parts, axis)
    parts = [ctx.tensor(i) for i in range(ctx.num_inputs) if ctx.has(i)]
    parts = [p for p in parts if p.size != 0 or len(parts) == 1]
    if len(parts) > 1 and all(jnp.issubdtype(p.dtype, jnp.floating) for p in parts):
        return ops.concat(*parts, axis=axis)
    return jnp.concatenate(parts, axis)


@handles("Split")
def _split(ctx):
    x = ctx.value(0)
    shape = _shape_of(x)
    axis = ctx.attr("axis", 0) % len(shape)
    sizes = ctx.ints(1, "split") if ctx.opset >= 13 and ctx.has(1) else ctx.attr("split")
    if sizes is None:
        n = ctx.attr("num_outputs", len(ctx.node.output))
        size = shape[axis]
        chunk = -(-size // n)
        sizes = [chunk] * (n - 1) + [size - chunk * (n - 1)]
    bounds = np.cumsum([0, *sizes])
    return [x[(slice(None),) * axis + (slice(int(lo), int(hi)),)] for lo, hi in zip(bounds[:-1], bounds[1:])]


@handles("Slice")
def _slice(ctx):
    x = ctx.value(0)
    shape = _shape_of(x)
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
        axes = ctx.ints(3, "axes") if ctx.has(3) else None
        steps = ctx.ints(4, "steps") if ctx.has(4) else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = steps or [1] * len(starts)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % len(shape)] = slice(_bound(start, step, True), _bound(end, step, False), step)
    return x[tuple(index)]


def _bound(v, step: int, is_start: bool):
    """A Python slice bound for an ONNX one: huge bounds mean "to the end" (None)."""
    if isinstance(v, int) and (v >= _INT_MAX or v <= -_INT_MAX):
        if is_start:
            return None if (v > 0) == (step < 0) else v
        return None
    return v


@handles("Gather")
def _gather(ctx):
    axis = ctx.attr("axis", 0)
    if ctx.all_known():
        data, idx = np.asarray(ctx.raw(0)), np.asarray(ctx.raw(1))
        return np.take(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)
    data = ctx.tensor(0)
    n = data.shape[axis % data.ndim]
    if ctx.is_constant(1):
        idx = np.asarray(ctx.known(1, "indices"))
        if isinstance(n, int):
            idx = np.where(idx < 0, idx + n, idx)
        if idx.ndim == 0:
            return lax.index_in_dim(data, int(idx), axis % data.ndim, keepdims=False)
        idx = jnp.asarray(idx.astype(np.int32))
    else:
        idx = ctx.tensor(1)
        idx = jnp.where(idx < 0, idx + n, idx)
    return jnp.take(data, idx, axis=axis, mode="clip")


@handles("GatherElements")
def _gather_elements(ctx):
    data, idx = ctx.tensor(0), ctx.tensor(1)
    axis = ctx.attr("axis", 0) % data.ndim
    idx = jnp.where(idx < 0, idx + data.shape[axis], idx)
    return jnp.take_along_axis(data, idx, axis=axis)


@handles("Tile")
def _tile(ctx):
    reps = ctx.ints(1, "repeats")
    return np.tile(ctx.raw(0), reps) if ctx.all_known() else jnp.tile(ctx.tensor(0), reps)


def _broadcast_shape(ctx, a, b) -> tuple:
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if isinstance(x, int) and x == 1:
            out.append(y)
        elif isinstance(y, int) and y == 1 or x is y or x == y:
            out.append(x)
        else:
            raise ctx.error(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
    return tuple(out)


@handles("Expand")
def _expand(ctx):
    shape = ctx.ints(1, "shape")
    x = ctx.value(0)
    target = _broadcast_shape(ctx, _shape_of(x), shape)
    if is_known(x) and is_static(target):
        return np.broadcast_to(x, target).copy()
    return jnp.broadcast_to(ctx.tensor(0), target)  # a symbolic target is only known when run


@handles("ConstantOfShape")
def _constant_of_shape(ctx):
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    shape = ctx.ints(0, "shape")
    if is_static(shape) and math.prod(shape) <= 1024:
        return np.full(shape, value[0], value.dtype)
    return jnp.full(shape, value[0], _runtime_dtype(value.dtype))


@handles("Range")
def _range(ctx):
    if ctx.all_known():
        start, limit, delta = (np.asarray(ctx.raw(i)).reshape(()) for i in range(3))
        return np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))
    raise ctx.error("start, limit and delta must be known while converting")


@handles("Pad")
def _pad(ctx):
    x = ctx.tensor(0)
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads, value, axes = ctx.attr("pads"), float(ctx.attr("value", 0.0)), None
    else:
        pads = ctx.ints(1, "pads")
        value = float(np.asarray(ctx.known(2, "constant_value")).reshape(())) if ctx.has(2) else 0.0
        axes = ctx.ints(3, "axes") if ctx.has(3) else None
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    per_axis = {a: (pads[i], pads[i + len(axes)]) for i, a in enumerate(axes)}
    if any(p < 0 for lo_hi in per_axis.values() for p in lo_hi):
        raise ctx.error(f"negative pads {pads} (cropping) are not supported")
    modes = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}
    if mode not in modes:
        raise ctx.error(f"mode {mode!r} is not supported ({sorted(modes)} are)")
    flat = [p for a in range(x.ndim) for p in per_axis.get(a, (0, 0))]
    return ops.pad(x, paddings=tuple(int(p) for p in flat), mode=modes[mode], value=value)


# -- reductions ------------------------------------------------------------------------------
_REDUCTIONS = {"ReduceMean": ops.reduce_mean, "ReduceSum": ops.reduce_sum, "ReduceMax": ops.reduce_max}
_JNP_REDUCTIONS = {"ReduceMin": jnp.min, "ReduceProd": jnp.prod, "ReduceL1": lambda x, **k: jnp.sum(jnp.abs(x), **k),
                   "ReduceL2": lambda x, **k: jnp.sqrt(jnp.sum(x * x, **k)),
                   "ReduceSumSquare": lambda x, **k: jnp.sum(x * x, **k),
                   "ReduceLogSumExp": jax.scipy.special.logsumexp,
                   "ReduceLogSum": lambda x, **k: jnp.log(jnp.sum(x, **k))}


@handles(*_REDUCTIONS, *_JNP_REDUCTIONS)
def _reduce(ctx):
    t = ctx.node.op_type
    axes_as_input = ctx.opset >= 18 or (t == "ReduceSum" and ctx.opset >= 13)
    axes = (ctx.ints(1, "axes") if ctx.has(1) else None) if axes_as_input else ctx.attr("axes")
    keepdims = bool(ctx.attr("keepdims", 1))
    if ctx.all_known() and t in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"):
        fn = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[t]
        return np.asarray(fn(np.asarray(ctx.raw(0)), axis=None if not axes else tuple(axes), keepdims=keepdims))
    x = ctx.tensor(0)
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    axes = tuple(a % x.ndim for a in axes)
    if t in _REDUCTIONS:
        return _REDUCTIONS[t](x, axis=axes, keepdim=keepdims)
    return _JNP_REDUCTIONS[t](x, axis=axes, keepdims=keepdims)


@handles("ArgMax", "ArgMin")
def _arg(ctx):
    x = ctx.tensor(0)
    axis = ctx.attr("axis", 0) % x.ndim
    if ctx.attr("select_last_index", 0):
        x = jnp.flip(x, axis)
    out = (jnp.argmax if ctx.node.op_type == "ArgMax" else jnp.argmin)(x, axis=axis, keepdims=bool(ctx.attr("keepdims", 1)))
    return x.shape[axis] - 1 - out if ctx.attr("select_last_index", 0) else out


@handles("CumSum")
def _cumsum(ctx):
    x = ctx.tensor(0)
    axis = int(np.asarray(ctx.known(1, "axis")).reshape(())) % x.ndim
    if ctx.attr("reverse", 0):
        x = jnp.flip(x, axis)
    out = jnp.cumsum(x, axis=axis)
    if ctx.attr("exclusive", 0):
        out = out - x
    return jnp.flip(out, axis) if ctx.attr("reverse", 0) else out


@handles("Softmax", "LogSoftmax")
def _softmax(ctx):
    x = ctx.tensor(0)
    fn = ops.softmax if ctx.node.op_type == "Softmax" else ops.log_softmax
    axis = ctx.attr("axis", -1 if ctx.opset >= 13 else 1) % x.ndim
    if ctx.opset >= 13 or axis == x.ndim - 1:
        return fn(x, axis=axis)
    # before opset 13 the input is flattened to 2-D at axis
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return fn(flat, axis=-1).reshape(x.shape)


# -- linear algebra --------------------------------------------------------------------------
@handles("MatMul")
def _matmul(ctx):
    a = ctx.tensor(0)
    w = ctx.weight_array(1)
    if w is not None and w.ndim == 2 and a.ndim >= 2:
        return ops.linear(a, ctx.tensor(1))
    return ops.matmul(a, ctx.tensor(1))


@handles("Gemm")
def _gemm(ctx):
    a, b = ctx.tensor(0), ctx.tensor(1)
    if ctx.attr("transA", 0):
        a = a.T
    if ctx.attr("transB", 0) and ctx.node.input[1] not in ctx.pretransposed:
        b = b.T
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    c = ctx.tensor(2) if ctx.has(2) else None
    if alpha == 1.0 and (c is None or beta == 1.0 and c.ndim == 1 and c.shape[0] == b.shape[1]):
        return ops.linear(a, b, c)
    y = ops.matmul(a, b) * alpha if alpha != 1.0 else ops.matmul(a, b)
    return y if c is None else y + beta * c


@handles("Einsum")
def _einsum(ctx):
    return jnp.einsum(ctx.attr("equation"), *[ctx.tensor(i) for i in range(ctx.num_inputs)])


# -- convolution, normalisation, pooling -------------------------------------------------------
def _explicit_pads(ctx, spatial, kernel, strides, dilations):
    """(lo, hi) per spatial axis from ``pads`` or ``auto_pad``."""
    auto = ctx.attr("auto_pad", "NOTSET")
    n = len(kernel)
    if auto in ("NOTSET", ""):
        pads = ctx.attr("pads") or [0] * (2 * n)
        return tuple((int(pads[i]), int(pads[i + n])) for i in range(n))
    if auto == "VALID":
        return ((0, 0),) * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad {auto!r} is not supported")
    if not is_static(spatial):
        raise ctx.error(f"auto_pad {auto} needs static spatial sizes, got {tuple(spatial)}; fix them with "
                        "from_onnx(..., input_shapes=...)")
    upper = same_padding(spatial, kernel, strides, dilations)
    return upper if auto == "SAME_UPPER" else tuple((hi, lo) for lo, hi in upper)


@handles("Conv")
def _conv(ctx):
    x, w = ctx.tensor(0), ctx.tensor(1)
    b = ctx.tensor(2) if ctx.has(2) else None
    n = w.ndim - 2
    kernel = tuple(ctx.attr("kernel_shape") or w.shape[2:])
    strides = tuple(ctx.attr("strides") or (1,) * n)
    dilations = tuple(ctx.attr("dilations") or (1,) * n)
    pads = _explicit_pads(ctx, x.shape[2:], kernel, strides, dilations)
    group = int(ctx.attr("group", 1))
    conv = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}.get(n)
    if conv is None:
        raise ctx.error(f"{n}-D convolutions are not supported (1-D to 3-D are)")
    return conv(x, w, b, stride=strides, padding=pads, dilation=dilations, groups=group,
                data_format=_CHANNEL_FIRST[x.ndim])


@handles("ConvTranspose")
def _conv_transpose(ctx):
    x, w = ctx.tensor(0), ctx.tensor(1)
    b = ctx.tensor(2) if ctx.has(2) else None
    if w.ndim != 4:
        raise ctx.error(f"only 2-D transposed convolutions are supported, the weight is {w.ndim - 2}-D")
    kernel = tuple(ctx.attr("kernel_shape") or w.shape[2:])
    strides = tuple(ctx.attr("strides") or (1, 1))
    dilations = tuple(ctx.attr("dilations") or (1, 1))
    out_pad = tuple(ctx.attr("output_padding") or (0, 0))
    output_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if output_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        spatial = x.shape[2:]
        if not is_static(spatial):
            raise ctx.error("output_shape / auto_pad need static spatial sizes; use from_onnx(..., input_shapes=...)")
        target = output_shape[-2:] if output_shape is not None else [n * s for n, s in zip(spatial, strides)]
        pads = []
        for n, k, s, d, o, t in zip(spatial, kernel, strides, dilations, out_pad, target):
            total = s * (n - 1) + o + (k - 1) * d + 1 - t
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads.append((lo, total - lo))
        pads = tuple(pads)
    elif auto == "VALID":
        pads = ((0, 0), (0, 0))
    else:
        p = ctx.attr("pads") or [0, 0, 0, 0]
        pads = ((p[0], p[2]), (p[1], p[3]))
    return ops.conv2d_transpose(x, w, b, stride=strides, padding=pads, dilation=dilations, output_padding=out_pad,
                                groups=int(ctx.attr("group", 1)), data_format="NCHW")


@handles("BatchNormalization")
def _batch_norm(ctx):
    if ctx.attr("training_mode", 0):
        raise ctx.error("training_mode=1: only inference graphs are converted")
    x = ctx.tensor(0)
    if x.ndim not in _CHANNEL_FIRST:
        raise ctx.error(f"inputs of rank {x.ndim} are not supported (2 to 5 are)")
    out = ops.batch_norm(x, ctx.tensor(3), ctx.tensor(4), ctx.tensor(1), ctx.tensor(2),
                         epsilon=float(ctx.attr("epsilon", 1e-5)), data_format=_CHANNEL_FIRST[x.ndim])
    return out[0]


@handles("InstanceNormalization")
def _instance_norm(ctx):
    x = ctx.tensor(0)
    return ops.group_norm(x, ctx.tensor(1), ctx.tensor(2), groups=x.shape[1],
                          epsilon=float(ctx.attr("epsilon", 1e-5)), data_format=_CHANNEL_FIRST[x.ndim])


@handles("LayerNormalization")
def _layer_norm(ctx):
    if any(o for o in ctx.node.output[1:]):
        raise ctx.error("the Mean and InvStdDev outputs are not supported")
    x = ctx.tensor(0)
    return ops.layer_norm(x, ctx.tensor(1), ctx.tensor(2) if ctx.has(2) else None,
                          epsilon=float(ctx.attr("epsilon", 1e-5)), begin_norm_axis=ctx.attr("axis", -1) % x.ndim)


def _pool_input(ctx):
    """The input as a 2-D pooling input: 1-D pools run on a height-1 image."""
    x = ctx.tensor(0)
    if x.ndim == 3:
        return x[:, :, None, :], True
    if x.ndim != 4:
        raise ctx.error(f"{x.ndim - 2}-D pooling is not supported (1-D and 2-D are)")
    return x, False


@handles("MaxPool", "AveragePool")
def _pool(ctx):
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        raise ctx.error("the Indices output is not supported")
    x, one_d = _pool_input(ctx)
    kernel = tuple(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides = tuple(ctx.attr("strides") or (1,) * n)
    dilations = tuple(ctx.attr("dilations") or (1,) * n)
    if any(d != 1 for d in dilations):
        raise ctx.error(f"dilations {dilations} are not supported")
    pads = _explicit_pads(ctx, x.shape[2:][-n:], kernel, strides, dilations)
    if one_d:
        kernel, strides, pads = (1, *kernel), (1, *strides), ((0, 0), *pads)
    avg = ctx.node.op_type == "AveragePool"
    y = ops.pool2d(x, pooling_type="avg" if avg else "max", kernel_size=kernel, stride=strides, padding=pads,
                   ceil_mode=bool(ctx.attr("ceil_mode", 0)),
                   exclusive=not ctx.attr("count_include_pad", 0), data_format="NCHW")
    return y[:, :, 0, :] if one_d else y


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx):
    x = ctx.tensor(0)
    if x.ndim == 4:
        return ops.pool2d(x, pooling_type="avg" if ctx.node.op_type == "GlobalAveragePool" else "max",
                          global_pooling=True, data_format="NCHW")
    fn = jnp.mean if ctx.node.op_type == "GlobalAveragePool" else jnp.max
    return fn(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@handles("Resize", "Upsample")
def _resize(ctx):
    x = ctx.tensor(0)
    mode = ctx.attr("mode", "nearest")
    coords = ctx.attr("coordinate_transformation_mode", "asymmetric" if ctx.opset < 11 else "half_pixel")
    nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    if ctx.attr("antialias", 0) or ctx.attr("axes") is not None:
        raise ctx.error("antialias and axes are not supported")
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        scales, sizes = [float(s) for s in ctx.known(1, "scales")] if ctx.has(1) else ctx.attr("scales"), None
    else:
        scales = [float(s) for s in ctx.known(2, "scales")] if ctx.has(2) and ctx.known(2, "scales").size else None
        sizes = ctx.ints(3, "sizes") if ctx.has(3) else None
    if sizes is None and scales is None:
        raise ctx.error("neither scales nor sizes is given")
    if (sizes if sizes is not None else scales)[:2] not in ([1, 1], [1.0, 1.0], list(x.shape[:2])):
        raise ctx.error("resizing the batch or channel axis is not supported")
    spatial = list(x.shape[2:])
    if mode == "nearest" and coords == "asymmetric" and nearest_mode == "floor" and sizes is None \
            and all(float(s).is_integer() for s in scales[2:]):
        # out[j] = in[floor(j / s)]: repeating each element s times, exactly, for any (symbolic) size
        for axis, s in enumerate(scales[2:], start=2):
            x = jnp.repeat(x, int(s), axis=axis) if s != 1 else x
        return x
    if not is_static(spatial):
        raise ctx.error(f"resizing symbolic sizes {tuple(spatial)} is supported only for nearest, integer scales; "
                        "fix them with from_onnx(..., input_shapes=...)")
    out = list(sizes[2:]) if sizes is not None else [int(math.floor(n * s)) for n, s in zip(spatial, scales[2:])]
    if mode == "nearest":
        return _resize_nearest(ctx, x, out, scales[2:] if scales is not None and sizes is None else None,
                               coords, nearest_mode)
    if mode != "linear":
        raise ctx.error(f"mode {mode!r} is not supported (nearest and linear are)")
    align = {"half_pixel": (False, 0), "pytorch_half_pixel": (False, 0), "align_corners": (True, 0),
             "asymmetric": (False, 1)}.get(coords)
    if align is None:
        raise ctx.error(f"coordinate_transformation_mode {coords!r} is not supported for linear resizing")
    return ops.interpolate(x, size=tuple(out), mode={3: "linear", 4: "bilinear", 5: "trilinear"}[x.ndim],
                           align_corners=align[0], align_mode=align[1], data_format=_CHANNEL_FIRST[x.ndim])


def _resize_nearest(ctx, x, out, scales, coords, nearest_mode):
    """Nearest resizing by gathering the source index of every output index (ONNX's formulas)."""
    for axis, size in enumerate(out, start=2):
        n = x.shape[axis]
        j = np.arange(size, dtype=np.float64)
        scale = scales[axis - 2] if scales is not None else size / n
        if coords == "asymmetric":
            src = j / scale
        elif coords in ("half_pixel", "pytorch_half_pixel"):
            src = (j + 0.5) / scale - 0.5 if not (coords == "pytorch_half_pixel" and size == 1) else 0 * j
        elif coords == "align_corners":
            src = j * (n - 1) / (size - 1) if size > 1 else 0 * j
        else:
            raise ctx.error(f"coordinate_transformation_mode {coords!r} is not supported")
        pick = {"floor": np.floor, "ceil": np.ceil, "round_prefer_floor": lambda v: np.ceil(v - 0.5),
                "round_prefer_ceil": lambda v: np.floor(v + 0.5)}.get(nearest_mode)
        if pick is None:
            raise ctx.error(f"nearest_mode {nearest_mode!r} is not supported")
        idx = np.clip(pick(src), 0, n - 1).astype(np.int32)
        x = jnp.take(x, jnp.asarray(idx), axis=axis)
    return x


@handles("DepthToSpace", "SpaceToDepth")
def _depth_space(ctx):
    x = ctx.tensor(0)
    r = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    if ctx.node.op_type == "SpaceToDepth":
        y = x.reshape(n, c, h // r, r, w // r, r).transpose(0, 3, 5, 1, 2, 4)
        return y.reshape(n, c * r * r, h // r, w // r)
    if ctx.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, r, r, c // (r * r), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (r * r), h * r, w * r)


# -- recurrent -----------------------------------------------------------------------------
# ONNX orders the LSTM gates (i, o, f, c), the op library (i, f, c, o); GRU (z, r, h) vs (r, z, c).
_GATE_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


def _gates(w, order):
    parts = jnp.split(w, len(order), axis=0)
    return jnp.concatenate([parts[i] for i in order], axis=0)


@handles("LSTM", "GRU")
def _rnn(ctx):
    t = ctx.node.op_type
    directions = 2 if ctx.attr("direction") == "bidirectional" else 1
    defaults = (["sigmoid", "tanh", "tanh"] if t == "LSTM" else ["sigmoid", "tanh"]) * directions
    if [a.lower() for a in ctx.attr("activations", defaults)] != defaults:
        raise ctx.error(f"activations {ctx.attr('activations')} are not supported (the defaults are)")
    if ctx.attr("clip") is not None or ctx.attr("input_forget", 0):
        raise ctx.error("clip and input_forget are not supported")
    if t == "GRU" and not ctx.attr("linear_before_reset", 0):
        raise ctx.error("linear_before_reset=0 is not supported (PyTorch and Paddle export 1)")
    if t == "LSTM" and ctx.has(7):
        raise ctx.error("peephole weights (input P) are not supported")
    batch_major = ctx.attr("layout", 0) == 1
    x = ctx.tensor(0) if batch_major else jnp.swapaxes(ctx.tensor(0), 0, 1)  # the op library's are batch-major
    w, r = ctx.tensor(1), ctx.tensor(2)
    order = _GATE_ORDER[t]
    gates = len(order)
    dirs, gh, _ = w.shape
    hidden = int(ctx.attr("hidden_size", gh // gates))
    batch = x.shape[0]
    bias = ctx.tensor(3) if ctx.has(3) else jnp.zeros((dirs, 2 * gates * hidden), x.dtype)
    lengths = ctx.tensor(4) if ctx.has(4) else None
    states = []
    for k in (5, 6) if t == "LSTM" else (5,):
        s = ctx.tensor(k) if ctx.has(k) else jnp.zeros((dirs, batch, hidden), x.dtype)
        states.append(jnp.swapaxes(s, 0, 1) if batch_major else s)
    outs, hs, cs = [], [], []
    for d in range(dirs):
        args = (_gates(w[d], order), _gates(r[d], order), _gates(bias[d, :gates * hidden], order),
                _gates(bias[d, gates * hidden:], order))
        reverse = ctx.attr("direction") == "reverse" or d == 1
        if t == "LSTM":
            out, h, c = ops.lstm(x, states[0][d], states[1][d], *args, lengths, is_reverse=reverse)
            cs.append(c)
        else:
            out, h = ops.gru(x, states[0][d], *args, lengths, is_reverse=reverse)
        outs.append(out)
        hs.append(h)
    y = jnp.stack(outs, axis=1)  # [batch, dirs, time, hidden]
    y = jnp.transpose(y, (0, 2, 1, 3)) if batch_major else jnp.transpose(y, (2, 1, 0, 3))
    last = [jnp.stack(hs), *([jnp.stack(cs)] if t == "LSTM" else [])]
    if batch_major:
        last = [jnp.swapaxes(s, 0, 1) for s in last]
    return (y, *last)
