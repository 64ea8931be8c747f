"""Paddle → Program: read PaddlePaddle inference models and trace them into our IR.

Both of Paddle's saved formats are read, without paddlepaddle:

- the legacy ``model.pdmodel`` (a ``ProgramDesc`` protobuf) + ``model.pdiparams``;
- Paddle 3's PIR ``model.json`` + ``model.pdiparams``.

Each format is first put in one form, a list of :class:`Node` s named as Paddle 3 names its
ops (``elementwise_add`` is ``add``, ``matmul_v2`` is ``matmul``; legacy input slots such as
``X`` or ``StartsTensorList`` become ``x`` and ``starts``). The nodes are then interpreted once
under :func:`paddlejax.trace` by the handlers of :mod:`paddlejax.convert.paddle_ops`, which call
the op library (``conv2d``, ``batch_norm``, ``layer_norm``, ``linear``, ``pool2d``…) and
jax.numpy, so the program is the same kind as any traced model and every pass applies.

- Parameters keep Paddle's names (``conv2d_0.w_0``, ``batch_norm2d_0.w_1``).
- Dynamic sizes (``-1``) become symbolic: axis 0 is the batch ``b``, axis ``k`` is ``d<k>``,
  shared by all inputs (so ``ids`` and ``segments`` of one sequence length agree).
  ``input_shapes={"x": (None, 3, 224, 224)}`` fixes sizes; a string names a symbolic size.
- 64-bit integers and floats run as 32-bit ones, as JAX does by default.

>>> import paddlejax as pj
>>> pj.convert.from_paddle(b"garbage", b"")  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
paddlejax.convert.errors.ConversionError: from_paddle: the bytes given is not a Paddle ProgramDesc (...)
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np

from paddlejax.capture import CaptureError, InputSpec, trace
from paddlejax.convert import paddle_format
from paddlejax.convert.errors import ConversionError
from paddlejax.convert.values import Weight, as_value, override_dims, runtime_dtype
from paddlejax.ir import Program

# the PIR format versions whose layout this importer reads (Paddle 3.0 to 3.3 write 1 to 4)
MAX_PIR_VERSION = 4


@dataclasses.dataclass
class Node:
    """One op of a Paddle program, in Paddle 3's names.

    ``inputs`` maps an input name to the names of the values it reads (a list: legacy slots
    and PIR vectors may hold several); ``outputs`` lists the value names the op defines, its
    main result first.
    """

    type: str
    inputs: dict[str, list[str]]
    outputs: list[str]
    attrs: dict[str, Any]
    label: str


@dataclasses.dataclass(frozen=True)
class Graph:
    """A Paddle program in one form: inputs (name, dims with -1 for dynamic, dtype), the nodes,
    the output value names, and the parameters (name -> declared shape)."""

    inputs: list[tuple[str, tuple, np.dtype]]
    nodes: list[Node]
    outputs: list[str]
    param_shapes: dict[str, tuple]


# -- legacy ProgramDesc ------------------------------------------------------------------------
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_MAIN_OUTPUTS = ("Out", "Output", "Y")
_DTYPE_ATTRS = ("dtype", "in_dtype", "out_dtype")


def snake(slot: str) -> str:
    """A legacy slot name in Paddle 3's spelling: ``StartsTensorList`` → ``starts``."""
    for suffix in ("TensorList", "Tensor"):
        if slot.endswith(suffix) and slot != suffix:
            slot = slot[: -len(suffix)]
    return _CAMEL.sub("_", slot).lower()


def _attr_value(attr):
    field = paddle_format.ATTR_FIELDS.get(attr.type)
    if field is None:
        return None
    value = getattr(attr, field)
    if field in ("scalar", "scalars"):
        return [_scalar(s) for s in value] if field == "scalars" else _scalar(value)
    return list(value) if not isinstance(value, (int, float, str, bool)) else value


def _scalar(s):
    return {1: lambda: s.b, 2: lambda: s.i, 3: lambda: s.r, 4: lambda: complex(s.c.r, s.c.i)}.get(s.type, lambda: None)()


def _dtype_name(code: int, where: str) -> str:
    return paddle_format.tensor_dtype(code, where).name


def legacy_graph(desc, renames) -> Graph:
    """The :class:`Graph` of a ``ProgramDesc``; ``renames`` maps legacy op types to
    ``(Paddle 3 name, {legacy attribute: Paddle 3 attribute})``."""
    block = desc.blocks[0]
    variables = {v.name: v for v in block.vars}
    feeds, fetches, nodes = {}, {}, []
    for index, op in enumerate(block.ops):
        ins = {p.parameter: list(p.arguments) for p in op.inputs}
        outs = {p.parameter: list(p.arguments) for p in op.outputs}
        attrs = {a.name: _attr_value(a) for a in op.attrs}
        if op.type == "feed":
            feeds[int(attrs.get("col", 0))] = outs["Out"][0]
            nodes.append(Node("data", {}, outs["Out"], {"name": outs["Out"][0]}, f"op {index} (feed)"))
            continue
        if op.type == "fetch":
            fetches[int(attrs.get("col", 0))] = ins["X"][0]
            continue
        if any(a.type in paddle_format.BLOCK_ATTRS for a in op.attrs):
            nodes.append(Node(op.type, {}, [], {"__control_flow__": True}, f"op {index}"))
            continue
        new_type, attr_renames = renames.get(op.type, (op.type, {}))
        label = f"op {index} ({op.type} → {', '.join(a for v in outs.values() for a in v[:1]) or 'nothing'})"
        for name in _DTYPE_ATTRS:
            if isinstance(attrs.get(name), int):  # -1: unset
                attrs[name] = _dtype_name(attrs[name], label) if attrs[name] >= 0 else None
        attrs = {attr_renames.get(k, k): v for k, v in attrs.items()}
        inputs = {}
        for slot, args in ins.items():
            if args:
                inputs[attr_renames.get(slot, snake(slot))] = args
        main = next((outs[s] for s in _MAIN_OUTPUTS if outs.get(s)), None)
        if main is None:
            main = next((a for a in outs.values() if a), [])
        nodes.append(Node(new_type, inputs, list(main), attrs, label))
    inputs = []
    for col in sorted(feeds):
        var = variables.get(feeds[col])
        tensor = var.type.dense_tensor.tensor if var is not None else None
        if tensor is None:
            raise ConversionError(f"from_paddle: the feed target '{feeds[col]}' has no variable declaration")
        inputs.append((feeds[col], tuple(int(d) for d in tensor.dims), np.dtype(_dtype_name(tensor.data_type, feeds[col]))))
    params = {v.name: tuple(int(d) for d in v.type.dense_tensor.tensor.dims) for v in block.vars
              if v.persistable and v.type.type == paddle_format.DENSE_TENSOR and v.name not in ("feed", "fetch")}
    if not fetches:
        raise ConversionError("from_paddle: the program has no fetch ops, so it names no outputs")
    return Graph(inputs, nodes, [fetches[c] for c in sorted(fetches)], params)


# -- PIR JSON ----------------------------------------------------------------------------------
def _pir_attr(attr):
    """A PIR attribute's value: ``{"#": "0.a_i64", "D": 3}`` → 3; arrays element by element."""
    if not isinstance(attr, dict):
        return attr
    tag, data = attr.get("#", ""), attr.get("D")
    if tag.endswith("a_array"):
        return [_pir_attr(a) for a in data]
    if tag.endswith("a_place"):
        return None
    return data


_PIR_DTYPES = {"t_f16": "float16", "t_bf16": "bfloat16", "t_f32": "float32", "t_f64": "float64", "t_i8": "int8",
               "t_ui8": "uint8", "t_i16": "int16", "t_i32": "int32", "t_i64": "int64", "t_bool": "bool"}


def _pir_type(tt, where: str) -> tuple[tuple, np.dtype]:
    if not isinstance(tt, dict) or not str(tt.get("#", "")).endswith("t_dtensor"):
        raise ConversionError(f"from_paddle: {where} is not a dense tensor ({tt!r:.80}), which is not supported")
    dtype_tag, dims = tt["D"][0]["#"].split(".")[-1], tt["D"][1]
    if dtype_tag not in _PIR_DTYPES:
        raise ConversionError(f"from_paddle: {where} has dtype {dtype_tag}, which is not supported")
    return tuple(int(d) for d in dims), _np_dtype(_PIR_DTYPES[dtype_tag])


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return paddle_format.tensor_dtype(paddle_format.BF16, name)
    return np.dtype(name)


def pir_graph(program: dict, signatures) -> Graph:
    """The :class:`Graph` of a PIR program; ``signatures`` maps an op's name to its input names
    in order (PIR lists inputs by position)."""
    base = program["base_code"]
    version = base.get("version")
    if not isinstance(version, int) or not 1 <= version <= MAX_PIR_VERSION:
        raise ConversionError(f"from_paddle: PIR program version {version!r} is not one this importer reads "
                              f"(1 to {MAX_PIR_VERSION})")
    try:
        ops = program["program"]["regions"][0]["blocks"][0]["ops"]
    except (KeyError, IndexError, TypeError):
        raise ConversionError("from_paddle: the PIR program has no top-level block of ops") from None
    inputs, outputs, nodes, params = [], {}, [], {}
    for index, op in enumerate(ops):
        try:
            _pir_op(op, index, signatures, inputs, outputs, nodes, params)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, ConversionError):
                raise
            raise ConversionError(f"from_paddle: PIR op {index} is malformed ({type(error).__name__}: "
                                  f"{error})") from None
    if not outputs:
        raise ConversionError("from_paddle: the program has no fetch ops, so it names no outputs")
    return Graph(inputs, nodes, [outputs[c] for c in sorted(outputs)], params)


def _value_id(v) -> str | None:
    ref = v["%"]
    return None if ref == 0 else f"%{ref}"  # id 0 is PIR's null value (an absent optional input)


def _pir_op(op, index, signatures, inputs, outputs, nodes, params):
    full = op["#"]
    if full == "p":  # a parameter: its name is the string among its attributes
        name = next(a for a in op["A"] if isinstance(a, str))
        shape, _ = _pir_type(op["O"]["TT"], f"parameter '{name}'")
        params[name] = shape
        nodes.append(Node("parameter", {}, [_value_id(op["O"])], {"name": name}, f"parameter {name}"))
        return
    kind = full.split(".", 1)[-1]
    attrs = {a["N"]: _pir_attr(a["AT"]) for a in op.get("A", [])}
    outs = [_value_id(o) for o in op.get("O", [])]
    ins = [_value_id(v) for v in op.get("I", [])]
    label = f"op {index} ({kind} → {outs[0] if outs else 'nothing'})"
    if op.get("regions"):
        nodes.append(Node(kind, {}, outs, {"__control_flow__": True}, label))
        return
    if kind == "data":
        shape, dtype = _pir_type(op["O"][0]["TT"], f"input '{attrs['name']}'")
        inputs.append((attrs["name"], shape, dtype))
        nodes.append(Node("data", {}, outs, {"name": attrs["name"]}, label))
        return
    if kind == "fetch":
        outputs[int(attrs.get("col", len(outputs)))] = ins[0]
        return
    if kind == "combine":
        nodes.append(Node("combine", {"x": [i for i in ins if i]}, outs, {}, label))
        return
    if full == "0.split":  # builtin: a vector into its elements (pd_op.split is "1.split")
        nodes.append(Node("unpack", {"x": ins}, outs, {}, label))
        return
    name = kind[:-1] if kind.endswith("_") and kind[:-1] in signatures else kind
    names = signatures.get(name)
    if names is None:
        nodes.append(Node(name, {}, outs, attrs, label))
        return
    present = [(n, v) for n, v in zip(names, ins) if v is not None]
    if len(ins) > len(names) and any(v is not None for v in ins[len(names):]):
        raise ConversionError(f"from_paddle: {label} has {len(ins)} inputs; the importer knows {len(names)} "
                              f"({', '.join(names)})")
    nodes.append(Node(name, {n: [v] for n, v in present}, outs, attrs, label))


# -- the importer ------------------------------------------------------------------------------
def _program_file(path: str) -> str:
    """The program file a path names: the file itself, ``PATH.json`` / ``PATH.pdmodel`` for a
    prefix (``paddle.jit.save``'s ``path``), or the one program in a directory (PaddleOCR's
    ``inference/``); PIR's ``.json`` first where both exist."""
    if os.path.isdir(path):
        stems = sorted({os.path.join(path, os.path.splitext(f)[0]) for f in os.listdir(path)
                        if f.endswith((".json", ".pdmodel")) and os.path.isfile(os.path.join(path, os.path.splitext(f)[0]
                                                                                             + ".pdiparams"))})
        if len(stems) != 1:
            raise ConversionError(f"from_paddle: {path!r} holds {len(stems)} programs with parameters beside them "
                                  f"({', '.join(os.path.basename(s) for s in stems) or 'none'}); name one")
        path = stems[0]
    if os.path.splitext(path)[1] in (".pdmodel", ".json"):
        if not os.path.isfile(path):
            raise ConversionError(f"from_paddle: no such program file: {path!r}")
        return path
    for ext in (".json", ".pdmodel"):
        if os.path.isfile(path + ext):
            return path + ext
    raise ConversionError(f"from_paddle: no program at {path!r}: expected a .pdmodel or .json file, the prefix of one "
                          "or a directory holding one")


def _paths(model, params):
    """(program source, params source, format) from the arguments of :func:`from_paddle`."""
    if isinstance(model, (bytes, bytearray)):
        if params is None:
            raise ConversionError("from_paddle: a program given as bytes needs its parameters (params=...)")
        return bytes(model), params, "pir" if model.lstrip()[:1] == b"{" else "legacy"
    path = _program_file(os.fspath(model))
    stem, ext = os.path.splitext(path)
    if params is None:
        params = stem + ".pdiparams"
        if not os.path.isfile(params):
            raise ConversionError(f"from_paddle: the parameters of {path} are not beside it ({params} is missing); "
                                  "pass params=...")
    return path, params, "pir" if ext == ".json" else "legacy"


def _input_specs(graph: Graph, input_shapes) -> list[InputSpec]:
    input_shapes = dict(input_shapes or {})
    names = [n for n, _, _ in graph.inputs]
    unknown = sorted(set(input_shapes) - set(names))
    if unknown:
        raise ConversionError(f"from_paddle: input_shapes names {unknown}, which are not inputs of the model ({names})")
    specs = []
    for name, dims, dtype in graph.inputs:
        dims = ["b" if d < 0 and axis == 0 else f"d{axis}" if d < 0 else d for axis, d in enumerate(dims)]
        if name in input_shapes:
            dims = override_dims("from_paddle", name, dims, input_shapes[name])
        specs.append(InputSpec(tuple(dims), runtime_dtype(dtype), name=name))
    return specs


def _check_supported(graph: Graph, handlers) -> None:
    """One error listing every op that has no conversion, with the ops using it."""
    structural = {"parameter", "data", "combine", "unpack"}
    missing: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.attrs.get("__control_flow__"):
            missing.setdefault(f"{node.type} (control flow)", []).append(node.label)
        elif node.type not in handlers and node.type not in structural:
            missing.setdefault(node.type, []).append(node.label)
    if missing:
        lines = [f"  {op}: {', '.join(labels[:3])}{f' and {len(labels) - 3} more' if len(labels) > 3 else ''}"
                 for op, labels in sorted(missing.items())]
        raise ConversionError("from_paddle: the model uses ops that have no conversion:\n" + "\n".join(lines))


def from_paddle(model, params=None, *, input_shapes: dict | None = None, name: str | None = None) -> Program:
    """The program of a PaddlePaddle inference model.

    ``model`` is a ``.pdmodel`` or PIR ``.json`` path, the path prefix both share with their
    ``.pdiparams`` (``paddle.jit.save``'s ``path``), a directory holding one such pair
    (PaddleOCR's ``inference/``), or the program's bytes; ``params`` is the
    ``.pdiparams`` path or bytes (by default the file beside the program). ``input_shapes``
    replaces the model's dynamic sizes (``None`` keeps one dynamic; a string names it).
    Raises :class:`ConversionError` for unreadable or mismatched files and lists every op
    that has no conversion.

    >>> prog = pj.convert.from_paddle("inference/model")  # doctest: +SKIP
    >>> prog(np.zeros((1, 3, 224, 224), np.float32))  # doctest: +SKIP
    """
    from paddlejax.convert import paddle_ops

    source, params_source, fmt = _paths(model, params)
    if fmt == "legacy":
        graph = legacy_graph(paddle_format.read_program_desc(source), paddle_ops.LEGACY)
    else:
        graph = pir_graph(paddle_format.read_pir(source), paddle_ops.SIGNATURES)
    _check_supported(graph, paddle_ops.HANDLERS)
    arrays = paddle_format.read_params(params_source, list(graph.param_shapes), graph.param_shapes)
    weights = {n: Weight(n, a) for n, a in arrays.items()}
    specs = _input_specs(graph, input_shapes)
    default_name = os.path.basename(os.path.splitext(source)[0]) if isinstance(source, str) else "paddle_model"

    def run(p, *xs):
        env: dict[str, Any] = dict(weights)
        feeds = dict(zip((s.name for s in specs), xs))
        for node in graph.nodes:
            if node.type == "parameter":
                env[node.outputs[0]] = weights[node.attrs["name"]]
                continue
            if node.type == "data":
                env[node.outputs[0]] = feeds[node.attrs["name"]]
                continue
            ctx = paddle_ops.OpContext(node, env, p)
            try:
                results = paddle_ops.run_node(ctx)
            except ConversionError:
                raise
            except Exception as error:  # noqa: BLE001 - whatever a handler hits, the op is what failed
                raise ConversionError(f"from_paddle: {node.label} failed: {type(error).__name__}: {error}") from error
            for out, value in zip(node.outputs, results):
                if out:
                    env[out] = value if isinstance(value, list) else as_value(value)
        for out in graph.outputs:
            if out not in env:
                raise ConversionError(f"from_paddle: the output '{out}' is produced by no op")
        values = tuple(paddle_ops.as_output(env[o], p) for o in graph.outputs)
        return values[0] if len(values) == 1 else values

    params_for_trace = {n: a.astype(runtime_dtype(a.dtype)) for n, a in arrays.items()}
    try:
        return trace(run, *specs, params=params_for_trace, name=name or re.sub(r"[^A-Za-z0-9_]", "_", default_name))
    except CaptureError as error:
        raise ConversionError(f"from_paddle: {error}") from error
