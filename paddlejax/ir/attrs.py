"""Attribute values: symbolic dimensions, JSON encoding and text formatting.

Op attributes are plain Python values (ints, floats, strings, tuples), dtypes, a few lax
enums and named tuples (``lax.Precision``, ``ConvDimensionNumbers`` …), and :class:`SymDim`
for a dimension that depends on a symbolic input size. Decoding accepts only these kinds:
a program file can name a lax enum, never an arbitrary class.

>>> encode(((1, 1), "SAME"))
{'tuple': [{'tuple': [1, 1]}, 'SAME']}
>>> decode(encode(SymDim("2*b")))
SymDim('2*b')
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import json
import math
import operator

import jax
import numpy as np


class AttrError(ValueError):
    """An attribute value that cannot be encoded or decoded."""


@dataclasses.dataclass(frozen=True)
class SymDim:
    """A dimension given by an expression over symbolic input sizes, e.g. ``"2*b"``."""

    expr: str

    def __repr__(self) -> str:
        return f"SymDim({self.expr!r})"


# ---------------------------------------------------------------------------------------
# Symbolic dimension expressions: parsed with ``ast`` and evaluated over a small grammar,
# never with ``eval``.

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else jax.core.max_dim(a, b)


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else jax.core.min_dim(a, b)


_CALLS = {"floordiv": operator.floordiv, "mod": operator.mod, "max": _max, "min": _min,
          "non_negative": lambda a: _max(a, 0)}


@functools.lru_cache(maxsize=1024)
def _parse(expr: str) -> ast.AST:
    if len(expr) > 200:
        raise AttrError(f"dimension expression too long: {expr[:40]}...")
    try:
        return ast.parse(expr, mode="eval").body
    except SyntaxError:
        raise AttrError(f"bad dimension expression {expr!r}") from None


def eval_dim(expr: str, env: dict):
    """Value of a dimension expression; ``env`` maps symbol names to sizes.

    >>> eval_dim("2*b + 1", {"b": 3})
    7
    """
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise AttrError(f"unknown dimension symbol {node.id!r} in {expr!r}")
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
                and not node.keywords):
            return _CALLS[node.func.id](*[ev(a) for a in node.args])
        raise AttrError(f"bad dimension expression {expr!r}")

    return ev(_parse(expr))


def dim_symbols(expr: str) -> set[str]:
    return {n.id for n in ast.walk(_parse(expr)) if isinstance(n, ast.Name) and n.id not in _CALLS}


# Attributes that passes record on ops for lowering (``remat_segment``: recompute this op in
# the backward pass with the others of its segment; ``remat_offload``: keep that segment's
# inputs in host memory until the backward pass; ``kernel``: run the op's variant of that
# name instead of its reference kernel; ``donate``, on a program's return: the inputs whose
# buffers the outputs may take). They are printed and saved with the op but are not arguments
# of its kernel.
ANNOTATIONS = frozenset({"remat_segment", "remat_offload", "kernel", "donate"})


def kernel_attrs(attrs: dict) -> dict:
    """``attrs`` without the pass annotations (:data:`ANNOTATIONS`): what the kernel takes.

    >>> kernel_attrs({"axis": 1, "remat_segment": 0})
    {'axis': 1}
    """
    return {k: v for k, v in attrs.items() if k not in ANNOTATIONS}


def resolve(value, env: dict):
    """``value`` with every :class:`SymDim` replaced by its size under ``env``."""
    if isinstance(value, SymDim):
        return eval_dim(value.expr, env)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(resolve(v, env) for v in value)
    if isinstance(value, tuple):
        return type(value)(*[resolve(v, env) for v in value])
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, env) for k, v in value.items()}
    return value


def from_jax(value):
    """Turn jax's symbolic dimensions inside a primitive parameter into :class:`SymDim`."""
    if jax.export.is_symbolic_dim(value):
        return SymDim(str(value))
    if isinstance(value, (np.integer, np.bool_)):  # some transpose rules pass numpy ints
        return value.item()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*[from_jax(v) for v in value])
    if isinstance(value, tuple):
        return tuple(from_jax(v) for v in value)
    if isinstance(value, list):
        return [from_jax(v) for v in value]
    if isinstance(value, dict):
        return {k: from_jax(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------
# JSON encoding

@functools.cache
def _lax_types() -> dict[str, type]:
    """Public lax enums and named tuples that may appear in primitive parameters."""
    found = {}
    for name in dir(jax.lax):
        obj = getattr(jax.lax, name)
        if isinstance(obj, type) and (issubclass(obj, enum.Enum) or
                                      (issubclass(obj, tuple) and hasattr(obj, "_fields"))):
            found[obj.__name__] = obj
    return found


def encodable(value) -> bool:
    try:
        encode(value)
    except AttrError:
        return False
    return True


def encode(value):
    """A JSON-ready form of an attribute value; AttrError for anything else."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):  # before int: lax.RoundingMethod and lax.FftType are IntEnums
        cls = type(value)
        if _lax_types().get(cls.__name__) is not cls:
            raise AttrError(f"cannot save enum {cls.__name__}")
        return {"enum": cls.__name__, "value": value.name}
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, SymDim):
        return {"dim": value.expr}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        cls = type(value)
        if _lax_types().get(cls.__name__) is not cls:
            raise AttrError(f"cannot save {cls.__name__}")
        return {"struct": cls.__name__, "fields": {f: encode(getattr(value, f)) for f in value._fields}}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return {"list": [encode(v) for v in value]}
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return {"dtype": np.dtype(value).name}
    raise AttrError(f"cannot save a value of type {type(value).__name__}")


_DTYPE_NAMES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                          "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                          "complex128", "float8_e4m3fn", "float8_e5m2", "float0"))


def decode(data, depth: int = 0):
    """Inverse of :func:`encode`; AttrError on anything malformed."""
    if depth > 32:
        raise AttrError("attribute nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        raise AttrError("bare JSON list in an attribute (expected {'tuple': [...]})")
    if not isinstance(data, dict) or len(data) not in (1, 2):
        raise AttrError(f"malformed attribute {str(data)[:60]}")
    key = next(iter(data))
    if key == "tuple" and isinstance(data[key], list):
        return tuple(decode(v, depth + 1) for v in data[key])
    if key == "list" and isinstance(data[key], list):
        return [decode(v, depth + 1) for v in data[key]]
    if key == "float" and data[key] in ("nan", "inf", "-inf"):
        return float(data[key])
    if key == "dim" and isinstance(data[key], str):
        _parse(data[key])
        return SymDim(data[key])
    if key == "dtype" and data[key] in _DTYPE_NAMES:
        return jax.numpy.dtype(data[key])
    if key == "enum" and set(data) == {"enum", "value"}:
        cls = _lax_types().get(data["enum"])
        if cls is None or not issubclass(cls, enum.Enum) or data["value"] not in cls.__members__:
            raise AttrError(f"unknown enum {data['enum']}.{data['value']}")
        return cls[data["value"]]
    if key == "struct" and set(data) == {"struct", "fields"} and isinstance(data["fields"], dict):
        cls = _lax_types().get(data["struct"])
        if cls is None or not hasattr(cls, "_fields") or set(data["fields"]) != set(cls._fields):
            raise AttrError(f"unknown structure {data['struct']}")
        return cls(**{f: decode(v, depth + 1) for f, v in data["fields"].items()})
    raise AttrError(f"malformed attribute {str(data)[:60]}")


# ---------------------------------------------------------------------------------------
# Text

def format_value(value) -> str:
    """How an attribute value reads in the text form."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # quotes and control characters escaped
    if isinstance(value, SymDim):
        return value.expr
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        inner = ", ".join(f"{f}={format_value(getattr(value, f))}" for f in value._fields)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    return repr(value)
