"""Pipeline stage splitting: cut a program's main block into consecutive stages.

:func:`split_stages` cuts the top-level ops of a program into ``N`` consecutive stages, either
balanced by the op cost model (the largest stage's FLOPs as small as possible, from
:func:`paddlejax.analysis.op_flops`) or at the user's marks (``pj.ops.pipeline_stage(x)``,
which is the identity and disappears from the stages). Each stage becomes a :class:`Program`
of its own:

- stage 0 takes the program's inputs; stage ``k > 0`` takes the *boundary* values of stage
  ``k - 1``: every value computed before it (the program's inputs included) that stage ``k`` or
  a later one reads, so a value needed two stages later is passed through the stage between;
- stage ``k < N - 1`` returns its boundary; the last stage returns the program's outputs;
- ``param`` and ``constant`` ops cost nothing and are copied into each stage that reads them, so
  a stage holds the parameters it uses (a parameter read by two stages, such as tied weights,
  is in both; :attr:`PipelineSplit.shared_params` names them).

Stage programs take and return flat tuples of arrays; :meth:`PipelineSplit.__call__` chains them
with the original program's pytree structure and computes what the program computes.

>>> import jax.numpy as jnp, paddlejax as pj
>>> def mlp(p, x):
...     for i in range(4):
...         x = pj.ops.linear(x, p[f"w{i}"], act="relu")
...     return x
>>> params = {f"w{i}": jnp.full((8, 8), 0.1) for i in range(4)}
>>> prog = pj.trace(mlp, pj.InputSpec((None, 8)), params=params)
>>> split = split_stages(prog, 2)
>>> print(split.summary(sizes={"b": 2}))
stage  ops  FLOPs  params  boundary out
0      2    512    128     f32[b,8]
1      2    512    128
total  4    1024   256
>>> bool(jnp.allclose(split(jnp.ones((2, 8))), prog(jnp.ones((2, 8)))))
True
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from paddlejax.analysis import op_flops, size_env
from paddlejax.ir.core import Block, Op, Program, Value
from paddlejax.table import format_table

MARK = "pipeline_stage"
_FREE = ("param", "constant")


@dataclasses.dataclass
class Stage:
    """One pipeline stage: its program, the original ops it runs, and its cost."""

    index: int
    program: Program
    ops: list[Op]
    flops: int
    inputs: list[Value]
    outputs: list[Value]

    @property
    def param_names(self) -> list[str]:
        return [op.attrs["name"] for op in self.program.param_ops()]

    def num_params(self) -> int:
        return self.program.num_params()


@dataclasses.dataclass
class PipelineSplit:
    """The stages of a program (from :func:`split_stages`) and the original pytree structure."""

    program: Program
    stages: list[Stage]
    sizes: dict

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def shared_params(self) -> list[str]:
        """Parameters held by more than one stage (their gradients add up)."""
        counts: dict[str, int] = {}
        for stage in self.stages:
            for name in stage.param_names:
                counts[name] = counts.get(name, 0) + 1
        return sorted(n for n, c in counts.items() if c > 1)

    def stage_params(self, params: dict, k: int) -> dict:
        """The entries of ``params`` that stage ``k`` reads."""
        return {n: params[n] for n in self.stages[k].param_names}

    def run_stage(self, k: int, params: dict, leaves) -> list:
        """Stage ``k`` on the flat list ``leaves`` with ``params`` (a dict with at least its
        parameters): the flat list of its outputs."""
        return list(self.stages[k].program.apply(self.stage_params(params, k), *leaves))

    def apply(self, params: dict, *inputs):
        """The stages one after the other, as a pure function of ``params`` (like
        :meth:`Program.apply` of the original program)."""
        leaves = jax.tree_util.tree_leaves(inputs)
        for k in range(self.num_stages):
            leaves = self.run_stage(k, params, leaves)
        return jax.tree_util.tree_unflatten(self.program.out_tree, leaves)

    def __call__(self, *inputs):
        return self.apply(self.program.params, *inputs)

    def summary(self, sizes: dict | None = None) -> str:
        """A table: per stage its op count, FLOPs, parameter elements and the types of the
        values it hands to the next stage; ``sizes`` gives symbolic sizes (others are 1)."""
        env = size_env(self.program, sizes if sizes is not None else self.sizes)
        rows = [("stage", "ops", "FLOPs", "params", "boundary out")]
        for st in self.stages:
            flops = sum(op_flops(op, env) for op in st.ops)
            boundary = ", ".join(str(v.type) for v in st.outputs) if st.index < self.num_stages - 1 else ""
            rows.append((str(st.index), str(len(st.ops)), str(flops), str(st.num_params()), boundary))
        total_flops = sum(op_flops(op, env) for st in self.stages for op in st.ops)
        rows.append(("total", str(sum(len(s.ops) for s in self.stages)), str(total_flops),
                     str(self.program.num_params()), ""))
        return format_table(rows)

    def __str__(self) -> str:
        return self.summary()


def split_stages(program: Program, num_stages: int | None = None, *, sizes: dict | None = None,
                 balance: str = "flops") -> PipelineSplit:
    """Split ``program``'s main block into ``num_stages`` consecutive stages.

    If the program holds ``pipeline_stage`` marks, it is cut at them (``num_stages``, if given,
    must be the number of marks plus one); otherwise the ops are cut so that the largest
    stage's FLOPs (symbolic sizes from ``sizes``, others 1) are as small as possible, or with
    ``balance="params"`` its parameter bytes (each parameter counted at its first reader).
    ``param`` and ``constant`` ops are not counted as ops to split.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: pj.ops.pipeline_stage(jnp.sin(x)) * 2.0, jnp.ones(3))
    >>> [[op.type for op in st.program.walk()] for st in split_stages(prog).stages]
    [['lax.sin', 'return'], ['constant', 'lax.mul', 'return']]
    """
    body = program.body.ops[:-1]
    marks = [op for op in body if op.type == MARK]
    work = [op for op in body if op.type not in _FREE and op.type != MARK]
    if marks:
        if num_stages is not None and num_stages != len(marks) + 1:
            raise ValueError(f"split_stages: num_stages={num_stages}, but the program has {len(marks)} "
                             f"pipeline_stage mark(s), which make {len(marks) + 1} stages")
        num_stages = len(marks) + 1
    elif num_stages is None:
        raise ValueError("split_stages: give num_stages, or mark stage boundaries with pj.ops.pipeline_stage")
    if balance not in ("flops", "params"):
        raise ValueError(f"split_stages: balance expects 'flops' or 'params', got {balance!r}")
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"split_stages: num_stages expects a positive int, got {num_stages!r}")
    if num_stages > len(work):
        raise ValueError(f"split_stages: {num_stages} stages asked for, but program '{program.name}' has only "
                         f"{len(work)} op(s) to split; use at most {len(work)} stages")
    env = size_env(program, sizes)
    if marks:
        stage_of, k = {}, 0
        for op in body:
            if op.type == MARK:
                k += 1
            elif op.type not in _FREE:
                stage_of[op] = k
        groups = [[op for op in work if stage_of[op] == k] for k in range(num_stages)]
        empty = [k for k, g in enumerate(groups) if not g]
        if empty:
            raise ValueError(f"split_stages: stage(s) {empty} hold no ops (pipeline_stage marks with no op "
                             "between them, or at the very start or end)")
    elif balance == "params":
        groups = balanced_partition(param_bytes(program, work), num_stages, work)
    else:
        groups = balanced_partition([op_flops(op, env) for op in work], num_stages, work)
    alias = {op.result: op.operands[0] for op in marks}
    stages = _build_stages(program, groups, alias, env)
    return PipelineSplit(program, stages, dict(sizes or {}))


def split_groups(program: Program, groups: list[list[Op]]) -> PipelineSplit:
    """``program`` split into stages of the given consecutive groups of its top-level ops
    (``param`` and ``constant`` ops left out: each stage copies those it reads).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.cos(jnp.sin(x)) * 2.0, jnp.ones(3))
    >>> work = [op for op in prog.body.ops[:-1] if op.type != "constant"]
    >>> split_groups(prog, [work[:1], work[1:]]).num_stages
    2
    """
    work = [op for op in program.body.ops[:-1] if op.type not in _FREE]
    if [op for g in groups for op in g] != work or not all(groups):
        raise ValueError("split_groups: groups must be non-empty and hold the program's top-level ops in order")
    return PipelineSplit(program, _build_stages(program, groups, {}, size_env(program, None)), {})


def param_bytes(program: Program, ops: list[Op]) -> list[int]:
    """The bytes of the parameters each of ``ops`` reads first (a parameter read by several ops
    counts at the first).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]) @ p["w"], jnp.ones((1, 4)),
    ...                 params={"w": jnp.ones((4, 4))})
    >>> param_bytes(prog, [op for op in prog.body.ops if op.type not in ("param", "return")])
    [64, 0]
    """
    owner = {op.result: op.attrs["name"] for op in program.param_ops()}
    seen: set[str] = set()
    costs = []
    for op in ops:
        names = [owner[v] for v in op.operands if v in owner and owner[v] not in seen]
        seen.update(names)
        costs.append(sum(int(program.params[n].nbytes) for n in dict.fromkeys(names)))
    return costs


def balanced_partition(costs, n: int, items=None) -> list[list]:
    """Cut ``items`` (default: their indices) into ``n`` non-empty consecutive groups whose
    largest cost sum is as small as possible.

    >>> balanced_partition([4, 1, 1, 1, 1, 4], 3)
    [[0], [1, 2, 3, 4], [5]]
    """
    items = list(range(len(costs))) if items is None else list(items)
    costs = [int(c) for c in costs]
    if not 1 <= n <= len(costs):
        raise ValueError(f"balanced_partition: cannot cut {len(costs)} items into {n} non-empty groups")
    lo, hi = max(costs), max(sum(costs), max(costs))
    while lo < hi:  # the smallest feasible largest-group cost
        mid = (lo + hi) // 2
        if len(_greedy_cuts(costs, n, mid)) <= n - 1:
            hi = mid
        else:
            lo = mid + 1
    bounds = _greedy_cuts(costs, n, lo)
    return [items[a:b] for a, b in zip([0, *bounds], [*bounds, len(items)])]


def _greedy_cuts(costs, n: int, limit: int) -> list[int]:
    """Cut positions packing groups up to ``limit`` but leaving at least one item per later
    group: exactly ``n - 1`` cuts when ``limit`` is feasible, more when it is not."""
    cuts, total = [], 0
    for i, c in enumerate(costs):
        groups_left = n - len(cuts) - 1
        if i > 0 and (total + c > limit or len(costs) - i == groups_left):
            cuts.append(i)
            total = 0
        total += c
    return cuts



def _build_stages(program: Program, groups: list[list[Op]], alias: dict, env: dict) -> list[Stage]:
    def real(v: Value) -> Value:
        while v in alias:
            v = alias[v]
        return v

    n = len(groups)
    stage_of = {op: k for k, g in enumerate(groups) for op in g}
    free = {r: op for op in program.body.ops if op.type in _FREE for r in op.results}
    defined = {v: -1 for v in program.inputs}  # -1: before stage 0
    last_use: dict[Value, int] = {}
    for op, k in stage_of.items():
        defined.update((r, k) for r in op.results)
        for v in map(real, op.operands):
            if v not in free:
                last_use[v] = max(last_use.get(v, -1), k)
    for v in map(real, program.outputs):
        if v not in free:
            last_use[v] = n  # outputs leave through the last stage
    order = [*program.inputs, *(r for g in groups for op in g for r in op.results)]
    boundaries = [[v for v in order if defined[v] <= k < last_use.get(v, -1)] for k in range(n - 1)]
    stages = []
    for k, ops in enumerate(groups):
        inputs = list(program.inputs) if k == 0 else boundaries[k - 1]
        outputs = boundaries[k] if k < n - 1 else [real(v) for v in program.outputs]
        stage_prog = _stage_program(program, f"stage{k}", ops, inputs, outputs, real, free)
        flops = sum(op_flops(op, env) for op in ops)
        stages.append(Stage(k, stage_prog, ops, flops, inputs, outputs))
    return stages


def sub_program(program: Program, ops: list[Op], inputs: list[Value], outputs: list[Value], name: str) -> Program:
    """The program that runs ``ops`` (consecutive top-level ops of ``program``) on ``inputs`` (the
    values they read that others compute) and returns ``outputs``; the parameters and constants
    they read are copied in. Takes and returns flat tuples.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: jnp.cos(jnp.sin(x)), jnp.ones(3))
    >>> sin, cos = prog.body.ops[:2]
    >>> part = sub_program(prog, [cos], [sin.result], [cos.result], "tail")
    >>> [op.type for op in part.walk()]
    ['lax.cos', 'return']
    """
    free = {r: op for op in program.body.ops if op.type in _FREE for r in op.results}
    return _stage_program(program, name, ops, inputs, outputs, lambda v: v, free)


def _stage_program(program: Program, name: str, ops: list[Op], inputs, outputs, real, free) -> Program:
    block = Block([v.type for v in inputs], name, [v.name for v in inputs])
    mapping = dict(zip(inputs, block.args))

    def get(v: Value) -> Value:
        v = real(v)
        if v not in mapping:  # a parameter or constant: copied into every stage that reads it
            op = free[v]
            mapping[v] = block.append(Op(op.type, [], [r.type for r in op.results], op.attrs, loc=op.loc)).result
        return mapping[v]

    for v in outputs:  # outputs that are parameters or constants come first, like all free ops
        if v in free:
            get(v)
    for op in ops:
        for v in op.operands:
            if real(v) in free:
                get(v)
    for op in ops:
        copy = Op(op.type, [get(v) for v in op.operands], [r.type for r in op.results], op.attrs,
                  [_clone_sub(b) for b in op.blocks], op.loc)
        mapping.update(zip(op.results, copy.results))
        block.append(copy)
    block.append(Op("return", [get(v) for v in outputs], []))
    flat_in = jax.tree_util.tree_structure(tuple(np.zeros(0) for _ in inputs))
    flat_out = jax.tree_util.tree_structure([np.zeros(0) for _ in outputs])
    names = [op.attrs["name"] for op in block.ops if op.type == "param"]
    consts = [op.attrs["name"] for op in block.walk() if op.type == "constant" and "name" in op.attrs]
    return Program(block, {n: program.params[n] for n in names}, {n: program.constants[n] for n in consts},
                   flat_in, flat_out, f"{program.name}.{name}")


def _clone_sub(block: Block) -> Block:
    from paddlejax.ir.core import clone_block

    return clone_block(block, {})
