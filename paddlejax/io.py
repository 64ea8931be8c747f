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

Sparse tensors: ``save(prog, path, sparse=True)`` stores each parameter and constant that it makes
smaller as its nonzero elements plus a bitmask, one bit per element (the ``bitmask`` encoding, declared
per tensor in the JSON). A 75 %-sparse float32 weight then takes about 0.28 of its dense bytes, a 2:4
one about 0.53; :func:`load` expands them back to the same dense arrays, bit for bit. Sparse saving is
an option, not automatic: a file holding an encoded tensor has format version 4, which readers before
it refuse by name, while dense saves stay version 3, byte for byte what they were. Tools that read the
tensor file alone (``pj.parse(text, params=path)``) see an encoded tensor's parts, not the tensor.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
import safetensors
import safetensors.numpy

from paddlejax import adapter, files
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import Block, Op, Program, TensorType
from paddlejax.ir.printer import Namer
from paddlejax.ir.verifier import STRUCTURAL, VerificationError, verify
from paddlejax.ops import registry

FORMAT = "paddlejax.program"
FORMAT_VERSION = 4
# Files without encoded tensors are written as version 3, which every reader since it loads.
DENSE_FORMAT_VERSION = 3
MAX_FILE_BYTES = 1 << 30
# An encoded tensor expands on load (up to 64x for a float64 tensor of zeros): the dense bytes of a
# file's encoded tensors are bounded, so that a small file cannot claim a huge allocation.
MAX_DECODED_BYTES = 4 << 30
# Tensor encodings: how a tensor is stored in the tensor file, in place of its dense bytes.
BITMASK = "bitmask"
ENCODINGS = (BITMASK,)
# An encoded tensor adds a second header entry to the tensor file and a key to the JSON: it is
# stored encoded only when that saves more than this many bytes.
ENCODING_MIN_SAVING = 256
MAX_BLOCK_DEPTH = 64
# Parsed JSON costs several times its text; a document whose estimated cost passes this many
# times its size (plus a floor) is refused before it is parsed.
JSON_MEMORY_FACTOR = 16
JSON_MEMORY_FLOOR = 32 << 20
MAX_NAME_CHARS = 4096


def _bind_tensors_v1(doc: dict) -> dict:
    """Version 1 files do not bind their tensor file; version 2 records its sha256."""
    doc["tensors"] = None
    return doc


# Version 2 wrote the lax enums that are ints (lax.round's rounding method, lax.fft's type) as bare
# ints, which no version loads, and kept a plain scatter's empty update function; version 3 writes
# enums as enums and rebuilds every scatter's update function from its primitive.
_INT_ENUMS = {("lax.round", "rounding_method"): jax.lax.RoundingMethod, ("lax.fft", "fft_type"): jax.lax.FftType}


def _enums_and_scatters_v2(doc: dict) -> dict:
    """Rewrite the bare ints of version 2 as the lax enums they stood for and drop the update
    function of plain scatters; anything malformed is left for validation to refuse."""
    def block(data, depth):
        ops = data.get("ops") if isinstance(data, dict) and depth <= MAX_BLOCK_DEPTH else None
        for op in ops if isinstance(ops, list) else ():
            if not isinstance(op, dict):
                continue
            attrs = op.get("attrs")
            for (kind, name), cls in _INT_ENUMS.items():
                if op.get("type") == kind and isinstance(attrs, dict) and type(attrs.get(name)) is int \
                        and attrs[name] in cls._value2member_map_:
                    attrs[name] = {"enum": cls.__name__, "value": cls(attrs[name]).name}
            if op.get("type") == "lax.scatter" and isinstance(attrs, dict) and attrs.get("update_jaxpr", 0) is None \
                    and attrs.get("update_consts") == {"tuple": []}:
                del attrs["update_jaxpr"], attrs["update_consts"]
            for sub in op.get("blocks") if isinstance(op.get("blocks"), list) else ():
                block(sub, depth + 1)

    block(doc.get("body"), 0)
    return doc


def _no_encodings_v3(doc: dict) -> dict:
    """Version 4 adds an optional ``encoding`` to each tensor's entry: a version 3 document, whose
    tensors are all dense, reads as it is."""
    return doc


# Migrations from older format versions: MIGRATIONS[v] turns a version-v document into v+1.
MIGRATIONS: dict[int, Any] = {1: _bind_tensors_v1, 2: _enums_and_scatters_v2, 3: _no_encodings_v3}

_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
              "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
              "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
              "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64"}
_NP_DTYPES = {v: k for k, v in _ST_DTYPES.items()}
# Values inside a program may also be complex128, which safetensors cannot store.
_VALUE_DTYPES = frozenset(_ST_DTYPES) | {"complex128"}


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
        if isinstance(node, tuple) and isinstance(getattr(type(node), "_fields", None), tuple):
            cls = type(node)
            return {"namedtuple": {"class": f"{cls.__module__}:{cls.__qualname__}",
                                   "fields": {f: enc(v) for f, v in zip(cls._fields, node)}}}
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                raise ValueError("only dicts with string keys can be saved")
            return {"dict": {k: enc(v) for k, v in node.items()}}
        if isinstance(node, (list, tuple)) and type(node) in (list, tuple):
            return {type(node).__name__: [enc(v) for v in node]}
        raise ValueError(f"cannot save a pytree containing {type(node).__name__}; "
                         "use dicts, lists, tuples and named tuples")

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


def to_json(program: Program, tensor_bytes: bytes | None = None, encoded: frozenset = frozenset()) -> dict:
    """The JSON document of ``program``; ``tensor_bytes`` is the tensor file it is saved beside,
    whose size and sha256 the document records so that only that file is loaded with it;
    ``encoded`` holds the tensor file keys (``params/NAME``) stored with the bitmask encoding."""
    from paddlejax import __version__

    def entries(kind, arrays):
        return {k: {**_type_json(TensorType.of(v)), **({"encoding": BITMASK} if f"{kind}/{k}" in encoded else {})}
                for k, v in arrays.items()}

    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if encoded else DENSE_FORMAT_VERSION,
        "producer": {"paddlejax": __version__, "jax": jax.__version__},
        "tensors": None if tensor_bytes is None else _digest(tensor_bytes),
        "name": program.name,
        "input_tree": _tree_json(program.in_tree),
        "output_tree": _tree_json(program.out_tree),
        "params": entries("params", program.used_params()),
        "constants": entries("constants", program.used_constants()),
        "body": _block_json(program.body, Namer()),
    }


def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _bitmask(array: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(values, packed mask)`` of ``array``'s elements whose bits are not all zero (so -0.0 and
    NaN are kept and the dense array comes back bit for bit), or None when that is not smaller
    by :data:`ENCODING_MIN_SAVING` bytes."""
    flat = array.reshape(-1)
    keep = flat.view(f"u{array.itemsize}") != 0
    values = flat[keep]
    packed = np.packbits(keep)
    if values.nbytes + packed.nbytes + ENCODING_MIN_SAVING >= array.nbytes:
        return None
    return values, packed


def save(program: Program, path, *, sparse: bool = False) -> None:
    """Write ``path.json`` (the program) and ``path.safetensors`` (parameters, constants).

    The program is verified first (so what saves, loads), the JSON records the tensor file's
    sha256 (so a JSON is never loaded beside another save's tensors), and both files are
    replaced together: concurrent saves to one path take turns, and a save that fails part-way
    leaves the previous pair as it was.

    ``sparse=True`` stores each tensor with enough zero elements as its nonzero values and a
    bitmask (see the module's notes): a pruned program's file shrinks with its density.

    >>> import jax.numpy as jnp, numpy as np, paddlejax as pj, tempfile, os
    >>> w = np.where(np.arange(4096).reshape(64, 64) % 4 == 0, 1.0, 0.0).astype(np.float32)  # 75 % zeros
    >>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 64)), params={"w": w})
    >>> folder = tempfile.mkdtemp()
    >>> pj.save(prog, os.path.join(folder, "dense")); pj.save(prog, os.path.join(folder, "sparse"), sparse=True)
    >>> sizes = [os.path.getsize(os.path.join(folder, f"{n}.safetensors")) for n in ("dense", "sparse")]
    >>> round(sizes[1] / sizes[0], 2), np.array_equal(pj.load(os.path.join(folder, "sparse")).params["w"], w)
    (0.29, True)
    """
    try:
        verify(program)
    except VerificationError as e:
        raise VerificationError(f"cannot save an invalid program: {e}") from None
    json_path, st_path = _paths(path)
    if not json_path.name[: -len(".json")]:
        raise ValueError(f"save path {str(path)!r} names a directory, not a file: give a file name "
                         "such as 'out/model'")
    tensors = {}
    for prefix, arrays in (("params", program.used_params()), ("constants", program.used_constants())):
        for name, value in arrays.items():
            array = np.require(np.asarray(value), requirements="C")  # 0-d stays 0-d
            if array.dtype.name not in _ST_DTYPES:
                raise ValueError(f"cannot save {prefix[:-1]} '{name}' of dtype {array.dtype.name}: a tensor "
                                 f"file holds {', '.join(_ST_DTYPES)}")
            key = f"{prefix}/{name}"
            parts = _bitmask(array) if sparse else None
            if parts is None:
                tensors[key] = array
            else:
                tensors[key], tensors[f"{BITMASK}/{key}"] = parts
    encoded = frozenset(k[len(BITMASK) + 1:] for k in tensors if k.startswith(f"{BITMASK}/"))
    st_bytes = safetensors.numpy.save(tensors, metadata={"format": "paddlejax.tensors"})
    doc = json.dumps(to_json(program, st_bytes, encoded), indent=1, allow_nan=False).encode()
    files.write_together({st_path: st_bytes, json_path: doc})


# ---------------------------------------------------------------------------------------
# Loading

class _Doc:
    """Checked access to the parsed JSON; every failure names the JSON path."""

    @staticmethod
    def need(cond: bool, where: str, msg: str) -> None:
        if not cond:
            text = f"{where}: {msg}"
            raise ProgramFormatError(text if len(text) <= 400 else f"{text[:150]} ... {text[-240:]}")

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
        cls.need(isinstance(dtype, str) and dtype in _VALUE_DTYPES, where, f"unsupported dtype {dtype!r}")
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
    if kind == "namedtuple" and isinstance(value, dict) and set(value) == {"class", "fields"} \
            and isinstance(value["class"], str) and isinstance(value["fields"], dict):
        fields = value["fields"]
        cls = _namedtuple_class(value["class"], tuple(fields), where)
        return cls(*[_tree_from_json(v, f"{where}.{k}", depth + 1) for k, v in fields.items()])
    raise ProgramFormatError(f"{where}: bad pytree node kind {kind!r}")


# module:qualname; a class defined in a function has <locals> in its qualname
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:([A-Za-z_]\w*|<locals>)(\.([A-Za-z_]\w*|<locals>))*",
                         re.ASCII)


def _namedtuple_class(path: str, fields: tuple, where: str) -> type:
    """The named tuple class ``module:qualname`` with ``fields`` if its module is already
    imported (nothing is imported or run to find it), else a stand-in named tuple of that
    name and fields, the same class for every load."""
    _Doc.need(len(path) <= 256 and _CLASS_PATH.fullmatch(path) is not None, where, f"bad class name {path[:80]!r}")
    _Doc.need(len(fields) <= 256 and all(f.isidentifier() and not f.startswith("_") for f in fields),
              where, "named tuple fields must be identifiers")
    module, qualname = path.split(":")
    _Doc.need(qualname.rsplit(".", 1)[-1].isidentifier(), where, f"bad class name {path[:80]!r}")
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = vars(obj).get(part) if isinstance(obj, (type, types.ModuleType)) else None
    if isinstance(obj, type) and issubclass(obj, tuple) and vars(obj).get("_fields") == fields:
        return obj
    return _stand_in(qualname.rsplit(".", 1)[-1], fields)


@functools.cache
def _stand_in(name: str, fields: tuple) -> type:
    return collections.namedtuple(name, fields)


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
        _Doc.need(loc is None or (isinstance(loc, str) and len(loc) <= MAX_NAME_CHARS), where,
                  f"loc must be a string of at most {MAX_NAME_CHARS} characters")
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
        by = str(producer.get("paddlejax"))[:40] if isinstance(producer, dict) else None
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
    return _decode_tensors(_read(path), path.name)


def _decode_tensors(data: bytes, name: str) -> dict[str, np.ndarray]:
    try:
        entries = safetensors.deserialize(data)
    except Exception as e:
        raise ProgramFormatError(f"{name}: not a valid safetensors file ({e})") from None
    out = {}
    for tname, entry in entries:
        dtype = _NP_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ProgramFormatError(f"{name}: tensor '{tname}' has unsupported dtype {entry['dtype']}")
        arr = np.frombuffer(bytes(entry["data"]), dtype=jax.numpy.dtype(dtype))
        try:
            out[tname] = arr.reshape(entry["shape"])
        except ValueError:
            raise ProgramFormatError(f"{name}: tensor '{tname}' has {arr.size} elements for "
                                     f"shape {entry['shape']}") from None
    return out


def _read(path: Path) -> bytes:
    try:
        return files.read_regular(path, MAX_FILE_BYTES)
    except files.FileReadError as e:
        raise ProgramFormatError(str(e)) from None


def _no_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ProgramFormatError(f"duplicate key {dup[:60]!r} in a JSON object")
    return out


def _no_constant(name: str):
    raise ProgramFormatError(f"bare {name} in JSON (non-finite numbers are written as {{'float': 'nan'}})")


def parse_json(raw: bytes, name: str):
    """Parse a program file's JSON strictly and within bounded memory: duplicate keys, bare
    ``NaN``/``Infinity`` and documents whose parsed form would cost more than a small multiple
    of their size are refused with :class:`ProgramFormatError`.

    >>> parse_json(b'{"a": 1, "a": 2}', "x.json")
    Traceback (most recent call last):
    ...
    paddlejax.io.ProgramFormatError: x.json: duplicate key 'a' in a JSON object
    """
    # every JSON value is preceded or closed by one of these; each parsed value costs at most
    # ~80 bytes of Python objects plus its characters
    values = sum(raw.count(c) for c in (b",", b":", b"[", b"{")) + 1
    estimate = 80 * values + 4 * len(raw)
    if estimate > JSON_MEMORY_FLOOR + JSON_MEMORY_FACTOR * len(raw):
        raise ProgramFormatError(f"{name}: {values} JSON values in {len(raw)} bytes would take about "
                                 f"{estimate >> 20} MiB to parse; refusing (not a program file)")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except ProgramFormatError as e:
        raise ProgramFormatError(f"{name}: {e}") from None
    except RecursionError:
        raise ProgramFormatError(f"{name}: JSON nested too deeply") from None
    except MemoryError:
        raise ProgramFormatError(f"{name}: out of memory parsing the JSON") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ProgramFormatError(f"{name}: not valid JSON ({e})") from None


class _Budget:
    """The dense bytes the encoded tensors of one file may still expand to."""

    def __init__(self):
        self.left = MAX_DECODED_BYTES

    def take(self, nbytes: int, what: str, where: str) -> None:
        self.left -= nbytes
        _Doc.need(self.left >= 0, where, f"{what} would expand the file's encoded tensors past "
                                         f"{MAX_DECODED_BYTES >> 30} GiB; refusing")


def _attach(kind: str, declared: dict, tensors: dict, where: str, budget: _Budget) -> dict[str, np.ndarray]:
    _Doc.need(isinstance(declared, dict), kind, "expected an object")
    out = {}
    for name, t in declared.items():
        entry = f"{kind}.{name}"
        encoding = t.get("encoding") if isinstance(t, dict) else None
        if isinstance(t, dict) and "encoding" in t:
            _Doc.need(encoding in ENCODINGS, entry, f"unknown encoding {str(encoding)[:40]!r}; this paddlejax reads "
                                                   f"{', '.join(map(repr, ENCODINGS))}")
            t = {k: v for k, v in t.items() if k != "encoding"}
        ttype = _Doc.type(t, entry)
        what = f"{kind[:-1]} '{name}'"
        key = f"{kind}/{name}"
        _Doc.need(key in tensors, where, f"{what} is missing from the tensor file")
        arr = tensors.pop(key)
        if encoding is not None:
            arr = _decode_bitmask(arr, tensors.pop(f"{BITMASK}/{key}", None), ttype, key, where, budget)
        got = TensorType.of(arr)
        _Doc.need(got == ttype, where, f"{what} is {got} in the tensor file but {ttype} in the program")
        out[name] = arr
    return out


def _decode_bitmask(values: np.ndarray, packed: np.ndarray | None, ttype: TensorType, key: str, where: str,
                    budget: _Budget) -> np.ndarray:
    """The dense array the ``bitmask`` encoded tensor ``key`` (``params/NAME``) stands for, every
    part checked against ``ttype``: the mask one bit per element (trailing bits clear), one value
    per set bit."""
    kind, _, name = key.partition("/")
    what = f"{kind[:-1]} '{name}'"
    _Doc.need(ttype.is_static, where, f"{what} is encoded, which needs a static shape, not {ttype}")
    size = ttype.size
    _Doc.need(packed is not None, where, f"{what} is declared {BITMASK}-encoded but '{BITMASK}/{key}' is missing "
                                         "from the tensor file")
    mask_type = TensorType(((size + 7) // 8,), "uint8")
    _Doc.need(TensorType.of(packed) == mask_type, where, f"{what}: its bitmask is {TensorType.of(packed)} in the "
                                                         f"tensor file; a {ttype} needs {mask_type}")
    budget.take(size * np.dtype(jax.numpy.dtype(ttype.dtype)).itemsize, what, where)
    keep = np.unpackbits(packed)
    _Doc.need(not keep[size:].any(), where, f"{what}: its bitmask sets bits past the tensor's {size} elements")
    keep = keep[:size].view(bool)
    count = int(np.count_nonzero(keep))
    _Doc.need(values.ndim == 1 and values.dtype == np.dtype(jax.numpy.dtype(ttype.dtype)), where,
              f"{what}: its values are {TensorType.of(values)} in the tensor file; expected a vector of {ttype.dtype}")
    _Doc.need(values.size == count, where, f"{what}: its bitmask keeps {count} values but the tensor file "
                                           f"holds {values.size}")
    dense = np.zeros(size, values.dtype)
    dense[keep] = values
    return dense.reshape(ttype.shape)


def _check_producer(producer) -> None:
    _Doc.need(isinstance(producer, dict) and len(producer) <= 16, "producer", "expected a small object")
    for k, v in producer.items():
        _Doc.need(isinstance(v, str) and len(k) <= 64 and len(v) <= 256, f"producer.{k[:64]}",
                  "expected a short string")


def _check_binding(declared, digest: dict | None, where: str) -> None:
    """The document names the tensor file it was saved with; refuse any other."""
    if declared is None:  # a version-1 file, or a document built in memory
        return
    _Doc.obj(declared, "tensors", {"bytes", "sha256"})
    _Doc.need(isinstance(declared["sha256"], str) and isinstance(declared["bytes"], int), "tensors",
              "expected the tensor file's byte count and sha256")
    if digest is not None and digest != declared:
        raise ProgramFormatError(f"{where} does not belong to this program file (its sha256 differs from "
                                 "the one recorded when they were saved): the two files come from different "
                                 "saves, or a save was interrupted")


def from_json(doc: dict, tensors: dict[str, np.ndarray], where: str = "tensors",
              digest: dict | None = None) -> Program:
    """Build and verify a Program from a parsed document and its tensors (``digest``: the
    size and sha256 of the tensor file, checked against the one the document records)."""
    doc = _check_version(doc)
    _Doc.obj(doc, "file", {"format", "format_version", "name", "input_tree", "output_tree", "params",
                           "constants", "body", "tensors"}, {"producer"})
    _check_producer(doc.get("producer", {}))
    tensors, budget = dict(tensors), _Budget()
    params = _attach("params", doc["params"], tensors, where, budget)
    constants = _attach("constants", doc["constants"], tensors, where, budget)
    _Doc.need(not tensors, where, f"unexpected tensors {sorted(tensors)[:5]}")
    _check_binding(doc["tensors"], digest, where)
    body = _Builder().block(doc["body"], "body", 0)
    _Doc.need(isinstance(doc["name"], str) and len(doc["name"]) <= MAX_NAME_CHARS, "name",
              f"must be a string of at most {MAX_NAME_CHARS} characters")
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
    with files.directory_lock(json_path.parent, shared=True):  # never half of a concurrent save
        raw, st_bytes = _read(json_path), _read(st_path)
    doc = parse_json(raw, json_path.name)
    try:
        tensors = _decode_tensors(st_bytes, st_path.name)
        return from_json(doc, tensors, st_path.name, _digest(st_bytes))
    except ProgramFormatError:
        raise
    except RecursionError:
        raise ProgramFormatError(f"{json_path.name}: nested too deeply") from None
    except MemoryError:
        raise ProgramFormatError(f"{json_path.name}: out of memory building the program") from None
    except Exception as e:  # the last line of defence: never another exception type
        raise ProgramFormatError(f"{json_path.name}: malformed program ({type(e).__name__}: {e})") from None
