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
