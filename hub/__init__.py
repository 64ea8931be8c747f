"""paddlejax.hub: ready modules to install, run, fine-tune, publish and serve, offline first.

>>> import paddlejax as pj
>>> digits = pj.hub.Module(name="digits_cnn")              # doctest: +SKIP
>>> digits.classification([image])                          # doctest: +SKIP
[{'label': '3', 'score': 0.9962}]

- :class:`Module` — an installed module (:mod:`paddlejax.hub.module`); :class:`Trainer`
  fine-tunes one (:mod:`paddlejax.hub.finetune`).
- :func:`install`, :func:`uninstall`, :func:`list_modules`, :func:`search` — the store
  (``HUB_HOME``) and its sources: directories, archives, registries, built-in recipes.
- :func:`publish` — write a module into a static registry (:mod:`paddlejax.hub.registry`).
- :mod:`paddlejax.hub.serving` — an HTTP server for modules (``paddlejax hub serve``).
"""
from __future__ import annotations

import importlib

_LAZY = {"Module": "module", "load_servable": "module", "Trainer": "finetune", "install": "installer",
         "search": "installer", "uninstall": "store", "list_modules": "store", "publish": "registry",
         "hub_home": "home", "build_module": "builtin", "write_module": "writer", "HubError": "errors",
         "ModuleNotFound": "errors", "ModuleFormatError": "errors", "ArchiveError": "errors",
         "RegistryError": "errors", "RequestError": "errors"}
_RENAMED = {"list_modules": "installed", "build_module": "build"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"paddlejax.hub.{_LAZY[name]}")
        value = getattr(module, _RENAMED.get(name, name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'paddlejax.hub' has no attribute {name!r}")
