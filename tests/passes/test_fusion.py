"""Fusion passes: the printed IR before and after, the same numbers on fresh inputs, and programs
the passes must leave alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import nn
from paddlejax.models.digits import DigitsCNN


def apply(prog, name):
    """The pass ``name`` applied to a copy of ``prog``: (program, PassResult)."""
    out = prog.clone()
    result = pj.passes.get_pass(name).apply(out, pj.passes.PassContext())
    out.verify()
    return out, result


def assert_same_function(before, after, shape, rtol=1e-6, atol=1e-6):
    for seed in range(2):
        x = jax.random.normal(jax.random.PRNGKey(seed), shape)
        np.testing.assert_allclose(after(x), before(x), rtol=rtol, atol=atol)


def assert_unchanged(prog, name):
    out, result = apply(prog, name)
    assert not result.changed
    assert str(out) == str(prog)


def randomise_batch_norms(prog):
    """Non-trivial statistics and affine parameters for every batch norm of ``prog``."""
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 64))
    for op in prog.walk():
        if op.type == "batch_norm":
            for i, v in enumerate(op.operands[1:], start=1):
                name = v.producer.attrs["name"]
                key = next(keys)
                sample = jax.random.uniform(key, v.type.shape, minval=0.5, maxval=2.0) if i == 2 else \
                    jax.random.normal(key, v.type.shape)
                prog.params[name] = sample
    return prog


def eval_program(*layers, shape):
    nn.seed(0)
    model = nn.Sequential(*layers)
    model.eval()
    return randomise_batch_norms(pj.to_static(model, pj.InputSpec(shape)))


# ------------------------------------------------------------------------------------------
# fold_conv_bn / fold_linear_bn

def test_fold_conv_bn_gives_one_conv_with_folded_parameters():
    prog = eval_program(nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4), shape=(None, 3, 8, 8))
    assert str(prog) == """\
program @Sequential(%x: f32[b,3,8,8]) -> (f32[b,4,8,8]) {
  %0 = param @0.bias : f32[4]
  %1 = param @0.weight : f32[4,3,3,3]
  %2 = param @1.bias : f32[4]
  %3 = param @1.mean : f32[4]
  %4 = param @1.variance : f32[4]
  %5 = param @1.weight : f32[4]
  %6 = conv2d(%x, %1, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,8,8]
  %7, %8, %9 = batch_norm(%6, %3, %4, %5, %2) {epsilon=1e-05, momentum=0.9, training=False, data_format="NCHW"} : f32[b,4,8,8], f32[4], f32[4]
  return %7
}"""
    out = pj.passes.run(prog, "fold_conv_bn,dce")
    assert str(out) == """\
program @Sequential(%x: f32[b,3,8,8]) -> (f32[b,4,8,8]) {
  %0 = param @0.weight.folded : f32[4,3,3,3]
  %1 = param @0.bias.folded : f32[4]
  %2 = conv2d(%x, %0, %1) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,4,8,8]
  return %2
}"""
    assert sorted(out.used_params()) == ["0.bias.folded", "0.weight.folded"]
    assert_same_function(prog, out, (2, 3, 8, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_conv_bn_layouts_and_bias(data_format, bias):
    shape = (None, 3, 6, 6) if data_format == "NCHW" else (None, 6, 6, 3)
    prog = eval_program(nn.Conv2D(3, 4, 3, stride=2, data_format=data_format, bias_attr=None if bias else False),
                        nn.BatchNorm2D(4, epsilon=1e-3, data_format=data_format), shape=shape)
    out = pj.passes.run(prog, "fold_conv_bn,dce")
    assert [op.type for op in out.walk()] == ["param", "param", "conv2d", "return"]
    bias_name = "0.bias.folded" if bias else "0.weight.folded_bias"
    assert sorted(out.used_params()) == sorted([bias_name, "0.weight.folded"])
    assert_same_function(prog, out, (2, *shape[1:]), rtol=1e-5, atol=1e-5)


def test_fold_conv_bn_folds_depthwise_convs_of_traced_functions():
    def f(p, x):
        y = pj.ops.depthwise_conv2d(x, p["w"], padding=1)
        return pj.ops.batch_norm(y, p["mean"], p["var"], p["gamma"], p["beta"])[0]

    key = jax.random.split(jax.random.PRNGKey(0), 5)
    params = {"w": jax.random.normal(key[0], (4, 1, 3, 3)), "mean": jax.random.normal(key[1], (4,)),
              "var": jax.random.uniform(key[2], (4,), minval=0.5), "gamma": jax.random.normal(key[3], (4,)),
              "beta": jax.random.normal(key[4], (4,))}
    prog = pj.trace(f, jnp.ones((2, 4, 5, 5)), params=params)
    out = pj.passes.run(prog, "fold_conv_bn,dce")
    assert [op.type for op in out.walk()] == ["param", "param", "depthwise_conv2d", "return"]
    assert_same_function(prog, out, (2, 4, 5, 5), rtol=1e-5, atol=1e-5)


def test_fold_conv_bn_leaves_a_conv_output_that_is_also_read_elsewhere():
    def f(p, x):
        y = pj.ops.conv2d(x, p["w"])
        return pj.ops.batch_norm(y, p["mean"], p["var"])[0] + y

    prog = pj.trace(f, jnp.ones((1, 2, 4, 4)), params={"w": jnp.ones((2, 2, 1, 1)), "mean": jnp.zeros(2),
                                                         "var": jnp.ones(2)})
    assert_unchanged(prog, "fold_conv_bn")


def test_fold_conv_bn_leaves_training_mode_batch_norm():
    def f(p, x):
        return pj.ops.batch_norm(pj.ops.conv2d(x, p["w"]), p["mean"], p["var"], training=True)

    prog = pj.trace(f, jnp.ones((1, 2, 4, 4)), params={"w": jnp.ones((2, 2, 1, 1)), "mean": jnp.zeros(2),
                                                         "var": jnp.ones(2)})
    assert_unchanged(prog, "fold_conv_bn")


def test_fold_linear_bn():
    prog = eval_program(nn.Linear(5, 4), nn.BatchNorm1D(4), shape=(None, 5))
    out = pj.passes.run(prog, "fold_linear_bn,dce")
    assert str(out) == """\
program @Sequential(%x: f32[b,5]) -> (f32[b,4]) {
  %0 = param @0.weight.folded : f32[5,4]
  %1 = param @0.bias.folded : f32[4]
  %2 = linear(%x, %0, %1) : f32[b,4]
  return %2
}"""
    assert_same_function(prog, out, (3, 5), rtol=1e-5, atol=1e-5)
    assert_unchanged(prog, "fold_conv_bn")  # each pass folds into its own kind of op


AFFINE_PARAMS = {"w": jax.random.normal(jax.random.PRNGKey(2), (4, 3, 3, 3)),
                 "w1": jax.random.normal(jax.random.PRNGKey(3), (5, 4, 1, 1)),
                 "b1": jax.random.normal(jax.random.PRNGKey(4), (5,)),
                 "a": jax.random.uniform(jax.random.PRNGKey(5), (1, 4, 1, 1), minval=0.5, maxval=2.0),
                 "c": jax.random.normal(jax.random.PRNGKey(6), (1, 4, 1, 1)),
                 "s": jnp.full((1, 1, 1, 1), 1.5)}


def lcnet_block(p, x):
    """PP-LCNet's pattern: conv, scalar scale, hard-swish, per-channel affine, 1x1 conv."""
    y = pj.ops.hard_swish(pj.ops.elementwise_mul(p["s"], pj.ops.conv2d(x, p["w"], padding=((1, 1), (1, 1)))))
    y = pj.ops.elementwise_add(pj.ops.elementwise_mul(y, p["a"]), p["c"])
    return pj.ops.conv2d(y, p["w1"], p["b1"])


def test_fold_conv_bn_folds_scales_after_and_affines_before_convolutions():
    prog = pj.trace(lcnet_block, jnp.ones((2, 3, 6, 6)), params=AFFINE_PARAMS)
    out, result = apply(prog, "fold_conv_bn")
    assert result.stats == {"scales": 1, "input affines": 1}
    out = pj.passes.run(out, "fuse_bias_act,dce")
    assert [(op.type, op.attrs.get("act")) for op in out.walk() if op.type not in ("param", "return")] == [
        ("conv2d", "hard_swish"), ("conv2d", None)]
    assert {"w.scaled", "w1.affine", "w1.affine_bias"} <= set(out.params)
    assert_same_function(prog, out, (2, 3, 6, 6), rtol=1e-5, atol=1e-5)


def test_an_input_affine_stays_before_a_padded_or_grouped_convolution():
    def padded(p, x):
        return pj.ops.conv2d(pj.ops.elementwise_add(x, p["c"]), p["w"], padding=((1, 1), (1, 1)))

    def grouped(p, x):
        return pj.ops.conv2d(pj.ops.elementwise_mul(x, p["a"]), p["g"], groups=4)

    params = {"c": jnp.ones((1, 3, 1, 1)), "w": jnp.ones((4, 3, 3, 3)), "a": jnp.ones((1, 4, 1, 1)),
              "g": jnp.ones((4, 1, 1, 1))}
    assert_unchanged(pj.trace(padded, jnp.ones((1, 3, 5, 5)), params=params), "fold_conv_bn")
    assert_unchanged(pj.trace(grouped, jnp.ones((1, 4, 5, 5)), params=params), "fold_conv_bn")


def test_fold_linear_bn_folds_an_input_affine_into_a_linear():
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (3, 4)), "b": jax.random.normal(jax.random.PRNGKey(1), (4,)),
              "a": jnp.array([0.5, 2.0, -1.0]), "c": jnp.array([1.0, 0.0, 3.0])}
    prog = pj.trace(lambda p, x: pj.ops.linear(x * p["a"] + p["c"], p["w"], p["b"]), jnp.ones((2, 3)), params=params)
    out = pj.passes.run(prog, "canonicalize,fold_linear_bn,dce")
    assert [op.type for op in out.walk() if op.type not in ("param", "return")] == ["linear"]
    assert_same_function(prog, out, (2, 3), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------
# fuse_bias_act / fuse_elementwise_act

def conv_add_relu(p, x):
    y = pj.ops.elementwise_add(pj.ops.conv2d(x, p["w"]), pj.ops.reshape(p["b"], shape=(1, -1, 1, 1)))
    return pj.ops.relu(y)


CONV_PARAMS = {"w": jax.random.normal(jax.random.PRNGKey(0), (4, 3, 1, 1)),
               "b": jax.random.normal(jax.random.PRNGKey(1), (4,))}


def test_fuse_bias_act_moves_the_bias_and_activation_into_the_conv():
    prog = pj.trace(conv_add_relu, jnp.ones((2, 3, 4, 4)), params=CONV_PARAMS)
    assert str(prog) == """\
program @conv_add_relu(%x: f32[2,3,4,4]) -> (f32[2,4,4,4]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[4,3,1,1]
  %2 = conv2d(%x, %1) {stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, data_format="NCHW"} : f32[2,4,4,4]
  %3 = reshape(%0) {shape=(1, -1, 1, 1)} : f32[1,4,1,1]
  %4 = elementwise_add(%2, %3) : f32[2,4,4,4]
  %5 = relu(%4) : f32[2,4,4,4]
  return %5
}"""
    out = pj.passes.run(prog, "fuse_bias_act,dce")
    assert str(out) == """\
program @conv_add_relu(%x: f32[2,3,4,4]) -> (f32[2,4,4,4]) {
  %0 = param @b : f32[4]
  %1 = param @w : f32[4,3,1,1]
  %2 = conv2d(%x, %1, %0) {stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, data_format="NCHW", act="relu"} : f32[2,4,4,4]
  return %2
}"""
    assert_same_function(prog, out, (2, 3, 4, 4))


ACTIVATIONS = {"relu": (pj.ops.relu, {}), "relu6": (pj.ops.relu6, {}), "gelu": (pj.ops.gelu, {}),
               "gelu_tanh": (pj.ops.gelu, {"approximate": True}), "silu": (pj.ops.silu, {}),
               "sigmoid": (pj.ops.sigmoid, {}), "tanh": (pj.ops.tanh, {}),
               "leaky_relu": (pj.ops.leaky_relu, {"negative_slope": 0.2}), "hard_swish": (pj.ops.hard_swish, {})}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_fuse_bias_act_on_linear_with_each_activation(act):
    fn, attrs = ACTIVATIONS[act]
    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (3, 4)), "b": jnp.linspace(-1.0, 1.0, 4)}
    prog = pj.trace(lambda p, x: fn(pj.ops.linear(x, p["w"]) + p["b"], **attrs), jnp.ones((2, 3)), params=params)
    out = pj.passes.run(prog, "fuse_bias_act,dce")
    (linear,) = [op for op in out.walk() if op.type not in ("param", "return")]
    assert linear.type == "linear" and len(linear.operands) == 3
    assert (linear.attrs["act"], linear.attrs["act_alpha"]) == (act, 0.2 if act == "leaky_relu" else None)
    assert_same_function(prog, out, (2, 3))


def test_fuse_bias_act_keeps_an_existing_bias_and_fuses_the_activation():
    prog = eval_program(nn.Conv2D(3, 4, 1), nn.ReLU(), shape=(None, 3, 4, 4))
    out = pj.passes.run(prog, "fuse_bias_act")
    assert [(op.type, op.attrs.get("act")) for op in out.walk()] == [
        ("param", None), ("param", None), ("conv2d", "relu"), ("return", None)]
    assert_same_function(prog, out, (2, 3, 4, 4))


def test_fuse_bias_act_takes_a_stored_number_and_adds_a_stored_shift_to_an_existing_bias():
    params = {**CONV_PARAMS, "one": jnp.full((1, 1, 1, 1), 0.25), "shift": jnp.arange(4.0).reshape(1, 4, 1, 1)}

    def scalar_bias(p, x):
        return pj.ops.relu(pj.ops.elementwise_add(pj.ops.conv2d(x, p["w"]), p["one"]))

    def shifted_bias(p, x):
        return pj.ops.elementwise_add(pj.ops.conv2d(x, p["w"], p["b"]), p["shift"])

    for fn, name in ((scalar_bias, "w.bias"), (shifted_bias, "b.shifted")):
        prog = pj.trace(fn, jnp.ones((2, 3, 4, 4)), params=params)
        out = pj.passes.run(prog, "fuse_bias_act,dce")
        assert [op.type for op in out.walk() if op.type not in ("param", "return")] == ["conv2d"]
        assert name in out.params
        assert_same_function(prog, out, (2, 3, 4, 4))


def test_fuse_bias_act_leaves_shared_values_and_non_channel_biases():
    def shared(p, x):
        y = pj.ops.conv2d(x, p["w"])
        return pj.ops.relu(y) + y

    def along_width(p, x):  # a [4] vector broadcasts along the width of NCHW, not the channels
        return pj.ops.conv2d(x, p["w"]) + p["b"]

    for fn in (shared, along_width):
        assert_unchanged(pj.trace(fn, jnp.ones((2, 3, 4, 4)), params=CONV_PARAMS), "fuse_bias_act")


def test_fuse_elementwise_act():
    prog = pj.trace(lambda x, y: pj.ops.leaky_relu(pj.ops.elementwise_sub(x, y), negative_slope=0.2),
                    jnp.ones((2, 3)), jnp.ones((3,)))
    out, result = apply(prog, "fuse_elementwise_act")
    assert result.stats == {"activations": 1}
    assert str(out) == """\
program @<lambda>(%x: f32[2,3], %y: f32[3]) -> (f32[2,3]) {
  %0 = elementwise_sub(%x, %y) {act="leaky_relu", act_alpha=0.2} : f32[2,3]
  return %0
}"""
    for seed in range(2):
        kx, ky = jax.random.split(jax.random.PRNGKey(seed))
        x, y = jax.random.normal(kx, (2, 3)), jax.random.normal(ky, (3,))
        np.testing.assert_allclose(out(x, y), prog(x, y), rtol=1e-6)


def test_fuse_elementwise_act_leaves_a_sum_read_twice():
    prog = pj.trace(lambda x: pj.ops.tanh(pj.ops.elementwise_mul(x, x)) * pj.ops.elementwise_mul(x, x),
                    jnp.ones(3))
    out = pj.passes.run(prog, "cse,fuse_elementwise_act")
    assert [op.type for op in out.walk()] == ["elementwise_mul", "tanh", "lax.mul", "return"]


def test_an_add_of_zero_with_a_fused_activation_is_no_identity():
    prog = pj.trace(lambda x: pj.ops.relu(pj.ops.elementwise_add(x, jnp.float32(0.0))), jnp.ones(3))
    out = pj.passes.run(prog, "fuse_elementwise_act,eliminate_identity")
    assert [op.type for op in out.walk()] == ["constant", "elementwise_add", "return"]
    np.testing.assert_array_equal(out(jnp.array([-1.0, 0.0, 2.0])), [0.0, 0.0, 2.0])


def test_fused_activation_survives_save_and_load(tmp_path):
    prog = pj.passes.run(pj.trace(conv_add_relu, jnp.ones((2, 3, 4, 4)), params=CONV_PARAMS), "fuse_bias_act,dce")
    pj.save(prog, tmp_path / "fused")
    loaded = pj.load(tmp_path / "fused")
    assert str(loaded) == str(prog)
    assert 'act="relu"' in str(loaded)
    assert_same_function(prog, loaded, (2, 3, 4, 4))


# ------------------------------------------------------------------------------------------
# eliminate_transposes

def test_eliminate_transposes_cancels_inverse_pairs():
    prog = pj.trace(lambda x: pj.ops.relu(jnp.transpose(jnp.transpose(x, (0, 2, 3, 1)), (0, 3, 1, 2))),
                    jnp.ones((1, 2, 3, 4)))
    out, result = apply(prog, "eliminate_transposes")
    assert result.stats == {"transposes": 1}
    assert str(out) == """\
program @<lambda>(%x: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
  %0 = relu(%x) : f32[1,2,3,4]
  return %0
}"""


def test_eliminate_transposes_composes_pairs_that_do_not_cancel():
    prog = pj.trace(lambda x: pj.ops.transpose(pj.ops.transpose(x, perm=(1, 2, 0)), perm=(1, 0, 2)),
                    jnp.ones((2, 3, 4)))
    out, _ = apply(prog, "eliminate_transposes")
    assert str(out) == """\
program @<lambda>(%x: f32[2,3,4]) -> (f32[4,3,2]) {
  %0 = transpose(%x) {perm=(2, 1, 0)} : f32[4,3,2]
  return %0
}"""
    assert_same_function(prog, out, (2, 3, 4))


def test_eliminate_transposes_sinks_below_pointwise_ops_to_meet_the_inverse():
    def f(x, y):
        a, b = jnp.transpose(x, (0, 2, 1)), jnp.transpose(y, (0, 2, 1))
        return jnp.transpose(pj.ops.relu(a + b) * 2.0, (0, 2, 1))

    prog = pj.trace(f, jnp.ones((1, 2, 3)), jnp.ones((1, 2, 3)))
    out, result = apply(prog, "eliminate_transposes")
    assert result.stats == {"sunk": 3, "transposes": 1}
    assert str(out) == """\
program @f(%x: f32[1,2,3], %y: f32[1,2,3]) -> (f32[1,2,3]) {
  %0 = lax.add(%x, %y) : f32[1,2,3]
  %1 = relu(%0) : f32[1,2,3]
  %2 = constant 2.0 : f32[]
  %3 = lax.mul(%1, %2) : f32[1,2,3]
  return %3
}"""
    x, y = (jax.random.normal(jax.random.PRNGKey(i), (1, 2, 3)) for i in range(2))
    np.testing.assert_array_equal(out(x, y), prog(x, y))


def test_eliminate_transposes_does_not_sink_a_transpose_other_ops_still_need():
    def f(x):
        t = jnp.transpose(x, (1, 0))
        return pj.ops.relu(t), t @ x

    prog = pj.trace(f, jnp.ones((2, 2)))
    assert_unchanged(prog, "eliminate_transposes")


def test_eliminate_transposes_does_not_sink_different_permutations():
    prog = pj.trace(lambda x: jnp.transpose(x, (1, 0, 2)) + jnp.transpose(x, (0, 2, 1)), jnp.ones((2, 2, 2)))
    assert_unchanged(prog, "eliminate_transposes")


def test_eliminate_transposes_drops_identity_and_keeps_a_transpose_read_elsewhere():
    def f(x):
        t = pj.ops.transpose(x, perm=(1, 0))
        return pj.ops.transpose(t, perm=(1, 0)) + pj.ops.transpose(x, perm=(0, 1)), t

    prog = pj.trace(f, jnp.ones((2, 2)))
    out, _ = apply(prog, "eliminate_transposes")
    assert str(out) == """\
program @f(%x: f32[2,2]) -> (f32[2,2], f32[2,2]) {
  %0 = transpose(%x) {perm=(1, 0)} : f32[2,2]
  %1 = lax.add(%x, %x) : f32[2,2]
  return %1, %0
}"""
    assert_unchanged(pj.trace(lambda x: pj.ops.transpose(x, perm=(1, 0)), jnp.ones((2, 3))), "eliminate_transposes")


# ------------------------------------------------------------------------------------------
# A pipeline on a small CNN

def test_inference_pipeline_on_digits_cnn():
    nn.seed(0)
    model = DigitsCNN()
    model.eval()
    prog = randomise_batch_norms(pj.to_static(model, pj.InputSpec((None, 1, 8, 8))))
    out = pj.passes.run(prog, "fold_conv_bn,fuse_bias_act,dce")
    ops = [op for op in out.walk() if op.type not in ("param", "return")]
    assert [op.type for op in ops] == ["conv2d", "conv2d", "pool2d", "conv2d", "pool2d", "reshape", "linear"]
    assert all(len(op.operands) == 3 and op.attrs["act"] == "relu" for op in ops if op.type == "conv2d")
    assert out.num_params() == prog.num_params() - 4 * (32 + 64 + 128) + 32  # BN gone, a bias for conv 1
    assert_same_function(prog, out, (4, 1, 8, 8), rtol=1e-5, atol=1e-5)
