"""PaddleSlim 1.x's compression config (the 2019 ``compress.yaml``: ``version``, ``pruners``,
``controllers``, ``distillers``, ``strategies``, ``compressor``), read strictly and run on a
program with unlabelled samples.

The strategies map onto this package's: ``UniformPruneStrategy`` is :func:`prune` with
``flops=target_ratio`` over ``pruned_params``; ``SensitivePruneStrategy`` measures
:func:`sensitivity` and raises the loss bound until ``target_ratio`` of the FLOPs go;
``AutoPruneStrategy`` is the :class:`AutoPruner` with its ``SAController``'s settings;
``DistillationStrategy`` names the distillers used while fine-tuning (for ``compressor.epoch``
epochs, the original program as teacher); ``QuantizationStrategy`` is quantization-aware
training with that distillation when it has epochs to train (``end_epoch > start_epoch``),
post-training quantization otherwise; ``LightNASStrategy`` is read by
:mod:`paddlejax.slim.nas.light_nas`, and searches new networks rather than compressing a
program, so a run on a program refuses it.

Where Paddle's config names a metric (``metric_name``), there are no labels here: the metric is
fidelity to the original program on held-out samples (top-1 agreement for logits, else one
minus the relative error). Feature maps in distillers name program values: ``output`` or
``output:K`` (the K-th output), or a parameter's name for the result of the op that reads it
(``features.3.weight``: that convolution's output), stable across pruning. Keys Paddle used
for its own file layout (``checkpoint_path``, ``*_save_path``, ``save_in_nodes``, ...) are
accepted and listed in :attr:`CompressPlan.ignored`; any other unknown key is an error naming it.

>>> plan = read_config({"version": 1.0,
...     "pruners": {"pruner_1": {"class": "StructurePruner", "pruning_axis": {"*": 0}, "criterions": {"*": "l1_norm"}}},
...     "strategies": {"uniform": {"class": "UniformPruneStrategy", "pruner": "pruner_1", "target_ratio": 0.5,
...                                "pruned_params": ".*weight"}},
...     "compressor": {"epoch": 2, "checkpoint_path": "./checkpoints/", "strategies": ["uniform"]}})
>>> [(s.kind, s.options["target_ratio"]) for s in plan.strategies], plan.epochs, plan.ignored
([('uniform', 0.5)], 2, ['compressor.checkpoint_path'])
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np

from paddlejax.ir.core import Program, Value

PRUNER_KEYS = {"class", "pruning_axis", "criterions"}
CONTROLLER_KEYS = {"class", "reduce_rate", "init_temperature", "max_iter_number"}
DISTILLER_KEYS = {
    "FSPDistiller": {"class", "teacher_pairs", "student_pairs", "distillation_loss_weight"},
    "L2Distiller": {"class", "teacher_feature_map", "student_feature_map", "distillation_loss_weight"},
    "SoftLabelDistiller": {"class", "teacher_feature_map", "student_feature_map", "distillation_loss_weight",
                           "teacher_temperature", "student_temperature"},
}
_COMMON = {"class", "start_epoch", "end_epoch", "metric_name"}
STRATEGY_KEYS = {
    "UniformPruneStrategy": _COMMON | {"pruner", "target_ratio", "pruned_params"},
    "SensitivePruneStrategy": _COMMON | {"pruner", "target_ratio", "pruned_params", "delta_rate", "num_steps",
                                         "eval_rate", "sensitivities_file"},
    "AutoPruneStrategy": _COMMON | {"pruner", "controller", "target_ratio", "pruned_params", "retrain_epoch",
                                    "max_ratio", "min_ratio", "uniform_range", "init_tokens"},
    "DistillationStrategy": _COMMON | {"distillers"},
    "QuantizationStrategy": _COMMON | {"weight_bits", "activation_bits", "weight_quantize_type",
                                       "activation_quantize_type", "float_model_save_path", "mobile_model_save_path",
                                       "int8_model_save_path", "save_in_nodes", "save_out_nodes"},
}
# Paddle's own file layout and graph feeds: they have no meaning for a program here
IGNORED_KEYS = {"checkpoint_path", "float_model_save_path", "mobile_model_save_path", "int8_model_save_path",
                "save_in_nodes", "save_out_nodes", "init_model", "eval_epoch", "start_epoch", "end_epoch",
                "retrain_epoch", "uniform_range", "init_tokens", "eval_rate", "num_steps"}
COMPRESSOR_KEYS = {"epoch", "checkpoint_path", "strategies", "init_model", "eval_epoch"}
KINDS = {"UniformPruneStrategy": "uniform", "SensitivePruneStrategy": "sensitive", "AutoPruneStrategy": "auto",
         "DistillationStrategy": "distillation", "QuantizationStrategy": "quantization",
         "LightNASStrategy": "light_nas"}


@dataclasses.dataclass
class Strategy:
    """One strategy of the plan: ``kind`` (``uniform``, ``sensitive``, ``auto``,
    ``distillation``, ``quantization``, ``light_nas``), its ``name`` in the file and its
    ``options`` with the pruner, controller or distillers it names resolved in."""

    kind: str
    name: str
    options: dict


@dataclasses.dataclass
class CompressPlan:
    """A config read and checked: the strategies in the compressor's order, the fine-tuning
    ``epochs``, and the keys read but without meaning here (``ignored``)."""

    strategies: list[Strategy]
    epochs: int
    ignored: list[str]
    source: dict


def _error(message: str) -> ValueError:
    return ValueError(f"compress config: {message}")


def _entries(doc: dict, section: str) -> dict:
    value = doc.get(section, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise _error(f"'{section}' must map names to settings")
    return value


def _keys(entry: dict, known: set, where: str, ignored: list) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise _error(f"unknown key '{unknown[0]}' in {where}; known: {', '.join(sorted(known))}")
    ignored.extend(f"{where}.{k}" for k in sorted(set(entry) & IGNORED_KEYS))


def _number(entry: dict, key: str, where: str, low: float, high: float, default=None) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _error(f"{where}.{key} must be a number in [{low}, {high}], got {value!r}")
    return value


def read_config(source) -> CompressPlan:
    """The plan in ``source`` (a YAML file's path, YAML text, or the parsed mapping), checked:
    unknown sections, classes and keys, and references to pruners, controllers or distillers
    that are not defined, are errors that name them.

    >>> read_config("version: 1.0\\nstrategies: {q: {class: 'QuantizationStrategy'}}\\ncompressor: {strategies: [p]}")
    Traceback (most recent call last):
    ...
    ValueError: compress config: compressor.strategies names 'p', which strategies does not define (it has: q)
    """
    import yaml

    if isinstance(source, (str, os.PathLike)) and not (isinstance(source, str) and "\n" in source):
        path = Path(source)
        if not path.is_file():
            raise _error(f"no config file at {path}")
        source = path.read_text()
    if isinstance(source, str):
        try:
            source = yaml.safe_load(source)  # safe_load builds plain data only: no object tags
        except yaml.YAMLError as e:  # one line: what is wrong and where
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise _error(f"not valid YAML: {problem}{where}") from None
    if not isinstance(source, dict):
        raise _error(f"the top level must be a mapping, got {type(source).__name__}")
    ignored: list[str] = []
    _keys(source, {"version", "pruners", "controllers", "distillers", "strategies", "compressor", "include"},
          "the config", ignored)
    if "include" in source:
        raise _error("'include' of other config files is not supported; put the sections in one file")
    pruners, controllers = _entries(source, "pruners"), _entries(source, "controllers")
    distillers, strategies = _entries(source, "distillers"), _entries(source, "strategies")
    for name, entry in pruners.items():
        _keys(entry, PRUNER_KEYS, f"pruners.{name}", ignored)
        if entry.get("class") != "StructurePruner":
            raise _error(f"pruners.{name} has class {entry.get('class')!r}; only 'StructurePruner' is known")
        if any(axis != 0 for axis in (entry.get("pruning_axis") or {"*": 0}).values()):
            raise _error(f"pruners.{name}.pruning_axis: only axis 0 (output channels) is pruned")
    for name, entry in controllers.items():
        _keys(entry, CONTROLLER_KEYS, f"controllers.{name}", ignored)
        if entry.get("class") != "SAController":
            raise _error(f"controllers.{name} has class {entry.get('class')!r}; only 'SAController' is known")
    for name, entry in distillers.items():
        if entry.get("class") not in DISTILLER_KEYS:
            raise _error(f"distillers.{name} has class {entry.get('class')!r}; known: {', '.join(DISTILLER_KEYS)}")
        _keys(entry, DISTILLER_KEYS[entry["class"]], f"distillers.{name}", ignored)
    compressor = source.get("compressor", {})
    if not isinstance(compressor, dict):
        raise _error("'compressor' must be a mapping")
    _keys(compressor, COMPRESSOR_KEYS, "compressor", ignored)
    order = compressor.get("strategies", list(strategies))
    if not isinstance(order, list) or not order:
        raise _error("compressor.strategies must list the strategies to run")
    plan = []
    for name in order:
        if name not in strategies:
            raise _error(f"compressor.strategies names {name!r}, which strategies does not define "
                         f"(it has: {', '.join(strategies) or 'none'})")
        plan.append(_strategy(name, strategies[name], pruners, controllers, distillers, ignored, source))
    epochs = int(_number(compressor, "epoch", "compressor", 0, 10_000, default=0))
    return CompressPlan(plan, epochs, ignored, source)


def _named(entry: dict, key: str, table: dict, section: str, where: str):
    name = entry.get(key)
    if name not in table:
        raise _error(f"{where}.{key} names {name!r}, which {section} does not define "
                     f"(it has: {', '.join(table) or 'none'})")
    return table[name]


def _strategy(name, entry, pruners, controllers, distillers, ignored, source) -> Strategy:
    where = f"strategies.{name}"
    cls = entry.get("class")
    if cls not in KINDS:
        raise _error(f"{where} has class {cls!r}; known: {', '.join(KINDS)}")
    if cls == "LightNASStrategy":
        from paddlejax.slim.nas.light_nas import LightNASStrategy

        try:
            options = dataclasses.asdict(LightNASStrategy.from_config(
                {k: source[k] for k in ("controllers", "strategies") if k in source}, name))
        except ValueError as e:
            raise _error(str(e)) from None
        return Strategy("light_nas", name, options)
    _keys(entry, STRATEGY_KEYS[cls], where, ignored)
    options = {k: v for k, v in entry.items() if k != "class" and k not in IGNORED_KEYS}
    if "pruner" in STRATEGY_KEYS[cls]:
        pruner = _named(entry, "pruner", pruners, "pruners", where)
        criteria = set((pruner.get("criterions") or {"*": "l1_norm"}).values())
        if len(criteria) != 1:
            raise _error(f"pruners.{entry['pruner']}.criterions: one criterion for all parameters, got {criteria}")
        options["criterion"] = criteria.pop()
        options["target_ratio"] = _number(entry, "target_ratio", where, 0.01, 0.99, default=0.5)
    if cls == "AutoPruneStrategy":
        controller = _named(entry, "controller", controllers, "controllers", where)
        options["controller"] = {k: v for k, v in controller.items() if k != "class"}
    if cls == "DistillationStrategy":
        names = entry.get("distillers")
        if not isinstance(names, list) or not names:
            raise _error(f"{where}.distillers must list distillers")
        options["distillers"] = [{**_named({"distiller": n}, "distiller", distillers, "distillers", where), "name": n}
                                 for n in names]
    if cls == "QuantizationStrategy":
        for key in ("weight_bits", "activation_bits"):
            if entry.get(key, 8) != 8:
                raise _error(f"{where}.{key}: 8-bit quantization only (got {entry[key]!r}); 4-bit weights are "
                             f"pj.slim.quant_post(..., weight_bits=4)")
        options["train"] = entry.get("end_epoch", 0) > entry.get("start_epoch", 0)
    return Strategy(KINDS[cls], name, options)


def feature(program: Program, name: str, where: str = "feature map") -> Value:
    """The value a distiller's feature-map name means in ``program``: ``output``, ``output:K``,
    or the parameter ``name``'s reading op's result.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.relu(pj.ops.linear(x, p["w"])), pj.InputSpec((None, 2)),
    ...                 params={"w": jnp.eye(2)})
    >>> feature(prog, "w").producer.type, feature(prog, "output").producer.type
    ('linear', 'relu')
    """
    match = re.fullmatch(r"output(?::(\d+))?", name)
    if match:
        k = int(match.group(1) or 0)
        if k >= len(program.outputs):
            raise _error(f"{where} {name!r}: the program has {len(program.outputs)} outputs")
        return program.outputs[k]
    param = next((op.result for op in program.param_ops() if op.attrs["name"] == name), None)
    if param is None or not param.users:
        raise _error(f"{where} {name!r} is neither 'output[:K]' nor a parameter the program reads")
    return param.users[0].results[0]


def fidelity(reference: list[np.ndarray], got: list[np.ndarray]) -> float:
    """How close outputs stay to the original's (higher is better, 1 at most): top-1 agreement
    for 2-d logits, else one minus the relative error."""
    if reference[0].ndim == 2 and reference[0].shape[1] > 1:
        return float(np.mean(reference[0].argmax(-1) == got[0].argmax(-1)))
    return 1.0 - max(float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-12)) for r, g in zip(reference, got))
