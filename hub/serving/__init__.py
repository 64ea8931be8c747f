"""Serving hub modules over HTTP: PaddleHub Serving's ``POST /predict/<module>``, dynamically
batched onto the modules' precompiled batch sizes, with limits, health, Prometheus metrics and
an OpenAPI document; on uvicorn in this process (:func:`serve`) or as Ray Serve replicas
(:func:`deploy_on_ray`).

- :class:`Limits`: what a request may hold and how long it may take (``limits``);
- :func:`create_app`: the Starlette app (``app``; its status codes are listed there);
- :func:`serve` and :func:`make_server`: run it on uvicorn (``server``);
- :func:`deploy_on_ray`: the same app in Ray Serve replicas (``ray_serve``).

Importing this package is cheap: the web libraries load with the first of these used.

>>> from paddlejax.hub.serving import Limits
>>> Limits(max_items=32).max_items
32
"""
from __future__ import annotations

import importlib

from paddlejax.hub.serving.limits import Limits

_LAZY = {"create_app": "app", "serve": "server", "make_server": "server", "deploy_on_ray": "ray_serve"}

__all__ = ["Limits", "create_app", "serve", "make_server", "deploy_on_ray"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
