"""Keras h5 → Program: a Keras 2 model file (its ``model_config`` and ``model_weights``), read
with ``h5py``, as a program of registry ops.

The layer graph is interpreted under :func:`paddlejax.trace`, like the ONNX importer's node
graph. Programs keep Keras's channels-last layout (``data_format="NHWC"``); kernels are stored
in the op library's layouts (``conv2d``: OIHW), under the layer's name and the Keras weight's
(``conv2d_1.kernel``, ``batch_normalization_1.moving_mean``). Nothing is unpickled: the
configuration is JSON and the weights are HDF5 datasets. A layer with an unknown class, or a
configuration the op library cannot express, raises :class:`ConversionError` naming it.

>>> import paddlejax as pj
>>> pj.convert.from_keras(b"not a file")
Traceback (most recent call last):
    ...
TypeError: from_keras: expected the path of an .h5 file, got bytes
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from paddlejax import ops
from paddlejax._extras import require
from paddlejax.capture import CaptureError, InputSpec, trace
from paddlejax.convert.errors import ConversionError
from paddlejax.ir import Program
from paddlejax.ops.conv import same_padding

LAYERS: dict[str, Callable] = {}
# Keras activations by name; "linear" is none
ACTIVATIONS: dict[str, Callable] = {
    "linear": lambda x: x, "relu": ops.relu, "relu6": ops.relu6, "sigmoid": ops.sigmoid, "tanh": ops.tanh,
    "softmax": lambda x: ops.softmax(x, axis=-1), "elu": lambda x: jnp.where(x > 0, x, jnp.expm1(x)),
    "selu": lambda x: 1.0507009873554805 * jnp.where(x > 0, x, 1.6732632423543772 * jnp.expm1(x)),
    "softplus": lambda x: jnp.logaddexp(x, 0.0), "softsign": lambda x: x / (1 + jnp.abs(x)),
    "hard_sigmoid": lambda x: ops.hard_sigmoid(x, slope=0.2, offset=0.5), "swish": ops.silu, "gelu": ops.gelu,
}


def layer(*class_names: str):
    def register(fn):
        for name in class_names:
            LAYERS[name] = fn
        return fn

    return register


class LayerContext:
    """One layer's view: its config, its weights (as parameters), its label for errors."""

    def __init__(self, spec: dict, params: dict):
        self.class_name = spec["class_name"]
        self.name = spec["config"].get("name", spec.get("name", "?"))
        self.config = spec["config"]
        self._params = params

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"from_keras: layer '{self.name}' ({self.class_name}): {message}")

    def weight(self, kind: str, required: bool = True):
        name = f"{self.name}.{kind}"
        if name not in self._params:
            if required:
                raise self.error(f"the file has no '{kind}' weight for it")
            return None
        return self._params[name]

    def activation(self, x):
        act = self.config.get("activation", "linear")
        if act not in ACTIVATIONS:
            raise self.error(f"activation {act!r} is not supported ({', '.join(sorted(ACTIVATIONS))} are)")
        return ACTIVATIONS[act](x)

    def channels_last(self) -> None:
        if self.config.get("data_format", "channels_last") != "channels_last":
            raise self.error("data_format channels_first is not supported")


def _padding(ctx, x, kernel, strides, dilation=(1, 1)):
    mode = ctx.config.get("padding", "valid")
    if mode == "valid":
        return ((0, 0), (0, 0))
    if mode != "same":
        raise ctx.error(f"padding {mode!r} is not supported")
    return same_padding(x.shape[1:3], kernel, strides, dilation)


def _conv_geometry(ctx, x):
    kernel = tuple(ctx.config["kernel_size"])
    strides = tuple(ctx.config.get("strides", (1, 1)))
    dilation = tuple(ctx.config.get("dilation_rate", (1, 1)))
    return kernel, strides, dilation, _padding(ctx, x, kernel, strides, dilation)


@layer("Conv2D")
def _conv2d(ctx, x):
    ctx.channels_last()
    kernel, strides, dilation, pads = _conv_geometry(ctx, x)
    y = ops.conv2d(x, ctx.weight("kernel"), ctx.weight("bias", required=False) if ctx.config.get("use_bias", True)
                   else None, stride=strides, padding=pads, dilation=dilation, groups=int(ctx.config.get("groups", 1)),
                   data_format="NHWC")
    return ctx.activation(y)


@layer("DepthwiseConv2D", "SeparableConv2D")
def _depthwise(ctx, x):
    ctx.channels_last()
    kernel, strides, dilation, pads = _conv_geometry(ctx, x)
    separable = ctx.class_name == "SeparableConv2D"
    bias = ctx.weight("bias", required=False) if ctx.config.get("use_bias", True) else None
    y = ops.conv2d(x, ctx.weight("depthwise_kernel"), None if separable else bias, stride=strides, padding=pads,
                   dilation=dilation, groups=x.shape[-1], data_format="NHWC")
    if separable:
        y = ops.conv2d(y, ctx.weight("pointwise_kernel"), bias, data_format="NHWC")
    return ctx.activation(y)


@layer("Dense")
def _dense(ctx, x):
    bias = ctx.weight("bias", required=False) if ctx.config.get("use_bias", True) else None
    return ctx.activation(ops.linear(x, ctx.weight("kernel"), bias))


@layer("BatchNormalization")
def _batch_norm(ctx, x):
    axis = ctx.config.get("axis", -1)
    axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
    if not isinstance(axis, int) or axis % x.ndim != x.ndim - 1:
        raise ctx.error(f"axis {axis} is not supported (the last axis is)")
    layout = {2: "NC", 3: "NLC", 4: "NHWC", 5: "NDHWC"}.get(x.ndim)
    if layout is None:
        raise ctx.error(f"inputs of rank {x.ndim} are not supported")
    scale = ctx.weight("gamma") if ctx.config.get("scale", True) else None
    center = ctx.weight("beta") if ctx.config.get("center", True) else None
    return ops.batch_norm(x, ctx.weight("moving_mean"), ctx.weight("moving_variance"), scale, center,
                          epsilon=float(ctx.config.get("epsilon", 1e-3)), data_format=layout)[0]


@layer("Activation")
def _activation(ctx, x):
    return ctx.activation(x)


@layer("ReLU")
def _relu(ctx, x):
    if ctx.config.get("threshold", 0.0) or ctx.config.get("negative_slope", 0.0):
        raise ctx.error("threshold and negative_slope are not supported")
    cap = ctx.config.get("max_value")
    return ops.relu(x) if cap is None else ops.relu6(x) if float(cap) == 6.0 else jnp.clip(x, 0, float(cap))


@layer("LeakyReLU")
def _leaky_relu(ctx, x):
    return ops.leaky_relu(x, negative_slope=float(ctx.config.get("alpha", ctx.config.get("negative_slope", 0.3))))


@layer("MaxPooling2D", "AveragePooling2D")
def _pool(ctx, x):
    ctx.channels_last()
    size = tuple(ctx.config.get("pool_size", (2, 2)))
    strides = tuple(ctx.config.get("strides") or size)
    pads = _padding(ctx, x, size, strides)
    return ops.pool2d(x, pooling_type="max" if ctx.class_name == "MaxPooling2D" else "avg", kernel_size=size,
                      stride=strides, padding=pads, exclusive=True, data_format="NHWC")


@layer("GlobalAveragePooling2D", "GlobalMaxPooling2D")
def _global_pool(ctx, x):
    ctx.channels_last()
    y = ops.pool2d(x, pooling_type="avg" if "Average" in ctx.class_name else "max", global_pooling=True,
                   data_format="NHWC")
    return y if ctx.config.get("keepdims", False) else y.reshape(y.shape[0], y.shape[-1])


@layer("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")
def _merge(ctx, *xs):
    fn = {"Add": jnp.add, "Subtract": jnp.subtract, "Multiply": jnp.multiply, "Average": jnp.add,
          "Maximum": jnp.maximum, "Minimum": jnp.minimum}[ctx.class_name]
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out / len(xs) if ctx.class_name == "Average" else out


@layer("Concatenate")
def _concatenate(ctx, *xs):
    return ops.concat(*xs, axis=ctx.config.get("axis", -1) % xs[0].ndim)


@layer("Flatten")
def _flatten(ctx, x):
    return x.reshape(x.shape[0], -1)


@layer("Reshape")
def _reshape(ctx, x):
    return x.reshape(x.shape[0], *ctx.config["target_shape"])


@layer("Dropout", "SpatialDropout2D", "GaussianNoise", "GaussianDropout", "ActivityRegularization")
def _identity(ctx, x):
    return x  # inference


@layer("ZeroPadding2D")
def _zero_padding(ctx, x):
    pad = ctx.config.get("padding", 1)
    pad = ((pad, pad), (pad, pad)) if isinstance(pad, int) else tuple(
        (p, p) if isinstance(p, int) else tuple(p) for p in pad)
    return ops.pad(x, paddings=(0, 0, *pad[0], *pad[1], 0, 0))


def _open(path):
    h5py = require("h5py", extra="convert", feature="pj.convert.from_keras")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"from_keras: expected the path of an .h5 file, got {type(path).__name__}")
    if not os.path.isfile(path):
        raise ConversionError(f"from_keras: no such file: {os.fspath(path)!r}")
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise ConversionError(f"from_keras: {os.fspath(path)} is not a readable HDF5 file ({error})") from None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_weights(f, layer_specs) -> dict[str, np.ndarray]:
    """``{"<layer>.<weight>": array}`` in the op library's layouts."""
    group = f["model_weights"] if "model_weights" in f else f
    params = {}
    for spec in layer_specs:
        name = spec["config"].get("name", spec.get("name"))
        if name not in group:
            continue
        names = [_text(n) for n in group[name].attrs.get("weight_names", [])]
        for full in names:
            kind = full.split("/")[-1].split(":")[0]
            data = group[name][full]
            if not hasattr(data, "shape") or data.dtype.kind not in "fiu":
                raise ConversionError(f"from_keras: weight '{full}' of layer '{name}' is not a numeric dataset")
            params[f"{name}.{kind}"] = _to_op_layout(spec["class_name"], kind, np.asarray(data))
    return params


def _to_op_layout(class_name: str, kind: str, array: np.ndarray) -> np.ndarray:
    array = array.astype(np.float32) if array.dtype.kind == "f" else array
    if (class_name == "Conv2D" and kind == "kernel") or kind == "pointwise_kernel":
        return np.ascontiguousarray(array.transpose(3, 2, 0, 1))  # HWIO -> OIHW
    if kind == "depthwise_kernel":  # (kh, kw, C, multiplier) -> (C * multiplier, 1, kh, kw)
        kh, kw, c, m = array.shape
        return np.ascontiguousarray(array.reshape(kh, kw, c * m, 1).transpose(2, 3, 0, 1))
    return array


def _model_config(f) -> dict:
    raw = f.attrs.get("model_config")
    if raw is None:
        raise ConversionError("from_keras: the file has no model_config (a weights-only file?); save the whole "
                              "model with model.save('model.h5')")
    try:
        config = json.loads(_text(raw))
    except json.JSONDecodeError as error:
        raise ConversionError(f"from_keras: model_config is not valid JSON ({error})") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise ConversionError("from_keras: model_config has no class_name")
    return config


def _graph(config: dict):
    """``(layers, inputs, outputs)``: layer specs, input layer names, output (layer, index) pairs; a
    Sequential model becomes a chain."""
    kind = config["class_name"]
    body = config.get("config")
    if kind == "Sequential":
        layers = body if isinstance(body, list) else body.get("layers", [])
        first = layers[0]["config"] if layers else {}
        if layers and layers[0]["class_name"] == "InputLayer":
            specs, shape = layers[1:], first.get("batch_input_shape", first.get("batch_shape"))
        else:
            specs, shape = layers, first.get("batch_input_shape")
        if shape is None:
            raise ConversionError("from_keras: the Sequential model does not record its input shape")
        chain, previous = [{"class_name": "InputLayer", "config": {"name": "input", "batch_input_shape": shape}}], "input"
        for spec in specs:
            chain.append({**spec, "inbound_nodes": [[[previous, 0, 0, {}]]]})
            previous = spec["config"]["name"]
        return chain, ["input"], [(previous, 0)]
    if kind not in ("Model", "Functional"):
        raise ConversionError(f"from_keras: model class {kind!r} is not supported (Sequential and functional are)")
    return (body["layers"], [i[0] for i in body["input_layers"]], [(o[0], o[2]) for o in body["output_layers"]])


def _inbound(spec) -> list[tuple[str, int]]:
    nodes = spec.get("inbound_nodes") or []
    if len(nodes) > 1:
        raise ConversionError(f"from_keras: layer '{spec['config'].get('name')}' is called {len(nodes)} times "
                              "(shared layers are not supported)")
    if not nodes:
        return []
    node = nodes[0]
    if isinstance(node, dict):  # Keras 3 style: {"args": [...]} of keras tensors
        return [(a["config"]["keras_history"][0], a["config"]["keras_history"][2]) for a in node.get("args", [])
                if isinstance(a, dict)]
    return [(entry[0], entry[2]) for entry in node]


def from_keras(path, *, input_shapes: dict | None = None, name: str | None = None) -> Program:
    """The program of a Keras 2 ``.h5`` model file (Sequential or functional).

    The batch axis is symbolic (``b``); ``input_shapes`` (input layer name → shape, ``None``
    for the batch) fixes sizes the file leaves open. Raises :class:`ConversionError` naming
    unknown layer classes (all of them) and unsupported configurations.
    """
    with _open(path) as f:
        config = _model_config(f)
        layers, input_names, outputs = _graph(config)
        unknown: dict[str, list[str]] = {}
        for spec in layers:
            if spec["class_name"] != "InputLayer" and spec["class_name"] not in LAYERS:
                unknown.setdefault(spec["class_name"], []).append(spec["config"].get("name", "?"))
        if unknown:
            raise ConversionError("from_keras: the model uses layers that have no conversion:\n" + "\n".join(
                f"  {cls}: {', '.join(names)}" for cls, names in sorted(unknown.items())))
        params = _read_weights(f, layers)
    by_name = {spec["config"].get("name", spec.get("name")): spec for spec in layers}
    specs = []
    input_shapes = dict(input_shapes or {})
    for n in input_names:
        cfg = by_name[n]["config"]
        shape = list(cfg.get("batch_input_shape") or cfg.get("batch_shape") or [])
        given = input_shapes.pop(n, None)
        if given is not None:
            if len(given) != len(shape):
                raise ConversionError(f"from_keras: input_shapes['{n}'] has {len(given)} dims, the input has "
                                      f"{len(shape)}")
            shape = [g if g is not None else s for g, s in zip(given, shape)]
        if any(d is None for d in shape[1:]):
            raise ConversionError(f"from_keras: input '{n}' has open sizes {shape}; fix them with "
                                  f"from_keras(..., input_shapes={{'{n}': (None, ...)}})")
        specs.append(InputSpec((None, *shape[1:]), cfg.get("dtype", "float32"), name=n))
    if input_shapes:
        raise ConversionError(f"from_keras: input_shapes names {sorted(input_shapes)}, which are not inputs "
                              f"({input_names})")

    def run(p, *xs):
        env: dict[tuple[str, int], Any] = {(n, 0): x for n, x in zip(input_names, xs)}
        for spec in layers:
            if spec["class_name"] == "InputLayer":
                continue
            ctx = LayerContext(spec, p)
            try:
                args = [env[key] for key in _inbound(spec)]
            except KeyError as missing:
                raise ctx.error(f"its input {missing} comes from no earlier layer") from None
            try:
                out = LAYERS[spec["class_name"]](ctx, *args)
            except ConversionError:
                raise
            except Exception as error:  # noqa: BLE001 - whatever a layer hits, the layer is what failed
                raise ctx.error(f"{type(error).__name__}: {error}") from error
            env[(ctx.name, 0)] = out
        values = tuple(env[key] for key in outputs)
        return values[0] if len(values) == 1 else values

    try:
        return trace(run, *specs, params=params,
                     name=name or os.path.splitext(os.path.basename(path))[0].replace("-", "_"))
    except CaptureError as error:
        raise ConversionError(f"from_keras: {error}") from error

