"""Fixtures of the hub's tests: tiny real module directories (see ``tiny_modules.py``, which
this file makes importable as ``tiny_modules``)."""
import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("tiny_modules", Path(__file__).with_name("tiny_modules.py"))
tiny_modules = sys.modules.setdefault("tiny_modules", importlib.util.module_from_spec(_spec))
if not hasattr(tiny_modules, "write_text_module"):
    _spec.loader.exec_module(tiny_modules)


@pytest.fixture
def text_module(tmp_path):
    """The directory of a tiny text-embedding module."""
    tiny_modules.write_text_module(tmp_path / "tiny_text")
    return tmp_path / "tiny_text"


@pytest.fixture
def image_module(tmp_path):
    """The directory of a tiny image classifier (labels cat, dog, owl; 4x4 grey images)."""
    tiny_modules.write_image_module(tmp_path / "tiny_cnn")
    return tmp_path / "tiny_cnn"
