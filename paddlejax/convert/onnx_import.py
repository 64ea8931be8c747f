"""ONNX → Program: read a model with the ``onnx`` package and trace its graph into our IR.

The graph is interpreted once, under :func:`paddlejax.trace`, by the handlers of
:mod:`paddlejax.convert.onnx_ops`: ``Conv`` calls the op library's ``conv2d``, ``Add`` ``jnp.add``,
and so on, so the program holds registry ops (which passes understand) and generic ``lax`` ops
between them, as any traced JAX function does.

- Floating initializers and ``Constant`` tensors with more than one element become parameters,
  under their ONNX names (``conv2d_0.w_0``); scalars and integer tensors stay constants.
- Shape arithmetic (``Shape`` → ``Gather`` → ``Concat`` → ``Reshape``) is evaluated while
  converting, in NumPy, so reshapes get static (or symbolic) target shapes, as the graph meant.
- Dynamic dimensions become symbolic sizes: the first axis is the batch ``b`` (shared by all
  inputs); the others are named after the ONNX ``dim_param`` (or ``<input>_d<axis>`` when it
  has none). ``input_shapes`` fixes them: ``{"x": (None, 3, 640, 640)}``.
- 64-bit integers and floats run as 32-bit ones, as JAX does by default.

>>> import numpy as np, onnx, paddlejax as pj
>>> from onnx import helper, TensorProto
>>> graph = helper.make_graph(
...     [helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
>>> prog = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> print(prog.inputs[0].type, [op.type for op in prog.walk()])
f32[b,3] ['relu', 'return']
"""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from paddlejax._extras import require
from paddlejax.capture import CaptureError, InputSpec, trace
from paddlejax.convert.errors import ConversionError
from paddlejax.convert.values import Weight, as_value, override_dims
from paddlejax.convert.values import runtime_dtype as _runtime_dtype
from paddlejax.ir import Program

MIN_OPSET, MAX_OPSET = 7, 21


def _onnx():
    return require("onnx", extra="convert", feature="pj.convert.from_onnx")


def load_model(model):
    """The ``onnx.ModelProto`` of a path, bytes or a ModelProto; ConversionError if unreadable."""
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        if isinstance(model, (str, os.PathLike)):
            if not os.path.isfile(model):
                raise ConversionError(f"from_onnx: no such file: {os.fspath(model)!r}")
            return onnx.load(os.fspath(model))
    except ConversionError:
        raise
    except Exception as error:  # the protobuf parser's errors name no common base class
        what = f"{os.fspath(model)} is" if isinstance(model, (str, os.PathLike)) else "the bytes given are"
        raise ConversionError(f"from_onnx: {what} not a readable ONNX model ({type(error).__name__}: {error})") from None
    raise TypeError(f"from_onnx: expected a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _opset(model) -> int:
    versions = {o.domain: o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx"))
    if opset is None:
        raise ConversionError("from_onnx: the model imports no version of the default ONNX domain")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ConversionError(f"from_onnx: opset {opset} is not supported (opsets {MIN_OPSET} to {MAX_OPSET} are)")
    return opset


def _node_label(node, index: int) -> str:
    return f"node '{node.name}'" if node.name else f"node {index}"


def _check_supported(graph, handlers) -> None:
    """One error listing every node whose op has no handler (or whose domain is not ONNX's)."""
    missing: dict[str, list[str]] = {}
    for i, node in enumerate(graph.node):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if node.domain not in ("", "ai.onnx") or node.op_type not in handlers:
            missing.setdefault(op, []).append(_node_label(node, i))
    if missing:
        lines = [f"  {op}: {', '.join(nodes[:5])}{f' and {len(nodes) - 5} more' if len(nodes) > 5 else ''}"
                 for op, nodes in sorted(missing.items())]
        raise ConversionError("from_onnx: the model uses ops that have no conversion:\n" + "\n".join(lines))


def _is_weight(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" and array.size > 1


def _constants(graph) -> dict[str, Any]:
    """Initializers and Constant-node outputs: Weights (parameters) or NumPy arrays."""
    from onnx import numpy_helper

    values = {}
    for init in graph.initializer:
        values[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            values[node.output[0]] = _constant_value(node)
    return {name: Weight(name, a) if _is_weight(a) else a for name, a in values.items()}


def _constant_value(node) -> np.ndarray:
    from onnx import numpy_helper

    onnx = _onnx()
    attr = {a.name: a for a in node.attribute}
    if "value" in attr:
        return numpy_helper.to_array(attr["value"].t)
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64)):
        if key in attr:
            return np.array(onnx.helper.get_attribute_value(attr[key]), dtype)
    for key, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attr:
            return np.array(list(onnx.helper.get_attribute_value(attr[key])), dtype)
    raise ConversionError(f"from_onnx: Constant node '{node.name}' has no supported value attribute "
                          f"({', '.join(attr) or 'none'})")


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _input_specs(graph, constants, input_shapes) -> list[InputSpec]:
    onnx = _onnx()
    input_shapes = dict(input_shapes or {})
    inputs = [v for v in graph.input if v.name not in constants]
    unknown = sorted(set(input_shapes) - {v.name for v in inputs})
    if unknown:
        raise ConversionError(f"from_onnx: input_shapes names {unknown}, which are not inputs of the model "
                              f"({[v.name for v in inputs]})")
    symbols: dict[str, str] = {}
    specs = []
    for v in inputs:
        ttype = v.type.tensor_type
        if not v.type.HasField("tensor_type"):
            raise ConversionError(f"from_onnx: input '{v.name}' is not a tensor (sequences and maps are not supported)")
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        dims = []
        for axis, d in enumerate(ttype.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif axis == 0:
                dims.append("b")
            else:
                key = d.dim_param if d.dim_param and d.dim_param != "?" else f"{v.name}_d{axis}"
                if key not in symbols:
                    clean = key if _SYMBOL.fullmatch(key) and key != "b" else f"{_clean(v.name)}_d{axis}"
                    symbols[key] = clean if clean not in symbols.values() else f"{clean}_{len(symbols)}"
                dims.append(symbols[key])
        if v.name in input_shapes:
            dims = override_dims("from_onnx", v.name, dims, input_shapes[v.name])
        specs.append(InputSpec(tuple(dims), _runtime_dtype(dtype), name=v.name))
    return specs


def _clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "x"


def from_onnx(model, *, input_shapes: dict | None = None, name: str | None = None) -> Program:
    """The program of an ONNX model (a path, its bytes or an ``onnx.ModelProto``).

    ``input_shapes`` maps input names to shapes that replace the model's dynamic ones (``None``
    keeps an axis dynamic): static sizes let XLA specialise and the Predictor freeze weights.
    Raises :class:`ConversionError` for unreadable files, unsupported opsets and ops (all of them
    named, with their nodes), and graphs that cannot be traced.

    >>> import paddlejax as pj
    >>> pj.convert.from_onnx(b"not a model")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    paddlejax.convert.errors.ConversionError: from_onnx: the bytes given are not a readable ONNX model (DecodeError: ...)
    """
    from paddlejax.convert import onnx_ops

    default_name = os.path.splitext(os.path.basename(model))[0] if isinstance(model, (str, os.PathLike)) else None
    model = load_model(model)
    opset = _opset(model)
    graph = model.graph
    _check_supported(graph, onnx_ops.HANDLERS)
    constants = _constants(graph)
    pretransposed = _pretranspose_gemm_weights(graph, constants)
    specs = _input_specs(graph, constants, input_shapes)
    params = {w.name: w.array.astype(_runtime_dtype(w.array.dtype)) for w in constants.values()
              if isinstance(w, Weight)}
    outputs = [v.name for v in graph.output]

    def run(p, *xs):
        env: dict[str, Any] = dict(constants)
        env.update(zip((s.name for s in specs), xs))
        for index, node in enumerate(graph.node):
            ctx = onnx_ops.NodeContext(node, _node_label(node, index), opset, env, p, pretransposed)
            try:
                results = onnx_ops.HANDLERS[node.op_type](ctx)
            except ConversionError:
                raise
            except Exception as error:  # noqa: BLE001 - whatever a handler hits, the node is what failed
                raise ConversionError(f"from_onnx: {ctx.label} ({node.op_type}) failed: {type(error).__name__}: "
                                      f"{error}{_symbolic_hint(specs, error)}") from error
            results = results if isinstance(results, (tuple, list)) else (results,)
            for out, value in zip(node.output, results):
                if out:
                    env[out] = as_value(value)
        missing = [o for o in outputs if o not in env]
        if missing:
            raise ConversionError(f"from_onnx: graph outputs {missing} are produced by no node")
        values = tuple(onnx_ops.as_tensor(env[o], p) for o in outputs)
        return values[0] if len(values) == 1 else values

    try:
        return trace(run, *specs, params=params, name=name or _clean(default_name or graph.name or "onnx_model"))
    except CaptureError as error:
        raise ConversionError(f"from_onnx: {error}") from error


def _pretranspose_gemm_weights(graph, constants) -> frozenset:
    """Stores the 2-D weights that only ``Gemm(transB=1)`` nodes read (PyTorch's ``nn.Linear``)
    transposed, so ``linear`` reads them as parameters (which quantization and folding need)
    rather than as the output of a transpose. Returns their names."""
    uses: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, i))
    names = set()
    for name, users in uses.items():
        w = constants.get(name)
        if isinstance(w, Weight) and w.array.ndim == 2 and all(
                n.op_type == "Gemm" and i == 1 and any(a.name == "transB" and a.i for a in n.attribute)
                for n, i in users):
            constants[name] = Weight(name, np.ascontiguousarray(w.array.T))
            names.add(name)
    return frozenset(names)


def _symbolic_hint(specs, error) -> str:
    symbolic = {s.name: s.shape for s in specs if any(isinstance(d, str) and d != "b" for d in s.shape)}
    if not symbolic or "symbolic" not in str(error).lower() and "shape" not in str(error).lower():
        return ""
    return (f" — the inputs have symbolic sizes {symbolic}; fix them with "
            f"from_onnx(..., input_shapes={{'{next(iter(symbolic))}': (None, ...)}})")
