"""Empirical bias correction: the mean output shift of int8 weights goes into the biases."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.slim.quant.bias import correct_bias


def linear_program(bias: bool):
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(32, 6)).astype(np.float32)}
    if bias:
        params["b"] = rng.normal(size=6).astype(np.float32)
    return pj.trace(lambda p, x: pj.ops.linear(x, p["w"], p.get("b")), pj.InputSpec((None, 32)), params=params)


@pytest.mark.parametrize("bias", [True, False])
def test_corrected_layer_has_the_float_layers_mean_output(bias):
    prog = linear_program(bias)
    data = [np.random.default_rng(i).normal(0.5, 1.0, size=(64, 32)).astype(np.float32) for i in range(2)]
    fake = pj.passes.run(prog, "insert_fake_quant{weight_bits=4}")
    pj.slim.calibrate(fake, data, "abs_max", progress=False)
    before = pj.slim.convert(fake)
    shifts = correct_bias(fake, data, progress=False)
    after = pj.slim.convert(fake)
    assert ("b" in after.used_params()) == bias and ("w.bias_correction" in after.used_params()) != bias
    x = np.concatenate(data)
    mean_error = {name: np.abs((np.asarray(p(x)) - np.asarray(prog(x))).mean(0)).mean()
                  for name, p in (("before", before), ("after", after))}
    assert mean_error["after"] < 0.1 * mean_error["before"]
    assert shifts["w"].shape == (6,)


def test_sequences_of_different_lengths_average_over_every_token():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, "t", 8)), params={"w": w})
    data = [rng.normal(0.5, 1.0, size=(2, t, 8)).astype(np.float32) for t in (3, 5)]
    fake = pj.passes.run(prog, "insert_fake_quant{weight_bits=4}")
    pj.slim.calibrate(fake, data, "abs_max", progress=False)
    shifts = correct_bias(fake, data, progress=False)
    tokens = np.concatenate([x.reshape(-1, 8) for x in data])  # 16 tokens, each one sample
    approx = pj.ops.dequantize(pj.ops.quantize(w, fake.params["w.quant_scale"], axis=1, bits=4),
                               fake.params["w.quant_scale"], axis=1, bits=4)
    np.testing.assert_allclose(shifts["w"], tokens.mean(0) @ (w - np.asarray(approx)), rtol=1e-5, atol=1e-7)


def test_digits_cnn_closer_to_float_with_bias_correction(digits):
    fp32 = np.asarray(digits.program(digits.x_test))
    error = {}
    for corrected in (False, True):
        int8 = pj.slim.quant_post(digits.program, digits.calib, algo="hist", weight_bits=4,
                                  bias_correction=corrected, progress=False)
        error[corrected] = np.abs(np.asarray(int8(digits.x_test)) - fp32).mean()
    assert error[True] < 0.8 * error[False]


def test_bias_correction_needs_data_it_can_read_twice(digits):
    with pytest.raises(ValueError, match="bias_correction reads calib_data twice"):
        pj.slim.quant_post(digits.program, iter(digits.calib), bias_correction=True, progress=False)
