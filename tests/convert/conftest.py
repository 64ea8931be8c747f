"""Makes ``onnx_cases.py`` (building ONNX models, running onnxruntime) importable as ``onnx_cases``."""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("onnx_cases", Path(__file__).with_name("onnx_cases.py"))
onnx_cases = sys.modules.setdefault("onnx_cases", importlib.util.module_from_spec(_spec))
if not hasattr(onnx_cases, "make_model"):
    _spec.loader.exec_module(onnx_cases)
