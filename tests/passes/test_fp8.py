"""convert_fp8: the printed IR, the device check and its message, the converted program's numbers,
saved size and round trip, and which ops are (not) converted."""
import types

import jax
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.passes.fp8 import fp8_device_problem


def params(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    return {"fc1.w": f(16, 32), "fc1.b": f(32), "fc2.w": f(32, 4)}


def mlp(p, x):
    h = pj.ops.linear(x, p["fc1.w"], p["fc1.b"], act="relu")
    return pj.ops.matmul(h, p["fc2.w"])


@pytest.fixture
def prog():
    return pj.trace(mlp, pj.InputSpec((None, 16)), params=params())


def inputs(seed=1, n=8):
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


EMULATE = "convert_fp8{emulate=true},dce"


def test_linear_and_matmul_become_fp8_linear_with_e4m3_weights(prog):
    assert str(prog).splitlines()[4:6] == [
        '  %3 = linear(%x, %1, %0) {act="relu"} : f32[b,32]',
        "  %4 = matmul(%3, %2) {transpose_x=False, transpose_y=False} : f32[b,4]"]
    assert str(pj.passes.run(prog, EMULATE)) == """\
program @mlp(%x: f32[b,16]) -> (f32[b,4]) {
  %0 = param @fc1.b : f32[32]
  %1 = param @fc1.w.fp8 : f8e4m3fn[16,32]
  %2 = param @fc1.w.fp8_scale : f32[32]
  %3 = param @fc2.w.fp8 : f8e4m3fn[32,4]
  %4 = param @fc2.w.fp8_scale : f32[4]
  %5 = fp8_linear(%x, %1, %2, %0) {act="relu"} : f32[b,32]
  %6 = fp8_linear(%5, %3, %4) : f32[b,4]
  return %6
}"""


def test_weight_scales_are_abs_max_per_channel_or_per_tensor(prog):
    w = params()["fc1.w"]
    channels = pj.passes.run(prog, EMULATE).params
    np.testing.assert_array_equal(channels["fc1.w.fp8_scale"], np.abs(w).max(axis=0))
    tensor = pj.passes.run(prog, "convert_fp8{emulate=true channel_wise=false},dce").params
    assert tensor["fc1.w.fp8_scale"].shape == () and float(tensor["fc1.w.fp8_scale"]) == np.abs(w).max()
    np.testing.assert_array_equal(channels["fc1.w.fp8"], pj.ops.quantize_fp8(w, np.abs(w).max(axis=0), axis=1))


def cpu_device(monkeypatch):
    fake = types.SimpleNamespace(platform="cpu", device_kind="cpu")
    monkeypatch.setattr(jax, "devices", lambda *backend: [fake])


def test_devices_without_fp8_dots_get_a_clear_message(prog, monkeypatch):
    cpu_device(monkeypatch)
    with pytest.raises(pj.passes.PassError) as error:
        pj.passes.run(prog, "convert_fp8")
    assert str(error.value).endswith(
        "convert_fp8: fp8 (e4m3) kernels need a GPU with compute capability >= 8.9 (Ada, Hopper or newer); "
        "this device is cpu. Use int8 (convert_int8) here, or emulate=true to simulate fp8 numerics on this "
        "device (slow).")
    assert [op.type for op in pj.passes.run(prog, EMULATE).walk()].count("fp8_linear") == 2


@pytest.mark.parametrize("platform,kind,capability,problem", [
    ("gpu", "NVIDIA H100 80GB HBM3", "9.0", None),
    ("gpu", "NVIDIA L4", "8.9", None),
    ("gpu", "NVIDIA A100-SXM4-40GB", "8.0", "this device is gpu (NVIDIA A100-SXM4-40GB, compute capability 8.0)"),
    ("tpu", "TPU v5 lite", None, "this device is tpu (TPU v5 lite)"),
    ("gpu", "AMD Instinct MI300X", "gfx942", "this device is gpu (AMD Instinct MI300X, compute capability gfx942)"),
])
def test_only_gpus_of_compute_capability_8_9_and_newer_have_fp8(platform, kind, capability, problem):
    device = types.SimpleNamespace(platform=platform, device_kind=kind, compute_capability=capability)
    assert fp8_device_problem(device) == problem


def test_emulated_fp8_mlp_is_close_to_float(prog):
    fp8 = pj.passes.run(prog, EMULATE)
    x = inputs()
    exact, y = np.asarray(prog(x)), np.asarray(fp8(x))
    assert np.abs(y - exact).max() < 0.06 * np.abs(exact).max()
    p = fp8.params
    by_hand = pj.ops.fp8_linear(pj.ops.fp8_linear(x, p["fc1.w.fp8"], p["fc1.w.fp8_scale"], p["fc1.b"], act="relu"),
                                p["fc2.w.fp8"], p["fc2.w.fp8_scale"])
    np.testing.assert_allclose(y, by_hand, rtol=1e-6, atol=1e-6)


def test_saved_fp8_program_is_about_four_times_smaller_and_loads_back_equal(tmp_path):
    big = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 256)),
                   params={"w": np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)})
    fp8 = pj.passes.run(big, EMULATE)
    pj.save(big, tmp_path / "fp32")
    pj.save(fp8, tmp_path / "fp8")
    ratio = (tmp_path / "fp32.safetensors").stat().st_size / (tmp_path / "fp8.safetensors").stat().st_size
    assert 3.8 < ratio < 4.0  # the float32 scales, one per output channel, cost the rest
    loaded = pj.load(tmp_path / "fp8")
    assert str(loaded) == str(fp8) and loaded.params["w.fp8"].dtype.name == "float8_e4m3fn"
    np.testing.assert_array_equal(np.asarray(loaded.params["w.fp8"]).view(np.uint8),
                                  np.asarray(fp8.params["w.fp8"]).view(np.uint8))
    x = np.random.default_rng(1).normal(size=(2, 256)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), fp8(x))


def test_skip_and_op_types_choose_the_ops(prog):
    def converted(pipeline):
        return [op.type for op in pj.passes.run(prog, pipeline).walk() if op.type not in ("param", "return")]

    assert converted("convert_fp8{emulate=true skip=^fc2}") == ["fp8_linear", "matmul"]
    assert converted("convert_fp8{emulate=true ops=matmul}") == ["linear", "fp8_linear"]
    with pytest.raises(pj.passes.PassError, match=r"cannot convert op types \['conv2d'\]"):
        pj.passes.run(prog, "convert_fp8{ops=conv2d emulate=true}")


def unchanged(program):
    again = program.clone()
    result = pj.passes.get_pass("convert_fp8", emulate=True).apply(again, pj.passes.PassContext())
    return not result.changed and result.stats == {"fp8": 0} and str(again) == str(program)


def test_nothing_to_convert_leaves_the_program_unchanged(prog):
    w = {"w": np.ones((3, 4), np.float32)}
    assert unchanged(pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((None, 3))))
    assert unchanged(pj.trace(lambda a, b: pj.ops.matmul(a, b), pj.InputSpec((2, 3)), pj.InputSpec((3, 4))))
    assert unchanged(pj.trace(lambda p, x: pj.ops.matmul(x, p["w"], transpose_y=True), pj.InputSpec((2, 4)), params=w))
    assert unchanged(pj.passes.run(prog, EMULATE))  # already converted


def test_a_shared_weight_is_stored_once():
    w = {"w": np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)}
    prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.linear(x, p["w"]), p["w"]), pj.InputSpec((None, 4)), params=w)
    fp8 = pj.passes.run(prog, EMULATE)
    assert sorted(fp8.used_params()) == ["w.fp8", "w.fp8_scale"]
