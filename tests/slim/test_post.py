"""Post-training quantization on real data: the digits CNN of the PaddleSlim comparison (see conftest.py),
int4 weight-only, calibration's bad-input errors and the layers left in float."""
import numpy as np
import pytest

import paddlejax as pj

# PaddleSlim 2.6 on this exact setup: int8 loses no accuracy; mean |int8 logit - fp32 logit|
PADDLESLIM_DLOGIT = {"hist": 0.050, "abs_max": 0.047, "avg": 0.060, "KL": 0.33}


@pytest.mark.parametrize("algo", sorted(PADDLESLIM_DLOGIT))
def test_int8_loses_no_accuracy_and_stays_as_close_to_fp32_as_paddleslim(digits, algo):
    program, calib, x_test, y_test = digits.program, digits.calib, digits.x_test, digits.y_test
    fp32 = np.asarray(program(x_test))
    int8 = pj.slim.quant_post(program, calib, algo=algo, progress=False)
    assert sum(op.type.startswith("quantized_") for op in int8.walk()) == 4  # three convs and the head
    out = np.asarray(int8(x_test))
    assert (fp32.argmax(1) == y_test).mean() >= 0.99
    assert (out.argmax(1) == y_test).mean() >= (fp32.argmax(1) == y_test).mean()
    assert np.abs(out - fp32).mean() <= PADDLESLIM_DLOGIT[algo]


def test_quant_post_saves_and_the_file_reloads(digits, tmp_path):
    program, calib, x_test = digits.program, digits.calib, digits.x_test
    int8 = pj.slim.quant_post(program, calib, algo="abs_max", progress=False, output=tmp_path / "int8")
    np.testing.assert_array_equal(pj.load(tmp_path / "int8")(x_test[:8]), int8(x_test[:8]))


def test_bad_calibration_data_is_named(digits):
    program = digits.program
    with pytest.raises(ValueError, match="calib_data gave no batch"):
        pj.slim.quant_post(program, [], progress=False)
    with pytest.raises(ValueError, match="calibrate: batch 0 does not fit"):
        pj.slim.quant_post(program, [np.zeros((4, 3, 8, 8), np.float32)], progress=False)
    with pytest.raises(ValueError, match="calibrate: batch 0 does not fit"):
        pj.slim.quant_post(program, [np.zeros((4, 1, 8, 8), np.int32)], progress=False)
    with pytest.raises(ValueError, match="nothing to quantize in <lambda>: no conv2d, .* op with a parameter weight"):
        pj.slim.quant_post(pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((None, 4))), [np.ones((1, 4))],
                           progress=False)


def test_per_layer_report_names_each_quantized_layer(digits, tmp_path):
    program, calib, x_test = digits.program, digits.calib, digits.x_test
    int8 = pj.slim.quant_post(program, calib, algo="hist", progress=False)
    errors = pj.slim.quant.layer_errors(program, int8, x_test[:64])
    assert [e.op for e in errors] == ["quantized_conv2d"] * 3 + ["quantized_linear"]
    assert [e.layer for e in errors][-1] == "fc.weight" and all(e.cosine > 0.99 for e in errors)
    assert errors[0].shape == (64, 32, 8, 8)
    pj.slim.quant.plot_layer_errors(errors, tmp_path / "errors.png")
    assert (tmp_path / "errors.png").stat().st_size > 1000
    other = pj.trace(lambda x: pj.ops.relu(x), pj.InputSpec((None, 1, 8, 8)))
    with pytest.raises(ValueError, match="has no float op for the int8 layers"):
        pj.slim.quant.layer_errors(other, int8, x_test[:4])


def test_int4_weight_only_packs_every_layer_and_keeps_the_accuracy(digits, tmp_path):
    program, x_test, y_test = digits.program, digits.x_test, digits.y_test
    pj.save(program, tmp_path / "fp32")
    int4 = pj.slim.quant_post(program, digits.calib, weight_bits=4, progress=False, output=tmp_path / "int4")
    assert [op.type for op in int4.walk() if op.type.startswith(("weight_only", "quantize", "fake"))] == [
        "weight_only_conv2d"] * 3 + ["weight_only_linear"]
    packed = {k: v for k, v in int4.params.items() if k.endswith(".int4")}
    assert len(packed) == 4 and all(v.dtype == np.uint8 for v in packed.values())
    assert packed["fc.weight.int4"].shape[0] == -(-program.params["fc.weight"].shape[0] // 2)  # two rows per byte
    assert (tmp_path / "fp32.safetensors").stat().st_size > 5 * (tmp_path / "int4.safetensors").stat().st_size
    out = np.asarray(pj.load(tmp_path / "int4")(x_test))
    assert (out.argmax(1) == y_test).mean() >= 0.97


def test_weight_bits_and_activation_options_that_do_not_combine_are_refused(digits):
    with pytest.raises(ValueError, match=r"weight_bits must be 8 \(int8 weights and activations\) or 4"):
        pj.slim.quant_post(digits.program, digits.calib, weight_bits=2, progress=False)
    with pytest.raises(ValueError, match="weight_bits=4 quantizes the weights only and leaves the activations float"):
        pj.slim.quant_post(digits.program, digits.calib, weight_bits=4, algo="min_max", act_symmetric=False,
                           progress=False)


def test_layers_left_in_float_are_named_with_the_reason():
    prog = pj.trace(lambda a, b: pj.ops.matmul(a, b, transpose_y=True), pj.InputSpec((2, 3, 4)),
                    pj.InputSpec((2, 5, 4)))
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=(2, 5, 4)).astype(np.float32))
    with pytest.warns(UserWarning, match=r"quant_post: matmul at .* stay float \(fake-quantized\): an asymmetric "
                                         r"activation folds its zero point only into a linear or a convolution"):
        pj.slim.quant_post(prog, [batch], algo="min_max", act_symmetric=False, progress=False)


def test_batch_norms_are_folded_before_quantizing_unless_asked_not_to(digits):
    program, calib, x_test = digits.program, digits.calib, digits.x_test
    assert sum(op.type == "batch_norm" for op in program.walk()) == 3
    folded = pj.slim.quant_post(program, calib, algo="abs_max", progress=False)
    kept = pj.slim.quant_post(program, calib, algo="abs_max", fold_batch_norm=False, progress=False)
    assert not any(op.type == "batch_norm" for op in folded.walk())
    assert sum(op.type == "batch_norm" for op in kept.walk()) == 3
    # the weights quantized as they compute: the folded program is as close to float as the other
    fp32 = np.asarray(program(x_test))
    assert np.abs(np.asarray(folded(x_test)) - fp32).mean() <= 1.2 * np.abs(np.asarray(kept(x_test)) - fp32).mean()
