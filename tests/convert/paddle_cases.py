"""Building small Paddle programs by hand, for the importer's tests: a legacy ``ProgramDesc``
of a few ops, and the ``.pdiparams`` stream of a few tensors, written by the layout
``paddlejax.convert.paddle_format`` documents (Paddle's own files are in ``fixtures/``)."""
import struct

import numpy as np

from paddlejax.convert import paddle_format

CODES = {np.dtype(v): k for k, v in paddle_format.DTYPES.items()}


def pdiparams(arrays: dict) -> bytes:
    """The .pdiparams bytes of ``arrays``, in the sorted order of their names."""
    tensor_desc = paddle_format.message_class("TensorDesc")
    out = b""
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        desc = tensor_desc(data_type=CODES[a.dtype], dims=list(a.shape)).SerializeToString()
        out += struct.pack("<IQI", 0, 0, 0) + struct.pack("<i", len(desc)) + desc + a.tobytes()
    return out


def program(inputs: dict, ops: list, outputs: list, params: dict | None = None) -> bytes:
    """A legacy ProgramDesc: ``inputs`` name -> (dims, dtype); ``ops`` as
    ``(type, {slot: [vars]}, {slot: [vars]}, {attr: value})``; ``params`` name -> array."""
    desc = paddle_format.message_class("ProgramDesc")()
    block = desc.blocks.add(idx=0, parent_idx=-1)

    def var(name, dims, dtype, persistable=False):
        v = block.vars.add(name=name, persistable=persistable)
        v.type.type = paddle_format.DENSE_TENSOR
        v.type.dense_tensor.tensor.data_type = CODES[np.dtype(dtype)]
        v.type.dense_tensor.tensor.dims.extend(dims)

    for name, (dims, dtype) in inputs.items():
        var(name, dims, dtype)
    for name, a in (params or {}).items():
        var(name, a.shape, a.dtype, persistable=True)
    for col, name in enumerate(inputs):
        _op(block, "feed", {"X": ["feed"]}, {"Out": [name]}, {"col": col})
    for op in ops:
        _op(block, *op)
    for col, name in enumerate(outputs):
        _op(block, "fetch", {"X": [name]}, {"Out": ["fetch"]}, {"col": col})
    return desc.SerializeToString()


def _op(block, type_, inputs, outputs, attrs):
    op = block.ops.add(type=type_)
    for slot, args in inputs.items():
        op.inputs.add(parameter=slot, arguments=args)
    for slot, args in outputs.items():
        op.outputs.add(parameter=slot, arguments=args)
    for name, value in attrs.items():
        a = op.attrs.add(name=name)
        if isinstance(value, bool):
            a.type, a.b = 6, value
        elif isinstance(value, int):
            a.type, a.i = 0, value
        elif isinstance(value, float):
            a.type, a.f = 1, value
        elif isinstance(value, str):
            a.type, a.s = 2, value
        elif all(isinstance(v, int) for v in value):
            a.type = 3
            a.ints.extend(value)
        else:
            a.type = 4
            a.floats.extend(value)
