"""Reading the text form back: ``parse(str(program))`` prints exactly as ``program`` does.

A hand-written recursive-descent parser, scanning the text directly (no token list, so a huge
input costs no more memory than its text). Nothing in the text is evaluated: numbers, strings
and symbolic sizes are read by small grammars, and an attribute can name only a dtype, a lax
enum or a lax structure. Grammar (``#`` starts a comment; after an op's types it is the op's
source location)::

    program := 'program' SYMBOL '(' [arg {',' arg}] ')' '->' '(' [type {',' type}] ')' '{' {op} '}'
    arg     := VALUE ':' type
    op      := [VALUE {',' VALUE} '='] body
    body    := 'return' [VALUE {',' VALUE}] [attrs]
             | 'param' SYMBOL [attrs] ':' type
             | 'constant' (SYMBOL | literal) ':' type
             | OPNAME '(' [VALUE {',' VALUE}] ')' [attrs] ':' [type {',' type}] ['(' {block} ')']
    block   := NAME '(' [arg {',' arg}] ')' '{' {op} '}'
    attrs   := '{' [NAME '=' value {',' NAME '=' value}] '}'
    type    := DTYPE '[' [dim {',' dim}] ']'         e.g. f32[b,10], bf16[], i8[2*b,3]
    value   := STRING | '(' [value {',' value} [',']] ')' | '[' [value {',' value}] ']'
             | STRUCT '(' [NAME '=' value {',' ...}] ')' | ENUM.MEMBER | DTYPE
             | True | False | None | INT | FLOAT | nan | inf | -inf | dim expression

``VALUE`` is ``%name``, ``SYMBOL`` is ``@name`` or ``@"any name"``. Values are numbered anew
when printed, so hand-written text may name results freely.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.parse('''
... program @f(%x: f32[b,3]) -> (f32[b,3]) {
...   %0 = relu(%x) : f32[b,3]
...   %1 = constant 2.0 : f32[]
...   %2 = lax.mul(%0, %1) : f32[b,3]
...   return %2
... }''')
>>> prog(jnp.array([[-1.0, 0.5, 2.0]])).tolist()
[[0.0, 1.0, 4.0]]
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import zlib
from collections.abc import Mapping

import jax
import numpy as np

from paddlejax.io import ProgramFormatError
from paddlejax.ir import attrs as attrs_lib
from paddlejax.ir.core import _SHORT_DTYPES, Block, Op, Program, TensorType, Value
from paddlejax.ir.printer import BARE_SYMBOL

MAX_DEPTH = 32  # nesting of attribute values and of dimension expressions
MAX_BLOCK_DEPTH = 64
MAX_NUMBER_CHARS = 100
MAX_DIM_CHARS = 200  # as attrs.eval_dim reads
MAX_ITEMS = 1024  # values in one attribute tuple or list (shapes, paddings and strides are short)

_LONG_DTYPES = {short: long for long, short in _SHORT_DTYPES.items()}
_EXTRA_DTYPES = ("int2", "int4", "uint2", "uint4", "float0", "float4_e2m1fn", "float8_e3m4", "float8_e4m3",
                 "float8_e4m3b11fnuz", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

_SPACE = re.compile(r"(?:\s+|#[^\n]*)+")
_VALUE = re.compile(r"%([A-Za-z0-9_.]+)")
_BARE_SYMBOL = re.compile(f"@({BARE_SYMBOL.pattern})")
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_DIGITS = re.compile(r"\d+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_FLOAT = re.compile(r"-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf\b|nan\b)")
# Python's repr of a complex number: 1j, (1+2j), (-0-nanj), (1e+300+infj)
_COMPLEX = re.compile(r"\((?:-?(?:\d[\d.e+-]*|inf|nan))?[+-]?(?:\d[\d.e+-]*|inf|nan)?j\)|-?(?:\d[\d.e+-]*|inf|nan)j\b")
_INT = re.compile(r"-?\d+(?![\d.eE])")
_DTYPE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\[")
_SUM_OP = re.compile(r"\s*(\+|-(?!>))")
_PRODUCT_OP = re.compile(r"\s*(\*|//|%(?![A-Za-z0-9_.]))")
_LOC = re.compile(r"[ \t]*# ?([^\n]*)")


class ParseError(ProgramFormatError):
    """Malformed program text; ``line`` and ``column`` (from 1) say where, the message what was
    expected there."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(f"line {line}, column {column}: {message}")
        self.line, self.column = line, column


@functools.cache
def _dtype_names() -> frozenset[str]:
    names = set(_SHORT_DTYPES) | set(_EXTRA_DTYPES) | set(attrs_lib._DTYPE_NAMES)
    known = set()
    for name in names:
        try:
            if np.dtype(jax.numpy.dtype(name)).name == name:
                known.add(name)
        except TypeError:
            pass
    return frozenset(known)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.scopes: list[dict[str, Value]] = []
        self.expression_start = 0  # where the dimension expression being read starts
        self.positions: dict[Op, int] = {}  # where each op starts, for errors found after parsing

    # -- scanning ------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> ParseError:
        pos = self.next_token() if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ParseError(message, line, column)

    def expected(self, what: str) -> ParseError:
        self.skip()
        found = re.match(r"[^\s]{1,20}", self.text[self.pos:self.pos + 20])
        return self.error(f"expected {what}, found {repr(found.group()) if found else 'the end of the text'}")

    def skip(self) -> None:
        self.pos = self.next_token()

    def next_token(self) -> int:
        """Where the next token starts: past spaces and comments (the text stays unread)."""
        if self.pos < len(self.text) and not (self.text[self.pos].isspace() or self.text[self.pos] == "#"):
            return self.pos
        m = _SPACE.match(self.text, self.pos)
        return m.end() if m else self.pos

    def peek(self, pattern: re.Pattern | str):
        pos = self.next_token()
        if isinstance(pattern, str):
            return pattern if self.text.startswith(pattern, pos) else None
        return pattern.match(self.text, pos)

    def accept(self, pattern: re.Pattern | str):
        m = self.peek(pattern)
        if m:
            self.pos = self.next_token() + len(m) if isinstance(m, str) else m.end()
        return m

    def expect(self, pattern: re.Pattern | str, what: str | None = None):
        m = self.accept(pattern)
        if not m:
            raise self.expected(what or repr(pattern))
        return m

    def keyword(self, word: str) -> bool:
        m = self.peek(_OPNAME)
        if m and m.group() == word:
            self.pos = m.end()
            return True
        return False

    def symbol(self) -> str:
        m = self.accept(_BARE_SYMBOL)
        if m:
            return m.group(1)
        start = self.pos
        if self.accept("@") and self.peek(_STRING):
            return self.string()
        self.pos = start
        raise self.expected("a symbol name (@name or @\"name\")")

    def string(self) -> str:
        m = self.expect(_STRING, "a string")
        try:
            return json.loads(m.group())
        except ValueError:
            raise self.error("bad escape in string", m.start()) from None

    def separated(self, item, close: str, limit: int | None = None) -> list:
        """``item {',' item}`` up to ``close`` (consumed); an empty list when ``close`` follows;
        at most ``limit`` items."""
        items = []
        if self.accept(close):
            return items
        while True:
            self.count(items, limit)
            items.append(item())
            if self.accept(close):
                return items
            self.expect(",", f"',' or '{close}'")

    def count(self, items: list, limit: int | None) -> None:
        if limit is not None and len(items) >= limit:
            raise self.error(f"more than {limit} values in one tuple or list")

    # -- types ---------------------------------------------------------------------------
    def type(self) -> TensorType:
        m = self.peek(_DTYPE)
        if not m:
            raise self.expected("a type such as f32[2,3]")
        name = _LONG_DTYPES.get(m.group(1), m.group(1))
        if name not in _dtype_names():
            raise self.error(f"unknown dtype {m.group(1)!r}", m.start())
        self.pos = m.end()
        return TensorType(tuple(self.separated(self.dim, "]")), name)

    def dim(self):
        m = self.peek(_INT)
        if m and re.match(r"\s*[,\]]", self.text[m.end():m.end() + 64]):
            self.pos = m.end()
            return self.number(m, int)
        return self.symbolic().expr

    # -- dimension expressions: sum := product {('+'|'-') product}, product := unary {('*'|'//'|'%') unary}
    def expression(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.error("dimension expression nested too deeply")
        self.product(depth)
        while self.accept(_SUM_OP):
            self.product(depth)

    def product(self, depth: int) -> None:
        self.unary(depth)
        while self.accept(_PRODUCT_OP):
            self.unary(depth)

    def unary(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.error("dimension expression nested too deeply")
        if self.pos - self.expression_start > MAX_DIM_CHARS:
            raise self.error(f"dimension expression of more than {MAX_DIM_CHARS} characters", self.expression_start)
        if self.accept("-"):
            return self.unary(depth + 1)
        if self.accept("("):
            self.expression(depth + 1)
            self.expect(")")
            return
        if m := self.accept(_DIGITS):
            self.number(m, int)
            return
        m = self.expect(_NAME, "a dimension (an int or a symbolic size)")
        if self.peek("("):
            if m.group() not in attrs_lib._CALLS:
                raise self.error(f"unknown function {m.group()!r} in a dimension (known: "
                                 f"{', '.join(attrs_lib._CALLS)})", m.start())
            self.expect("(")
            self.separated(lambda: self.expression(depth + 1), ")")

    def symbolic(self) -> attrs_lib.SymDim:
        """A dimension expression such as ``2*b + 1``."""
        start = self.expression_start = self.next_token()
        self.expression(0)
        text = self.text[start:self.pos]
        try:
            attrs_lib.dim_symbols(text)
        except attrs_lib.AttrError as e:
            raise self.error(str(e), start) from None
        return attrs_lib.SymDim(text)

    def number(self, m: re.Match, kind):
        text = m.group()
        if len(text) > MAX_NUMBER_CHARS:
            raise self.error(f"number of {len(text)} characters (at most {MAX_NUMBER_CHARS})", m.start())
        try:
            return kind(text)
        except ValueError:
            raise self.error(f"bad number {text!r}", m.start()) from None

    # -- attribute values ------------------------------------------------------------------
    def attrs(self) -> dict:
        attrs = {}
        if not self.accept("{"):
            return attrs

        def item():
            start = self.pos
            key = self.expect(_NAME, "an attribute name").group()
            if key in attrs:
                raise self.error(f"attribute {key!r} given twice", start)
            self.expect("=", "'='")
            attrs[key] = self.value(0)

        self.separated(item, "}")
        return attrs

    def value(self, depth: int):
        if depth > MAX_DEPTH:
            raise self.error("attribute nested too deeply")
        if self.peek('"'):
            return self.string()
        if m := self.accept(_COMPLEX):
            return self.number(m, complex)
        if self.accept("("):
            return self.tuple(depth)
        if self.accept("["):
            return self.separated(lambda: self.value(depth + 1), "]", MAX_ITEMS)
        start = self.next_token()
        if m := self.accept(_FLOAT):
            return self.number(m, float)
        if m := self.accept(_INT):
            if not self.peek(_SUM_OP) and not self.peek(_PRODUCT_OP):
                return self.number(m, int)
            self.pos = start
            return self.symbolic()
        m = self.peek(_NAME)
        if not m:
            raise self.expected("an attribute value")
        return self.named_value(m, depth)

    def tuple(self, depth: int) -> tuple:
        items = []
        if self.accept(")"):
            return ()
        while True:
            self.count(items, MAX_ITEMS)
            items.append(self.value(depth + 1))
            if self.accept(")"):
                if len(items) == 1:
                    raise self.error("a tuple of one value is written (x,)")
                return tuple(items)
            self.expect(",", "',' or ')'")
            if self.accept(")"):
                return tuple(items)

    def named_value(self, m: re.Match, depth: int):
        name, start = m.group(), m.start()
        self.pos = m.end()
        constants = {"True": True, "False": False, "None": None, "nan": math.nan, "inf": math.inf}
        if name in constants:
            return constants[name]
        lax_types = attrs_lib._lax_types()
        if self.text.startswith(".", self.pos):
            self.pos += 1
            member = self.expect(_NAME, "an enum member").group()
            cls = lax_types.get(name)
            if cls is None or not isinstance(cls, type) or not hasattr(cls, "__members__") \
                    or member not in cls.__members__:
                raise self.error(f"unknown enum {name}.{member}", start)
            return cls[member]
        if name in lax_types and hasattr(lax_types[name], "_fields") and self.accept("("):
            return self.struct(lax_types[name], start, depth)
        if name in _dtype_names() and not self.peek(_SUM_OP) and not self.peek(_PRODUCT_OP):
            return jax.numpy.dtype(name)
        self.pos = start
        return self.symbolic()

    def struct(self, cls, start: int, depth: int):
        fields = {}

        def field():
            key = self.expect(_NAME, "a field name").group()
            self.expect("=", "'='")
            fields[key] = self.value(depth + 1)

        self.separated(field, ")")
        if set(fields) != set(cls._fields):
            raise self.error(f"{cls.__name__} has the fields {', '.join(cls._fields)}", start)
        return cls(**fields)

    # -- values, ops and blocks ---------------------------------------------------------------
    def use(self) -> Value:
        m = self.expect(_VALUE, "a value (%name)")
        for scope in reversed(self.scopes):
            if m.group(1) in scope:
                return scope[m.group(1)]
        raise self.error(f"undefined value %{m.group(1)}", m.start())

    def define(self, name: str, value: Value, pos: int) -> None:
        if any(name in scope for scope in self.scopes):
            raise self.error(f"value %{name} is defined twice", pos)
        self.scopes[-1][name] = value

    def args(self) -> list[tuple[str, TensorType, int]]:
        def arg():
            m = self.expect(_VALUE, "an argument (%name: type)")
            self.expect(":", "':'")
            return m.group(1), self.type(), m.start()

        self.expect("(", "'('")
        return self.separated(arg, ")")

    def block(self, name: str, args, depth: int, main: bool = False) -> Block:
        if depth > MAX_BLOCK_DEPTH:
            raise self.error("blocks nested too deeply")
        names = [n if main or not n.isdigit() else None for n, _, _ in args]
        block = Block([t for _, t, _ in args], name, names)
        self.scopes.append({})
        for (n, _, pos), v in zip(args, block.args):
            self.define(n, v, pos)
        self.expect("{", "'{'")
        while not self.accept("}"):
            block.append(self.op(depth))
        self.scopes.pop()
        return block

    def op(self, depth: int) -> Op:
        self.skip()
        start = self.pos
        results = []
        if self.peek(_VALUE):
            results = self.result_names()
        if self.keyword("return"):
            if results:
                raise self.error("return has no results", start)
            return Op("return", self.optional_list(_VALUE, self.use), [], self.attrs())
        kind, operands, attrs = self.op_head()
        self.expect(":", "':' and the result types")
        types = self.optional_list(_DTYPE, self.type)
        blocks = []
        if self.accept("("):
            loc = self.loc()
            while not self.accept(")"):
                name = self.expect(_NAME, "a block (name(args) {...}) or ')'").group()
                blocks.append(self.block(name, self.args(), depth + 1))
        else:
            loc = self.loc()
        if len(types) != len(results):
            plural = "" if len(types) == 1 else "s"
            raise self.error(f"{len(results)} result names but {len(types)} result type{plural}", start)
        op = Op(kind, operands, types, attrs, blocks, loc)
        self.positions[op] = start
        for (name, pos), value in zip(results, op.results):
            self.define(name, value, pos)
        return op

    def result_names(self) -> list[tuple[str, int]]:
        names = []
        while True:
            m = self.expect(_VALUE, "a result name (%name)")
            names.append((m.group(1), m.start()))
            if self.accept("="):
                return names
            self.expect(",", "',' or '='")

    def optional_list(self, first: re.Pattern, item) -> list:
        """``[item {',' item}]``: the items, if the next token matches ``first``."""
        if not self.peek(first):
            return []
        items = [item()]
        while self.accept(","):
            items.append(item())
        return items

    def op_head(self):
        """Kind, operands and attributes of an op, from its name to its ':'."""
        pos = self.next_token()
        kind = next((k for k in ("param", "constant") if self.keyword(k)), None)
        if kind:
            if kind == "param":
                name = self.symbol()
                attrs = self.attrs()  # a parameter's layout: {sharding=(...)}
                if "name" in attrs:
                    raise self.error("a param's name is its @symbol, not an attribute", pos)
                return kind, [], {"name": name, **attrs}
            if self.peek("@"):
                return kind, [], {"name": self.symbol()}
            literal = self.value(MAX_DEPTH)
            if not isinstance(literal, (bool, int, float, complex)):
                raise self.error("an inline constant is a bool, int, float or complex number", pos)
            return kind, [], {"value": literal}
        kind = self.expect(_OPNAME, "an op (%r = name(operands) : types) or return").group()
        self.expect("(", "'(' and the operands")
        operands = self.separated(self.use, ")")
        return kind, operands, self.attrs()

    def loc(self) -> str | None:
        m = _LOC.match(self.text, self.pos)
        if not m:
            return None
        self.pos = m.end()
        return m.group(1)

    def program(self):
        self.skip()
        if not self.keyword("program"):
            raise self.expected("'program @name(...) -> (...) {'")
        name = self.symbol()
        args = self.args()
        self.expect("->", "'->'")
        self.expect("(", "'('")
        header = self.pos
        outs = self.separated(self.type, ")")
        body = self.block("", args, 0, main=True)
        self.skip()
        if self.pos < len(self.text):
            raise self.expected("the end of the text after the program's closing '}'")
        got = [v.type for v in body.ops[-1].operands] if body.ops and body.ops[-1].type == "return" else None
        if got is not None and got != outs:
            raise self.error(f"the program declares results ({', '.join(map(str, outs))}) but returns "
                             f"({', '.join(map(str, got))})", header)
        return name, body


def _placeholder(name: str, t: TensorType) -> np.ndarray:
    """Deterministic stand-in values of type ``t``: floats in [0.5, 1.5) (valid as variances,
    scales and divisors), small integers, random bools; seeded by ``name``."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dtype = jax.numpy.dtype(t.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, t.shape).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        lo = 0 if np.issubdtype(dtype, np.unsignedinteger) else -8
        return rng.integers(lo, lo + 16, t.shape).astype(dtype)
    return rng.uniform(0.5, 1.5, t.shape).astype(dtype)


def _read_arrays(source, kind: str) -> dict | None:
    """``params`` or ``constants`` as a dict: given as one, or read from a safetensors file
    (saved by :func:`paddlejax.save`, whose ``params/`` and ``constants/`` prefixes are dropped,
    or a plain file of named tensors)."""
    if source is None or isinstance(source, Mapping):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"parse: {kind} must be a dict of arrays or a .safetensors path, "
                        f"not {type(source).__name__}")
    from paddlejax.io import read_tensors

    tensors = read_tensors(source)
    prefixed = {k.partition("/")[2]: v for k, v in tensors.items() if k.startswith(f"{kind}/")}
    saved = any(k.startswith(("params/", "constants/")) for k in tensors)
    return prefixed if saved else tensors


def _arrays(program_ops, kind: str, given, parser: _Parser) -> dict:
    ops = [op for op in program_ops if op.type == kind and "name" in op.attrs]
    if given is not None:
        return {op.attrs["name"]: given[op.attrs["name"]] for op in ops if op.attrs["name"] in given}
    out = {}
    for op in ops:
        t = op.results[0].type if len(op.results) == 1 else None
        if t is None or not t.is_static:
            raise parser.error(f"{kind} @{op.attrs['name']} needs a static type for a placeholder value",
                               parser.positions.get(op, 0))
        out[op.attrs["name"]] = _placeholder(op.attrs["name"], t)
    return out


_NONE_PARAMS: dict = {}


def _restore_none_params(program: Program) -> None:
    """The printer leaves out attributes that are None, but a lax primitive is bound with all of
    its parameters: give back the None-able ones declared in :mod:`paddlejax.ops.lax_params`
    that the installed jax's shape rule takes (most first, tried once per set of names). A
    rule that tolerates a parameter its primitive does not record (reduce_max's out_sharding
    on jax 0.10) gets it too: the op verifies and runs the same."""
    from paddlejax.ir.verifier import Shapes, infer_types
    from paddlejax.ops import lax_params

    shapes = None
    for op in program.walk():
        declared = lax_params.PARAMS.get(op.type[4:], {}) if op.type.startswith("lax.") else {}
        missing = [k for k, kind in declared.items() if k not in op.attrs and kind(None)]
        if not missing:
            continue
        key = (op.type, frozenset(op.attrs))
        if key not in _NONE_PARAMS:
            shapes = shapes or Shapes(program)
            base = dict(op.attrs)
            # most first: jax records a None-able parameter whenever its primitive has it
            subsets = (s for n in range(len(missing), -1, -1) for s in itertools.combinations(missing, n))
            for subset in itertools.islice(subsets, 64):
                op.attrs = {**base, **dict.fromkeys(subset)}
                try:
                    infer_types(op, [v.type for v in op.operands], shapes)
                except Exception:  # this jax's primitive lacks one of them, or the op is malformed
                    continue
                _NONE_PARAMS[key] = subset
                break
            op.attrs = base
        op.attrs.update(dict.fromkeys(_NONE_PARAMS.get(key, ())))


def _canonical_attrs(program: Program) -> None:
    """Registry ops' attributes with their defaults filled in, as capture records them (an
    attribute the op rejects is left for the verifier to name)."""
    from paddlejax.ops import registry

    for op in program.walk():
        opdef = registry.lookup(op.type)
        if opdef is None:
            continue
        try:
            checked = opdef.check_attrs(attrs_lib.kernel_attrs(op.attrs))
        except Exception:  # the verifier names the op and attribute
            continue
        op.attrs = {**checked, **{k: v for k, v in op.attrs.items() if k in attrs_lib.ANNOTATIONS}}


def parse(text: str, params=None, constants=None, verify: bool = True) -> Program:
    """The program that ``text`` (as printed by ``print(program)``) describes, verified.

    ``params`` gives the arrays of the ``param @name`` ops: a dict name → array, or the path of
    a safetensors file (one written by :func:`paddlejax.save`, or a plain file of named tensors,
    as :func:`paddlejax.nn.save_weights` writes). ``constants`` does the same for the named
    ``constant @name`` ops (a :func:`paddlejax.save` file given as ``params`` supplies both).
    A name missing from a given dict, or of another type, is reported by the verifier.

    Left out (None), every parameter and named constant gets a *placeholder*: deterministic
    values seeded by its name (floats in [0.5, 1.5), small integers), so that the program runs
    and passes can fold through it, as when an MLIR file's weights are elided. Its outputs
    mean nothing: give the real arrays for real results.

    The text does not show the pytree structure of inputs and outputs: the parsed program takes
    its inputs as positional arrays and returns one array, or a tuple of them when it has
    several outputs (or none).

    Malformed text raises :class:`ParseError` (a :class:`paddlejax.ProgramFormatError`) with the
    line, column and what was expected; an op that is well formed but wrong (an unknown op,
    a type its inputs do not give, a value from another block) is named by the verifier's
    :class:`paddlejax.ir.VerificationError` (``verify=False`` skips that check).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"], jnp.ones((1, 2)), params={"w": jnp.eye(2)})
    >>> same = pj.parse(str(prog), params=prog.params)
    >>> str(same) == str(prog), same(jnp.ones((1, 2))).tolist()
    (True, [[1.0, 1.0]])
    >>> pj.parse("program @f(%x: f32[2]) -> (f32[2]) {\\n  return %y\\n}")
    Traceback (most recent call last):
    ...
    paddlejax.ir.parser.ParseError: line 2, column 10: undefined value %y
    """
    if not isinstance(text, str):
        raise TypeError(f"parse: text must be a str, not {type(text).__name__}")
    parser = _Parser(text)
    try:
        name, body = parser.program()
    except RecursionError:
        raise parser.error("nested too deeply") from None
    source = _read_arrays(params, "params")
    if isinstance(params, (str, os.PathLike)) and constants is None:
        constants = _read_arrays(params, "constants")
    ops = list(body.walk())
    n_out = len(body.ops[-1].operands) if body.ops and body.ops[-1].type == "return" else 0
    in_tree = jax.tree_util.tree_structure((0,) * len(body.args))
    out_tree = jax.tree_util.tree_structure(0 if n_out == 1 else (0,) * n_out)
    program = Program(body, _arrays(ops, "param", source, parser),
                      _arrays(ops, "constant", _read_arrays(constants, "constants"), parser),
                      in_tree, out_tree, name)
    _canonical_attrs(program)
    _restore_none_params(program)
    if verify:
        program.verify()
    return program
