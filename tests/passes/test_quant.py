"""insert_fake_quant and convert_int8: the printed IR, the scales, int8 parameters, and the
converted program computing what the fake-quantized one does."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def params(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    return {"conv.w": f(4, 3, 3, 3), "conv.b": f(4), "dw.w": f(4, 1, 3, 3), "fc.w": f(16, 5), "fc.b": f(5)}


def net(p, x):
    h = pj.ops.relu(pj.ops.conv2d(x, p["conv.w"], p["conv.b"], padding=1))
    h = pj.ops.depthwise_conv2d(h, p["dw.w"], stride=2, padding=1)
    return pj.ops.linear(pj.ops.reshape(h, shape=(0, -1)), p["fc.w"], p["fc.b"])


@pytest.fixture
def prog():
    return pj.trace(net, pj.InputSpec((None, 3, 4, 4)), params=params())


def inputs(seed=1, n=3):
    return np.random.default_rng(seed).normal(size=(n, 3, 4, 4)).astype(np.float32)


def calibrated(prog):
    """The fake-quantized program with every activation scale set to its abs-max on ``inputs``."""
    fake = pj.passes.run(prog, "insert_fake_quant")
    pj.slim.calibrate(fake, [inputs()], algo="abs_max", progress=False)
    return fake


def test_fake_quant_in_front_of_every_weight_and_activation(prog):
    fake = pj.passes.run(prog, "insert_fake_quant")
    listing = [line.split(" = ")[1].split("(")[0] for line in str(fake).splitlines() if "fake_quantize" in line
               or "conv2d(" in line or "linear(" in line]
    assert listing == ["fake_quantize", "fake_quantize", "conv2d", "fake_quantize", "fake_quantize",
                       "depthwise_conv2d", "fake_quantize", "fake_quantize", "linear"]
    scales = {k: v.shape for k, v in fake.params.items() if "scale" in k}
    assert scales == {"conv.w.quant_scale": (4,), "conv.w.input_scale": (), "dw.w.quant_scale": (4,),
                      "dw.w.input_scale": (), "fc.w.quant_scale": (5,), "fc.w.input_scale": ()}
    np.testing.assert_array_equal(fake.params["fc.w.quant_scale"], np.abs(params()["fc.w"]).max(axis=0))


def unchanged(program, name):
    again = program.clone()
    result = pj.passes.get_pass(name).apply(again, pj.passes.PassContext())
    return not result.changed and str(again) == str(program)


def test_running_the_passes_twice_or_on_nothing_changes_nothing(prog):
    fake = pj.passes.run(prog, "insert_fake_quant")
    int8 = pj.passes.run(fake, "convert_int8,dce")
    plain = pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((None, 3)))
    assert unchanged(fake, "insert_fake_quant") and unchanged(int8, "convert_int8")
    assert unchanged(prog, "convert_int8")  # nothing fake-quantized: nothing to convert
    assert unchanged(plain, "insert_fake_quant") and unchanged(plain, "convert_int8")


def test_skip_and_op_types_choose_the_ops(prog):
    fake = pj.passes.run(prog, "insert_fake_quant{ops=conv2d:linear skip=^fc}")
    assert sorted(k for k in fake.params if "scale" in k) == ["conv.w.input_scale", "conv.w.quant_scale"]
    with pytest.raises(pj.passes.PassError, match=r"cannot quantize op types \['pool2d'\]"):
        pj.passes.run(prog, "insert_fake_quant{ops=pool2d}")
    with pytest.raises(pj.passes.PassError, match="act_bits must be 8, 4 or 0"):
        pj.passes.run(prog, "insert_fake_quant{act_bits=6}")


def test_int8_program_equals_the_fake_quantized_one(prog):
    fake = calibrated(prog)
    int8 = pj.passes.run(fake, "convert_int8,dce")
    assert [op.type for op in int8.walk() if op.type not in ("param", "reshape", "relu", "return")] == [
        "quantize", "quantized_conv2d", "quantize", "quantized_conv2d", "quantize", "quantized_linear"]
    assert {k: v.dtype.name for k, v in int8.params.items() if k.endswith(".int8")} == {
        "conv.w.int8": "int8", "dw.w.int8": "int8", "fc.w.int8": "int8"}
    assert not any(k in int8.used_params() for k in ("conv.w", "dw.w", "fc.w"))  # the float weights are gone
    x = inputs(seed=1)
    np.testing.assert_allclose(int8(x), fake(x), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(int8(x)) - np.asarray(prog(x))).max() < 0.1 * np.abs(np.asarray(prog(x))).max()


def test_saved_int8_program_is_about_four_times_smaller(prog, tmp_path):
    big = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 256)),
                   params={"w": np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)})
    fake = pj.passes.run(big, "insert_fake_quant")
    pj.slim.calibrate(fake, [np.ones((2, 256), np.float32)], algo="abs_max", progress=False)
    pj.save(big, tmp_path / "fp32")
    pj.save(pj.passes.run(fake, "convert_int8,dce"), tmp_path / "int8")
    ratio = (tmp_path / "fp32.safetensors").stat().st_size / (tmp_path / "int8.safetensors").stat().st_size
    assert 3.8 < ratio < 4.0
    loaded = pj.load(tmp_path / "int8")
    assert loaded.params["w.int8"].dtype == np.int8


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_linear_keeps_the_activation_in_float(bits):
    w = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 6)), params={"w": w})
    fake = pj.passes.run(prog, f"insert_fake_quant{{act_bits=0 weight_bits={bits}}}")
    out = pj.passes.run(fake, "convert_int8,dce")
    assert [op.type for op in out.walk() if op.type != "param"] == ["weight_only_linear", "return"]
    stored = out.params[f"w.int{bits}"]
    assert stored.dtype.name == ("int8" if bits == 8 else "uint8") and stored.shape == (6 // (8 // bits), 3)
    x = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    np.testing.assert_allclose(out(x), fake(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_convolutions_keep_the_activation_in_float(bits):
    rng = np.random.default_rng(0)
    params = {"conv.w": rng.normal(size=(5, 3, 3, 3)).astype(np.float32),
              "dw.w": rng.normal(size=(5, 1, 3, 3)).astype(np.float32)}
    prog = pj.trace(lambda p, x: pj.ops.depthwise_conv2d(pj.ops.conv2d(x, p["conv.w"], padding=1), p["dw.w"]),
                    pj.InputSpec((None, 3, 6, 6)), params=params)
    fake = pj.passes.run(prog, f"insert_fake_quant{{act_bits=0 weight_bits={bits}}}")
    out = pj.passes.run(fake, "convert_int8,dce")
    assert [op.type for op in out.walk() if op.type != "param"] == ["weight_only_conv2d"] * 2 + ["return"]
    assert [op.attrs["groups"] for op in out.walk() if op.type == "weight_only_conv2d"] == [1, 5]
    stored = {k: (v.dtype.name, v.shape[0]) for k, v in out.params.items() if k.endswith(f".int{bits}")}
    assert stored == {f"{w}.int{bits}": ("int8", 5) if bits == 8 else ("uint8", 3) for w in params}
    x = rng.normal(size=(2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(out(x), fake(x), rtol=1e-5, atol=1e-5)


def test_matmul_of_two_activations_runs_as_int8():
    prog = pj.trace(lambda a, b: pj.ops.matmul(a, b, transpose_y=True), pj.InputSpec((2, 3, 4)),
                    pj.InputSpec((2, 5, 4)))
    fake = pj.passes.run(prog, "insert_fake_quant")
    assert sorted(fake.params) == ["matmul_0.x_scale", "matmul_0.y_scale"]
    a, b = (np.random.default_rng(i).normal(size=s).astype(np.float32) for i, s in ((0, (2, 3, 4)), (1, (2, 5, 4))))
    pj.slim.calibrate(fake, [(a, b)], algo="abs_max", progress=False)
    int8 = pj.passes.run(fake, "convert_int8,dce")
    assert [op.type for op in int8.walk() if op.type != "param"] == ["quantize", "quantize", "quantized_matmul",
                                                                     "return"]
    np.testing.assert_allclose(int8(a, b), fake(a, b), rtol=1e-5, atol=1e-5)


def test_fake_quantized_program_trains_with_straight_through_gradients(prog):
    fake = calibrated(prog)
    x = jnp.asarray(inputs())
    grads = jax.grad(lambda p: fake.apply(p, x).sum())(fake.params)
    assert float(jnp.abs(grads["conv.w"]).sum()) > 0 and float(jnp.abs(grads["fc.w"]).sum()) > 0


def test_quant_aware_computes_weight_scales_from_the_weights_in_the_program(prog):
    qat = pj.passes.run(prog, "quant_aware")
    assert [op.type for op in qat.walk() if op.type in ("abs_max", "fake_quantize", "linear")][-4:] == [
        "abs_max", "fake_quantize", "fake_quantize", "linear"]
    assert sorted(k for k in qat.params if "scale" in k) == ["conv.w.input_scale", "dw.w.input_scale",
                                                             "fc.w.input_scale"]
    fake = calibrated(prog)  # the same weight scales, stored, and calibrated activation scales
    qat.params.update({k: v for k, v in fake.params.items() if k.endswith("input_scale")})
    x = inputs()
    np.testing.assert_array_equal(qat(x), fake(x))


def training(prog):
    """``prog`` as a training-mode capture returns it: (outputs, updates)."""
    return pj.trace(lambda p, x: (net(p, x), {}), pj.InputSpec((None, 3, 4, 4)), params=prog.params)


def test_quant_aware_training_program_updates_moving_average_scales(prog):
    qat = pj.passes.run(training(prog), "quant_aware{moving_rate=0.5}", training=True)
    assert qat.params["conv.w.input_state"] == 0
    x1, x2 = inputs(seed=1), 3 * inputs(seed=2)
    _, first = qat.apply(qat.params, x1)
    assert sorted(first) == ["conv.w.input_scale", "conv.w.input_state", "dw.w.input_scale", "dw.w.input_state",
                             "fc.w.input_scale", "fc.w.input_state"]
    assert float(first["conv.w.input_scale"]) == np.abs(x1).max() and float(first["conv.w.input_state"]) == 1
    _, second = qat.apply({**qat.params, **first}, x2)
    expected = (0.5 * np.abs(x1).max() + np.abs(x2).max()) / 1.5
    np.testing.assert_allclose(float(second["conv.w.input_scale"]), expected, rtol=1e-6)
    # the step quantizes with the scale it has just observed: the input is never clipped
    grads = jax.grad(lambda p: qat.apply(p, jnp.asarray(x2))[0].sum())(qat.params)
    assert float(jnp.abs(grads["conv.w"]).sum()) > 0


def test_quant_aware_in_training_needs_the_updates_output(prog):
    with pytest.raises(pj.passes.PassError, match=r"a training program returns \(outputs, updates\)"):
        pj.passes.run(prog, "quant_aware", training=True)
    with pytest.raises(pj.passes.PassError, match=r"moving_rate must be in \[0, 1\)"):
        pj.passes.run(prog, "quant_aware{moving_rate=1.5}")


def test_converted_quant_aware_program_stores_the_weight_scales(prog):
    qat = pj.passes.run(prog, "quant_aware")
    pj.slim.calibrate(qat, [inputs()], algo="abs_max", progress=False)
    int8 = pj.slim.convert(qat)
    assert not any(op.type in ("abs_max", "fake_quantize") for op in int8.walk())
    np.testing.assert_array_equal(int8.params["fc.w.quant_scale"], np.abs(params()["fc.w"]).max(axis=0))
    assert not any(k in int8.used_params() for k in ("conv.w", "dw.w", "fc.w"))
    x = inputs(seed=3)
    np.testing.assert_allclose(int8(x), qat(x), rtol=1e-5, atol=1e-5)



def test_an_activation_read_by_several_ops_has_one_scale_and_one_quantize():
    rng = np.random.default_rng(0)
    prog = pj.trace(lambda p, x: pj.ops.linear(x, p["q"]) * pj.ops.linear(x, p["k"]), pj.InputSpec((None, 4)),
                    params={"q": rng.normal(size=(4, 3)).astype(np.float32),
                            "k": rng.normal(size=(4, 3)).astype(np.float32)})
    fake = pj.passes.run(prog, "insert_fake_quant")
    assert sorted(k for k in fake.params if k.endswith("input_scale")) == ["q.input_scale"]
    x = rng.normal(size=(5, 4)).astype(np.float32)
    pj.slim.calibrate(fake, [x], algo="abs_max", progress=False)
    int8 = pj.slim.convert(fake)
    assert [op.type for op in int8.walk() if op.type not in ("param", "lax.mul", "return")] == [
        "quantize", "quantized_linear", "quantized_linear"]
    np.testing.assert_allclose(int8(x), fake(x), rtol=1e-5, atol=1e-5)


def asym_program():
    """conv (unpadded) -> relu -> conv (padded) -> linear."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    params = {"c1.w": f(4, 3, 3, 3), "c1.b": f(4), "c2.w": f(4, 4, 3, 3), "fc.w": f(16, 5)}

    def net(p, x):
        h = pj.ops.relu(pj.ops.conv2d(x, p["c1.w"], p["c1.b"]))
        h = pj.ops.conv2d(h, p["c2.w"], padding=1, stride=2)
        return pj.ops.linear(pj.ops.reshape(h, shape=(0, -1)), p["fc.w"])

    return pj.trace(net, pj.InputSpec((None, 3, 6, 6)), params=params)


def test_asymmetric_activations_fold_their_zero_points_into_the_biases():
    prog = asym_program()
    x = np.random.default_rng(1).normal(size=(8, 3, 6, 6)).astype(np.float32) + 0.5
    fake = pj.passes.run(prog, "insert_fake_quant{act_symmetric=false}")
    assert sorted(k for k in fake.params if k.endswith(("_min", "_max"))) == [
        "c1.w.input_max", "c1.w.input_min", "c2.w.input_max", "c2.w.input_min", "fc.w.input_max", "fc.w.input_min"]
    ranges = pj.slim.calibrate(fake, [x], "min_max", progress=False)
    assert ranges["c1.w.input_min"] == (float(x.min()), float(x.max()))
    assert ranges["c2.w.input_min"][0] == 0  # after a relu
    manager = pj.passes.PassManager("convert_int8,dce")
    int8 = manager.run(fake)
    assert manager.records[0].stats == {"int8": 3, "weight_only": 0, "asym_float": 0}
    # the padded convolution's zeros would not be the zero point: its input is padded with the zero point
    assert [op.type for op in int8.walk() if op.type not in ("param", "relu", "reshape", "return")] == [
        "quantize_asym", "quantized_conv2d", "quantize_asym", "pad", "quantized_conv2d", "quantize_asym",
        "quantized_linear"]
    pad = next(op for op in int8.walk() if op.type == "pad")
    conv = next(op for op in int8.walk() if op.type == "quantized_conv2d" and op.operands[0] is pad.result)
    step, zero_point = pj.ops.quant.asym_grid(*ranges["c2.w.input_min"])
    assert pad.attrs["paddings"] == (0, 0, 0, 0, 1, 1, 1, 1) and pad.attrs["value"] == float(zero_point) - 128
    assert conv.attrs["padding"] == ((0, 0), (0, 0)) and conv.attrs["stride"] == (2, 2)
    assert {"c2.w.zero_point_bias", "fc.w.zero_point_bias"} <= set(int8.used_params()) and "c1.b" not in int8.used_params()
    out = np.asarray(int8(x))
    np.testing.assert_allclose(out, fake(x), rtol=1e-5, atol=1e-5 * np.abs(out).max())


def test_asymmetric_activations_need_the_min_max_observer_and_post_training():
    prog = asym_program()
    with pytest.raises(ValueError, match="asymmetric activations are calibrated by their range: algo='min_max'"):
        pj.slim.quant_post(prog, [np.ones((2, 3, 6, 6), np.float32)], act_symmetric=False, progress=False)
    with pytest.raises(pj.passes.PassError, match="act_symmetric=false is for post-training quantization"):
        pj.passes.run(prog, "quant_aware{act_symmetric=false}")
    int8 = pj.slim.quant_post(prog, [np.ones((2, 3, 6, 6), np.float32)], algo="min_max", act_symmetric=False,
                              progress=False)
    assert sum(op.type == "quantize_asym" for op in int8.walk()) == 3


def residual_net(p, x):
    """A projection block: a 3x3 convolution plus a strided 1x1 projection of the same input."""
    h = pj.ops.relu(pj.ops.conv2d(x, p["stem.w"], padding=1))
    main = pj.ops.conv2d(h, p["main.w"], stride=2, padding=1)
    return pj.ops.relu(main + pj.ops.conv2d(h, p["project.w"], stride=2))


def residual_params():
    rng = np.random.default_rng(2)
    return {"stem.w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
            "main.w": rng.normal(size=(6, 4, 3, 3)).astype(np.float32),
            "project.w": rng.normal(size=(6, 4, 1, 1)).astype(np.float32)}


def test_a_projection_shortcut_gets_an_output_scale():
    prog = pj.trace(residual_net, pj.InputSpec((None, 3, 4, 4)), params=residual_params())
    manager = pj.passes.PassManager("insert_fake_quant")
    fake = manager.run(prog)
    assert manager.records[0].stats == {"ops": 3, "weights": 3, "activations": 2, "shortcuts": 1}
    add = next(op for op in fake.walk() if op.canonical[0] == "elementwise_add")
    main, short = (v.producer for v in add.operands)
    assert main.type == "conv2d" and short.type == "fake_quantize"  # the smaller weight's output
    assert short.operands[1].producer.attrs["name"] == "project.w.output_scale"
    for options in ("shortcuts=false", "act_bits=0"):  # asked not to, or activations left float
        off = pj.passes.PassManager(f"insert_fake_quant{{{options}}}")
        off.run(prog)
        assert "shortcuts" not in off.records[0].stats


def test_quant_aware_training_updates_the_shortcut_scale():
    train = pj.trace(lambda p, x: (residual_net(p, x), {}), pj.InputSpec((None, 3, 4, 4)), params=residual_params())
    qat = pj.passes.run(train, "quant_aware", training=True)
    _, updates = qat(inputs())
    assert {"project.w.output_scale", "project.w.output_state"} <= set(updates)
    assert float(updates["project.w.output_scale"]) > 0
