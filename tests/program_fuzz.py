"""Fuzzing saved programs: every mutated file is refused with ProgramFormatError or loads into a
program that runs.

Mutations are seeded and replayable: bytes of either file (truncate, flip, insert, delete,
splice), a node of the JSON document replaced by a hostile value, an op attribute set to one,
added or removed. A file that loads is run on inputs made from its declared input types, so a
value that slips past the loader and crashes XLA (an abort, not an exception) kills this
process: run it in a subprocess and read the last "case" line it printed.

    python tests/program_fuzz.py --seed 0 --cases 300
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj
from paddlejax.io import ProgramFormatError

HOSTILE = [True, False, None, 0, -1, 1, 3.0, 2 ** 31, -(2 ** 63), 10 ** 30, "", "x" * 300, "HIGHEST", "NaN",
           [], {}, [[]], {"float": "nan"}, {"float": "inf"}, {"float": "-inf"}, {"tuple": []},
           {"tuple": [True, True]}, {"tuple": [0, 0]}, {"tuple": [-1]}, {"tuple": [2 ** 40]},
           {"list": [1]}, {"dim": "b*b"}, {"dim": "unknown"}, {"dtype": "float64"}, {"dtype": "float0"},
           {"enum": "Precision", "value": "HIGHEST"}, {"enum": "GatherScatterMode", "value": "CLIP"},
           {"enum": "RoundingMethod", "value": "AWAY_FROM_ZERO"}, {"enum": "AccuracyMode", "value": "HIGHEST"},
           {"struct": "ConvDimensionNumbers", "fields": {"lhs_spec": {"tuple": [0, 1]},
                                                         "rhs_spec": {"tuple": [0, 1]},
                                                         "out_spec": {"tuple": [0, 1]}}},
           {"shape": [2, 2], "dtype": "float32"}, {"shape": [-1], "dtype": "int8"}]


def _cnn():
    from paddlejax import nn

    nn.seed(0)
    model = nn.Sequential(nn.Conv2D(1, 4, 3, padding=1), nn.BatchNorm2D(4), nn.ReLU(), nn.MaxPool2D(2),
                          nn.Flatten(), nn.Linear(4 * 2 * 2, 3))
    model.eval()
    return pj.trace(model, pj.InputSpec((None, 1, 4, 4)))


def _lax_mix(p, x):
    h = jax.lax.dot_general(x, p["w"], (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST)
    h = jnp.cumsum(jnp.sort(h, axis=1), axis=1)[jnp.array([1, 0])]
    h = jnp.pad(h, ((0, 0), (1, 1))).astype(jnp.bfloat16).astype(jnp.float32)
    c, ys = jax.lax.scan(lambda c, row: (c + jnp.exp(row).max(), row * c), 0.0, h)
    loop = jax.lax.fori_loop(0, 3, lambda i, v: v * 0.5 + i, ys)
    chosen = jax.lax.cond(c > 0, lambda v: v + 1.0, lambda v: v - 1.0, loop)
    return jnp.concatenate([chosen, jax.lax.dynamic_slice(h, (0, 1), (2, 2))], axis=1), jnp.argmax(h, axis=1)


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


def _custom_rules(x):
    return _clip_gradient(jax.nn.relu(x) * jax.nn.softplus(x)).sum(axis=1)


def seed_programs() -> dict[str, pj.Program]:
    w = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    return {"cnn": _cnn(), "lax_mix": pj.trace(_lax_mix, jnp.ones((2, 3)), params={"w": w}),
            "custom_rules": pj.trace(_custom_rules, pj.InputSpec((None, 3)))}


def _exercise(prog: pj.Program) -> None:
    """Run ``prog`` on inputs made from its declared types, and differentiate its floating
    outputs with respect to its floating inputs (derivative rules run only then)."""
    flat = [np.ones(tuple(2 if isinstance(d, str) else d for d in v.type.shape), jnp.dtype(v.type.dtype))
            for v in prog.inputs]

    def total(*xs):
        outs = jax.tree_util.tree_leaves(prog(*jax.tree_util.tree_unflatten(prog.in_tree, list(xs))))
        return sum(jnp.sum(o.astype(jnp.float32)) for o in outs if jnp.issubdtype(o.dtype, jnp.floating))

    floating = tuple(i for i, x in enumerate(flat) if jnp.issubdtype(x.dtype, jnp.floating))
    run = jax.value_and_grad(total, argnums=floating) if floating else total
    jax.block_until_ready(jax.jit(run)(*flat))  # one compilation for both


def _nodes(doc):
    """Every (container, key) of the document, to pick one to replace."""
    found = []

    def walk(node, depth):
        if depth > 40:
            return
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            found.append((node, k))
            walk(v, depth + 1)

    walk(doc, 0)
    return found


def _ops(doc):
    found = []

    def walk(block):
        for op in block.get("ops", []):
            found.append(op)
            for b in op.get("blocks", []):
                walk(b)

    walk(doc["body"])
    return found


def _mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    kind = rng.choice(["truncate", "flip", "insert", "delete", "splice"])
    i = rng.randrange(len(data))
    if kind == "truncate":
        return data[:i], f"truncate at {i}"
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1:], f"flip byte {i}"
    if kind == "insert":
        extra = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        return data[:i] + extra + data[i:], f"insert {extra!r} at {i}"
    if kind == "delete":
        n = rng.randrange(1, 17)
        return data[:i] + data[i + n:], f"delete {n} at {i}"
    j = rng.randrange(len(data))
    return data[:i] + data[j:j + 32] + data[i:], f"splice {j} at {i}"


def mutate(doc: dict, json_bytes: bytes, st_bytes: bytes, rng: random.Random):
    """One mutation of a saved pair: ``(json_bytes, st_bytes, description)``."""
    kind = rng.choice(["json-bytes", "tensor-bytes", "node", "attr", "attr", "attr-add", "attr-drop"])
    if kind == "json-bytes":
        data, what = _mutate_bytes(json_bytes, rng)
        return data, st_bytes, f"json: {what}"
    if kind == "tensor-bytes":
        data, what = _mutate_bytes(st_bytes, rng)
        return json_bytes, data, f"tensors: {what}"
    doc = copy.deepcopy(doc)
    value = rng.choice(HOSTILE)
    if kind == "node":
        node, key = rng.choice(_nodes(doc))
        node[key] = value
        what = f"node [{key!r}] = {value!r}"[:160]
    else:
        ops = [op for op in _ops(doc) if kind == "attr-add" or op.get("attrs")]
        op = rng.choice(ops)
        attrs = op.setdefault("attrs", {})
        if kind == "attr-drop":
            key = rng.choice(sorted(attrs))
            del attrs[key]
            what = f"{op['type']}: drop {key}"
        else:
            key = rng.choice(sorted(attrs)) if kind == "attr" else rng.choice(
                ["precision", "kernel", "unroll", "accuracy", "donate", "axis", "remat_segment", "bogus"])
            attrs[key] = value
            what = f"{op['type']}.{key} = {value!r}"[:160]
    return json.dumps(doc).encode(), st_bytes, what


def run(seed: int, cases: int, verbose: bool = False) -> dict:
    """Fuzz ``cases`` mutations from ``seed``; counts of refused and loaded-and-run files, and
    the failures (files neither refused nor runnable)."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="program-fuzz-"))
    seeds = []
    for name, prog in seed_programs().items():
        pj.save(prog, work / name)
        raw = (work / f"{name}.json").read_bytes()
        seeds.append((name, json.loads(raw), raw, (work / f"{name}.safetensors").read_bytes(), str(prog)))
    counts = {"refused": 0, "ran": 0, "unchanged": 0, "failures": []}
    path = work / "case"
    for case in range(cases):
        name, doc, raw, st, printed = seeds[rng.randrange(len(seeds))]
        json_bytes, st_bytes, what = mutate(doc, raw, st, rng)
        label = f"case {case} ({name}; {what})"
        print(label, flush=True) if verbose else None
        path.with_suffix(".json").write_bytes(json_bytes)
        path.with_suffix(".safetensors").write_bytes(st_bytes)
        try:
            prog = pj.load(path)
        except ProgramFormatError:
            counts["refused"] += 1
            continue
        except Exception:
            counts["failures"].append(f"{label}: load raised {traceback.format_exc(limit=2)}")
            continue
        if str(prog) == printed:
            counts["unchanged"] += 1  # the mutation did not change the program (whitespace, a loc …)
            continue
        try:
            _exercise(prog)
            counts["ran"] += 1
        except Exception as e:
            counts["failures"].append(f"{label}: loaded but failed to run: {type(e).__name__}: {str(e)[:300]}")
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--verbose", action="store_true", help="print each case before it runs")
    args = parser.parse_args(argv)
    counts = run(args.seed, args.cases, args.verbose)
    failures = counts.pop("failures")
    for f in failures:
        print("FAILURE", f)
    print(f"summary: {json.dumps(counts)} failures={len(failures)}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
