"""Program → ONNX: write a program as an ONNX model, built with the ``onnx`` package's helpers.

Each op becomes ONNX nodes through one handler per op type (:func:`handles`): ``conv2d``
becomes ``Conv``, ``batch_norm`` ``BatchNormalization`` in its inference form, ``linear``
``Gemm`` (or ``MatMul`` + ``Add``), ``pool2d`` ``MaxPool`` / ``AveragePool``, and the generic
``lax.*`` ops of traced JAX code their ONNX twins (``lax.dot_general`` an ``Einsum``).

- Parameters become initializers under their program names (``layer1.0.conv1.weight``) and in
  their own dtypes (float16 and bfloat16 included); the program's inputs and outputs become the
  graph's, symbolic sizes (``b``) as ``dim_param`` s. Where an op needs a symbolic size as a
  value (a broadcast to ``(b, 6)``), the graph reads it from an input with ``Shape``.
- ONNX's image ops are channel-first: an op in ``NHWC`` is wrapped in ``Transpose`` s.
- Every op is checked before anything is built, and one :class:`ConversionError` names all the
  ops that cannot be exported: control flow (``cond``, ``while``, ``scan``), batch norm and
  dropout in training mode, random, recurrent (``lstm``, ``gru``), quantized and loss ops, and
  the lax ops without an ONNX twin (scatters, sorts, window reductions, gathers other than
  ``x[:, i]`` / ``jnp.take``).

>>> import paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(x) * 2.0, pj.InputSpec((None, 3)))
>>> model = to_onnx(prog)
>>> [n.op_type for n in model.graph.node], model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
(['Relu', 'Mul'], 'b')
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax._extras import require
from paddlejax.convert.errors import ConversionError
from paddlejax.ir import Op, Program
from paddlejax.ir.attrs import SymDim, dim_symbols, eval_dim
from paddlejax.ir.printer import op_lines
from paddlejax.ops import registry
from paddlejax.ops.common import channel_axis
from paddlejax.ops.conv import paddle_padding
from paddlejax.ops.pool import pool_geometry

# LayerNormalization arrives in opset 17; the importer reads up to 21.
MIN_OPSET, MAX_OPSET = 17, 21


@dataclasses.dataclass(frozen=True)
class _Handler:
    """How one op type becomes ONNX nodes: ``emit(node)`` returns the ONNX name of each result;
    ``check(op, attrs, opset)``, when given, says why a particular op cannot be exported (None
    when it can), before anything is built."""

    emit: Callable
    check: Callable | None = None


HANDLERS: dict[str, _Handler] = {}


def handles(*op_types: str, check: Callable | None = None):
    """Register the decorated function as the ONNX exporter of ``op_types``.

    >>> @handles("example_double")
    ... def _double(node):
    ...     return node.emit("Add", [node.inputs[0], node.inputs[0]])
    >>> HANDLERS.pop("example_double").emit is _double
    True
    """
    def register(fn):
        for t in op_types:
            HANDLERS[t] = _Handler(fn, check)
        return fn

    return register


def _onnx():
    return require("onnx", extra="convert", feature="pj.convert.to_onnx")


def _np_dtype(name) -> np.dtype:
    # jnp knows bfloat16 and the float8 types by name, NumPy does not
    return np.dtype(jnp.dtype(name))


def _tensor_type(name) -> int:
    return _onnx().helper.np_dtype_to_tensor_dtype(_np_dtype(name))


def _compute_dtype(name: str) -> str:
    """The dtype the op library computes statistics and attention in: at least float32."""
    return jnp.promote_types(name, jnp.float32).name


def _static(dims) -> bool:
    return all(isinstance(d, (int, np.integer)) for d in dims)


def _dim_key(d):
    return d.expr if isinstance(d, SymDim) else d


def _arithmetic(op_type: str, swap: bool = False):
    return lambda self, other: self.apply(op_type, other, swap)


class _Size:
    """A symbolic size being computed in the graph (an int64 ``[1]`` tensor): arithmetic with ints
    and other sizes adds nodes, so :func:`paddlejax.ir.attrs.eval_dim` turns an expression such
    as ``2*b`` into the graph."""

    def __init__(self, graph: "_Graph", name: str):
        self.graph, self.name = graph, name

    def apply(self, op_type: str, other, swap: bool = False) -> "_Size":
        other = other.name if isinstance(other, _Size) else self.graph.ints([other])
        a, b = (other, self.name) if swap else (self.name, other)
        return _Size(self.graph, self.graph.node(op_type, [a, b]))

    def __neg__(self):
        return _Size(self.graph, self.graph.node("Neg", [self.name]))

    __add__, __radd__ = _arithmetic("Add"), _arithmetic("Add", True)
    __sub__, __rsub__ = _arithmetic("Sub"), _arithmetic("Sub", True)
    __mul__, __rmul__ = _arithmetic("Mul"), _arithmetic("Mul", True)
    # sizes are never negative, so ONNX's truncating integer Div is the floor division asked for
    __floordiv__, __rfloordiv__ = _arithmetic("Div"), _arithmetic("Div", True)
    __mod__, __rmod__ = _arithmetic("Mod"), _arithmetic("Mod", True)


class _Graph:
    """The ONNX graph being built: nodes, initializers, unique names, shared constants and the
    tensors of symbolic sizes."""

    def __init__(self, opset: int):
        self.onnx = _onnx()
        self.opset = opset
        self.nodes: list = []
        self.initializers: list = []
        self.hint = "value"
        self._taken: set[str] = set()
        self._counts: dict[str, int] = {}
        self._consts: dict[tuple, str] = {}
        self._dims: dict[str, str] = {}
        self._transposes: dict[str, tuple[str, list[int]]] = {}  # output -> (input, perm)
        self.symbols: dict[str, tuple[str, int]] = {}  # symbol -> (input name, axis)

    def reserve(self, name: str) -> str:
        """``name`` itself if free, else the first free ``name_<k>``."""
        if name in self._taken:
            return self.fresh(name)
        self._taken.add(name)
        return name

    def fresh(self, base: str) -> str:
        k = self._counts.get(base, 0)
        while f"{base}_{k}" in self._taken:
            k += 1
        self._counts[base] = k + 1
        name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def node(self, op_type: str, inputs, outputs: int = 1, names=None, **attrs):
        """Append a node; returns its output name (a list of them when ``outputs`` > 1)."""
        names = list(names) if names is not None else [self.fresh(self.hint) for _ in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), names, name=names[0], **attrs))
        return names[0] if len(names) == 1 else names

    def transpose(self, x: str, perm) -> str:
        """``x`` with its axes permuted. Undoing the Transpose that made ``x`` gives back that
        Transpose's input, so the layout changes between consecutive NHWC ops cancel."""
        perm = [int(p) for p in perm]
        if perm == sorted(perm):
            return x
        source, before = self._transposes.get(x, (None, None))
        if source is not None and [before[p] for p in perm] == sorted(perm):
            return source
        y = self.node("Transpose", [x], perm=perm)
        self._transposes[y] = (x, perm)
        return y

    def prune(self, outputs) -> None:
        """Drop the nodes and initializers that no output needs (Transposes that a later one
        cancelled, parameters the program reads but does not use)."""
        needed, kept = set(outputs), []
        for node in reversed(self.nodes):
            if needed.intersection(node.output):
                kept.append(node)
                needed.update(node.input)
        self.nodes[:] = kept[::-1]
        self.initializers[:] = [t for t in self.initializers if t.name in needed]

    def initializer(self, array: np.ndarray, name: str) -> str:
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, value, dtype) -> str:
        """An initializer holding ``value``; small ones are shared."""
        array = np.asarray(value, dtype=_np_dtype(dtype))
        key = (array.dtype.name, array.shape, array.tobytes()) if array.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.initializer(array, self.fresh("const"))
        if key is not None:
            self._consts[key] = name
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64).reshape(-1), "int64")

    def dim(self, d) -> str:
        """A size as an int64 ``[1]`` tensor: an int, a symbol or an expression over symbols."""
        if isinstance(d, (int, np.integer)):
            return self.ints([d])
        expr = _dim_key(d)
        if expr not in self._dims:
            try:
                value = eval_dim(expr, {s: _Size(self, self._symbol(s)) for s in dim_symbols(expr)})
            except ConversionError:
                raise
            except Exception as error:  # noqa: BLE001 - eval_dim's calls (max, min) take no graph tensors
                raise ConversionError(f"to_onnx: the symbolic size {expr!r} cannot be computed in ONNX "
                                      f"({type(error).__name__}: {error})") from None
            self._dims[expr] = value.name if isinstance(value, _Size) else self.ints([value])
        return self._dims[expr]

    def _symbol(self, symbol: str) -> str:
        if symbol not in self._dims:
            if symbol not in self.symbols:
                raise ConversionError(f"to_onnx: the symbolic size {symbol!r} is not the size of an axis of any "
                                      "program input, so the ONNX graph cannot read it")
            source, axis = self.symbols[symbol]
            self._dims[symbol] = self.node("Shape", [source], start=axis, end=axis + 1)
        return self._dims[symbol]

    def shape(self, dims) -> str:
        """A shape as an int64 1-D tensor: a constant, or a Concat where sizes are symbolic."""
        dims = tuple(dims)
        if _static(dims):
            return self.ints(dims)
        parts, run = [], []
        for d in dims:
            if isinstance(d, (int, np.integer)):
                run.append(int(d))
                continue
            if run:
                parts.append(self.ints(run))
                run = []
            parts.append(self.dim(d))
        if run:
            parts.append(self.ints(run))
        return parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)


def _attrs(op: Op) -> dict:
    """The op's attributes, with a registry op's declared defaults for those it leaves out."""
    opdef = registry.lookup(op.type)
    defaults = {} if opdef is None else {k: a.default for k, a in opdef.attrs.items()
                                          if a.default is not registry.REQUIRED}
    return {**defaults, **op.attrs}


class Node:
    """One op being exported, as its handler sees it: its attributes (declared defaults filled
    in), the ONNX names of its operands (``inputs``), their types (``types``) and its results'
    types (``out``); ``emit`` appends a node to the graph and returns its output's name.

    >>> import paddlejax as pj
    >>> prog = pj.trace(lambda x: pj.ops.softmax(x), pj.InputSpec((None, 3)))
    >>> node = Node(_Graph(17), prog.body.ops[0], ["x"])
    >>> node.attrs, node.emit("Softmax", node.inputs, axis=node.attrs["axis"])
    ({'axis': -1}, 'value_0')
    """

    def __init__(self, graph: _Graph, op: Op, inputs: list[str]):
        self.graph, self.op, self.inputs = graph, op, inputs
        self.attrs = _attrs(op)
        self.types = [v.type for v in op.operands]
        self.out = [r.type for r in op.results]

    @property
    def opset(self) -> int:
        return self.graph.opset

    def emit(self, op_type: str, inputs, outputs: int = 1, **attrs):
        return self.graph.node(op_type, inputs, outputs, **attrs)

    def const(self, value, dtype=None) -> str:
        return self.graph.const(value, dtype or self.out[0].dtype)

    def arg(self, name: str, dtype: str | None = None) -> str | None:
        """The ONNX name of the registry op's input ``name`` (None when the optional input is
        absent), cast to ``dtype`` when one is given."""
        names = [i.name for i in registry.get(self.op.type).inputs]
        i = names.index(name)
        if i >= len(self.inputs):
            return None
        return self.inputs[i] if dtype is None else self.cast(self.inputs[i], self.types[i].dtype, dtype)

    def arg_type(self, name: str):
        return self.types[[i.name for i in registry.get(self.op.type).inputs].index(name)]

    def cast(self, x: str, src: str, dst: str) -> str:
        return x if src == dst else self.emit("Cast", [x], to=_tensor_type(dst))

    def inputs_as(self, dtype: str) -> list[str]:
        """The operands cast to ``dtype`` (the result's, where the op promotes)."""
        return [self.cast(x, t.dtype, dtype) for x, t in zip(self.inputs, self.types)]

    def transpose(self, x: str, perm) -> str:
        return self.graph.transpose(x, perm)

    def reduce(self, op_type: str, x: str, axes, keepdims: bool) -> str:
        """A reduction over ``axes`` (all when None); since opset 18 (13 for ReduceSum) the
        axes are an input rather than an attribute."""
        if axes is None:
            return self.emit(op_type, [x], keepdims=int(keepdims))
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.emit(op_type, [x, self.graph.ints(axes)], keepdims=int(keepdims))
        return self.emit(op_type, [x], axes=[int(a) for a in axes], keepdims=int(keepdims))


def _filled(node: Node, value, dtype: str, shape) -> str:
    """A tensor of ``shape`` (symbolic sizes allowed) filled with ``value``."""
    fill = _onnx().numpy_helper.from_array(np.asarray([value], _np_dtype(dtype)))
    return node.emit("ConstantOfShape", [node.graph.shape(shape)], value=fill)


# -- layouts ------------------------------------------------------------------------------------

def _first_perm(data_format: str, rank: int) -> list[int]:
    """The permutation that brings a ``data_format`` tensor to channel-first."""
    if channel_axis(data_format, rank) == 1:
        return list(range(rank))
    return [0, rank - 1, *range(1, rank - 1)]


def _channels_first_shape(shape, data_format: str) -> tuple:
    return tuple(shape[i] for i in _first_perm(data_format, len(shape)))


def _spatial(ttype, data_format: str) -> tuple:
    """The spatial sizes of an image of type ``ttype`` in ``data_format``."""
    return _channels_first_shape(ttype.shape, data_format)[2:]


def _to_channels_first(node: Node, x: str, data_format: str, rank: int) -> str:
    return node.transpose(x, _first_perm(data_format, rank))


def _from_channels_first(node: Node, y: str, data_format: str, rank: int) -> str:
    return node.transpose(y, np.argsort(_first_perm(data_format, rank)))


def _pads(pairs) -> list[int]:
    """``((lo, hi), ...)`` per spatial axis as ONNX's ``[lo..., hi...]``."""
    return [int(lo) for lo, _ in pairs] + [int(hi) for _, hi in pairs]


# -- activations ----------------------------------------------------------------------------------

def _gelu(node: Node, x: str, attrs: dict) -> str:
    approximate = bool(attrs.get("approximate", False))
    if node.opset >= 20:
        return node.emit("Gelu", [x], approximate="tanh" if approximate else "none")
    half, one = node.const(0.5), node.const(1.0)
    if approximate:
        cube = node.emit("Mul", [node.emit("Mul", [x, x]), x])
        inner = node.emit("Add", [x, node.emit("Mul", [cube, node.const(0.044715)])])
        cdf = node.emit("Tanh", [node.emit("Mul", [inner, node.const(math.sqrt(2 / math.pi))])])
    else:
        cdf = node.emit("Erf", [node.emit("Mul", [x, node.const(1 / math.sqrt(2))])])
    return node.emit("Mul", [node.emit("Mul", [x, node.emit("Add", [cdf, one])]), half])


ACTIVATIONS: dict[str, Callable[[Node, str, dict], str]] = {
    "relu": lambda n, x, a: n.emit("Relu", [x]),
    "relu6": lambda n, x, a: n.emit("Clip", [x, n.const(0), n.const(6)]),
    "gelu": _gelu,
    "sigmoid": lambda n, x, a: n.emit("Sigmoid", [x]),
    "tanh": lambda n, x, a: n.emit("Tanh", [x]),
    "silu": lambda n, x, a: n.emit("Mul", [x, n.emit("Sigmoid", [x])]),
    "leaky_relu": lambda n, x, a: n.emit("LeakyRelu", [x], alpha=float(a["negative_slope"])),
    "hard_swish": lambda n, x, a: n.emit("HardSwish", [x]),
    "hard_sigmoid": lambda n, x, a: n.emit("HardSigmoid", [x], alpha=float(a["slope"]), beta=float(a["offset"])),
}


@handles(*ACTIVATIONS)
def _activation(node: Node):
    return ACTIVATIONS[node.op.type](node, node.inputs[0], node.attrs)


def _activate(node: Node, y: str) -> str:
    """``y`` through the op's fused activation (its ``act`` attribute), if it has one."""
    act = node.attrs.get("act")
    if act is None:
        return y
    if act == "gelu_tanh":
        return _gelu(node, y, {"approximate": True})
    if act == "leaky_relu":
        slope = node.attrs.get("act_alpha")
        return ACTIVATIONS["leaky_relu"](node, y, {
            "negative_slope": registry.get("leaky_relu").attrs["negative_slope"].default if slope is None else slope})
    return ACTIVATIONS[act](node, y, {})


@handles("softmax", "log_softmax")
def _softmax(node: Node):
    return node.emit("Softmax" if node.op.type == "softmax" else "LogSoftmax", [node.inputs[0]],
                     axis=int(node.attrs["axis"]))


@handles("prelu")
def _prelu(node: Node):
    x, slope = node.inputs
    rank, slopes = len(node.types[0].shape), node.types[1].shape[0]
    slope = node.cast(slope, node.types[1].dtype, node.out[0].dtype)
    if slopes != 1 and channel_axis(node.attrs["data_format"], rank) == 1:
        # one slope per channel: broadcast it over the axes after the channel one
        slope = node.emit("Reshape", [slope, node.graph.ints([slopes] + [1] * (rank - 2))])
    return node.emit("PRelu", [x, slope])


# -- arithmetic -----------------------------------------------------------------------------------

_ELEMENTWISE = {"elementwise_add": "Add", "elementwise_sub": "Sub", "elementwise_mul": "Mul",
                "elementwise_div": "Div", "elementwise_max": "Max", "elementwise_min": "Min",
                "elementwise_pow": "Pow"}


@handles(*_ELEMENTWISE)
def _elementwise(node: Node):
    # ONNX broadcasts as NumPy does; integer division in the op library is true division
    return _activate(node, node.emit(_ELEMENTWISE[node.op.type], node.inputs_as(node.out[0].dtype)))


@handles("linear")
def _linear(node: Node):
    # jnp.matmul promotes mixed dtypes; ONNX takes one
    x, weight, *bias = node.inputs_as(node.out[0].dtype)
    if len(node.types[0].shape) == 2:
        y = node.emit("Gemm", [x, weight, *bias])
    else:
        y = node.emit("MatMul", [x, weight])
        y = node.emit("Add", [y, *bias]) if bias else y
    return _activate(node, y)


def _swap_last(node: Node, x: str, rank: int, swap: bool) -> str:
    return node.transpose(x, [*range(rank - 2), rank - 1, rank - 2]) if swap and rank >= 2 else x


@handles("matmul")
def _matmul(node: Node):
    x, y = node.inputs_as(node.out[0].dtype)
    x = _swap_last(node, x, len(node.types[0].shape), node.attrs["transpose_x"])
    y = _swap_last(node, y, len(node.types[1].shape), node.attrs["transpose_y"])
    return node.emit("MatMul", [x, y])


@handles("embedding")
def _embedding(node: Node):
    ids, weight = node.inputs
    rows = node.emit("Gather", [weight, ids], axis=0)
    if node.attrs["padding_idx"] is None:
        return rows
    vocab = node.types[1].shape[0]
    padding = node.emit("Equal", [ids, node.const(node.attrs["padding_idx"] % vocab, node.types[0].dtype)])
    padding = node.emit("Unsqueeze", [padding, node.graph.ints([-1])])
    return node.emit("Where", [padding, node.const(0), rows])


def _training_dropout(op, attrs, opset):
    if attrs["training"] and attrs["p"] > 0:
        return "training=True draws random masks; trace the model in eval mode"
    return None


@handles("dropout", check=_training_dropout)
def _dropout(node: Node):
    x = node.inputs[0]
    if node.attrs["mode"] == "upscale_in_train" or node.attrs["training"]:
        return x
    return node.emit("Mul", [x, node.const(1 - node.attrs["p"])])


@handles("cast")
def _cast(node: Node):
    return node.cast(node.inputs[0], node.types[0].dtype, node.out[0].dtype)


_REDUCTIONS = {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean", "reduce_max": "ReduceMax"}


@handles(*_REDUCTIONS)
def _reduction(node: Node):
    # the mean of integers is a float: reduce in the result's dtype
    x = node.cast(node.inputs[0], node.types[0].dtype, node.out[0].dtype)
    rank = len(node.types[0].shape)
    axes = [a % rank for a in node.attrs["axis"]] if node.attrs["axis"] else None
    return node.reduce(_REDUCTIONS[node.op.type], x, axes, node.attrs["keepdim"])


# -- convolution, normalisation, pooling ------------------------------------------------------------

def _same_needs_sizes(op, attrs, opset):
    spatial = _spatial(op.operands[0].type, attrs["data_format"])
    if attrs["padding"] == "SAME" and not _static(spatial):
        return f"padding='SAME' needs static spatial sizes, the input has {spatial}"
    return None


def _conv_window(node: Node) -> dict:
    """A convolution's kernel, strides, dilations and explicit pads as ONNX attributes, with
    Paddle's SAME (from the undilated kernel, dilation then 1) and VALID resolved."""
    kernel = [int(k) for k in node.types[1].shape[2:]]
    pads, dilation = paddle_padding(node.attrs["padding"], _spatial(node.types[0], node.attrs["data_format"]),
                                    kernel, node.attrs["stride"], node.attrs["dilation"])
    return dict(kernel_shape=kernel, strides=list(node.attrs["stride"]), dilations=list(dilation), pads=_pads(pads))


@handles("conv1d", "conv2d", "conv3d", "depthwise_conv2d", check=_same_needs_sizes)
def _conv(node: Node):
    fmt, rank = node.attrs["data_format"], len(node.types[0].shape)
    # depthwise_conv2d declares no groups: one group per input channel
    groups = node.attrs.get("groups") or _channels_first_shape(node.types[0].shape, fmt)[1]
    x = _to_channels_first(node, node.inputs[0], fmt, rank)
    y = node.emit("Conv", [x, *node.inputs[1:]], group=int(groups), **_conv_window(node))
    return _activate(node, _from_channels_first(node, y, fmt, rank))


@handles("conv2d_transpose", check=_same_needs_sizes)
def _conv_transpose(node: Node):
    fmt = node.attrs["data_format"]
    x = _to_channels_first(node, node.inputs[0], fmt, 4)
    y = node.emit("ConvTranspose", [x, *node.inputs[1:]], group=int(node.attrs["groups"]),
                  output_padding=list(node.attrs["output_padding"]), **_conv_window(node))
    return _from_channels_first(node, y, fmt, 4)


def _inference_only(op, attrs, opset):
    return "training=True normalises with batch statistics; trace the model in eval mode" if attrs["training"] else None


@handles("batch_norm", "sync_batch_norm", check=_inference_only)
def _batch_norm(node: Node):
    fmt, dtype = node.attrs["data_format"], node.types[0].dtype
    rank, channels = len(node.types[0].shape), node.types[1].shape[0]
    compute = _compute_dtype(dtype)
    x = node.cast(_to_channels_first(node, node.inputs[0], fmt, rank), dtype, compute)
    stats = [node.cast(s, t.dtype, compute) for s, t in zip(node.inputs[1:3], node.types[1:3])]
    affine = [node.arg(name, compute) or node.const(np.full(channels, fill), compute)
              for name, fill in (("weight", 1.0), ("bias", 0.0))]
    y = node.emit("BatchNormalization", [x, *affine, *stats], epsilon=float(node.attrs["epsilon"]))
    # in inference the running statistics pass through unchanged
    return [_from_channels_first(node, node.cast(y, compute, dtype), fmt, rank), node.inputs[1], node.inputs[2]]


@handles("layer_norm")
def _layer_norm(node: Node):
    shape, dtype = node.types[0].shape, node.types[0].dtype
    begin = node.attrs["begin_norm_axis"] % len(shape)
    normalised, compute = shape[begin:], _compute_dtype(dtype)
    affine = []
    for name in ("weight", "bias"):
        given = node.arg(name, compute)
        # the op library also takes the weights flat
        if given is not None and tuple(map(_dim_key, node.arg_type(name).shape)) != tuple(map(_dim_key, normalised)):
            given = node.emit("Reshape", [given, node.graph.shape(normalised)])
        affine.append(given)
    scale, bias = affine
    scale = scale or _filled(node, 1.0, compute, normalised)
    y = node.emit("LayerNormalization", [node.cast(node.inputs[0], dtype, compute), scale] + ([bias] if bias else []),
                  axis=begin, epsilon=float(node.attrs["epsilon"]), stash_type=1)
    return node.cast(y, compute, dtype)


@handles("group_norm")
def _group_norm(node: Node):
    fmt, dtype = node.attrs["data_format"], node.types[0].dtype
    rank, groups, compute = len(node.types[0].shape), int(node.attrs["groups"]), _compute_dtype(dtype)
    channels = _channels_first_shape(node.types[0].shape, fmt)[1]
    x = node.cast(_to_channels_first(node, node.inputs[0], fmt, rank), dtype, compute)
    # a group's statistics cover its channels and every position: instance norm over [N, groups, rest]
    flat = node.emit("Reshape", [x, node.graph.ints([0, groups, -1])])
    normed = node.emit("InstanceNormalization", [flat, node.const(np.ones(groups), compute),
                                                 node.const(np.zeros(groups), compute)],
                       epsilon=float(node.attrs["epsilon"]))
    y = node.emit("Reshape", [normed, node.emit("Shape", [x])])
    per_channel = node.graph.ints([channels] + [1] * (rank - 2))
    for name, op_type in (("weight", "Mul"), ("bias", "Add")):
        given = node.arg(name, compute)
        if given is not None:
            y = node.emit(op_type, [y, node.emit("Reshape", [given, per_channel])])
    return _from_channels_first(node, node.cast(y, compute, dtype), fmt, rank)


def _pool_window(attrs, spatial):
    """Kernel, strides and explicit pads of a pool2d's windows; ceil_mode's extra window is an
    extra high pad, so ONNX's own ceil_mode (which rounds differently) stays off."""
    return pool_geometry(spatial, attrs["kernel_size"], attrs["stride"], attrs["padding"], attrs["ceil_mode"], False)


def _pool_check(op, attrs, opset):
    if attrs["global_pooling"]:
        return None
    spatial = _spatial(op.operands[0].type, attrs["data_format"])
    if not _static(spatial):
        return f"pooling windows need static spatial sizes, the input has {spatial}"
    kernel, _, pads = _pool_window(attrs, spatial)
    if any(max(p) >= k for p, k in zip(pads, kernel)):
        return f"pads {pads} as large as the window {kernel} (ONNX pools refuse them)"
    return None


def _pool(node: Node, window) -> str:
    """The op's max or average pooling of its input over ``window``: ``(kernel, strides, pads)``
    on the channel-first image, or None for the whole image."""
    fmt, is_max = node.attrs["data_format"], node.attrs["pooling_type"] == "max"
    x = _to_channels_first(node, node.inputs[0], fmt, 4)
    if window is None:
        y = node.emit("GlobalMaxPool" if is_max else "GlobalAveragePool", [x])
    else:
        kernel, strides, pads = window
        window = dict(kernel_shape=list(kernel), strides=list(strides), pads=_pads(pads))
        # exclusive averages count the real input elements only; every window lies inside the
        # explicit pads, so including them divides by the whole window, as Paddle does
        y = node.emit("MaxPool", [x], **window) if is_max else node.emit(
            "AveragePool", [x], count_include_pad=int(not node.attrs["exclusive"]), **window)
    return _from_channels_first(node, y, fmt, 4)


@handles("pool2d", check=_pool_check)
def _pool2d(node: Node):
    if node.attrs["global_pooling"]:
        return _pool(node, None)
    return _pool(node, _pool_window(node.attrs, _spatial(node.types[0], node.attrs["data_format"])))


def _adaptive_check(op, attrs, opset):
    spatial = _spatial(op.operands[0].type, attrs["data_format"])
    sized = [n for n, out in zip(spatial, attrs["output_size"]) if out is not None]
    if tuple(attrs["output_size"]) != (1, 1) and not _static(sized):
        return f"adaptive bins need static spatial sizes, the input has {spatial}"
    return None


@handles("adaptive_pool2d", check=_adaptive_check)
def _adaptive_pool2d(node: Node):
    if tuple(node.attrs["output_size"]) == (1, 1):
        return _pool(node, None)
    fmt, is_max = node.attrs["data_format"], node.attrs["pooling_type"] == "max"
    y = _to_channels_first(node, node.inputs[0], fmt, 4)
    spatial = _spatial(node.types[0], fmt)
    # a 2-D bin is a row range times a column range: pooling rows, then columns, is exact
    for axis, n, out in zip((2, 3), spatial, node.attrs["output_size"]):
        if out is None or out == n:
            continue
        if n % out == 0:
            window = [n // out if a == axis else 1 for a in (2, 3)]
            y = node.emit("MaxPool" if is_max else "AveragePool", [y], kernel_shape=window, strides=window)
            continue
        bins = []
        for i in range(out):  # Paddle's bins: [floor(i n / out), ceil((i + 1) n / out))
            part = node.emit("Slice", [y, node.graph.ints([i * n // out]), node.graph.ints([-(-(i + 1) * n // out)]),
                                       node.graph.ints([axis])])
            bins.append(node.reduce("ReduceMax" if is_max else "ReduceMean", part, [axis], True))
        y = node.emit("Concat", bins, axis=axis)
    return _from_channels_first(node, y, fmt, 4)


def _interpolate_check(op, attrs, opset):
    scale = attrs["scale_factor"]
    if scale is None:
        return None
    data_format = attrs["data_format"]
    spatial, out = _spatial(op.operands[0].type, data_format), _spatial(op.results[0].type, data_format)
    scales = scale * len(spatial) if len(scale) == 1 else scale
    # ONNX sizes the output as in * scale in float32; the op library in float64
    onnx_out = tuple(int(np.float32(n) * np.float32(s)) for n, s in zip(spatial, scales))
    if onnx_out != tuple(out) and tuple(out) != tuple(spatial):
        return f"scale_factor {scale} sizes the output {onnx_out} in ONNX's float32, not {tuple(out)}"
    return None


@handles("interpolate", check=_interpolate_check)
def _interpolate(node: Node):
    fmt, dtype = node.attrs["data_format"], node.types[0].dtype
    rank = len(node.types[0].shape)
    shape = _channels_first_shape(node.types[0].shape, fmt)
    out_shape = _channels_first_shape(node.out[0].shape, fmt)
    if tuple(out_shape[2:]) == tuple(shape[2:]):  # Paddle copies an input already of the output size
        return node.inputs[0]
    nearest = node.attrs["mode"] == "nearest"
    compute = dtype if nearest else _compute_dtype(dtype)
    x = node.cast(_to_channels_first(node, node.inputs[0], fmt, rank), dtype, compute)
    if nearest:
        how = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        # pytorch_half_pixel is half_pixel except that a size-1 output reads index 0, as Paddle does
        coords = ("align_corners" if node.attrs["align_corners"] else
                  "asymmetric" if node.attrs["align_mode"] == 1 else "pytorch_half_pixel")
        how = dict(mode="linear", coordinate_transformation_mode=coords)
    scale = node.attrs["scale_factor"]
    if scale is not None:
        # Paddle reads the input at j / scale_factor, as ONNX does with scales (with sizes it
        # would read at j * in / out)
        scales = list(scale * (rank - 2) if len(scale) == 1 else scale)
        inputs = [x, "", node.const([1.0, 1.0, *scales], "float32")]
    else:
        inputs = [x, "", "", node.graph.shape(out_shape)]
    y = node.emit("Resize", inputs, **how)
    return _from_channels_first(node, node.cast(y, compute, dtype), fmt, rank)


def _repeat_heads(node: Node, x: str, batch, kv_heads: int, heads: int, rest) -> str:
    """``x [batch, kv_heads, *rest]`` with each head repeated for its group of query heads
    (grouped-query attention: query head i reads key/value head i // (heads / kv_heads))."""
    g = node.graph
    x = node.emit("Unsqueeze", [x, g.ints([2])])
    x = node.emit("Expand", [x, g.shape([batch, kv_heads, heads // kv_heads, *rest])])
    return node.emit("Reshape", [x, g.shape([batch, heads, *rest])])


@handles("scaled_dot_product_attention")
def _attention(node: Node):
    q_type, k_type = node.types[:2]
    _, sq, heads, depth = q_type.shape
    sk, kv_heads = k_type.shape[1:3]
    dtype, compute = q_type.dtype, _compute_dtype(q_type.dtype)
    q, k, v = (node.cast(x, t.dtype, compute) for x, t in zip(node.inputs[:3], node.types[:3]))
    q = node.transpose(q, (0, 2, 1, 3))  # [b, heads, sq, depth]
    k = node.transpose(k, (0, 2, 3, 1))  # [b, kv_heads, depth, sk]
    v = node.transpose(v, (0, 2, 1, 3))  # [b, kv_heads, sk, depth]
    if kv_heads != heads:
        k = _repeat_heads(node, k, q_type.shape[0], kv_heads, heads, (depth, sk))
        v = _repeat_heads(node, v, q_type.shape[0], kv_heads, heads, (sk, depth))
    scale = node.attrs["scale"] if node.attrs["scale"] is not None else 1 / math.sqrt(depth)
    logits = node.emit("Mul", [node.emit("MatMul", [q, k]), node.const(scale, compute)])
    # the same finite "minus infinity" as the op library, so fully masked rows agree
    masked = node.const(-0.7 * float(jnp.finfo(compute).max), compute)
    mask = node.arg("mask")
    if mask is not None:
        logits = (node.emit("Where", [mask, logits, masked]) if node.arg_type("mask").dtype == "bool"
                  else node.emit("Add", [logits, node.arg("mask", compute)]))
    if node.attrs["is_causal"]:
        ones = _filled(node, 1.0, compute, [sq, sk])
        keep = node.emit("Cast", [node.emit("Trilu", [ones], upper=0)], to=_tensor_type("bool"))
        logits = node.emit("Where", [keep, logits, masked])
    out = node.emit("MatMul", [node.emit("Softmax", [logits], axis=-1), v])
    return node.cast(node.transpose(out, (0, 2, 1, 3)), compute, dtype)


# -- shapes ---------------------------------------------------------------------------------------

@handles("reshape")
def _reshape(node: Node):
    # Paddle's 0 (copy the input size) and -1 (inferred) mean the same in ONNX's Reshape
    return node.emit("Reshape", [node.inputs[0], node.graph.shape(node.attrs["shape"])])


@handles("transpose")
def _transpose(node: Node):
    return node.transpose(node.inputs[0], node.attrs["perm"])


@handles("concat")
def _concat(node: Node):
    return node.emit("Concat", node.inputs_as(node.out[0].dtype), axis=node.attrs["axis"] % len(node.out[0].shape))


@handles("split")
def _split(node: Node):
    axis = node.attrs["axis"] % len(node.types[0].shape)
    sizes = node.graph.shape([t.shape[axis] for t in node.out])
    return node.emit("Split", [node.inputs[0], sizes], outputs=len(node.out), axis=axis)


@handles("slice")
def _slice(node: Node):
    # both clamp out-of-range bounds and count negative ones from the end
    ints = node.graph.ints
    return node.emit("Slice", [node.inputs[0], ints(node.attrs["starts"]), ints(node.attrs["ends"]),
                               ints(node.attrs["axes"])])


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "replicate": "edge", "circular": "wrap"}


def _pad_check(op, attrs, opset):
    if attrs["mode"] == "circular" and opset < 19:
        return "mode='circular' needs ONNX's wrap padding, from opset 19"
    return None


@handles("pad", check=_pad_check)
def _pad(node: Node):
    paddings = node.attrs["paddings"]
    inputs = [node.inputs[0], node.graph.ints([*paddings[::2], *paddings[1::2]])]
    if node.attrs["mode"] == "constant":
        inputs.append(node.const(node.attrs["value"]))
    return node.emit("Pad", inputs, mode=_PAD_MODES[node.attrs["mode"]])


# -- generic lax ops --------------------------------------------------------------------------------

_LAX_UNARY = {"neg": "Neg", "exp": "Exp", "log": "Log", "tanh": "Tanh", "logistic": "Sigmoid", "sqrt": "Sqrt",
              "abs": "Abs", "sign": "Sign", "floor": "Floor", "ceil": "Ceil", "erf": "Erf", "sin": "Sin", "cos": "Cos",
              "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
              "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh"}


@handles(*(f"lax.{p}" for p in _LAX_UNARY))
def _lax_unary(node: Node):
    return node.emit(_LAX_UNARY[node.op.type.removeprefix("lax.")], [node.inputs[0]])


@handles("lax.copy")
def _identity(node: Node):
    return node.inputs[0]


@handles("lax.rsqrt")
def _rsqrt(node: Node):
    return node.emit("Reciprocal", [node.emit("Sqrt", [node.inputs[0]])])


@handles("lax.square")
def _square(node: Node):
    return node.emit("Mul", [node.inputs[0], node.inputs[0]])


@handles("lax.integer_pow")
def _integer_pow(node: Node):
    return node.emit("Pow", [node.inputs[0], node.const(node.attrs["y"])])


def _round_check(op, attrs, opset):
    if attrs["rounding_method"] != jax.lax.RoundingMethod.TO_NEAREST_EVEN:
        return "rounding half away from zero has no ONNX op (Round rounds half to even)"
    return None


@handles("lax.round", check=_round_check)
def _round(node: Node):
    return node.emit("Round", [node.inputs[0]])


_LAX_ARITHMETIC = {"add": "Add", "add_any": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max",
                   "min": "Min", "pow": "Pow"}
_LAX_COMPARISONS = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


@handles(*(f"lax.{p}" for p in _LAX_ARITHMETIC))
def _lax_arithmetic(node: Node):
    # lax.mul's out_dtype and lax.pow's integer exponent: compute in the result's dtype
    return node.emit(_LAX_ARITHMETIC[node.op.type.removeprefix("lax.")], node.inputs_as(node.out[0].dtype))


@handles("lax.rem")
def _rem(node: Node):
    # lax.rem takes the sign of the dividend, as C's fmod
    return node.emit("Mod", node.inputs, fmod=1)


@handles(*(f"lax.{p}" for p in _LAX_COMPARISONS))
def _compare(node: Node):
    return node.emit(_LAX_COMPARISONS[node.op.type.removeprefix("lax.")], node.inputs)


@handles("lax.ne")
def _not_equal(node: Node):
    return node.emit("Not", [node.emit("Equal", node.inputs)])


_LOGICAL = {"and": ("And", "BitwiseAnd"), "or": ("Or", "BitwiseOr"), "xor": ("Xor", "BitwiseXor"),
            "not": ("Not", "BitwiseNot")}


def _bitwise_check(op, attrs, opset):
    if op.results[0].type.dtype != "bool" and opset < 18:
        return "bitwise ops on integers need opset 18"
    return None


@handles(*(f"lax.{p}" for p in _LOGICAL), check=_bitwise_check)
def _logical(node: Node):
    logical, bitwise = _LOGICAL[node.op.type.removeprefix("lax.")]
    return node.emit(logical if node.out[0].dtype == "bool" else bitwise, node.inputs)


@handles("lax.select_n")
def _select_n(node: Node):
    which, *cases = node.inputs
    if node.types[0].dtype == "bool":
        return node.emit("Where", [which, cases[1], cases[0]]) if len(cases) == 2 else cases[0]
    out = cases[0]
    for i, case in enumerate(cases[1:], start=1):
        out = node.emit("Where", [node.emit("Equal", [which, node.const(i, node.types[0].dtype)]), case, out])
    return out


@handles("lax.clamp")
def _clamp(node: Node):
    low, x, high = node.inputs
    return node.emit("Min", [node.emit("Max", [x, low]), high])


@handles("lax.convert_element_type")
def _convert(node: Node):
    return node.cast(node.inputs[0], node.types[0].dtype, node.out[0].dtype)


def _reshape_check(op, attrs, opset):
    return None if attrs.get("dimensions") is None else "reshape with a transposing 'dimensions' is not supported"


@handles("lax.reshape", check=_reshape_check)
def _lax_reshape(node: Node):
    # lax sizes are sizes: a 0 is an empty axis, not ONNX's "copy the input size"
    return node.emit("Reshape", [node.inputs[0], node.graph.shape(node.out[0].shape)], allowzero=1)


@handles("lax.transpose")
def _lax_transpose(node: Node):
    return node.transpose(node.inputs[0], node.attrs["permutation"])


@handles("lax.squeeze")
def _squeeze(node: Node):
    axes = node.attrs["dimensions"]
    return node.emit("Squeeze", [node.inputs[0], node.graph.ints(axes)]) if axes else node.inputs[0]


@handles("lax.broadcast_in_dim")
def _broadcast_in_dim(node: Node):
    shape, kept = node.out[0].shape, tuple(node.attrs["broadcast_dimensions"])
    source = node.op.operands[0].producer
    if source is not None and source.type == "constant" and "value" in source.attrs:
        # a broadcast scalar is a filled tensor: no initializer, and readers that evaluate
        # constants while loading need not broadcast one to a symbolic shape
        return _filled(node, source.attrs["value"], node.out[0].dtype, shape)
    y = node.inputs[0]
    # broadcast_dimensions increase, so inserting the new axes keeps the old ones in place
    new_axes = [i for i in range(len(shape)) if i not in kept]
    if new_axes:
        y = node.emit("Unsqueeze", [y, node.graph.ints(new_axes)])
    unsqueezed = [node.types[0].shape[kept.index(i)] if i in kept else 1 for i in range(len(shape))]
    if list(map(_dim_key, unsqueezed)) != list(map(_dim_key, shape)):
        y = node.emit("Expand", [y, node.graph.shape(shape)])
    return y


@handles("lax.iota")
def _iota(node: Node):
    # counting ones along the axis: one node for any (symbolic) shape, where Range would need its
    # length as a scalar and then a broadcast
    out = node.out[0]
    ones = _filled(node, 1, out.dtype, out.shape)
    return node.emit("CumSum", [ones, node.const(node.attrs["dimension"], "int64")], exclusive=1)


_LAX_REDUCTIONS = {"reduce_sum": "ReduceSum", "reduce_max": "ReduceMax", "reduce_min": "ReduceMin",
                   "reduce_prod": "ReduceProd"}


@handles(*(f"lax.{p}" for p in _LAX_REDUCTIONS))
def _lax_reduction(node: Node):
    axes = node.attrs["axes"]
    if not axes:  # to ONNX, no axes would mean all of them
        return node.inputs[0]
    return node.reduce(_LAX_REDUCTIONS[node.op.type.removeprefix("lax.")], node.inputs[0], axes, False)


@handles("lax.argmax", "lax.argmin")
def _arg_reduction(node: Node):
    y = node.emit("ArgMax" if node.op.type == "lax.argmax" else "ArgMin", [node.inputs[0]],
                  axis=int(node.attrs["axes"][0]), keepdims=0)
    return node.cast(y, "int64", node.out[0].dtype)


@handles("lax.cumsum")
def _cumsum(node: Node):
    axis = node.const(node.attrs["axis"], "int64")
    return node.emit("CumSum", [node.inputs[0], axis], reverse=int(node.attrs["reverse"]))


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@handles("lax.dot_general")
def _dot_general(node: Node):
    (contract_x, contract_y), (batch_x, batch_y) = node.attrs["dimension_numbers"]
    rank_x, rank_y = (len(t.shape) for t in node.types)
    x = list(_LETTERS[:rank_x])
    y = list(_LETTERS[rank_x:rank_x + rank_y])
    for i, j in zip((*contract_x, *batch_x), (*contract_y, *batch_y)):
        y[j] = x[i]
    out = ([x[i] for i in batch_x] + [x[i] for i in range(rank_x) if i not in (*contract_x, *batch_x)]
           + [y[j] for j in range(rank_y) if j not in (*contract_y, *batch_y)])
    # preferred_element_type: multiply in the result's dtype
    return node.emit("Einsum", node.inputs_as(node.out[0].dtype), equation=f"{''.join(x)},{''.join(y)}->{''.join(out)}")


@handles("lax.concatenate")
def _concatenate(node: Node):
    return node.emit("Concat", node.inputs, axis=int(node.attrs["dimension"]))


@handles("lax.slice")
def _lax_slice(node: Node):
    rank = len(node.types[0].shape)
    g = node.graph
    inputs = [node.inputs[0], g.shape(node.attrs["start_indices"]), g.shape(node.attrs["limit_indices"]),
              g.ints(range(rank))]
    if node.attrs.get("strides"):
        inputs.append(g.ints(node.attrs["strides"]))
    return node.emit("Slice", inputs)


def _lax_pad_check(op, attrs, opset):
    if any(interior for _, _, interior in attrs["padding_config"]):
        return "interior padding is not supported"
    return None


@handles("lax.pad", check=_lax_pad_check)
def _lax_pad(node: Node):
    config = node.attrs["padding_config"]
    # negative pads crop, in ONNX as in lax
    pads = node.graph.shape([lo for lo, _, _ in config] + [hi for _, hi, _ in config])
    return node.emit("Pad", [node.inputs[0], pads, node.inputs[1]], mode="constant")


@handles("lax.split")
def _lax_split(node: Node):
    sizes = node.graph.shape(node.attrs["sizes"])
    return node.emit("Split", [node.inputs[0], sizes], outputs=len(node.out), axis=int(node.attrs["axis"]))


@handles("lax.rev")
def _rev(node: Node):
    axes = list(node.attrs["dimensions"])
    if not axes:
        return node.inputs[0]
    g = node.graph
    return node.emit("Slice", [node.inputs[0], g.ints([-1] * len(axes)), g.ints([-2 ** 63] * len(axes)), g.ints(axes),
                               g.ints([-1] * len(axes))])


@handles("lax.dim_as_value")
def _dim_as_value(node: Node):
    size = node.emit("Squeeze", [node.graph.dim(node.attrs["dim"]), node.graph.ints([0])])
    return node.cast(size, "int64", node.out[0].dtype)


@handles("lax.dynamic_slice")
def _dynamic_slice(node: Node):
    g = node.graph
    starts = [node.emit("Unsqueeze", [node.cast(s, t.dtype, "int64"), g.ints([0])])
              for s, t in zip(node.inputs[1:], node.types[1:])]
    starts = node.emit("Concat", starts, axis=0)
    sizes = g.shape(node.attrs["slice_sizes"])
    # lax clamps each start so that the slice stays inside the operand
    last = node.emit("Sub", [g.shape(node.types[0].shape), sizes])
    starts = node.emit("Min", [node.emit("Max", [starts, g.ints([0] * len(node.types[0].shape))]), last])
    return node.emit("Slice", [node.inputs[0], starts, node.emit("Add", [starts, sizes])])


def _gather_axis(op, attrs) -> int | None:
    """The axis of a gather that takes whole slices at indices along one axis (``x[:, i]``,
    ``x[:, :1]``, ``jnp.take``), or None for any other gather."""
    dn = attrs["dimension_numbers"]
    operand = op.operands[0].type.shape
    if (len(dn.start_index_map) != 1 or not set(dn.collapsed_slice_dims) <= set(dn.start_index_map)
            or dn.operand_batching_dims or op.operands[1].type.shape[-1:] != (1,)):
        return None
    axis = dn.start_index_map[0]
    full = [1 if i == axis else _dim_key(d) for i, d in enumerate(operand)]
    return axis if [_dim_key(s) for s in attrs["slice_sizes"]] == full else None


def _gather_check(op, attrs, opset):
    axis = _gather_axis(op, attrs)
    if axis is None:
        return "only gathers of whole slices along one axis (x[:, i], jnp.take) are supported"
    if attrs["mode"] == jax.lax.GatherScatterMode.CLIP and not isinstance(op.operands[0].type.shape[axis], int):
        return "a clipping gather needs a static size on its axis"
    return None


@handles("lax.gather", check=_gather_check)
def _gather(node: Node):
    axis = _gather_axis(node.op, node.attrs)
    # an axis the slices keep (of size 1) is the indices' trailing axis of size 1
    keep = axis not in node.attrs["dimension_numbers"].collapsed_slice_dims
    indices = node.inputs[1] if keep else node.emit("Squeeze", [node.inputs[1], node.graph.ints([-1])])
    if node.attrs["mode"] == jax.lax.GatherScatterMode.CLIP:
        dtype = node.types[1].dtype
        indices = node.emit("Clip", [indices, node.const(0, dtype), node.const(node.types[0].shape[axis] - 1, dtype)])
    y = node.emit("Gather", [node.inputs[0], indices], axis=axis)
    # ONNX puts the index axes where the gathered axis was; lax puts the slice's axes at offset_dims
    rank_x, batch = len(node.types[0].shape), len(node.types[1].shape) - 1
    onnx_order = [("x", i) for i in range(axis)] + [("i", j) for j in range(batch)] + \
        [("x", i) for i in range(axis if keep else axis + 1, rank_x)]
    offsets, rest = iter(d for d in onnx_order if d[0] == "x"), iter(d for d in onnx_order if d[0] == "i")
    lax_order = [next(offsets) if p in node.attrs["dimension_numbers"].offset_dims else next(rest)
                 for p in range(len(onnx_order))]
    return node.transpose(y, [onnx_order.index(d) for d in lax_order])


def _conv_general_check(op, attrs, opset):
    if any(d != 1 for d in attrs["lhs_dilation"]):
        return "input dilation (a transposed convolution) is not supported"
    if attrs["batch_group_count"] != 1:
        return "batch_group_count > 1 is not supported"
    return None


@handles("lax.conv_general_dilated", check=_conv_general_check)
def _conv_general(node: Node):
    dn = node.attrs["dimension_numbers"]
    x, w = node.inputs_as(node.out[0].dtype)
    x, w = node.transpose(x, dn.lhs_spec), node.transpose(w, dn.rhs_spec)
    kernel = [int(node.types[1].shape[i]) for i in dn.rhs_spec[2:]]
    y = node.emit("Conv", [x, w], kernel_shape=kernel, strides=list(node.attrs["window_strides"]),
                  dilations=list(node.attrs["rhs_dilation"]), pads=_pads(node.attrs["padding"]),
                  group=int(node.attrs["feature_group_count"]))
    return node.transpose(y, np.argsort(dn.out_spec))


# -- the program ------------------------------------------------------------------------------------

def _label(op: Op, lines: dict) -> str:
    line = lines.get(op, op.type)
    head = line.split(" = ")[0] if op.results else line
    return head + (f" at {op.loc}" if op.loc else "")


def _check_supported(program: Program, opset: int) -> None:
    """One error naming every op that cannot be exported, grouped by type and reason."""
    problems: dict[str, list[Op]] = {}
    for op in program.body.ops:
        if op.type in ("param", "constant", "return"):
            continue
        handler = HANDLERS.get(op.type)
        if handler is None:
            reason = "no ONNX exporter" + (" (control flow is not exported)" if op.blocks else "")
        else:
            reason = handler.check(op, _attrs(op), opset) if handler.check else None
        if reason:
            problems.setdefault(f"{op.type}: {reason}", []).append(op)
    if problems:
        lines = op_lines(program)
        text = []
        for what, ops in problems.items():
            names = ", ".join(_label(op, lines) for op in ops[:5])
            more = f" and {len(ops) - 5} more" if len(ops) > 5 else ""
            text.append(f"  {what}: {names}{more}")
        raise ConversionError(f"to_onnx: program '{program.name}' has ops that cannot be exported to ONNX:\n"
                              + "\n".join(text))


def _parameters(program: Program, params) -> dict[str, np.ndarray]:
    """The arrays of the parameters the program reads: ``params``' where given, else the program's."""
    given = dict(params or {})
    unknown = sorted(set(given) - set(program.params))
    if unknown:
        raise ConversionError(f"to_onnx: params names {unknown[:5]}, which are not parameters of program "
                              f"'{program.name}'")
    arrays = {}
    for op in program.param_ops():
        name, want = op.attrs["name"], op.result.type
        if name not in given and name not in program.params:
            raise ConversionError(f"to_onnx: parameter '{name}' has no array (pass it in params)")
        array = np.asarray(given.get(name, program.params.get(name)))
        if tuple(array.shape) != tuple(want.shape) or array.dtype != _np_dtype(want.dtype):
            raise ConversionError(f"to_onnx: parameter '{name}' is {array.dtype}{list(array.shape)}, "
                                  f"but the program reads it as {want}")
        arrays[name] = array
    return arrays


def _constant(program: Program, op: Op) -> np.ndarray:
    value = program.constants[op.attrs["name"]] if "name" in op.attrs else op.attrs["value"]
    return np.asarray(value, dtype=_np_dtype(op.result.type.dtype))


def _output_names(program: Program) -> list[str]:
    """Names of the outputs from their places in the output tree: ``output`` for a single one,
    dict keys where they are names, else ``output_<path>``."""
    count = len(program.outputs)
    tree = jax.tree_util.tree_unflatten(program.out_tree, list(range(count)))
    paths = [jax.tree_util.keystr(path, simple=True, separator="_")
             for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if paths == [""]:
        return ["output"]
    return [p if p[:1].isalpha() else f"output_{p}" for p in paths]


def _value_info(name: str, ttype):
    dims = [d if isinstance(d, int) else str(d) for d in ttype.shape]
    return _onnx().helper.make_tensor_value_info(name, _tensor_type(ttype.dtype), dims)


def _rename(graph: _Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new
        if node.name == old:
            node.name = new


def to_onnx(program: Program, path=None, *, opset: int = 17, params: dict | None = None,
            name: str | None = None):
    """An ONNX model (``onnx.ModelProto``) computing what ``program`` computes; written to ``path``
    when one is given.

    ``opset`` picks the ONNX opset (17 to 21); ``params`` replaces parameter arrays by name (the
    program's own are used for the others); ``name`` names the graph (the program's name by
    default). The model passes ``onnx.checker.check_model``. Raises :class:`ConversionError`
    naming every op that cannot be exported, before anything is built.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"], p["b"], act="relu"), pj.InputSpec((None, 2)),
    ...                 params={"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
    >>> model = to_onnx(prog)
    >>> [n.op_type for n in model.graph.node], sorted(i.name for i in model.graph.initializer)
    (['Gemm', 'Relu'], ['b', 'w'])
    """
    onnx = _onnx()
    if not isinstance(program, Program):
        raise TypeError(f"to_onnx: expected a Program, got {type(program).__name__}")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ConversionError(f"to_onnx: opset {opset} is not supported (opsets {MIN_OPSET} to {MAX_OPSET} are)")
    _check_supported(program, opset)
    arrays = _parameters(program, params)

    graph = _Graph(opset)
    env: dict = {}
    for op in program.param_ops():
        env[op.result] = graph.initializer(arrays[op.attrs["name"]], graph.reserve(op.attrs["name"]))
    inputs = []
    for i, value in enumerate(program.inputs):
        env[value] = graph.reserve(value.name or f"input_{i}")
        inputs.append(_value_info(env[value], value.type))
        for axis, d in enumerate(value.type.shape):
            if isinstance(d, str) and d.isidentifier():
                graph.symbols.setdefault(d, (env[value], axis))

    for op in program.body.ops:
        if op.type in ("param", "return"):
            continue
        if op.type == "constant":
            env[op.result] = graph.const(_constant(program, op), op.result.type.dtype)
            continue
        graph.hint = op.type.removeprefix("lax.")
        node = Node(graph, op, [env[v] for v in op.operands])
        try:
            results = HANDLERS[op.type].emit(node)
        except ConversionError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever a handler hits, the op is what failed
            raise ConversionError(f"to_onnx: {_label(op, op_lines(program))} ({op.type}) failed: "
                                  f"{type(error).__name__}: {error}") from error
        env.update(zip(op.results, [results] if isinstance(results, str) else results))

    produced = {o for n in graph.nodes for o in n.output}
    outputs = []
    for value, wanted in zip(program.outputs, _output_names(program)):
        have, wanted = env[value], graph.reserve(wanted)
        if have in produced:
            # the node's own output takes the output's name: no Identity needed
            _rename(graph, have, wanted)
            produced.discard(have)
            env.update({v: wanted for v, n in env.items() if n == have})
        else:
            graph.node("Identity", [have], names=[wanted])
        outputs.append(_value_info(wanted, value.type))

    graph.prune(o.name for o in outputs)
    helper = onnx.helper
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(helper.make_graph(graph.nodes, name or program.name, inputs, outputs,
                                                graph.initializers),
                              opset_imports=opsets, producer_name="paddlejax")
    # the oldest IR version that has the opset, so that older runtimes read the file
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model
