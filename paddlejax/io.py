"""Saved programs: a versioned JSON program file beside a safetensors tensor file.

``save(prog, "out/model")`` writes ``out/model.json`` and ``out/model.safetensors``;
``load("out/model")`` reads them back, checks everything, and raises one error type,
:class:`ProgramFormatError`, whatever is wrong. Nothing is ever unpickled: the JSON is
data, attribute values decode only to plain values and lax enums, and tensors are raw bytes.

>>> import jax.numpy as jnp, paddlejax as pj, tempfile, os
>>> prog = pj.trace(lambda p, x: x @ p["w"], jnp.ones((1, 2)), params={"w": jnp.ones((2, 2))})
>>> path = os.path.join(tempfile.mkdtemp(), "model")
>>> pj.save(prog, path)
>>> str(pj.load(path)) == str(prog)
True
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
import safetensors
import safetensors.numpy

from paddlejax import adapter
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Block, Op, Program, TensorType
from paddlejax.ir.printer import Namer
from paddlejax.ir.verifier import STRUCTURAL, VerificationError, verify
from paddlejax.ops import registry

FORMAT = "paddlejax.program"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 30
MAX_BLOCK_DEPTH = 64

# Migrations from older format versions: MIGRATIONS[v] turns a version-v document into v+1.
MIGRATIONS: dict[int, Any] = {}

_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
              "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
              "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
              "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_NP_DTYPES = {v: k for k, v in _ST_DTYPES.items()}


class ProgramFormatError(ValueError):
    """A saved program or its tensors are malformed; the message says what and where."""


def _paths(path) -> tuple[Path, Path]:
    p = str(path)
    for suffix in (".json", ".safetensors"):
        if p.endswith(suffix):
            p = p[: -len(suffix)]
    return Path(p + ".json"), Path(p + ".safetensors")


# ---------------------------------------------------------------------------------------
# Saving

def _type_json(t: TensorType) -> dict:
    return {"shape": list(t.shape), "dtype": t.dtype}


def _tree_json(tree) -> Any:
    """A JSON form of a pytree structure (dicts, lists, tuples, None and leaves)."""
    def enc(node):
        if isinstance(node, _Leaf):
            return "*"
        if node is None:
            return {"none": None}
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                raise ValueError("only dicts with string keys can be saved")
            return {"dict": {k: enc(v) for k, v in node.items()}}
        if isinstance(node, (list, tuple)) and type(node) in (list, tuple):
            return {type(node).__name__: [enc(v) for v in node]}
        raise ValueError(f"cannot save a pytree containing {type(node).__name__}; "
                         "use dicts, lists and tuples")

    return enc(jax.tree_util.tree_unflatten(tree, [_Leaf()] * tree.num_leaves))


class _Leaf:
    pass


def _block_json(block: Block, namer: Namer) -> dict:
    args = [{"id": namer.arg(a) if a.name else namer.result(a), "type": _type_json(a.type)}
            for a in block.args]
    ops = []
    for op in block.ops:
        entry: dict[str, Any] = {"type": op.type, "operands": [namer[v] for v in op.operands]}
        if op.results:
            entry["results"] = [{"id": namer.result(r), "type": _type_json(r.type)} for r in op.results]
        if op.attrs:
            entry["attrs"] = {k: attrs_lib.encode(v) for k, v in op.attrs.items()}
        if op.blocks:
            entry["blocks"] = [_block_json(b, namer) for b in op.blocks]
        if op.loc:
            entry["loc"] = op.loc
        ops.append(entry)
    return {"name": block.name, "args": args, "ops": ops}


def to_json(program: Program) -> dict:
    """The JSON document of ``program`` (tensors not included)."""
    from paddlejax import __version__

    params, constants = program.used_params(), program.used_constants()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "producer": {"paddlejax": __version__, "jax": jax.__version__},
        "name": program.name,
        "input_tree": _tree_json(program.in_tree),
        "output_tree": _tree_json(program.out_tree),
        "params": {k: _type_json(TensorType.of(v)) for k, v in params.items()},
        "constants": {k: _type_json(TensorType.of(v)) for k, v in constants.items()},
        "body": _block_json(program.body, Namer()),
    }


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save(program: Program, path) -> None:
    """Write ``path.json`` (the program) and ``path.safetensors`` (parameters, constants)."""
    doc = to_json(program)
    tensors = {}
    for prefix, arrays in (("params", program.used_params()), ("constants", program.used_constants())):
        for name, value in arrays.items():
            tensors[f"{prefix}/{name}"] = np.require(np.asarray(value), requirements="C")  # 0-d stays 0-d
    json_path, st_path = _paths(path)
    _atomic_write(st_path, safetensors.numpy.save(tensors, metadata={"format": "paddlejax.tensors"}))
    _atomic_write(json_path, json.dumps(doc, indent=1).encode())


# ---------------------------------------------------------------------------------------
# Loading

class _Doc:
    """Checked access to the parsed JSON; every failure names the JSON path."""

    @staticmethod
    def need(cond: bool, where: str, msg: str) -> None:
        if not cond:
            raise ProgramFormatError(f"{where}: {msg}")

    @classmethod
    def obj(cls, data, where: str, keys: set[str], optional: set[str] = frozenset()) -> dict:
        cls.need(isinstance(data, dict), where, f"expected an object, got {type(data).__name__}")
        missing = keys - set(data)
        cls.need(not missing, where, f"missing {sorted(missing)}")
        extra = set(data) - keys - set(optional)
        cls.need(not extra, where, f"unexpected {sorted(extra)}")
        return data

    @classmethod
    def type(cls, data, where: str) -> TensorType:
        cls.obj(data, where, {"shape", "dtype"})
        shape, dtype = data["shape"], data["dtype"]
        cls.need(isinstance(shape, list) and len(shape) <= 64, where, "shape must be a list of at most 64 dims")
        dims = []
        for d in shape:
            if isinstance(d, str):
                try:
                    attrs_lib.dim_symbols(d)
                except attrs_lib.AttrError as e:
                    raise ProgramFormatError(f"{where}: {e}") from None
            else:
                cls.need(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2 ** 62,
                         where, f"bad dimension {d!r}")
            dims.append(d)
        cls.need(isinstance(dtype, str) and dtype in _ST_DTYPES, where, f"unsupported dtype {dtype!r}")
        return TensorType(tuple(dims), dtype)


def _tree_from_json(data, where: str, depth: int = 0):
    _Doc.need(depth < 64, where, "structure nested too deeply")
    if data == "*":
        return _Leaf()
    _Doc.need(isinstance(data, dict) and len(data) == 1, where, "bad pytree node")
    kind, value = next(iter(data.items()))
    if kind == "none":
        return None
    if kind == "dict" and isinstance(value, dict):
        return {k: _tree_from_json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if kind in ("list", "tuple") and isinstance(value, list):
        items = [_tree_from_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        return items if kind == "list" else tuple(items)
    raise ProgramFormatError(f"{where}: bad pytree node kind {kind!r}")


def _treedef(data, where):
    example = _tree_from_json(data, where)
    return jax.tree_util.tree_structure(example, is_leaf=lambda x: isinstance(x, _Leaf))


class _Builder:
    def __init__(self):
        self.values: dict[str, Any] = {}

    def block(self, data, where: str, depth: int) -> Block:
        _Doc.need(depth <= MAX_BLOCK_DEPTH, where, "blocks nested too deeply")
        _Doc.obj(data, where, {"name", "args", "ops"})
        _Doc.need(isinstance(data["args"], list) and isinstance(data["ops"], list), where,
                  "args and ops must be lists")
        _Doc.need(isinstance(data["name"], str), where, "block name must be a string")
        ids, types = [], []
        for i, a in enumerate(data["args"]):
            _Doc.obj(a, f"{where}.args[{i}]", {"id", "type"})
            ids.append(a["id"])
            types.append(_Doc.type(a["type"], f"{where}.args[{i}].type"))
        is_main = depth == 0
        block = Block(types, data["name"], ids if is_main else None)
        for vid, v in zip(ids, block.args):
            self._define(vid, v, f"{where}.args")
        for i, op_data in enumerate(data["ops"]):
            block.append(self.op(op_data, f"{where}.ops[{i}]", depth))
        return block

    def _define(self, vid, value, where):
        _Doc.need(isinstance(vid, str) and 0 < len(vid) <= 256, where, f"bad value id {vid!r}")
        _Doc.need(vid not in self.values, where, f"value %{vid} is defined twice")
        self.values[vid] = value

    def op(self, data, where: str, depth: int) -> Op:
        _Doc.obj(data, where, {"type", "operands"}, {"results", "attrs", "blocks", "loc"})
        kind = data["type"]
        _Doc.need(isinstance(kind, str), where, "op type must be a string")
        where = f"{where} ({kind})"
        known = kind in STRUCTURAL or registry.lookup(kind) is not None or (
            kind.startswith("lax.") and adapter.lax_primitive(kind[4:]) is not None)
        _Doc.need(known, where, f"unknown op type '{kind}'")
        operands = data["operands"]
        _Doc.need(isinstance(operands, list), where, "operands must be a list")
        for o in operands:
            _Doc.need(isinstance(o, str) and o in self.values, where, f"operand %{o} is not defined before use")
        results = data.get("results", [])
        _Doc.need(isinstance(results, list), where, "results must be a list")
        result_types = []
        for i, r in enumerate(results):
            _Doc.obj(r, f"{where}.results[{i}]", {"id", "type"})
            result_types.append(_Doc.type(r["type"], f"{where}.results[{i}].type"))
        attrs_data = data.get("attrs", {})
        _Doc.need(isinstance(attrs_data, dict), where, "attrs must be an object")
        try:
            attrs = {k: attrs_lib.decode(v) for k, v in attrs_data.items()}
        except attrs_lib.AttrError as e:
            raise ProgramFormatError(f"{where}: {e}") from None
        opdef = registry.lookup(kind)
        if opdef is not None:
            try:
                attrs = {**opdef.check_attrs(attrs_lib.kernel_attrs(attrs)),
                         **{k: v for k, v in attrs.items() if k in attrs_lib.ANNOTATIONS}}
            except ValueError as e:
                raise ProgramFormatError(f"{where}: {e}") from None
        blocks_data = data.get("blocks", [])
        _Doc.need(isinstance(blocks_data, list), where, "blocks must be a list")
        blocks = [self.block(b, f"{where}.blocks[{i}]", depth + 1) for i, b in enumerate(blocks_data)]
        loc = data.get("loc")
        _Doc.need(loc is None or isinstance(loc, str), where, "loc must be a string")
        op = Op(kind, [self.values[o] for o in operands], result_types, attrs, blocks, loc)
        for r, value in zip(results, op.results):
            self._define(r["id"], value, where)
        return op


def _check_version(doc: dict) -> dict:
    _Doc.need(isinstance(doc, dict), "file", "a program file holds one JSON object")
    _Doc.need(doc.get("format") == FORMAT, "format", f"not a paddlejax program (expected {FORMAT!r})")
    version = doc.get("format_version")
    _Doc.need(isinstance(version, int) and not isinstance(version, bool) and version >= 0,
              "format_version", f"bad value {version!r}")
    if version > FORMAT_VERSION:
        producer = doc.get("producer", {})
        by = producer.get("paddlejax") if isinstance(producer, dict) else None
        raise ProgramFormatError(f"format_version {version} is newer than this paddlejax reads "
                                 f"({FORMAT_VERSION}); the file was written by paddlejax {by}: upgrade")
    while version < FORMAT_VERSION:
        _Doc.need(version in MIGRATIONS, "format_version", f"no migration from version {version}")
        doc = MIGRATIONS[version](doc)
        version += 1
        doc["format_version"] = version
    return doc


def read_tensors(path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as numpy arrays, checked; bad input raises
    :class:`ProgramFormatError` naming the file and tensor.

    >>> import numpy as np, safetensors.numpy, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> safetensors.numpy.save_file({"w": np.ones((2, 3), np.float32)}, path)
    >>> read_tensors(path)["w"].shape
    (2, 3)
    """
    path = Path(path)
    data = _read(path)
    try:
        entries = safetensors.deserialize(data)
    except Exception as e:
        raise ProgramFormatError(f"{path.name}: not a valid safetensors file ({e})") from None
    out = {}
    for name, entry in entries:
        dtype = _NP_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ProgramFormatError(f"{path.name}: tensor '{name}' has unsupported dtype {entry['dtype']}")
        arr = np.frombuffer(bytes(entry["data"]), dtype=jax.numpy.dtype(dtype))
        try:
            out[name] = arr.reshape(entry["shape"])
        except ValueError:
            raise ProgramFormatError(f"{path.name}: tensor '{name}' has {arr.size} elements for "
                                     f"shape {entry['shape']}") from None
    return out


def _read(path: Path) -> bytes:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ProgramFormatError(f"cannot read {path}: {e.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise ProgramFormatError(f"{path.name} is {size} bytes; refusing files over {MAX_FILE_BYTES}")
    return path.read_bytes()


def _attach(kind: str, declared: dict, tensors: dict, where: str) -> dict[str, np.ndarray]:
    _Doc.need(isinstance(declared, dict), kind, "expected an object")
    out = {}
    for name, t in declared.items():
        ttype = _Doc.type(t, f"{kind}.{name}")
        key = f"{kind}/{name}"
        _Doc.need(key in tensors, where, f"{kind[:-1]} '{name}' is missing from the tensor file")
        arr = tensors.pop(key)
        got = TensorType.of(arr)
        _Doc.need(got == ttype, where, f"{kind[:-1]} '{name}' is {got} in the tensor file but {ttype} "
                                       "in the program")
        out[name] = arr
    return out


def from_json(doc: dict, tensors: dict[str, np.ndarray], where: str = "tensors") -> Program:
    """Build and verify a Program from a parsed document and its tensors."""
    doc = _check_version(doc)
    _Doc.obj(doc, "file", {"format", "format_version", "name", "input_tree", "output_tree", "params",
                           "constants", "body"}, {"producer"})
    tensors = dict(tensors)
    params = _attach("params", doc["params"], tensors, where)
    constants = _attach("constants", doc["constants"], tensors, where)
    _Doc.need(not tensors, where, f"unexpected tensors {sorted(tensors)[:5]}")
    body = _Builder().block(doc["body"], "body", 0)
    _Doc.need(isinstance(doc["name"], str), "name", "must be a string")
    program = Program(body, params, constants, _treedef(doc["input_tree"], "input_tree"),
                      _treedef(doc["output_tree"], "output_tree"), doc["name"])
    used = set(program.used_params())
    _Doc.need(used == set(params), "params", f"declared but unused: {sorted(set(params) - used)[:5]}")
    try:
        verify(program)
    except VerificationError as e:
        raise ProgramFormatError(f"invalid program: {e}") from None
    return program


def load(path) -> Program:
    """Read a program saved by :func:`save`; :class:`ProgramFormatError` on any bad input."""
    json_path, st_path = _paths(path)
    raw = _read(json_path)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ProgramFormatError(f"{json_path.name}: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ProgramFormatError(f"{json_path.name}: not valid JSON ({e})") from None
    tensors = read_tensors(st_path)
    try:
        return from_json(doc, tensors, st_path.name)
    except ProgramFormatError:
        raise
    except RecursionError:
        raise ProgramFormatError(f"{json_path.name}: nested too deeply") from None
    except Exception as e:  # the last line of defence: never another exception type
        raise ProgramFormatError(f"{json_path.name}: malformed program ({type(e).__name__}: {e})") from None
