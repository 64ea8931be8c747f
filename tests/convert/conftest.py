"""Makes the test helpers beside this file importable: ``onnx_cases`` (building ONNX models,
running onnxruntime) and ``paddle_cases`` (building Paddle programs and parameter files)."""
import importlib.util
import sys
from pathlib import Path

for _name in ("onnx_cases", "paddle_cases"):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, Path(__file__).with_name(f"{_name}.py"))
        sys.modules[_name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_name])
