"""The program IR: a :class:`Program` holds a :class:`Block` of :class:`Op` s over SSA :class:`Value` s.

Ops are the registry's ops (``conv2d``), generic JAX primitives (``lax.add``), parameters
(``param``), constants (``constant``), structured control flow (``cond``, ``while``,
``scan``, holding sub-blocks) and the block terminator ``return``. Blocks are isolated from
above: whatever a sub-block uses comes in through its arguments, as in a jaxpr.

Every value knows its uses, so passes can ask "who reads this?". Change a program only
through :class:`paddlejax.ir.Rewriter`; the constructors here are for building new ops.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(x) * 2.0, jnp.ones((2, 3)))
>>> [op.type for op in prog.walk()]
['relu', 'constant', 'lax.mul', 'return']
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import jax
import numpy as np

from paddlejax.ops import registry
from paddlejax.ops.traits import Traits, canonical_form, traits_of

_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
                 "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool",
                 "complex64": "c64", "complex128": "c128", "float8_e4m3fn": "f8e4m3fn",
                 "float8_e5m2": "f8e5m2"}

Dim = int | str  # an int, or a symbolic dimension expression such as "b" or "2*b"


@dataclasses.dataclass(frozen=True)
class TensorType:
    """Shape and dtype of a value; symbolic dimensions are strings (``("b", 10)``)."""

    shape: tuple[Dim, ...]
    dtype: str

    @classmethod
    def of(cls, x) -> "TensorType":
        """The type of an array, abstract value or ``jax.ShapeDtypeStruct``."""
        dims = x.shape if hasattr(x, "shape") else np.shape(x)
        shape = tuple(int(d) if isinstance(d, (int, np.integer)) else str(d) for d in dims)
        dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
        return cls(shape, np.dtype(dtype).name)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int | None:
        return math.prod(self.shape) if self.is_static else None

    def __str__(self) -> str:
        return f"{_SHORT_DTYPES.get(self.dtype, self.dtype)}[{','.join(str(d) for d in self.shape)}]"


class Value:
    """An SSA value: the result of an op or an argument of a block."""

    __slots__ = ("type", "owner", "index", "uses", "name")

    def __init__(self, type: TensorType, owner, index: int, name: str | None = None):
        self.type = type
        self.owner = owner  # Op (a result) or Block (an argument)
        self.index = index
        self.uses: list[tuple[Op, int]] = []
        self.name = name

    @property
    def producer(self) -> "Op | None":
        """The op that defines this value (None for block arguments)."""
        return self.owner if isinstance(self.owner, Op) else None

    @property
    def users(self) -> list["Op"]:
        seen: dict[int, Op] = {}
        for op, _ in self.uses:
            seen.setdefault(id(op), op)
        return list(seen.values())

    def __repr__(self) -> str:
        where = self.owner.type if isinstance(self.owner, Op) else "arg"
        return f"<Value {self.name or ''}{self.type} from {where}>"


class Op:
    """One operation: ``type``, operands, results, attributes and optional sub-blocks."""

    __slots__ = ("type", "operands", "results", "attrs", "blocks", "parent", "loc")

    def __init__(self, type: str, operands, result_types, attrs: dict | None = None,
                 blocks=(), loc: str | None = None):
        self.type = type
        self.operands: list[Value] = []
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attrs = dict(attrs or {})
        self.blocks: list[Block] = []
        self.parent: Block | None = None
        self.loc = loc
        for v in operands:
            self._add_operand(v)
        for b in blocks:
            b.parent = self
            self.blocks.append(b)

    # Use-list upkeep; called by the constructor and the Rewriter only.
    def _add_operand(self, v: Value) -> None:
        v.uses.append((self, len(self.operands)))
        self.operands.append(v)

    def _set_operand(self, i: int, v: Value) -> None:
        old = self.operands[i]
        old.uses.remove((self, i))
        v.uses.append((self, i))
        self.operands[i] = v

    def _drop_operands(self) -> None:
        for i, v in enumerate(self.operands):
            v.uses.remove((self, i))
        self.operands = []

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.type} has {len(self.results)} results, not one")
        return self.results[0]

    @property
    def users(self) -> list["Op"]:
        seen: dict[int, Op] = {}
        for r in self.results:
            for u in r.users:
                seen.setdefault(id(u), u)
        return list(seen.values())

    # -- meaning, from the op library ----------------------------------------------------
    @property
    def traits(self) -> Traits:
        """What this op's type means (:class:`paddlejax.ops.traits.Traits`)."""
        return traits_of(self.type)

    def has_trait(self, name: str) -> bool:
        """Whether boolean trait ``name`` holds for this op and its attributes.

        >>> import jax.numpy as jnp, paddlejax as pj
        >>> prog = pj.trace(lambda x: pj.ops.relu(x) + x, jnp.ones(3))
        >>> [(op.type, op.has_trait("pointwise"), op.has_trait("commutative")) for op in prog.body.ops[:2]]
        [('relu', True, False), ('lax.add', True, True)]
        """
        return self.traits.has(name, self.attrs)

    @property
    def canonical(self) -> tuple[str, dict]:
        """``(type, attrs)`` in the registry's vocabulary: ``lax.add`` reads as ``elementwise_add``
        (:func:`paddlejax.ops.traits.canonical_form`)."""
        return canonical_form(self.type, self.attrs, tuple(v.type for v in self.operands))

    def input(self, name: str) -> "Value | list[Value] | None":
        """The operand bound to the op's input ``name`` (None for an absent optional input; a list
        for a variadic one), by the registry's declaration of the op.

        >>> import jax.numpy as jnp, paddlejax as pj
        >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), jnp.ones((1, 2)), params={"w": jnp.ones((2, 3))})
        >>> linear = prog.body.ops[1]
        >>> linear.input("weight").producer.attrs["name"], linear.input("bias")
        ('w', None)
        """
        opdef = registry.lookup(self.type)
        names = [i.name for i in opdef.inputs] if opdef is not None else []
        if name not in names:
            known = f"inputs {names}" if opdef is not None else "no named inputs (it is not a registry op)"
            raise KeyError(f"{self.type} has no input '{name}'; it has {known}")
        i = names.index(name)
        if opdef.inputs[i].variadic:
            return list(self.operands[i:])
        return self.operands[i] if i < len(self.operands) else None

    def walk(self) -> Iterator["Op"]:
        """This op, then every op nested in its blocks."""
        yield self
        for b in self.blocks:
            yield from b.walk()

    def __repr__(self) -> str:
        return f"<Op {self.type} {', '.join(str(r.type) for r in self.results)}>"


class Block:
    """A list of ops ending in ``return``, with typed arguments."""

    __slots__ = ("args", "ops", "parent", "name")

    def __init__(self, arg_types=(), name: str = "", arg_names=None):
        names = list(arg_names) if arg_names is not None else [None] * len(arg_types)
        self.args = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Op] = []
        self.parent: Op | Program | None = None
        self.name = name

    @property
    def terminator(self) -> Op:
        if not self.ops or self.ops[-1].type != "return":
            raise ValueError(f"block {self.name or ''} has no return")
        return self.ops[-1]

    @property
    def results(self) -> list[Value]:
        return self.terminator.operands

    def walk(self) -> Iterator[Op]:
        for op in self.ops:
            yield from op.walk()

    def append(self, op: Op) -> Op:
        """Append while building a new block (use the Rewriter on existing programs)."""
        op.parent = self
        self.ops.append(op)
        return op


def walk_blocks(block: Block) -> Iterator[Block]:
    yield block
    for op in block.ops:
        for b in op.blocks:
            yield from walk_blocks(b)


class Program:
    """A captured program: the IR, its parameters, constants and pytree signature.

    ``prog(*inputs)`` runs it (compiled with ``jax.jit`` on first call);
    ``prog.apply(params, *inputs)`` is the same computation as a pure function of the
    parameters, so ``jax.grad`` works through it. ``print(prog)`` shows the IR.
    """

    def __init__(self, body: Block, params: dict[str, Any], constants: dict[str, Any],
                 in_tree, out_tree, name: str = "main"):
        self.body = body
        body.parent = self
        self.params = dict(params)
        self.constants = dict(constants)
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.name = name
        self.revision = 0  # bumped by every rewrite, so compiled forms know they are stale

    # -- structure -------------------------------------------------------------------
    def walk(self) -> Iterator[Op]:
        """Every op, in program order, nested blocks included."""
        return self.body.walk()

    @property
    def inputs(self) -> list[Value]:
        return self.body.args

    @property
    def outputs(self) -> list[Value]:
        return self.body.results

    def set_outputs(self, outputs) -> None:
        """Make ``outputs`` (a pytree of values of the main block) what the program returns.

        Use it to fetch values added to a program, e.g. by :func:`paddlejax.autodiff.gradients`.

        >>> import jax.numpy as jnp, paddlejax as pj
        >>> prog = pj.trace(lambda x: jnp.sin(x) * 2.0, jnp.zeros(2))
        >>> sin = prog.body.ops[0].result
        >>> prog.set_outputs({"sin": sin, "out": prog.outputs[0]})
        >>> prog(jnp.zeros(2))["out"].tolist()
        [0.0, 0.0]
        """
        from paddlejax.ir.rewriter import Rewriter

        leaves, tree = jax.tree_util.tree_flatten(outputs)
        for i, v in enumerate(leaves):
            owner = program_of([v], "set_outputs", [f"output {i}"])
            if owner is not self:
                raise ValueError(f"set_outputs: output {i} belongs to a different program ('{owner.name}') "
                                 f"than the one whose outputs are set ('{self.name}')")
        rewriter = Rewriter(self)
        old = self.body.terminator
        rewriter.insert_before(old, Op("return", leaves, []))
        rewriter.erase_op(old)
        self.out_tree = tree

    def param_ops(self) -> list[Op]:
        return [op for op in self.body.ops if op.type == "param"]

    def used_params(self) -> dict[str, Any]:
        """The parameters the program reads (DCE may leave others behind)."""
        names = [op.attrs["name"] for op in self.param_ops()]
        return {n: self.params[n] for n in names}

    def used_constants(self) -> dict[str, Any]:
        names = [op.attrs["name"] for op in self.walk() if op.type == "constant" and "name" in op.attrs]
        return {n: self.constants[n] for n in names}

    def num_params(self) -> int:
        return sum(int(np.size(v)) for v in self.used_params().values())

    # -- running: conveniences over paddlejax.execution, the lowering layer -----------------
    def apply(self, params: dict[str, Any], *inputs):
        """Run the program as a pure function of ``params`` (a dict like ``self.params``).

        >>> import jax, jax.numpy as jnp, paddlejax as pj
        >>> prog = pj.trace(lambda p, x: x @ p["w"], jnp.ones((1, 2)), params={"w": jnp.ones((2, 2))})
        >>> jax.grad(lambda p: prog.apply(p, jnp.ones((1, 2))).sum())(prog.params)["w"].shape
        (2, 2)
        """
        return _execution().run_apply(self, params, *inputs)

    def __call__(self, *inputs):
        return _execution().call(self, *inputs)

    def compile(self, *example_inputs, freeze_params: bool = False, donate: bool = False):
        """A compiled callable ``f(*inputs)`` of a snapshot of the program and its parameters.

        With ``example_inputs`` (arrays or ``jax.ShapeDtypeStruct`` s, structured like the
        program's inputs) XLA compiles now, ahead of time, and ``f`` accepts exactly those shapes
        (``f.func`` is the ``jax.stages.Compiled``: ``memory_analysis()``, ``as_text()``);
        without, ``f`` compiles on its first call for each new input shape.

        ``freeze_params=True`` closes over the parameters as compile-time constants instead of
        passing them as arguments, so XLA can constant-fold and pre-pack them (on XLA's CPU
        backend small CNNs run about 3x faster). The price: the constants are embedded in the
        executable, so every compiled shape holds its own copy of the weights (memory grows
        with the parameter size times the number of compiled shapes) and compiling takes longer,
        as XLA folds through the weights. Use it for inference with small models.

        ``donate=True`` donates the inputs named by the program's ``donate`` annotation (the
        ``donate`` pass): outputs are written into their buffers, and those input arrays are
        deleted by each call.

        >>> import jax, jax.numpy as jnp, paddlejax as pj
        >>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
        >>> f = prog.compile(jax.ShapeDtypeStruct((3, 2), "float32"), freeze_params=True)
        >>> f(jnp.ones((3, 2))).tolist()
        [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
        """
        return _execution().compile_program(self, *example_inputs, freeze_params=freeze_params, donate=donate)

    # -- text, checks, copies -------------------------------------------------------------
    def __str__(self) -> str:
        return self.format()

    def format(self, locs: bool = False) -> str:
        """The text form; ``locs=True`` adds each op's source line as a comment."""
        from paddlejax.ir.printer import format_program

        return format_program(self, locs=locs)

    def verify(self) -> None:
        """Raise :class:`paddlejax.ir.VerificationError` naming the first bad op."""
        from paddlejax.ir.verifier import verify

        verify(self)

    def clone(self) -> "Program":
        """A deep copy of the IR sharing the (immutable) parameter arrays."""
        body = clone_block(self.body, {})
        return Program(body, self.params, self.constants, self.in_tree, self.out_tree, self.name)

    def __repr__(self) -> str:
        n_ops = sum(1 for _ in self.walk())
        return f"<Program {self.name}: {n_ops} ops, {len(self.used_params())} params>"


def _execution():
    # Running is the lowering layer's job, above this module: imported on first use so that
    # the IR itself never depends on it.
    from paddlejax import execution

    return execution


def program_of(values, caller: str, labels=None) -> Program:
    """The one program whose main block defines all ``values``; a clear error otherwise.

    ``caller`` names the function in errors and ``labels`` the values (``"inputs[1]"``).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x + 1.0, jnp.ones(3))
    >>> program_of(prog.outputs, "example") is prog
    True
    """
    labels = labels or [f"value {i}" for i in range(len(values))]
    found = first = None
    for v, label in zip(values, labels):
        if not isinstance(v, Value):
            raise TypeError(f"{caller}: {label} must be a Value of a program, got {type(v).__name__}")
        block = v.owner if isinstance(v.owner, Block) else v.owner.parent
        if block is None:
            raise ValueError(f"{caller}: {label} ({v.type}) comes from an op that was erased")
        if not isinstance(block.parent, Program):
            where = f"a '{block.parent.type}' op" if isinstance(block.parent, Op) else "no program"
            raise ValueError(f"{caller}: {label} ({v.type}) lives in block '{block.name}' of {where}; "
                             "only values of a program's main block qualify")
        if found is None:
            found, first = block.parent, label
        elif block.parent is not found:
            raise ValueError(f"{caller}: {label} belongs to a different program ('{block.parent.name}') "
                             f"than {first} ('{found.name}'); all values must come from one program")
    if found is None:
        raise ValueError(f"{caller}: no values given")
    return found


def clone_block(block: Block, mapping: dict[Value, Value]) -> Block:
    new = Block([a.type for a in block.args], block.name, [a.name for a in block.args])
    mapping.update(zip(block.args, new.args))
    for op in block.ops:
        blocks = [clone_block(b, mapping) for b in op.blocks]
        copy = Op(op.type, [mapping[v] for v in op.operands], [r.type for r in op.results],
                  op.attrs, blocks, op.loc)
        mapping.update(zip(op.results, copy.results))
        new.append(copy)
    return new
