"""Every example in a docstring runs and prints what it says."""
import doctest
import importlib
import importlib.machinery
import importlib.util
import pkgutil

import pytest

import paddlejax

MODULES = sorted(m.name for m in pkgutil.walk_packages(paddlejax.__path__, "paddlejax.")
                 if not m.name.startswith("paddlejax.cli"))
for package in (paddlejax.passes, paddlejax.models, paddlejax.slim, paddlejax.hub):
    MODULES += sorted(m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}."))
# compiled kernels loaded through ctypes (paddlejax/ops/onednn.py), not Python modules
MODULES = [m for m in MODULES
           if not importlib.util.find_spec(m).origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]


@pytest.mark.parametrize("name", ["paddlejax", *MODULES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
