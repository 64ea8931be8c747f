"""Light-NAS (PaddleSlim 1.x, 2019): its compress-config entries, read into a :class:`SANAS`.

PaddleSlim 1.x configured the search in its compress YAML::

    controllers:
        sa_controller:
            class: 'SAController'
            reduce_rate: 0.85
            init_temperature: 10.24
            max_iter_number: 300          # draws before a proposal meets target_flops
    strategies:
        light_nas_strategy:
            class: 'LightNASStrategy'
            controller: 'sa_controller'
            target_flops: 592948064       # 0: no FLOPs limit
            target_latency: 0             # milliseconds; 0: no latency limit
            end_epoch: 500
            retrain_epoch: 5              # epochs that train each candidate
            metric_name: 'acc_top1'
            search_steps: 100             # default: end_epoch // retrain_epoch
            server_ip: ''
            server_port: 8871
            is_server: True

:func:`light_nas` takes that mapping's ``controllers`` and ``strategies`` (or a ``light_nas``
entry holding one strategy, whose ``controller`` may be inline) and returns the configured
:class:`SANAS`; :meth:`LightNASStrategy.from_config` gives the strategy's settings (epochs,
metric) to the caller that trains the candidates. The search space is not in the YAML (Paddle
passed it to its ``Compressor``): ``configs`` names it. Unknown keys are errors naming the
key; the controller runs in this process (``is_server`` must stay true, ``server_ip`` be
local; ``server_port`` is ignored).

>>> config = {"controllers": {"sa": {"class": "SAController", "reduce_rate": 0.9, "init_temperature": 10.24,
...                                  "max_iter_number": 50}},
...           "strategies": {"nas": {"class": "LightNASStrategy", "controller": "sa", "target_flops": 200000,
...                                  "end_epoch": 6, "retrain_epoch": 2, "metric_name": "acc_top1"}}}
>>> space = [("MobileNetV2Space", {"input_size": 8, "output_size": 1, "block_num": 2, "input_channels": 1,
...                                "class_dim": 10})]
>>> nas = light_nas(config, space)
>>> nas.search_steps, nas.controller.max_try_times, [str(c) for c in nas.constraints]
(3, 50, ['flops <= 200000'])
>>> light_nas({"strategies": {"nas": {"class": "LightNASStrategy", "target_flop": 1}}}, space)
Traceback (most recent call last):
...
ValueError: light_nas: unknown key 'target_flop' in strategies.nas; known: class, controller, ...
"""
from __future__ import annotations

import dataclasses

from paddlejax.slim.nas.latency import LatencyTable
from paddlejax.slim.nas.sa_nas import SANAS

CONTROLLER_KEYS = ("class", "reduce_rate", "init_temperature", "max_iter_number")
STRATEGY_KEYS = ("class", "controller", "target_flops", "target_latency", "end_epoch", "retrain_epoch",
                 "metric_name", "search_steps", "server_ip", "server_port", "is_server")


def _mapping(entry, where: str) -> dict:
    if not isinstance(entry, dict):
        raise ValueError(f"light_nas: {where} must be a mapping, got {entry!r}")
    return entry


def _known(entry, keys, where: str) -> dict:
    for key in _mapping(entry, where):
        if key not in keys:
            raise ValueError(f"light_nas: unknown key {key!r} in {where}; known: {', '.join(keys)}")
    return entry


def _number(value, where: str, integer: bool = False, minimum: float = 0):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        raise ValueError(f"light_nas: {where} expects {'an int' if integer else 'a number'} >= {minimum}, "
                         f"got {value!r}")
    return value


@dataclasses.dataclass
class LightNASStrategy:
    """Light-NAS's settings with PaddleSlim 1.x's defaults (see the module doc); the
    controller's are ``reduce_rate``, ``init_temperature`` and ``max_iter_number``."""

    target_flops: float = 629145600
    target_latency: float = 0
    end_epoch: int = 1000
    retrain_epoch: int = 1
    metric_name: str = "top1_acc"
    search_steps: int | None = None
    server_ip: str | None = None
    server_port: int = 0
    is_server: bool = True
    reduce_rate: float = 0.85
    init_temperature: float = 100.0
    max_iter_number: int = 300

    @classmethod
    def from_config(cls, config: dict, strategy: str | None = None) -> LightNASStrategy:
        """The strategy of ``config`` (``controllers`` and ``strategies``, or ``light_nas``);
        ``strategy`` names it when ``strategies`` holds more than one of class
        ``LightNASStrategy`` (strategies of other classes are left to their readers).

        >>> LightNASStrategy.from_config({"light_nas": {"retrain_epoch": 2, "controller": {"reduce_rate": 0.9}}})
        ... # doctest: +ELLIPSIS
        LightNASStrategy(target_flops=629145600, ..., retrain_epoch=2, ..., reduce_rate=0.9, ...)
        """
        _known(config, ("controllers", "strategies", "light_nas"), "the config")
        where, entry = cls._strategy(config, strategy)
        _known(entry, STRATEGY_KEYS, where)
        if entry.get("class", "LightNASStrategy") != "LightNASStrategy":
            raise ValueError(f"light_nas: {where} has class {entry['class']!r}, not 'LightNASStrategy'")
        settings = {k: v for k, v in entry.items() if k not in ("class", "controller")}
        controller = entry.get("controller")
        if isinstance(controller, str):
            controllers = _mapping(config.get("controllers", {}), "controllers")
            if controller not in controllers:
                raise ValueError(f"light_nas: {where} names controller {controller!r}, which controllers does not "
                                 f"define (it has: {', '.join(controllers) or 'none'})")
            controller, cwhere = controllers[controller], f"controllers.{controller}"
        else:
            cwhere = f"{where}.controller"
        if controller is not None:
            _known(controller, CONTROLLER_KEYS, cwhere)
            if controller.get("class", "SAController") != "SAController":
                raise ValueError(f"light_nas: {cwhere} has class {controller['class']!r}; only 'SAController' "
                                 f"is supported")
            settings.update({k: v for k, v in controller.items() if k != "class"})
        for key in ("target_flops", "target_latency", "reduce_rate", "init_temperature"):
            if key in settings:
                _number(settings[key], f"{key} of {where}")
        for key in ("end_epoch", "retrain_epoch", "max_iter_number", "search_steps"):
            if settings.get(key) is not None:
                _number(settings[key], f"{key} of {where}", integer=True, minimum=1)
        return cls(**settings)

    @staticmethod
    def _strategy(config: dict, name: str | None) -> tuple[str, dict]:
        if "light_nas" in config:
            if "strategies" in config:
                raise ValueError("light_nas: give either a light_nas entry or strategies, not both")
            return "light_nas", config["light_nas"]
        strategies = _mapping(config.get("strategies"), "strategies")
        found = [k for k, v in strategies.items() if isinstance(v, dict) and v.get("class") == "LightNASStrategy"]
        if name is not None:
            if name not in found:
                raise ValueError(f"light_nas: no LightNASStrategy named {name!r} in strategies (found: "
                                 f"{', '.join(found) or 'none'})")
            found = [name]
        if len(found) != 1:
            raise ValueError(f"light_nas: strategies holds {len(found)} of class 'LightNASStrategy' "
                             f"({', '.join(found) or 'none'}); name one with strategy=")
        return f"strategies.{found[0]}", strategies[found[0]]

    @property
    def steps(self) -> int:
        """``search_steps``, or Paddle's count of networks per client: ``end_epoch // retrain_epoch``."""
        return self.search_steps if self.search_steps is not None else max(1, self.end_epoch // self.retrain_epoch)

    def sanas(self, configs, *, latency_table: LatencyTable | None = None, **options) -> SANAS:
        """The :class:`SANAS` of these settings over the spaces of ``configs``; ``options`` go to it
        (``seed``, ``save_checkpoint``, ``load_checkpoint``, ``init_tokens``)."""
        return SANAS(configs, (self.server_ip or "", self.server_port), self.init_temperature, self.reduce_rate,
                     self.steps, is_server=self.is_server, flops=self.target_flops or None,
                     latency=self.target_latency or None, latency_table=latency_table,
                     max_try_times=self.max_iter_number, **options)


def light_nas(config: dict, configs, *, strategy: str | None = None, **options) -> SANAS:
    """The :class:`SANAS` that Light-NAS's ``config`` describes, over the spaces of ``configs``
    (see the module doc); ``options`` go to :meth:`LightNASStrategy.sanas`."""
    return LightNASStrategy.from_config(config, strategy).sanas(configs, **options)
