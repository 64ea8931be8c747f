"""Building small ONNX models and running them in onnxruntime, the reference the importer is
checked against."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper


def make_model(nodes, inputs: dict, outputs, *, initializers: dict | None = None, opset: int = 17,
               dynamic: dict | None = None):
    """A model of ``nodes`` whose graph inputs are ``inputs`` (name → example array) and
    initializers ``initializers`` (name → array); ``dynamic`` maps an input name to its dims
    with ``None`` or names where they are dynamic."""
    dynamic = dynamic or {}
    graph_inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), dynamic.get(name, list(np.shape(a))))
        for name, a in inputs.items()]
    graph_outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "case", graph_inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)  # what the installed onnxruntime reads
    return model


def run_onnxruntime(model, inputs: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def relative_error(got, want) -> float:
    """max |got - want| over max |want| (0 for two all-zero arrays)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.abs(want).max() if want.size else 0.0
    return float(np.abs(got - want).max() / scale) if scale else float(np.abs(got - want).max() if got.size else 0)
