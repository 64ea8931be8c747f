"""int8_dataflow: a quantized convolution requantizes into the next quantized op's int8 input
through transposes, reshapes and max-pooling; anything else keeps the float round trip."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.inference import Config, Predictor
from paddlejax.ops import onednn

rng = np.random.default_rng(0)


def calib(shape, n=3):
    return [rng.normal(size=shape).astype(np.float32) for _ in range(n)]


def quantized(model, shape):
    model.eval()
    prog = pj.to_static(model, pj.InputSpec((None, *shape[1:])))
    return prog, pj.slim.quant_post(prog, calib(shape), progress=False)


def kinds(program):
    return [(op.type, op.result.type.dtype) for op in program.walk() if op.type not in ("param", "return")]


def levels_apart(a, b, scale_of_output):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / scale_of_output * 127


def test_the_ir_before_and_after():
    model = pj.nn.Sequential(pj.nn.Conv2D(3, 8, 3, padding=1), pj.nn.ReLU(), pj.nn.MaxPool2D(2), pj.nn.Flatten(),
                             pj.nn.Linear(8 * 4 * 4, 5))
    _, int8 = quantized(model, (4, 3, 8, 8))
    fused = pj.passes.run(int8, "fuse_bias_act")
    assert kinds(fused) == [("quantize", "int8"), ("quantized_conv2d", "float32"), ("pool2d", "float32"),
                            ("reshape", "float32"), ("quantize", "int8"), ("quantized_linear", "float32")]
    manager = pj.passes.PassManager("int8_dataflow")
    flowed = manager.run(fused)
    assert kinds(flowed) == [("quantize", "int8"), ("quantized_conv2d", "int8"), ("pool2d", "int8"),
                             ("reshape", "int8"), ("quantized_linear", "float32")]
    conv = next(op for op in flowed.walk() if op.type == "quantized_conv2d")
    linear = next(op for op in flowed.walk() if op.type == "quantized_linear")
    assert conv.input("out_scale") is linear.input("x_scale")  # the requantize uses the linear's scale
    assert manager.records[-1].stats == {"requantized": 1}
    again = pj.passes.run(flowed, "int8_dataflow")
    assert str(again) == str(flowed)  # a fixpoint
    x = calib((6, 3, 8, 8), 1)[0]
    np.testing.assert_allclose(flowed(x), fused(x), rtol=1e-5, atol=1e-5)


def test_a_convolution_without_bias_gets_a_zero_bias_before_its_out_scale():
    model = pj.nn.Sequential(pj.nn.Conv2D(3, 8, 3, padding=1, bias_attr=False), pj.nn.ReLU(),
                             pj.nn.Conv2D(8, 4, 3, bias_attr=False))
    _, int8 = quantized(model, (4, 3, 8, 8))
    flowed = pj.passes.run(int8, "fuse_bias_act,int8_dataflow,dce")
    conv = next(op for op in flowed.walk() if op.type == "quantized_conv2d")
    bias = conv.input("bias").producer.attrs["name"]
    assert bias.endswith(".zero_bias") and not np.asarray(flowed.params[bias]).any()
    x = calib((2, 3, 8, 8), 1)[0]
    np.testing.assert_allclose(flowed(x), int8(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("between", ["avg_pool", "residual", "second_reader"])
def test_what_does_not_commute_with_quantize_stays_float(between):
    conv = lambda cin, cout: pj.nn.Conv2D(cin, cout, 3, padding=1)  # noqa: E731

    class Net(pj.nn.Layer):
        def __init__(self):
            self.a, self.b, self.c = conv(3, 8), conv(8, 8), conv(8, 4)

        def __call__(self, x):
            h = pj.ops.relu(self.a(x))
            if between == "avg_pool":
                return self.c(pj.ops.pool2d(h, pooling_type="avg", kernel_size=(2, 2)))
            if between == "residual":
                return self.c(h + self.b(h))
            return self.c(h) + pj.ops.reduce_mean(h)  # h has a float reader besides the next conv

    _, int8 = quantized(Net(), (4, 3, 8, 8))
    # residual adds stay float when asked (by default they fuse: below)
    flowed = pj.passes.run(int8, "fuse_bias_act,int8_dataflow{residual=false}")
    first = next(op for op in flowed.walk() if op.type == "quantized_conv2d")
    assert first.result.type.dtype == "float32" and first.input("out_scale") is None


def test_a_per_channel_quantize_is_left_alone():
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)

    def net(p, x):
        y = pj.ops.quantized_conv2d(pj.ops.quantize(x, p["s"]), p["w"], p["s"], p["ws"], padding=1)
        return pj.ops.quantize(y, p["cs"], axis=1)

    params = {"s": np.float32(3.0), "w": np.clip(np.round(w * 40), -127, 127).astype(np.int8),
              "ws": np.ones(4, np.float32), "cs": np.full(4, 20.0, np.float32)}
    prog = pj.trace(net, pj.InputSpec((None, 3, 6, 6)), params=params)
    assert str(pj.passes.run(prog, "int8_dataflow")) == str(prog)


def test_a_cnn_served_int8_end_to_end():
    """SmallCNN's shape: three conv -> bn -> relu -> max-pool blocks, then a linear. The Predictor
    of its int8 program passes int8 from the first quantize to the linear."""
    layers, cin = [], 3
    for cout in (8, 16, 32):
        layers += [pj.nn.Conv2D(cin, cout, 3, padding=1, bias_attr=False), pj.nn.BatchNorm2D(cout), pj.nn.ReLU(),
                   pj.nn.MaxPool2D(2)]
        cin = cout
    pj.nn.seed(0)
    model = pj.nn.Sequential(*layers, pj.nn.Flatten(), pj.nn.Linear(32 * 2 * 2, 10))
    fp32, int8 = quantized(model, (8, 3, 16, 16))
    predictor = Predictor(int8, Config(max_batch_size=8, batch_buckets=(8,), progress=False))
    ops = kinds(predictor.program)
    assert ops.count(("quantize", "int8")) == 1 and ops.count(("quantized_conv2d", "int8")) == 3
    assert ("batch_norm", "float32") not in ops and ops[-1] == ("quantized_linear", "float32")
    x = calib((8, 3, 16, 16), 1)[0]
    want = np.asarray(int8(x))
    np.testing.assert_allclose(predictor(x), want, rtol=0, atol=0.02 * np.abs(want).max())
    drift = np.abs(predictor(x) - fp32(x)).max() / np.abs(fp32(x)).max()
    assert drift < 0.1


class Residual(pj.nn.Layer):
    """A stem and two ResNet basic blocks: one with an identity shortcut, one with a projection
    (strided 1x1 convolution) shortcut."""

    def __init__(self):
        conv = lambda cin, cout, k=3, stride=1: pj.nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2)  # noqa
        self.stem, self.a1, self.a2 = conv(3, 8), conv(8, 8), conv(8, 8)
        self.b1, self.b2, self.project = conv(8, 16, stride=2), conv(16, 16), conv(8, 16, 1, stride=2)
        self.head = conv(16, 4)

    def __call__(self, x):
        h = pj.ops.relu(self.stem(x))
        h = pj.ops.relu(self.a2(pj.ops.relu(self.a1(h))) + h)
        h = pj.ops.relu(self.b2(pj.ops.relu(self.b1(h))) + self.project(h))
        return self.head(h)


def values_of(program, pick, x):
    """The values ``pick(program)`` chooses in the program, on ``x``."""
    probe = program.clone()
    probe.set_outputs(pick(probe))
    return [np.asarray(v, np.float64) for v in probe(x)]


def grid(v, scale):
    """``v`` rounded and clipped to the int8 grid of ``scale`` (in levels)."""
    return np.clip(np.round(v * 127 / scale), -127, 127)


def test_residual_adds_fuse_into_the_convolution_before_them():
    """The identity shortcut is the stem's int8 output; the projection shortcut's output was
    calibrated by quant_post (its fake quantize), so its convolution returns int8 too."""
    pj.nn.seed(0)
    _, int8 = quantized(Residual(), (4, 3, 8, 8))
    fused = pj.passes.run(pj.passes.run(int8, "canonicalize,fuse_bias_act,fuse_elementwise_act"), "dce")
    manager = pj.passes.PassManager("int8_dataflow,dce")
    flowed = manager.run(fused)
    assert manager.records[0].stats == {"requantized": 4, "residual_fused": 2, "nonnegative_inputs": 6}
    assert kinds(flowed) == [("quantize", "int8"), ("quantized_conv2d", "int8"), ("quantized_conv2d", "int8"),
                             ("quantized_conv2d", "int8"),   # a2, with the identity shortcut
                             ("quantized_conv2d", "int8"),   # b1
                             ("quantized_conv2d", "int8"),   # the projection, requantized
                             ("quantized_conv2d", "int8"),   # b2, with the projection's int8 output
                             ("quantized_conv2d", "float32")]
    stem, a1, a2, b1, project, b2, _ = [op for op in flowed.walk() if op.type == "quantized_conv2d"]
    assert a2.input("residual") is stem.result and a2.input("residual_scale") is stem.input("out_scale")
    assert b2.input("residual") is project.result and b2.input("residual_scale") is project.input("out_scale")
    assert a2.attrs["act"] == b2.attrs["act"] == "relu" and project.attrs.get("act") is None
    # the block's int8 output is the sum with the shortcut rounded and clipped to its int8 grid
    # (as the next convolution's input already was), one level apart at most
    x = calib((6, 3, 8, 8), 1)[0]
    (got,) = values_of(flowed, lambda p: [[op for op in p.walk() if op.type == "quantized_conv2d"][2].result], x)
    add = next(op for op in fused.walk() if op.type == "elementwise_add")
    conv_out, shortcut = values_of(fused, lambda p: next(op.operands for op in p.walk()
                                                         if op.type == "elementwise_add"), x)
    s_shortcut, s_out = (float(fused.params[op.operands[1].producer.attrs["name"]]) for op in
                         (next(u for u in add.operands[1].users if u.type == "quantize"), add.result.users[0]))
    want = grid(np.maximum(conv_out + grid(shortcut, s_shortcut) * s_shortcut / 127, 0), s_out)
    assert np.abs(got - want).max() <= 1 and (got != want).mean() < 0.01
    unfused = values_of(fused, lambda p: [next(op.result for op in p.walk() if op.type == "quantize"
                                               and op.operands[0].producer is not None
                                               and op.operands[0].producer.type == "elementwise_add")], x)[0]
    assert (got != unfused).mean() < 0.2  # rounding the shortcut moves few of the sum's levels
    np.testing.assert_allclose(flowed(x), fused(x), atol=0.05 * np.abs(fused(x)).max())
    assert str(pj.passes.run(flowed, "int8_dataflow")) == str(flowed)  # a fixpoint


def test_a_projection_shortcut_left_uncalibrated_stays_a_float_add():
    pj.nn.seed(0)
    model = Residual()
    model.eval()
    prog = pj.passes.run(pj.to_static(model, pj.InputSpec((None, 3, 8, 8))), "fold_conv_bn,dce")
    fake = pj.passes.run(prog, "insert_fake_quant{shortcuts=false}")
    pj.slim.quant.calibrate(fake, calib((4, 3, 8, 8)), progress=False)
    flowed = pj.passes.run(pj.slim.quant.convert(fake),
                           "canonicalize,fuse_bias_act,fuse_elementwise_act,int8_dataflow,dce")
    fused = [op for op in flowed.walk() if op.type == "quantized_conv2d" and op.input("residual") is not None]
    assert len(fused) == 1 and [op.type for op in flowed.walk()].count("elementwise_add") == 1
    with_shortcuts = pj.passes.run(prog, "insert_fake_quant")
    assert [p for p in with_shortcuts.params if p.endswith("output_scale")] == ["project.weight.output_scale"]


def test_the_other_readers_of_a_fused_sum_read_its_int8_value():
    class Twice(pj.nn.Layer):  # the second block's shortcut is the first block's sum
        def __init__(self):
            conv = lambda: pj.nn.Conv2D(8, 8, 3, padding=1)  # noqa: E731
            self.stem, self.a, self.b, self.head = pj.nn.Conv2D(3, 8, 3, padding=1), conv(), conv(), conv()

        def __call__(self, x):
            h = pj.ops.relu(self.stem(x))
            h = pj.ops.relu(self.a(h) + h)
            h = pj.ops.relu(self.b(h) + h)
            return self.head(h) + pj.ops.reduce_mean(h)  # a float reader of the last sum too

    pj.nn.seed(1)
    _, int8 = quantized(Twice(), (4, 3, 8, 8))
    flowed = pj.passes.run(int8, "canonicalize,fuse_bias_act,fuse_elementwise_act,int8_dataflow,dce")
    convs = [op for op in flowed.walk() if op.type == "quantized_conv2d"]
    a, b = convs[1], convs[2]
    assert b.input("residual") is a.result  # the chain stays int8
    means = [op for op in flowed.walk() if op.canonical[0] == "reduce_mean"]
    assert means[0].operands[0].producer.type == "dequantize"
    assert means[0].operands[0].producer.operands[0] is b.result
    x = calib((3, 3, 8, 8), 1)[0]
    np.testing.assert_allclose(flowed(x), int8(x), atol=0.05 * np.abs(int8(x)).max())


def test_a_fused_residual_survives_layout_conversion_and_serves_through_the_predictor():
    pj.nn.seed(2)
    _, int8 = quantized(Residual(), (4, 3, 8, 8))
    flowed = pj.passes.run(int8, "canonicalize,fuse_bias_act,fuse_elementwise_act,int8_dataflow,dce")
    nhwc = pj.passes.run(flowed, "convert_layout{to=NHWC},dce")
    fused = next(op for op in nhwc.walk() if op.type == "quantized_conv2d" and op.input("residual") is not None)
    assert fused.input("residual").type.shape == fused.result.type.shape  # transposed with its input
    x = calib((2, 3, 8, 8), 1)[0]
    np.testing.assert_array_equal(nhwc(x), flowed(x))
    predictor = Predictor(int8, Config(max_batch_size=2, batch_buckets=(2,), progress=False))
    assert any(op.input("residual") is not None for op in predictor.program.walk() if op.type == "quantized_conv2d")
    np.testing.assert_allclose(predictor(x), flowed(x), atol=0.02 * np.abs(flowed(x)).max())


def test_convolutions_reading_what_a_relu_left_are_marked_nonnegative():
    """After a relu (fused into the convolution before, or through max-pooling) the int8 input
    has no negative value, and oneDNN may read it as uint8; the first convolution's input, and
    one after a convolution without an activation, may be negative."""
    model = pj.nn.Sequential(pj.nn.Conv2D(3, 8, 3, padding=1), pj.nn.ReLU(), pj.nn.MaxPool2D(2),
                             pj.nn.Conv2D(8, 8, 3, padding=1), pj.nn.Conv2D(8, 4, 3, padding=1))
    _, int8 = quantized(model, (4, 3, 8, 8))
    manager = pj.passes.PassManager("fuse_bias_act,int8_dataflow")
    flowed = manager.run(int8)
    marks = [op.attrs.get("x_nonnegative", False) for op in flowed.walk() if op.type == "quantized_conv2d"]
    assert marks == [False, True, False] and manager.records[-1].stats["nonnegative_inputs"] == 1
    assert "x_nonnegative=True" in str(flowed) and str(pj.parse(str(flowed))) == str(flowed)
    x = calib((2, 3, 8, 8), 1)[0]
    np.testing.assert_allclose(flowed(x), int8(x), rtol=1e-5, atol=1e-5)  # a kernel hint: the same values


@pytest.mark.skipif(not onednn.available(), reason="oneDNN kernels")
def test_onednn_reads_a_nonnegative_input_as_unsigned_with_the_same_result():
    from paddlejax.ops.quant import quantized_conv2d

    x_q = np.abs(rng.integers(-127, 128, (2, 6, 6, 8))).astype(np.int8)  # 0..127: the same bytes as uint8
    w_q = rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
    scales = (np.float32(3.0), rng.uniform(0.5, 2, 16).astype(np.float32), rng.normal(size=16).astype(np.float32))
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NHWC", act="relu")
    want = quantized_conv2d.kernel(x_q, w_q, *scales, **kw)
    for out_scale in ((), (np.float32(np.asarray(want).max()),)):
        ref = quantized_conv2d.kernel(x_q, w_q, *scales, *out_scale, **kw)
        got = quantized_conv2d.variants["onednn"](x_q, w_q, *scales, *out_scale, x_nonnegative=True, **kw)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), rtol=1e-5, atol=1e-3)
