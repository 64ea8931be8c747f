"""Reading PaddlePaddle's saved inference files, without paddlepaddle and without pickle.

- ``.pdmodel``: a ``ProgramDesc`` protobuf. Its schema is Paddle's public ``framework.proto``;
  the messages the importer reads are declared here (field numbers as Paddle has them) and
  parsed by the ``protobuf`` runtime, which ignores the fields not declared.
- ``.json``: Paddle 3's PIR program, plain JSON (:func:`read_pir`).
- ``.pdiparams``: the parameters, one serialized dense tensor after another, in the sorted
  order of their names (as Paddle's ``save_combine`` writes them and its predictor reads
  them). Each tensor is: ``uint32`` version, ``uint64`` LoD level count and the levels,
  ``uint32`` version, ``int32`` byte size of a ``TensorDesc`` protobuf (dtype and dims), the
  ``TensorDesc``, then the raw little-endian data (:func:`read_params`).

>>> desc = message_class("ProgramDesc")()
>>> op = desc.blocks.add(idx=0, parent_idx=-1).ops.add(type="relu")
>>> message_class("ProgramDesc").FromString(desc.SerializeToString()).blocks[0].ops[0].type
'relu'
"""
from __future__ import annotations

import functools
import json
import math
import os
import struct

import numpy as np

from paddlejax.convert.errors import ConversionError

# VarType.Type: Paddle's dtype codes (framework.proto)
DTYPES = {0: np.bool_, 1: np.int16, 2: np.int32, 3: np.int64, 4: np.float16, 5: np.float32, 6: np.float64,
          20: np.uint8, 21: np.int8, 23: np.complex64, 24: np.complex128}
BF16 = 22
DENSE_TENSOR = 7

# the subset of framework.proto the importer reads: message -> (field, number, kind, repeated);
# kind is a scalar type or another message of this table (enums are read as their int32 codes)
_SCHEMA = {
    "Version": [("version", 1, "int64", False)],
    "Complex": [("r", 1, "double", False), ("i", 2, "double", False)],
    "Scalar": [("type", 1, "int32", False), ("b", 2, "bool", False), ("i", 3, "int64", False),
               ("r", 4, "double", False), ("c", 5, "Complex", False)],
    "OpVar": [("parameter", 1, "string", False), ("arguments", 2, "string", True)],
    "OpAttr": [("name", 1, "string", False), ("type", 2, "int32", False), ("i", 3, "int32", False),
               ("f", 4, "float", False), ("s", 5, "string", False), ("ints", 6, "int32", True),
               ("floats", 7, "float", True), ("strings", 8, "string", True), ("b", 10, "bool", False),
               ("bools", 11, "bool", True), ("block_idx", 12, "int32", False), ("l", 13, "int64", False),
               ("blocks_idx", 14, "int32", True), ("longs", 15, "int64", True), ("float64s", 16, "double", True),
               ("var_name", 17, "string", False), ("vars_name", 18, "string", True),
               ("float64", 19, "double", False), ("scalar", 20, "Scalar", False), ("scalars", 21, "Scalar", True)],
    "OpDesc": [("type", 3, "string", False), ("inputs", 1, "OpVar", True), ("outputs", 2, "OpVar", True),
               ("attrs", 4, "OpAttr", True)],
    "TensorDesc": [("data_type", 1, "int32", False), ("dims", 2, "int64", True)],
    "DenseTensorDesc": [("tensor", 1, "TensorDesc", False), ("legacy_lod_level", 2, "int32", False)],
    "VarType": [("type", 1, "int32", False), ("dense_tensor", 3, "DenseTensorDesc", False)],
    "VarDesc": [("name", 1, "string", False), ("type", 2, "VarType", False), ("persistable", 3, "bool", False),
                ("is_parameter", 5, "bool", False)],
    "BlockDesc": [("idx", 1, "int32", False), ("parent_idx", 2, "int32", False), ("vars", 3, "VarDesc", True),
                  ("ops", 4, "OpDesc", True)],
    "ProgramDesc": [("blocks", 1, "BlockDesc", True), ("version", 4, "Version", False)],
}

# OpDesc.Attr's AttrType -> the field holding the value; BLOCK and BLOCKS name control flow's sub-blocks
BLOCK_ATTRS = (8, 10)
ATTR_FIELDS = {0: "i", 1: "f", 2: "s", 3: "ints", 4: "floats", 5: "strings", 6: "b", 7: "bools", 8: "block_idx",
               9: "l", 10: "blocks_idx", 11: "longs", 12: "float64s", 13: "var_name", 14: "vars_name",
               15: "float64", 16: "scalar", 17: "scalars"}


@functools.cache
def _messages() -> dict:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="paddlejax_paddle_framework.proto",
                                              package="paddlejax.paddle", syntax="proto2")
    for name, fields in _SCHEMA.items():
        message = file.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            spec = message.field.add(name=field, number=number,
                                     label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if kind in _SCHEMA:
                spec.type, spec.type_name = F.TYPE_MESSAGE, f".paddlejax.paddle.{kind}"
            else:
                spec.type = getattr(F, f"TYPE_{kind.upper()}")
    pool = descriptor_pool.DescriptorPool()  # our own pool: paddle's schema may be loaded beside it
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"paddlejax.paddle.{name}"))
            for name in _SCHEMA}


def message_class(name: str):
    """The message class ``name`` of :data:`_SCHEMA` (``ProgramDesc``, ``TensorDesc``...)."""
    return _messages()[name]


def _read_bytes(source, what: str) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if not os.path.isfile(source):
        raise ConversionError(f"from_paddle: no such {what} file: {os.fspath(source)!r}")
    with open(source, "rb") as f:
        return f.read()


def read_program_desc(source):
    """The ``ProgramDesc`` of a ``.pdmodel`` file (or its bytes); ConversionError if unreadable."""
    data = _read_bytes(source, "program")
    try:
        desc = message_class("ProgramDesc").FromString(data)
    except Exception as error:  # the protobuf parser's errors name no common base class
        raise ConversionError(f"from_paddle: {_label(source)} is not a Paddle ProgramDesc "
                              f"({type(error).__name__}: {error})") from None
    if not desc.blocks or not any(op.type for op in desc.blocks[0].ops):
        raise ConversionError(f"from_paddle: {_label(source)} holds no program (no ops in block 0)")
    return desc


def read_pir(source) -> dict:
    """The JSON of a PIR program file (or its bytes), checked to be one."""
    data = _read_bytes(source, "program")
    try:
        program = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ConversionError(f"from_paddle: {_label(source)} is not PIR JSON ({error})") from None
    base = program.get("base_code") if isinstance(program, dict) else None
    if not isinstance(base, dict) or base.get("magic") != "pir":
        raise ConversionError(f"from_paddle: {_label(source)} is JSON but not a Paddle PIR program "
                              "(no base_code with magic 'pir')")
    return program


def _label(source) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the bytes given"


def tensor_dtype(code: int, where: str) -> np.dtype:
    """The NumPy dtype of a Paddle dtype code (bfloat16 through ml_dtypes)."""
    if code == BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code not in DTYPES:
        raise ConversionError(f"from_paddle: {where} has dtype code {code}, which is not a tensor dtype this "
                              "importer reads")
    return np.dtype(DTYPES[code])


def read_params(source, names: list[str], shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """The tensors of a ``.pdiparams`` file (or its bytes), named by ``names`` in sorted order.

    ``shapes`` (name -> shape the program declares) is checked against each tensor's own dims.
    Truncated files, extra bytes, a wrong tensor count and mismatched shapes are errors.
    """
    data = memoryview(_read_bytes(source, "parameter"))
    tensor_desc = message_class("TensorDesc")
    ordered = sorted(names)
    params, pos = {}, 0

    def take(n: int, what: str) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise ConversionError(f"from_paddle: {_label(source)} ends inside {what} (byte {pos} of {len(data)}); "
                                  "the file is truncated or not a .pdiparams file")
        pos += n
        return data[pos - n:pos]

    for name in ordered:
        what = f"parameter '{name}'"
        (version,) = struct.unpack("<I", take(4, what))
        (lod_levels,) = struct.unpack("<Q", take(8, what))
        if version != 0 or lod_levels > 8:
            raise ConversionError(f"from_paddle: {_label(source)} at {what} has no tensor header (version "
                                  f"{version}, {lod_levels} LoD levels); it is not a .pdiparams file or belongs "
                                  "to another program")
        for _ in range(lod_levels):
            (size,) = struct.unpack("<Q", take(8, what))
            take(size, what)
        take(4, what)  # the tensor's own version
        (desc_size,) = struct.unpack("<i", take(4, what))
        try:
            desc = tensor_desc.FromString(bytes(take(desc_size, what)))
        except Exception as error:  # noqa: BLE001 - protobuf's DecodeError
            raise ConversionError(f"from_paddle: {_label(source)}: the description of {what} is unreadable "
                                  f"({error})") from None
        dtype = tensor_dtype(desc.data_type, what)
        dims = tuple(int(d) for d in desc.dims)
        if any(d < 0 for d in dims):
            raise ConversionError(f"from_paddle: {_label(source)}: {what} has negative dims {dims}")
        expected = (shapes or {}).get(name)
        if expected is not None and tuple(expected) != dims:
            raise ConversionError(f"from_paddle: {what} has shape {dims} in {_label(source)}, but the program "
                                  f"declares {tuple(expected)}; the files belong to different models")
        count = math.prod(dims)  # Python ints: hostile dims cannot wrap around
        raw = take(count * dtype.itemsize, what)
        params[name] = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(dims).astype(dtype)
    if pos != len(data):
        raise ConversionError(f"from_paddle: {_label(source)} has {len(data) - pos} bytes after the {len(ordered)} "
                              "parameters the program declares; the files belong to different models")
    return params
