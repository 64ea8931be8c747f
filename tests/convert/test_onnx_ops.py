"""Each ONNX op the importer converts, on a one- or few-node model, equals onnxruntime's result
(max relative error <= 1e-4), with the op library's op where one exists."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_cases import make_model, relative_error, run_onnxruntime

import paddlejax as pj

rng = np.random.default_rng(0)


def rand(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, shape).astype(np.float32)


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def case(id, nodes, inputs, *, inits=None, opset=17, outputs=("y",), ops=(), dynamic=None):
    """``ops``: registry ops the converted program must hold."""
    return pytest.param(nodes if isinstance(nodes, list) else [nodes], inputs, inits or {}, opset, outputs, ops,
                        dynamic, id=id)


x4 = rand(2, 3, 8, 8)
w33 = rand(4, 3, 3, 3)
seq = rand(2, 5, 6)
CASES = [
    # elementwise and activations
    case("add-broadcast", node("Add", ["a", "b"]), {"a": rand(2, 3, 4), "b": rand(3, 1)}),
    case("sub-div-mul", [node("Sub", ["a", "b"], ["s"]), node("Div", ["s", "c"], ["d"]), node("Mul", ["d", "a"])],
         {"a": rand(2, 3), "b": rand(2, 3)}, inits={"c": rand(3, low=0.5, high=2)}),
    case("pow-2", node("Pow", ["a", "e"]), {"a": rand(3, 4)}, inits={"e": np.array(2.0, np.float32)}),
    case("pow-tensor", node("Pow", ["a", "e"]), {"a": rand(3, 4, low=0.1), "e": rand(3, 4)}),
    case("max-min-mean", [node("Max", ["a", "b", "c"], ["m"]), node("Min", ["m", "a"], ["n"]),
                          node("Mean", ["n", "b"])], {"a": rand(4), "b": rand(4), "c": rand(4)}),
    *[case(op.lower(), node(op, ["a"]), {"a": rand(2, 6, low=lo, high=hi)}, ops=ours)
      for op, lo, hi, ours in [("Relu", -1, 1, ["relu"]), ("Sigmoid", -4, 4, ["sigmoid"]), ("Tanh", -2, 2, ["tanh"]),
                               ("Exp", -2, 2, []), ("Log", 0.1, 3, []), ("Sqrt", 0, 4, []), ("Erf", -2, 2, []),
                               ("Abs", -1, 1, []), ("Neg", -1, 1, []), ("Softplus", -3, 3, []),
                               ("Reciprocal", 0.5, 2, []), ("Floor", -3, 3, []), ("Ceil", -3, 3, []),
                               ("Sign", -1, 1, []), ("HardSwish", -5, 5, ["hard_swish"])]],
    case("hardsigmoid-paddle", node("HardSigmoid", ["a"], alpha=1 / 6, beta=0.5), {"a": rand(3, 8, low=-5, high=5)},
         ops=["hard_sigmoid"]),
    case("hardsigmoid-default", node("HardSigmoid", ["a"]), {"a": rand(3, 8, low=-5, high=5)}, ops=["hard_sigmoid"]),
    case("leakyrelu", node("LeakyRelu", ["a"], alpha=0.2), {"a": rand(3, 4)}, ops=["leaky_relu"]),
    case("elu-selu-celu", [node("Elu", ["a"], ["e"], alpha=0.5), node("Selu", ["e"], ["s"]), node("Celu", ["s"])],
         {"a": rand(3, 4, low=-3, high=3)}),
    case("gelu-20", node("Gelu", ["a"], approximate="tanh"), {"a": rand(3, 4)}, opset=20, ops=["gelu"]),
    case("prelu-channel", node("PRelu", ["a", "slope"]), {"a": x4}, inits={"slope": rand(3, 1, 1)}, ops=["prelu"]),
    case("prelu-2d", node("PRelu", ["a", "slope"]), {"a": rand(3, 4)}, inits={"slope": rand(4)}, ops=["prelu"]),
    case("prelu-broadcast-last-axis", node("PRelu", ["a", "slope"]), {"a": rand(2, 3, 4)}, inits={"slope": rand(4)}),
    case("clip-relu6", node("Clip", ["a", "lo", "hi"]), {"a": rand(2, 5, low=-9, high=9)},
         inits={"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}, ops=["relu6"]),
    case("clip-min-only", node("Clip", ["a", "lo"]), {"a": rand(2, 5, low=-9, high=9)},
         inits={"lo": np.array(-1.0, np.float32)}),
    case("clip-opset10", node("Clip", ["a"], min=-0.5, max=0.5), {"a": rand(2, 5)}, opset=10),
    case("where-equal-not", [node("Greater", ["a", "b"], ["g"]), node("Not", ["g"], ["n"]),
                             node("Where", ["n", "a", "b"])], {"a": rand(3, 4), "b": rand(3, 4)}),
    case("cast", [node("Cast", ["a"], ["i"], to=TensorProto.INT32), node("Cast", ["i"], to=TensorProto.FLOAT)],
         {"a": rand(3, 4, low=-5, high=5)}),
    case("softmax-13", node("Softmax", ["a"], axis=1), {"a": rand(2, 3, 4)}, ops=["softmax"]),
    case("softmax-11-flattens", node("Softmax", ["a"], axis=1), {"a": rand(2, 3, 4)}, opset=11),
    case("logsoftmax", node("LogSoftmax", ["a"]), {"a": rand(2, 7)}, ops=["log_softmax"]),
    # linear algebra
    case("matmul-weight", node("MatMul", ["a", "w"]), {"a": seq}, inits={"w": rand(6, 4)}, ops=["linear"]),
    case("matmul-batched", node("MatMul", ["a", "b"]), {"a": rand(2, 3, 4, 5), "b": rand(2, 3, 5, 2)},
         ops=["matmul"]),
    case("gemm-transB", node("Gemm", ["a", "w", "c"], transB=1), {"a": rand(3, 6)},
         inits={"w": rand(4, 6), "c": rand(4)}, ops=["linear"]),
    case("gemm-alpha-beta-transA", node("Gemm", ["a", "w", "c"], transA=1, alpha=0.5, beta=2.0), {"a": rand(6, 3)},
         inits={"w": rand(6, 4), "c": rand(3, 4)}),
    case("einsum", node("Einsum", ["a", "b"], equation="bij,bjk->bik"), {"a": rand(2, 3, 4), "b": rand(2, 4, 5)}),
    # convolution, normalisation, pooling
    case("conv-pads-bias", node("Conv", ["x", "w", "b"], pads=[1, 0, 1, 2], strides=[2, 1]), {"x": x4},
         inits={"w": w33, "b": rand(4)}, ops=["conv2d"]),
    case("conv-same-upper", node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2]), {"x": x4},
         inits={"w": w33}),
    case("conv-same-lower", node("Conv", ["x", "w"], auto_pad="SAME_LOWER", strides=[2, 2]), {"x": x4},
         inits={"w": w33}),
    case("conv-depthwise", node("Conv", ["x", "w"], group=3, pads=[1, 1, 1, 1]), {"x": x4},
         inits={"w": rand(3, 1, 3, 3)}),
    case("conv-1d", node("Conv", ["x", "w"], pads=[1, 1]), {"x": rand(2, 3, 9)}, inits={"w": rand(4, 3, 3)},
         ops=["conv1d"]),
    case("convtranspose", node("ConvTranspose", ["x", "w", "b"], strides=[2, 2], pads=[1, 1, 0, 0],
                               output_padding=[1, 1]), {"x": x4}, inits={"w": rand(3, 2, 3, 3), "b": rand(2)},
         ops=["conv2d_transpose"]),
    case("convtranspose-output-shape", node("ConvTranspose", ["x", "w"], strides=[2, 2], output_shape=[15, 16]),
         {"x": x4}, inits={"w": rand(3, 4, 2, 2)}),
    case("convtranspose-groups", node("ConvTranspose", ["x", "w"], strides=[2, 2], group=3), {"x": x4},
         inits={"w": rand(3, 1, 2, 2)}),
    case("batchnorm", node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3), {"x": x4},
         inits={"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)}, ops=["batch_norm"]),
    case("instancenorm", node("InstanceNormalization", ["x", "s", "b"]), {"x": x4}, inits={"s": rand(3), "b": rand(3)},
         ops=["group_norm"]),
    case("layernorm", node("LayerNormalization", ["a", "s", "b"], axis=-1, epsilon=1e-6), {"a": seq},
         inits={"s": rand(6), "b": rand(6)}, ops=["layer_norm"]),
    case("maxpool-ceil", node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), {"x": x4},
         ops=["pool2d"]),
    case("maxpool-pads", node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), {"x": x4}),
    case("avgpool-exclusive", node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), {"x": x4}),
    case("avgpool-include-pad", node("AveragePool", ["x"], kernel_shape=[2, 2], pads=[1, 1, 1, 1],
                                     count_include_pad=1, strides=[2, 2]), {"x": x4}),
    case("avgpool-1d", node("AveragePool", ["x"], kernel_shape=[2], strides=[2]), {"x": rand(2, 3, 8)}),
    case("globalpools", [node("GlobalAveragePool", ["x"], ["a"]), node("GlobalMaxPool", ["x"], ["m"]),
                         node("Add", ["a", "m"])], {"x": x4}),
    # resizing
    case("resize-nearest-scales", node("Resize", ["x", "", "s"], mode="nearest",
                                       coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
         {"x": x4}, inits={"s": np.array([1, 1, 2, 3], np.float32)}),
    case("resize-nearest-half-pixel-sizes", node("Resize", ["x", "", "", "sz"], mode="nearest"), {"x": x4},
         inits={"sz": np.array([2, 3, 5, 11], np.int64)}),
    case("resize-linear-half-pixel", node("Resize", ["x", "", "s"], mode="linear"), {"x": x4},
         inits={"s": np.array([1, 1, 2, 1.5], np.float32)}, ops=["interpolate"]),
    case("resize-linear-align-corners", node("Resize", ["x", "", "", "sz"], mode="linear",
                                             coordinate_transformation_mode="align_corners"), {"x": x4},
         inits={"sz": np.array([2, 3, 13, 5], np.int64)}),
    case("resize-linear-asymmetric", node("Resize", ["x", "", "s"], mode="linear",
                                          coordinate_transformation_mode="asymmetric"), {"x": x4},
         inits={"s": np.array([1, 1, 2, 2], np.float32)}),
    case("depth-to-space", node("DepthToSpace", ["x"], blocksize=2), {"x": rand(1, 8, 3, 3)}),
    case("depth-to-space-crd", node("DepthToSpace", ["x"], blocksize=2, mode="CRD"), {"x": rand(1, 8, 3, 3)}),
    case("space-to-depth", node("SpaceToDepth", ["x"], blocksize=2), {"x": x4}),
    # shapes
    case("shape-gather-concat-reshape",
         [node("Shape", ["a"], ["s"]), node("Gather", ["s", "i0"], ["n"], axis=0),
          node("Unsqueeze", ["n", "ax0"], ["n1"]), node("Concat", ["n1", "rest"], ["shape"], axis=0),
          node("Reshape", ["a", "shape"])],
         {"a": rand(2, 3, 4)}, inits={"i0": np.array(0, np.int64), "ax0": np.array([0], np.int64),
                                      "rest": np.array([-1, 2], np.int64)}),
    case("reshape-zero-copies", node("Reshape", ["a", "s"]), {"a": rand(2, 3, 4)},
         inits={"s": np.array([0, 0, 2, 2], np.int64)}),
    case("flatten", node("Flatten", ["x"], axis=2), {"x": x4}),
    case("transpose", node("Transpose", ["x"], perm=[0, 2, 3, 1]), {"x": x4}),
    case("squeeze-unsqueeze-13", [node("Unsqueeze", ["a", "ax"], ["u"]), node("Squeeze", ["u", "ax"])],
         {"a": rand(2, 3)}, inits={"ax": np.array([1, -1], np.int64)}),
    case("squeeze-unsqueeze-11", [node("Unsqueeze", ["a"], ["u"], axes=[0, 3]), node("Squeeze", ["u"], axes=[3])],
         {"a": rand(2, 3)}, opset=11),
    case("concat-float", node("Concat", ["a", "b"], axis=1), {"a": rand(2, 3), "b": rand(2, 2)}, ops=["concat"]),
    case("split-13", node("Split", ["a", "sp"], ["y", "z"], axis=1), {"a": rand(2, 7)},
         inits={"sp": np.array([3, 4], np.int64)}, outputs=("y", "z")),
    case("split-11-equal", node("Split", ["a"], ["y", "z"], axis=0), {"a": rand(4, 3)}, opset=11, outputs=("y", "z")),
    case("split-18-num-outputs", node("Split", ["a"], ["y", "z", "w"], axis=1, num_outputs=3), {"a": rand(2, 8)},
         opset=18, outputs=("y", "z", "w")),
    case("slice-steps-negative", node("Slice", ["a", "st", "en", "ax", "sp"]), {"a": rand(5, 6, 7)},
         inits={"st": np.array([-1, 1], np.int64), "en": np.array([-(2 ** 63), 100], np.int64),
                "ax": np.array([0, 2], np.int64), "sp": np.array([-2, 3], np.int64)}),
    case("slice-opset9", node("Slice", ["a"], starts=[1], ends=[3], axes=[1]), {"a": rand(2, 5)}, opset=9),
    case("gather-negative", node("Gather", ["a", "i"], axis=1), {"a": rand(3, 5, 2)},
         inits={"i": np.array([[0, -1], [2, 4]], np.int64)}),
    case("gather-runtime-indices", node("Gather", ["a", "i"], axis=0), {"a": rand(6, 3), "i": np.array([5, 0, 2])}),
    case("gather-elements", node("GatherElements", ["a", "i"], axis=1), {"a": rand(3, 4)},
         inits={"i": np.array([[0, 3], [1, 1], [2, 0]], np.int64)}),
    case("tile-expand", [node("Tile", ["a", "r"], ["t"]), node("Expand", ["t", "s"])], {"a": rand(1, 3)},
         inits={"r": np.array([2, 1], np.int64), "s": np.array([3, 2, 3], np.int64)}),
    case("constant-of-shape-range", [node("Shape", ["a"], ["s"]), node("ConstantOfShape", ["s"], ["z"],
                                                                        value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])),
                                     node("Add", ["a", "z"])], {"a": rand(2, 3)}),
    case("range", [node("Range", ["s", "l", "d"], ["r"]), node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                   node("Mul", ["a", "rf"])], {"a": rand(2, 5)},
         inits={"s": np.array(0, np.int64), "l": np.array(5, np.int64), "d": np.array(1, np.int64)}),
    case("pad-constant", node("Pad", ["x", "p", "v"]), {"x": x4},
         inits={"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "v": np.array(0.5, np.float32)}, ops=["pad"]),
    case("pad-reflect-edge", [node("Pad", ["x", "p"], ["r"], mode="reflect"), node("Pad", ["r", "p"], mode="edge")],
         {"x": x4}, inits={"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}),
    case("pad-opset2", node("Pad", ["x"], pads=[0, 1, 1, 0], value=1.0), {"x": rand(3, 4)}, opset=10),
    # reductions
    case("reducemean-13", node("ReduceMean", ["x"], axes=[2, 3]), {"x": x4}, ops=["reduce_mean"]),
    case("reducemean-18", node("ReduceMean", ["x", "ax"], keepdims=0), {"x": x4}, opset=18,
         inits={"ax": np.array([1], np.int64)}),
    case("reducesum-13", node("ReduceSum", ["x", "ax"]), {"x": x4}, opset=13, inits={"ax": np.array([-1], np.int64)},
         ops=["reduce_sum"]),
    case("reducemax-min-l2", [node("ReduceMax", ["x"], ["m"], axes=[1]), node("ReduceMin", ["x"], ["n"], axes=[1]),
                              node("ReduceL2", ["x"], ["l"], axes=[1]), node("Sum", ["m", "n", "l"])], {"x": x4},
         opset=13),
    case("argmax", node("ArgMax", ["a"], axis=1, keepdims=0), {"a": rand(3, 7)}),
    case("cumsum-exclusive-reverse", node("CumSum", ["a", "ax"], exclusive=1, reverse=1), {"a": rand(3, 5)},
         inits={"ax": np.array(1, np.int64)}),
    # recurrent
    case("lstm-bidirectional", node("LSTM", ["x", "w", "r", "b"], ["y", "h", "c"], hidden_size=4,
                                    direction="bidirectional"),
         {"x": rand(5, 2, 3)}, inits={"w": rand(2, 16, 3), "r": rand(2, 16, 4), "b": rand(2, 32)},
         outputs=("y", "h", "c"), ops=["lstm"]),
    case("lstm-lengths-initial", node("LSTM", ["x", "w", "r", "", "len", "h0", "c0"], ["y", "h"], hidden_size=3,
                                      activations=["Sigmoid", "Tanh", "Tanh"]),
         {"x": rand(4, 2, 3), "len": np.array([4, 2], np.int32)},
         inits={"w": rand(1, 12, 3), "r": rand(1, 12, 3), "h0": rand(1, 2, 3), "c0": rand(1, 2, 3)},
         outputs=("y", "h")),
    case("gru", node("GRU", ["x", "w", "r", "b"], ["y", "h"], hidden_size=4, linear_before_reset=1,
                     direction="reverse"),
         {"x": rand(5, 2, 3)}, inits={"w": rand(1, 12, 3), "r": rand(1, 12, 4), "b": rand(1, 24)},
         outputs=("y", "h"), ops=["gru"]),
    case("expand-constant-to-symbolic-batch",
         [node("Shape", ["a"], ["s"], end=1), node("Concat", ["s", "three"], ["t"], axis=0),
          node("Expand", ["row", "t"], ["e"]), node("Cast", ["e"], ["f"], to=TensorProto.FLOAT), node("Add", ["a", "f"])],
         {"a": rand(2, 3)}, inits={"row": np.array([[1, 2, 3]], np.int64), "three": np.array([3], np.int64)},
         dynamic={"a": [None, 3]}),
    # misc
    case("dropout-identity", node("Dropout", ["a"]), {"a": rand(3, 4)}),
    case("constant-node", [node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.FLOAT, [2, 2],
                                                                               [1, 2, 3, 4])),
                           node("MatMul", ["a", "c"])], {"a": rand(3, 2)}),
]


@pytest.mark.parametrize("nodes, inputs, inits, opset, outputs, ops, dynamic", CASES)
def test_op_equals_onnxruntime(nodes, inputs, inits, opset, outputs, ops, dynamic):
    model = make_model(nodes, inputs, outputs, initializers=inits, opset=opset, dynamic=dynamic)
    want = run_onnxruntime(model, inputs)
    prog = pj.convert.from_onnx(model)
    got = prog(*inputs.values())
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == w.shape
        assert relative_error(g, w) <= 1e-4
    types = {op.type for op in prog.walk()}
    assert set(ops) <= types, f"expected {ops} in {sorted(types)}"
