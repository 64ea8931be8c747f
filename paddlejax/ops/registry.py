"""The op registry: every high-level op is declared once, here, as an :class:`OpDef`.

An op has named inputs (trailing ones may be optional, or one variadic input), typed
attributes with defaults, a pure JAX reference kernel, its :class:`~paddlejax.ops.traits.Traits`
(what it means, for the passes), optional alternative kernels ("variants") and an optional
FLOP count. Declaring an op also makes it a JAX primitive, so ``jax.make_jaxpr`` shows it as
one equation and jit, grad, vmap and shard_map all work.

>>> import jax.numpy as jnp
>>> double = define("double_example", lambda x, *, k: k * x, inputs=[Input("x")],
...                 attrs={"k": Attr("float", 2.0)}, traits=Traits(pointwise=True, channels="identity"))
>>> float(double(jnp.float32(1.5)))
3.0
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from paddlejax import adapter
from paddlejax.ops.traits import Traits

REQUIRED = object()

_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
           "float8_e4m3fn", "float8_e5m2")


def _fail(op: str, what: str, expected: str, got: Any) -> ValueError:
    return ValueError(f"{op}: {what} expects {expected}, got {got!r}")


def _is_int(v) -> bool:
    return (isinstance(v, (int, np.integer)) and not isinstance(v, bool)) or jax.export.is_symbolic_dim(v)


@dataclasses.dataclass(frozen=True)
class Attr:
    """A typed attribute.

    ``kind`` is one of ``int``, ``float``, ``bool``, ``str``, ``ints`` (a tuple of ints;
    ``length`` fixes its length and a single int is broadcast to it), ``dtype``, ``padding``
    (``"SAME"``, ``"VALID"``, an int, per-dimension ints or ``(low, high)`` pairs over
    ``length`` spatial dimensions, 2 if unset). ``choices`` restricts the values, ``minimum``
    bounds numbers, ``optional`` allows None.
    """

    kind: str
    default: Any = REQUIRED
    choices: tuple | None = None
    length: int | None = None
    minimum: float | None = None
    optional: bool = False
    doc: str = ""

    def check(self, op: str, name: str, value):
        """The normalised (hashable) value, or a ValueError naming ``op`` and ``name``."""
        what = f"attribute '{name}'"
        if value is None:
            if self.optional:
                return None
            raise _fail(op, what, f"a {self.kind}", value)
        value = self._normalise(op, what, value)
        if self.choices is not None and value not in self.choices:
            raise _fail(op, what, f"one of {list(self.choices)}", value)
        if self.minimum is not None:
            items = value if isinstance(value, tuple) else (value,)
            if any(not jax.export.is_symbolic_dim(v) and v < self.minimum for v in items):
                raise _fail(op, what, f"values >= {self.minimum}", value)
        return value

    def _normalise(self, op, what, value):
        kind = self.kind
        if kind == "int":
            if not _is_int(value):
                raise _fail(op, what, "an int", value)
            return value if jax.export.is_symbolic_dim(value) else int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
                raise _fail(op, what, "a float", value)
            return float(value)
        if kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise _fail(op, what, "a bool", value)
            return bool(value)
        if kind == "str":
            if not isinstance(value, str):
                raise _fail(op, what, "a string", value)
            return value
        if kind == "dtype":
            try:
                name = np.dtype(value).name if not isinstance(value, str) else value
                name = jax.numpy.dtype(name).name
            except TypeError:
                raise _fail(op, what, f"a dtype ({', '.join(_DTYPES[:12])}, ...)", value) from None
            if name not in _DTYPES:
                raise _fail(op, what, "a supported dtype", value)
            return name
        if kind == "ints":
            return self._ints(op, what, value)
        if kind == "padding":
            return self._padding(op, what, value)
        raise AssertionError(f"unknown attribute kind {kind}")

    def _ints(self, op, what, value):
        if _is_int(value) and self.length is not None:
            value = (value,) * self.length
        if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
            expected = f"{self.length} ints" if self.length else "a tuple of ints"
            raise _fail(op, what, expected, value)
        if self.length is not None and len(value) != self.length:
            raise _fail(op, what, f"{self.length} ints", value)
        return tuple(v if jax.export.is_symbolic_dim(v) else int(v) for v in value)

    def _padding(self, op, what, value):
        n = self.length or 2  # spatial dimensions
        pairs = f"{n} (low, high) pairs" if n > 1 else "a (low, high) pair"
        expected = f"'SAME', 'VALID', an int, {n} or {2 * n} ints, or {pairs}"
        if isinstance(value, str):
            if value.upper() not in ("SAME", "VALID"):
                raise _fail(op, what, expected, value)
            return value.upper()
        if _is_int(value):
            value = (value,) * n
        if isinstance(value, (tuple, list)):
            if all(_is_int(v) for v in value) and len(value) in (n, 2 * n):
                if len(value) == n:
                    return tuple((int(v), int(v)) for v in value)
                return tuple((int(value[2 * i]), int(value[2 * i + 1])) for i in range(n))
            if len(value) == n and all(isinstance(p, (tuple, list)) and len(p) == 2
                                       and all(_is_int(v) for v in p) for p in value):
                return tuple((int(a), int(b)) for a, b in value)
        raise _fail(op, what, expected, value)


@dataclasses.dataclass(frozen=True)
class Input:
    """A named input. ``rank`` (an int or a tuple of allowed ranks) and ``dtype``
    (``"float"``, ``"int"`` or None) are checked on every call; ``optional`` inputs must
    come last; a ``variadic`` input takes any number (at least one) of arrays. A ``state``
    input is a buffer the op keeps rather than a trained weight (batch norm's running
    statistics): reports count parameters read only there apart from trainable ones. An
    ``image`` input is laid out in the op's ``data_format`` like its first input (a residual
    added to a convolution's output): layout passes transpose it with the first."""

    name: str
    rank: int | tuple[int, ...] | None = None
    dtype: str | None = None
    optional: bool = False
    variadic: bool = False
    state: bool = False
    image: bool = False

    def check(self, op: str, x) -> None:
        shape = np.shape(x) if not hasattr(x, "shape") else x.shape
        ranks = (self.rank,) if isinstance(self.rank, int) else self.rank
        if ranks is not None and len(shape) not in ranks:
            expected = " or ".join(str(r) for r in ranks)
            raise ValueError(f"{op}: input '{self.name}' expects rank {expected}, got shape {tuple(shape)}")
        if self.dtype is not None:
            dtype = jax.numpy.result_type(x)
            kind = "float" if jax.numpy.issubdtype(dtype, jax.numpy.inexact) else "int"
            if jax.numpy.issubdtype(dtype, jax.numpy.bool_):
                kind = "bool"
            if kind != self.dtype:
                raise ValueError(f"{op}: input '{self.name}' expects a {self.dtype} array, got {dtype}")


@dataclasses.dataclass
class OpDef:
    """A registered op. Call it like a function: ``conv2d(x, w, stride=2)``.

    ``traits`` say what it means (:class:`~paddlejax.ops.traits.Traits`): passes read them.
    """

    name: str
    kernel: Callable
    inputs: tuple[Input, ...]
    attrs: dict[str, Attr]
    outputs: tuple[str, ...] = ("out",)
    multiple_results: bool = False
    variants: dict[str, Callable] = dataclasses.field(default_factory=dict)
    reduced_precision: frozenset[str] = frozenset()
    # variants that run only where a predicate holds (a compiled extension, a backend); the
    # autotuner offers them only there, and elsewhere they compute by the reference kernel
    requires: dict[str, Callable[[], bool]] = dataclasses.field(default_factory=dict)
    flops: Callable | None = None
    # estimate(variant, in_shapes, dtypes, attrs, platform): a variant's relative time, or None
    # where it computes exactly as the reference kernel; the autotuner's cost model
    estimate: Callable | None = None
    doc: str = ""
    traits: Traits = Traits()

    def __post_init__(self):
        self.bind = adapter.make_primitive(self.name, self.kernel, self.multiple_results)
        self.primitive = self.bind.primitive

    def couples_batch(self, attrs: dict) -> bool:
        """Whether an op of this type with ``attrs`` mixes the rows of its batch.

        >>> from paddlejax.ops import batch_norm
        >>> batch_norm.couples_batch({"training": True}), batch_norm.couples_batch({"training": False})
        (True, False)
        """
        return self.traits.couples_batch(attrs)

    def check_attrs(self, attrs: dict) -> dict:
        """Validated attributes with defaults filled in, in declaration order."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise ValueError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; "
                             f"known: {sorted(self.attrs)}")
        out = {}
        for name, spec in self.attrs.items():
            if name in attrs:
                out[name] = spec.check(self.name, name, attrs[name])
            elif spec.default is REQUIRED:
                raise ValueError(f"{self.name}: attribute '{name}' is required ({spec.kind})")
            else:
                out[name] = spec.default
        return out

    def check_inputs(self, args: Sequence) -> list:
        """The present input arrays; raises on a missing, extra or ill-shaped one."""
        specs = self.inputs
        if specs and specs[-1].variadic:
            if len(args) < len(specs):
                raise ValueError(f"{self.name}: needs at least one '{specs[-1].name}' input")
            for x in args[len(specs) - 1:]:
                specs[-1].check(self.name, x)
            fixed = specs[:-1]
            for spec, x in zip(fixed, args):
                spec.check(self.name, x)
            return list(args)
        if len(args) > len(specs):
            raise ValueError(f"{self.name}: takes {len(specs)} inputs "
                             f"({', '.join(s.name for s in specs)}), got {len(args)}")
        present = []
        for i, spec in enumerate(specs):
            x = args[i] if i < len(args) else None
            if x is None:
                if not spec.optional:
                    raise ValueError(f"{self.name}: input '{spec.name}' is required")
                later = [s.name for s, a in zip(specs[i + 1:], args[i + 1:]) if a is not None]
                if later:
                    raise ValueError(f"{self.name}: input '{spec.name}' must be given when "
                                     f"{later} is (optional inputs are trailing)")
                break
            spec.check(self.name, x)
            present.append(x)
        return present

    def __call__(self, *args, **attrs):
        arrays = self.check_inputs(args)
        return self.bind(*arrays, **self.check_attrs(attrs))


_REGISTRY: dict[str, OpDef] = {}


def define(name: str, kernel: Callable, *, inputs: Sequence[Input], attrs: dict[str, Attr] | None = None,
           outputs: Sequence[str] = ("out",), multiple_results: bool | None = None,
           variants: dict[str, Callable] | None = None, reduced_precision: Sequence[str] = (),
           requires: dict[str, Callable[[], bool]] | None = None, flops: Callable | None = None,
           estimate: Callable | None = None, traits: Traits) -> OpDef:
    """Declare an op and register it under ``name``; returns the :class:`OpDef`.

    ``kernel(*arrays, **attrs)`` is the reference implementation; ``variants`` are other
    kernels of the same function, and ``reduced_precision`` names those among them that compute
    in a narrower type (autotuning tries them only when allowed), and ``requires`` maps variants
    that run only somewhere to a predicate saying whether they can here; ``flops(in_shapes,
    out_shapes, attrs)`` an optional FLOP count; ``estimate(variant, in_shapes, dtypes, attrs,
    platform)`` an optional cost model of the kernels (a relative time per kernel, ``"default"``
    included, or ``None`` for a variant that computes exactly as the reference does there), which
    the autotuner ranks candidates by before timing any; ``traits`` what the op means (required:
    a pass must never have to guess).
    """
    if not isinstance(traits, Traits):
        raise TypeError(f"op '{name}': traits must be a paddlejax.ops.traits.Traits, got {type(traits).__name__}")
    if traits.weight is not None and traits.weight not in [i.name for i in inputs]:
        raise ValueError(f"op '{name}': traits name weight input '{traits.weight}', which is not an input")
    if set(reduced_precision) - set(variants or {}):
        raise ValueError(f"op '{name}': reduced_precision names unknown variants "
                         f"{sorted(set(reduced_precision) - set(variants or {}))}")
    if set(requires or {}) - set(variants or {}):
        raise ValueError(f"op '{name}': requires names unknown variants {sorted(set(requires) - set(variants or {}))}")
    if name in _REGISTRY:
        raise ValueError(f"op '{name}' is already registered")
    outputs = tuple(outputs)
    op = OpDef(name=name, kernel=kernel, inputs=tuple(inputs), attrs=dict(attrs or {}),
               outputs=outputs,
               multiple_results=len(outputs) > 1 if multiple_results is None else multiple_results,
               variants=dict(variants or {}), reduced_precision=frozenset(reduced_precision),
               requires=dict(requires or {}), flops=flops, estimate=estimate, doc=(kernel.__doc__ or "").strip(),
               traits=traits)
    _REGISTRY[name] = op
    return op


def get(name: str) -> OpDef:
    """The op called ``name``; a KeyError lists close names if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown op '{name}'{hint}") from None


def lookup(name: str) -> OpDef | None:
    return _REGISTRY.get(name)


def by_primitive(prim) -> OpDef | None:
    """The op whose primitive is ``prim`` (None for lax primitives)."""
    op = _REGISTRY.get(prim.name)
    return op if op is not None and op.primitive is prim else None


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def elementwise_flops(in_shapes, out_shapes, attrs) -> int:
    """One FLOP per output element: the default cost of elementwise ops."""
    return sum(math.prod(s) for s in out_shapes)
