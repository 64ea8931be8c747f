"""ProgramLayer: a program as a trainable layer (Paddle's TranslatedLayer)."""
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.models.digits import DigitsCNN
from paddlejax.nn.program_layer import ProgramLayer


def digits_program():
    pj.nn.seed(0)
    model = DigitsCNN()
    model.eval()
    return pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))


def test_the_layer_computes_the_program():
    prog = digits_program()
    x = np.random.default_rng(0).random((3, 1, 8, 8), np.float32)
    np.testing.assert_array_equal(np.asarray(ProgramLayer(prog)(x)), np.asarray(prog(x)))


def test_weights_train_and_running_statistics_do_not():
    prog = digits_program()
    layer = ProgramLayer(prog)
    assert isinstance(layer.params["features.1.mean"], nnx.BatchStat)
    assert isinstance(layer.params["features.1.weight"], nnx.Param)
    x, y = pj.data.Digits("train").arrays()
    trainer = pj.Trainer(layer, optax.adam(1e-2), progress=False)
    trainer.fit((x[:128], y[:128]), epochs=1, batch_size=64)
    trained = trainer.current_model()
    assert not np.allclose(trained.params["features.0.weight"][...], prog.params["features.0.weight"])
    np.testing.assert_array_equal(trained.params["features.1.mean"][...], prog.params["features.1.mean"])


def test_frozen_layers_keep_every_weight():
    layer = ProgramLayer(digits_program(), trainable=False)
    assert not nnx.state(layer, nnx.Param)


def test_only_programs_are_taken():
    with pytest.raises(TypeError, match="expected a Program, got int"):
        ProgramLayer(3)
