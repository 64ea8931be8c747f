"""Per-layer quantization sensitivity (PaddleSlim's PTQ analysis) on the trained digits CNN (see
conftest.py), and ``quant_post(keep_float=k)``, which leaves the k most sensitive layers float."""
import jax
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.slim.quant import quant_sensitivity
from paddlejax.slim.quant.sensitivity import keep_float_pattern


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def int8_layers(program) -> list[str]:
    return [op.operands[1].producer.attrs["name"].removesuffix(".int8") for op in program.walk()
            if op.type.startswith("quantized_")]


def test_every_layer_is_measured_worst_first(digits):
    sensitivity = quant_sensitivity(digits.program, digits.calib[:2], algo="abs_max", progress=False)
    int8 = pj.slim.quant_post(digits.program, digits.calib[:2], algo="abs_max", progress=False)
    assert sorted(s.layer for s in sensitivity) == sorted(int8_layers(int8))
    assert [s.op for s in sensitivity].count("conv2d") == 3 and [s.op for s in sensitivity].count("linear") == 1
    relative = [s.relative for s in sensitivity]
    assert relative == sorted(relative, reverse=True) and all(0 < r < 0.1 for r in relative)


def test_a_layers_sensitivity_is_the_error_of_quantizing_it_alone(digits):
    data = digits.calib[:1]
    sensitivity = {s.layer: s.relative for s in quant_sensitivity(digits.program, data, algo="abs_max",
                                                                  progress=False)}
    want = digits.program(data[0])
    for layer in sorted(sensitivity)[:2]:
        others = keep_float_pattern("", [name for name in sensitivity if name != layer])
        alone = pj.slim.quant_post(digits.program, data, algo="abs_max", skip=others, progress=False)
        assert int8_layers(alone) == [layer]
        assert relative_error(alone(data[0]), want) == pytest.approx(sensitivity[layer], rel=1e-3)


def test_keep_float_leaves_the_most_sensitive_layers_in_float(digits):
    data = digits.calib[:2]
    worst = [s.layer for s in quant_sensitivity(digits.program, data, algo="abs_max", progress=False)]
    int8 = pj.slim.quant_post(digits.program, data, algo="abs_max", keep_float=2, progress=False)
    assert sorted(int8_layers(int8)) == sorted(worst[2:])
    # the user's own skip still holds beside the layers kept float
    head = pj.slim.quant_post(digits.program, data, algo="abs_max", keep_float=1, skip="^fc", progress=False)
    assert "fc.weight" not in int8_layers(head) and len(int8_layers(head)) == 2


def test_layers_inside_control_flow_stay_float_and_are_not_measured():
    rng = np.random.default_rng(0)
    params = {name: rng.normal(size=(8, 8)).astype(np.float32) for name in ("inner", "outer")}

    def f(p, x):
        y = jax.lax.cond(x.sum() > 0, lambda v: pj.ops.linear(v, p["inner"]), lambda v: v, x)
        return pj.ops.linear(y, p["outer"])

    program = pj.trace(f, pj.InputSpec((4, 8)), params=params)
    data = [rng.normal(size=(4, 8)).astype(np.float32) for _ in range(2)]
    assert [s.layer for s in quant_sensitivity(program, data, algo="abs_max", progress=False)] == ["outer"]


def test_bad_requests_are_refused_by_name(digits):
    program, calib = digits.program, digits.calib[:1]
    with pytest.raises(ValueError, match="data is read twice .* not an iterator"):
        quant_sensitivity(program, iter(calib), progress=False)
    with pytest.raises(ValueError, match="nothing to quantize .* outside skip='.'"):
        quant_sensitivity(program, calib, skip=".", progress=False)
    with pytest.raises(ValueError, match="cannot quantize"):
        quant_sensitivity(program, calib, ops="relu", progress=False)
    argmax = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]).argmax(-1), pj.InputSpec((None, 4)),
                      params={"w": np.ones((4, 3), np.float32)})
    with pytest.raises(ValueError, match="no float output to compare .* before its argmax"):
        quant_sensitivity(argmax, [np.ones((2, 4), np.float32)], progress=False)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"keep_float counts .* got {bad!r}"):
            pj.slim.quant_post(program, calib, keep_float=bad, progress=False)
    with pytest.raises(ValueError, match="with weight_bits=4"):
        pj.slim.quant_post(program, calib, keep_float=1, weight_bits=4, progress=False)
    with pytest.raises(ValueError, match="not an iterator"):
        pj.slim.quant_post(program, iter(calib), keep_float=1, progress=False)
