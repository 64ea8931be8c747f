"""Quantization-aware training: the quant_aware pass in the Trainer, its trained scales, and
the int8 program pj.slim.convert gives, on the digits CNN."""
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj


def accuracy(program, x, y):
    return float((np.asarray(program(x)).argmax(1) == y).mean())


@pytest.fixture(scope="module")
def qat(digits):
    """Two epochs of QAT from the trained float model (a copy of it)."""
    trainer = pj.Trainer(nnx.clone(digits.model), optax.adam(1e-4), passes="quant_aware", progress=False)
    trainer.fit((digits.x_train, digits.y_train), epochs=2, batch_size=32)
    return trainer


def test_qat_loses_no_accuracy_and_converts_to_int8(digits, qat):
    fake = qat.inference_program()
    int8 = pj.slim.convert(fake)
    assert [op.type for op in int8.walk() if op.type.startswith("quantized_")] == ["quantized_conv2d"] * 3 + [
        "quantized_linear"]
    fp32 = accuracy(digits.program, digits.x_test, digits.y_test)
    assert fp32 >= 0.99
    assert accuracy(fake, digits.x_test, digits.y_test) >= fp32
    assert accuracy(int8, digits.x_test, digits.y_test) >= fp32
    assert qat.evaluate((digits.x_test, digits.y_test))["loss"] < 0.05


def test_activation_scales_train_as_moving_averages(digits, qat):
    extra = qat.state.extra
    names = ["features.0.weight", "features.3.weight", "features.7.weight", "fc.weight"]
    assert sorted(k for k in extra if k.endswith(("_scale", "_state"))) == sorted(
        f"{n}.input_{s}" for n in names for s in ("scale", "state"))
    steps = 2 * int(np.ceil(len(digits.x_train) / 32))
    np.testing.assert_allclose(float(extra["fc.weight.input_state"]), (1 - 0.9 ** steps) / (1 - 0.9), rtol=1e-5)
    # the first layer sees the images, whose pixels reach 1.0 in every batch
    np.testing.assert_allclose(float(extra["features.0.weight.input_scale"]), 1.0, rtol=1e-6)
    program = qat.inference_program()
    assert float(program.params["fc.weight.input_scale"]) == float(extra["fc.weight.input_scale"])


def test_quant_aware_function_and_its_options(digits):
    fake = pj.slim.quant_aware(digits.program, skip="^fc", weight_bits=4)
    weights = [op for op in fake.walk() if op.type == "fake_quantize" and op.operands[1].producer.type == "abs_max"]
    assert len(weights) == 3 and all(op.attrs["bits"] == 4 for op in weights)
    with pytest.raises(pj.passes.PassError, match="a training program returns"):
        pj.slim.quant_aware(digits.program, training=True)
