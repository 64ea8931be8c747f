"""PassManager: run a pass pipeline (an ordered list of passes), verifying and timing each one.

Pipelines are written as ``"dce,cse,fold_constants{max_elements=64}"``: pass names
separated by commas, options in braces. A named pass pipeline (:func:`register_pipeline`; e.g.
``"inference"``) stands for its passes and may be mixed with others: ``"inference,amp"``.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: x * 1.0 + 0.0, jnp.ones(3))
>>> pm = PassManager("eliminate_identity,dce")
>>> print(pm.run(prog))
program @<lambda>(%x: f32[3]) -> (f32[3]) {
  return %x
}
"""
from __future__ import annotations

import dataclasses
import sys
import time
import typing
from typing import Callable, Sequence, TextIO

from paddlejax.ir.core import Program
from paddlejax.ir.verifier import VerificationError, verify
from paddlejax.passes.base import Pass, PassContext, get_pass, pass_class, registered_passes
from paddlejax.table import format_table


class PassError(RuntimeError):
    """A pass failed or left the program invalid; the message names the pass."""


class UnknownPassError(KeyError):
    """A pass pipeline names no registered pass; prints its message as is (a KeyError's str() is
    the repr of its message, quotes included).

    >>> str(UnknownPassError("unknown pass 'dcee'; did you mean dce?"))
    "unknown pass 'dcee'; did you mean dce?"
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced braces in pass pipeline {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _convert(cls: type[Pass], key: str, raw: str):
    hints = typing.get_type_hints(cls)
    if key not in hints:
        names = [f.name for f in dataclasses.fields(cls)]
        raise ValueError(f"pass '{cls.name}' has no option '{key}'; options: {names or 'none'}")
    kind = hints[key]
    origin = typing.get_origin(kind)
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"pass '{cls.name}': option '{key}' expects true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if origin is tuple:
        (inner, *_) = typing.get_args(kind)
        return tuple(inner(v) for v in raw.strip("()").replace(":", ",").split(",") if v.strip())
    try:
        return kind(raw) if kind in (int, float, str) else raw
    except ValueError:
        raise ValueError(f"pass '{cls.name}': option '{key}' expects {kind.__name__}, got {raw!r}") from None


# Passes the inference pass pipeline runs, in order, when they are registered (see inference_pipeline).
INFERENCE_PIPELINE = ["canonicalize", "eliminate_identity", "fold_constants", "fold_conv_bn", "fold_linear_bn",
                      "fuse_bias_act", "fuse_elementwise_act", "fuse_conv_pool", "fuse_attention", "int8_dataflow",
                      "eliminate_transposes", "cse", "dce", "autotune", "inplace"]

_PIPELINES: dict[str, Callable[[], str]] = {}


def register_pipeline(name: str, pipeline: str | Callable[[], str]) -> None:
    """Let ``name`` stand for ``pipeline`` (a pass pipeline string, or a function giving one when parsed).

    >>> register_pipeline("tidy_example", "eliminate_identity,dce")
    >>> [str(p) for p in parse_pipeline("tidy_example,cse")]
    ['eliminate_identity', 'dce', 'cse']
    """
    if name in registered_passes():
        raise ValueError(f"'{name}' is already the name of a pass; a pass pipeline cannot share it")
    _PIPELINES[name] = pipeline if callable(pipeline) else (lambda: pipeline)


def registered_pipelines() -> dict[str, str]:
    """Each named pass pipeline and the passes it stands for now."""
    return {name: text() for name, text in _PIPELINES.items()}


def inference_pipeline(**options: dict) -> str:
    """The registered passes of :data:`INFERENCE_PIPELINE`, in its order (others are skipped);
    ``options`` gives a pass's options by its name.

    >>> inference_pipeline().startswith("canonicalize,eliminate_identity,fold_constants")
    True
    >>> inference_pipeline(autotune={"sizes": "b=8", "frozen": True}).split(",")[-2:]
    ['autotune{sizes=b=8 frozen=true}', 'inplace']
    """
    known = registered_passes()
    unknown = set(options) - set(INFERENCE_PIPELINE)
    if unknown:
        raise ValueError(f"inference_pipeline: no pass {sorted(unknown)} in the pass pipeline {INFERENCE_PIPELINE}")
    return ",".join(name + _options_text(options.get(name, {})) for name in INFERENCE_PIPELINE if name in known)


def _options_text(options: dict) -> str:
    def text(v):
        return str(v).lower() if isinstance(v, bool) else str(v)
    return "{" + " ".join(f"{k}={text(v)}" for k, v in options.items()) + "}" if options else ""


register_pipeline("inference", inference_pipeline)


def parse_pipeline(text: str) -> list[Pass]:
    """Pass instances from a pass pipeline string.

    >>> [str(p) for p in parse_pipeline("dce, fold_constants{max_elements=8}")]
    ['dce', 'fold_constants{max_elements=8}']
    """
    passes = []
    for item in _split_top(text, ","):
        name, _, rest = item.partition("{")
        name = name.strip()
        if name in _PIPELINES and name not in registered_passes():
            if rest:
                raise ValueError(f"pass pipeline '{name}' takes no options: {item!r}")
            passes.extend(parse_pipeline(_PIPELINES[name]()))
            continue
        try:
            cls = pass_class(name)
        except KeyError as e:
            raise UnknownPassError(e.args[0]) from None
        options = {}
        if rest:
            if not rest.endswith("}"):
                raise ValueError(f"bad options for pass '{name}': {item!r}")
            for pair in _split_top(rest[:-1].replace(" ", ","), ","):
                key, eq, raw = pair.partition("=")
                if not eq:
                    raise ValueError(f"pass '{name}': option {pair!r} is not key=value")
                options[key.strip()] = _convert(cls, key.strip(), raw.strip())
        passes.append(get_pass(name, **options))
    return passes


@dataclasses.dataclass
class PassRecord:
    name: str
    changed: bool
    stats: dict[str, int]
    seconds: float
    ops_before: int
    ops_after: int


class PassManager:
    """Runs passes in order on a copy of the program.

    ``verify`` checks the IR after every pass; ``print_ir_after`` (True, or a set of pass
    names) prints it; ``records`` keeps each pass's statistics and time from the last run.
    """

    def __init__(self, passes: str | Sequence[Pass | str], verify: bool = True,
                 print_ir_after: bool | set[str] = False, stream: TextIO | None = None):
        if isinstance(passes, str):
            passes = parse_pipeline(passes)
        self.passes = [q for p in passes for q in (parse_pipeline(p) if isinstance(p, str) else [p])]
        self.verify = verify
        self.print_ir_after = print_ir_after
        self.stream = stream
        self.records: list[PassRecord] = []

    def run(self, program: Program, inplace: bool = False, training: bool = False,
            sizes: dict[str, int] | None = None) -> Program:
        """Apply the pass pipeline; returns the rewritten program (a copy unless ``inplace``).
        ``training``: ``program`` is a training-mode capture; ``sizes``: its symbolic sizes as it
        will run (see :class:`PassContext`)."""
        program = program if inplace else program.clone()
        ctx = PassContext(training=training, sizes=dict(sizes or {}))
        self.records = []
        for p in self.passes:
            before = sum(1 for _ in program.walk())
            start = time.perf_counter()
            try:
                result = p.apply(program, ctx)
            except Exception as e:
                raise PassError(f"pass '{p}' failed: {type(e).__name__}: {e}") from e
            seconds = time.perf_counter() - start
            if self.verify:
                try:
                    verify(program)
                except VerificationError as e:
                    raise PassError(f"pass '{p}' left an invalid program: {e}") from e
            self.records.append(PassRecord(str(p), result.changed, dict(result.stats), seconds,
                                           before, sum(1 for _ in program.walk())))
            if self.print_ir_after is True or (self.print_ir_after and p.name in self.print_ir_after):
                out = self.stream or sys.stdout
                print(f"// ----- IR after {p} -----", file=out)
                print(program, file=out)
        return program

    def report(self) -> str:
        """A table of the last run: pass, ops before → after, changes, time."""
        rows = [("pass", "ops", "changes", "ms")]
        for r in self.records:
            stats = ", ".join(f"{k}={v}" for k, v in r.stats.items() if v) or "-"
            rows.append((r.name, f"{r.ops_before} -> {r.ops_after}", stats, f"{r.seconds * 1e3:.1f}"))
        return format_table(rows)


def run(program: Program, pipeline: str | Sequence[Pass | str], *, training: bool = False,
        sizes: dict[str, int] | None = None, **options) -> Program:
    """Run a pass pipeline on a copy of ``program``: ``pj.passes.run(prog, "dce,cse")``; ``training``
    and ``sizes`` as for :meth:`PassManager.run`, ``options`` as for :class:`PassManager`."""
    return PassManager(pipeline, **options).run(program, training=training, sizes=sizes)
