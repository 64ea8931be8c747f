"""convert_layout: conv / pool / norm ops run in one data format, with a transpose where the
program enters and leaves that layout, computing the same function."""
import jax
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import nn


def convert(prog, to="NHWC"):
    out = prog.clone()
    result = pj.passes.get_pass("convert_layout", to=to).apply(out, pj.passes.PassContext())
    out.verify()
    return out, result


class Residual(nn.Layer):
    """conv-BN-ReLU, conv-BN, + shortcut, ReLU, max-pool, global average pool, flatten, linear."""

    def __init__(self, data_format="NCHW"):
        self.conv1 = nn.Conv2D(3, 4, 3, padding=1, data_format=data_format)
        self.bn1 = nn.BatchNorm2D(4, data_format=data_format)
        self.conv2 = nn.Conv2D(4, 4, 3, padding=1, data_format=data_format)
        self.bn2 = nn.BatchNorm2D(4, data_format=data_format)
        self.short = nn.Conv2D(3, 4, 1, data_format=data_format)
        self.pool = nn.MaxPool2D(2, data_format=data_format)
        self.gap = nn.AdaptiveAvgPool2D(1, data_format=data_format)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = pj.ops.relu(self.bn1(self.conv1(x)))
        y = pj.ops.relu(self.bn2(self.conv2(y)) + self.short(x))
        return self.fc(pj.ops.reshape(self.gap(self.pool(y)), shape=(0, -1)))


@pytest.fixture(scope="module")
def residual():
    nn.seed(0)
    model = Residual()
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 3, 8, 8)))


def layouts(prog):
    return [(op.type, op.attrs["data_format"]) for op in prog.walk() if "data_format" in op.attrs]


def test_every_layout_op_moves_and_only_the_boundary_transposes_remain(residual):
    out, result = convert(residual)
    assert result.changed and result.stats == {"converted": 7, "transposes": 2}
    assert {fmt for _, fmt in layouts(out)} == {"NHWC"} and len(layouts(out)) == 7
    transposes = [op for op in out.walk() if op.type == "transpose"]
    assert [t.attrs["perm"] for t in transposes] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    assert transposes[0].operands[0] is out.inputs[0]  # into NHWC at the input
    assert str(transposes[1].result.type) == "f32[b,4,1,1]"  # back after the global pool, before the flatten


def test_converted_program_computes_the_same_function(residual):
    out, _ = convert(residual)
    for seed in range(2):
        x = jax.random.normal(jax.random.PRNGKey(seed), (3, 3, 8, 8))
        np.testing.assert_allclose(out(x), residual(x), rtol=1e-6, atol=1e-6)


def test_converting_back_restores_the_original_layout(residual):
    nhwc, _ = convert(residual)
    back, result = convert(nhwc, to="NCHW")
    assert result.stats["transposes"] == 0 and {fmt for _, fmt in layouts(back)} == {"NCHW"}
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 8, 8))
    np.testing.assert_allclose(back(x), residual(x), rtol=1e-6, atol=1e-6)


def test_a_program_already_in_the_layout_is_unchanged(residual):
    out, result = convert(residual, to="NCHW")
    assert not result.changed and str(out) == str(residual)
    plain = pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((None, 4)))
    out, result = convert(plain)
    assert not result.changed and str(out) == str(plain)


def test_printed_program_after_conversion():
    nn.seed(0)
    model = nn.Sequential(nn.Conv2D(2, 4, 3, bias_attr=False), nn.ReLU())
    prog = pj.to_static(model, pj.InputSpec((None, 2, 5, 5)))
    out, _ = convert(prog)
    assert str(out) == """\
program @Sequential(%x: f32[b,2,5,5]) -> (f32[b,4,3,3]) {
  %0 = param @0.weight : f32[4,2,3,3]
  %1 = transpose(%x) {perm=(0, 2, 3, 1)} : f32[b,5,5,2]
  %2 = conv2d(%1, %0) {stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, data_format="NHWC"} : f32[b,3,3,4]
  %3 = relu(%2) : f32[b,3,3,4]
  %4 = transpose(%3) {perm=(0, 3, 1, 2)} : f32[b,4,3,3]
  return %4
}"""


def test_unknown_layout_is_named(residual):
    with pytest.raises(ValueError, match="convert_layout: 'to' must be one of \\['NCHW', 'NHWC'\\], got 'CHWN'"):
        convert(residual, to="CHWN")


def _layout_ops():
    """One small NCHW use of every layout-sensitive registry op over images."""
    r = np.random.default_rng(0)
    f = lambda *s: jax.numpy.asarray(r.uniform(0.5, 1.5, s), "float32")  # noqa: E731
    ops = pj.ops
    w8 = jax.numpy.asarray(r.integers(-8, 8, (4, 3, 3, 3)), "int8")
    return {
        "conv2d": lambda x: ops.conv2d(x, f(4, 3, 3, 3), padding=1, stride=2),
        "conv2d_pool": lambda x: ops.conv2d_pool(x, f(4, 3, 3, 3), padding=1, act="relu", pool_size=2),
        "depthwise_conv2d": lambda x: ops.depthwise_conv2d(x, f(6, 1, 3, 3)),
        "conv2d_transpose": lambda x: ops.conv2d_transpose(x, f(3, 2, 3, 3), stride=2),
        "pool2d": lambda x: ops.pool2d(x, kernel_size=2, stride=2, pooling_type="avg"),
        "adaptive_pool2d": lambda x: ops.adaptive_pool2d(x, output_size=(2, 3)),
        "batch_norm": lambda x: ops.batch_norm(x, f(3), f(3), f(3), f(3))[0],
        "sync_batch_norm": lambda x: ops.sync_batch_norm(x, f(3), f(3))[0],
        "group_norm": lambda x: ops.group_norm(x, f(3), f(3), groups=3),
        "interpolate": lambda x: ops.interpolate(x, scale_factor=(2.0, 2.0), mode="bilinear"),
        "prelu": lambda x: ops.prelu(x - 1.0, f(3)),
        "quantized_conv2d": lambda x: ops.quantized_conv2d(ops.quantize(x, f(), bits=8), w8, f(), f(4), padding=1),
        "weight_only_conv2d": lambda x: ops.weight_only_conv2d(x, w8, f(4), bits=8),
        "temporal_shift": lambda x: ops.temporal_shift(x, seg_num=2, shift_ratio=0.34),  # a channel each way
    }


@pytest.mark.parametrize("name", sorted(_layout_ops()))
def test_every_layout_sensitive_op_converts_exactly(name):
    assert pj.ops.get(name).traits.layout_sensitive
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 6, 8)).astype(np.float32)
    prog = pj.trace(_layout_ops()[name], x)
    nhwc, _ = convert(prog)
    assert [op.attrs["data_format"] for op in nhwc.walk() if op.type == name] == ["NHWC"]
    np.testing.assert_allclose(nhwc(x), prog(x), rtol=1e-5, atol=1e-6)


def test_the_cases_cover_every_layout_sensitive_op_over_images():
    sensitive = {name for name, op in pj.ops.all_ops().items() if op.traits.layout_sensitive
                 and set(op.attrs["data_format"].choices or ()) >= {"NCHW", "NHWC"}}
    assert sensitive == set(_layout_ops())


def test_an_int8_program_keeps_one_transpose_in_and_one_out(residual):
    # per-tensor (de)quantizers are pointwise: the transposes around each converted int8
    # convolution move through them and cancel, as they do through a float program's adds
    rng = np.random.default_rng(0)
    calibration = [rng.normal(size=(2, 3, 8, 8)).astype(np.float32) for _ in range(2)]
    int8 = pj.passes.run(pj.slim.quant_post(residual, calibration, progress=False), "int8_dataflow")
    assert [op.type for op in int8.walk()].count("quantized_conv2d") == 3
    out, result = convert(int8)
    assert result.stats["transposes"] == 2
    np.testing.assert_array_equal(out(calibration[0]), int8(calibration[0]))
