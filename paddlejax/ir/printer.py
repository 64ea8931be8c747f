"""The text form of a program: stable, MLIR-like, one op per line.

>>> import jax.numpy as jnp, paddlejax as pj
>>> print(pj.trace(lambda x: pj.ops.relu(x), jnp.ones((2, 3))))
program @<lambda>(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = relu(%x) : f32[2,3]
  return %0
}
"""
from __future__ import annotations

import json
import re

import jax

from paddlejax.ir.attrs import format_value
from paddlejax.ir.core import Block, Op, Program, Value
from paddlejax.ops import registry

_SAFE = re.compile(r"[^A-Za-z0-9_.]")
# Program, parameter and constant names print bare when made of these, quoted otherwise.
BARE_SYMBOL = re.compile(r"[A-Za-z0-9_.<>/\-]+")


def format_symbol(name: str) -> str:
    """``@name``, or ``@"name"`` (escaped as a JSON string) when ``name`` has other characters.

    >>> print(format_symbol("layer1.0.conv1.weight"), format_symbol('my "model"'))
    @layer1.0.conv1.weight @"my \\"model\\""
    """
    return "@" + (name if BARE_SYMBOL.fullmatch(name) else json.dumps(name, ensure_ascii=False))


class Namer:
    """Stable printed names: block arguments by their own name, everything else numbered."""

    def __init__(self):
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.counter = 0

    def arg(self, v: Value) -> str:
        base = _SAFE.sub("_", v.name) if v.name else f"arg{self.counter}"
        name, k = base, 1
        while name in self.taken or name.isdigit():
            name, k = f"{base}_{k}", k + 1
        return self._set(v, name)

    def result(self, v: Value) -> str:
        while str(self.counter) in self.taken:
            self.counter += 1
        name = str(self.counter)
        self.counter += 1
        return self._set(v, name)

    def _set(self, v: Value, name: str) -> str:
        self.taken.add(name)
        self.names[v] = name
        return name

    def __getitem__(self, v: Value) -> str:
        return self.names.get(v, "<undefined>")


def format_attrs(op: Op) -> str:
    opdef = registry.lookup(op.type)
    keys = list(opdef.attrs) if opdef is not None else sorted(op.attrs)
    keys += [k for k in op.attrs if k not in keys]
    items = [f"{k}={format_value(_as_declared(opdef, k, op.attrs[k]))}" for k in keys
             if k in op.attrs and op.attrs[k] is not None]
    return " {" + ", ".join(items) + "}" if items else ""


def _as_declared(opdef, key: str, value):
    """A registry op's dtype attribute prints as a dtype, however it is held (the registry
    keeps the name, passes may set a ``np.dtype``): one text for one meaning."""
    spec = opdef.attrs.get(key) if opdef is not None else None
    return jax.numpy.dtype(value) if spec is not None and spec.kind == "dtype" else value


def _op_lines(op: Op, namer: Namer, indent: str, locs: bool) -> list[str]:
    operands = ", ".join(f"%{namer[v]}" for v in op.operands)
    if op.type == "return":
        return [f"{indent}return {operands}{format_attrs(op)}".rstrip()]
    results = ", ".join(f"%{namer.result(r)}" for r in op.results)
    types = ", ".join(str(r.type) for r in op.results)
    if op.type == "param":
        layout = {k: v for k, v in op.attrs.items() if k != "name"}
        head = f"param {format_symbol(op.attrs['name'])}" + (
            " {" + ", ".join(f"{k}={format_value(v)}" for k, v in layout.items()) + "}" if layout else "")
    elif op.type == "constant" and "name" in op.attrs:
        head = f"constant {format_symbol(op.attrs['name'])}"
    elif op.type == "constant":
        head = f"constant {format_value(op.attrs['value'])}"
    else:
        head = f"{op.type}({operands}){format_attrs(op)}"
    lhs = f"{results} = " if results else ""
    comment = f"  # {op.loc}" if locs and op.loc else ""
    if not op.blocks:
        return [f"{indent}{lhs}{head} : {types}{comment}"]
    lines = [f"{indent}{lhs}{head} : {types} ({comment.strip()}".rstrip()]
    for block in op.blocks:
        lines += _block_lines(block, namer, indent + "  ", locs)
    lines.append(f"{indent})")
    return lines


def _block_lines(block: Block, namer: Namer, indent: str, locs: bool) -> list[str]:
    args = ", ".join(f"%{namer.arg(a) if a.name else namer.result(a)}: {a.type}" for a in block.args)
    lines = [f"{indent}{block.name or 'block'}({args}) {{"]
    for op in block.ops:
        lines += _op_lines(op, namer, indent + "  ", locs)
    lines.append(f"{indent}}}")
    return lines


def op_lines(program: Program) -> dict[Op, str]:
    """Each main-block op's line as ``print(program)`` shows it (the first line for ops with blocks).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: pj.ops.relu(x), jnp.ones(3))
    >>> op_lines(prog)[prog.body.ops[0]]
    '%0 = relu(%x) : f32[3]'
    """
    namer = Namer()
    for a in program.body.args:
        namer.arg(a)
    return {op: _op_lines(op, namer, "", False)[0] for op in program.body.ops}


def format_program(program: Program, locs: bool = False) -> str:
    namer = Namer()
    args = ", ".join(f"%{namer.arg(a)}: {a.type}" for a in program.body.args)
    outs = ", ".join(str(v.type) for v in program.outputs)
    lines = [f"program {format_symbol(program.name)}({args}) -> ({outs}) {{"]
    for op in program.body.ops:
        lines += _op_lines(op, namer, "  ", locs)
    lines.append("}")
    return "\n".join(lines)
