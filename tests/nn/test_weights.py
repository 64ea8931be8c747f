"""Weights files: state_dict / set_state_dict / save_weights / load_weights."""
import numpy as np
import pytest
import safetensors.numpy

import paddlejax.nn as nn
from paddlejax.nn.weights import WeightsError


def small_model(seed):
    nn.seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1D(4), nn.Dropout(0.5), nn.Linear(4, 2))


def test_state_dict_holds_parameters_and_running_statistics_but_no_random_keys():
    names = sorted(nn.state_dict(small_model(0)))
    assert names == ["0.bias", "0.weight", "1.bias", "1.mean", "1.variance", "1.weight", "3.bias", "3.weight"]


def test_save_then_load_restores_every_tensor(tmp_path):
    source, target = small_model(0), small_model(1)
    source[1].mean.set_value(source[1].mean[...] + 3.0)
    nn.save_weights(source, tmp_path / "w.safetensors")
    result = nn.load_weights(target, tmp_path / "w.safetensors")
    assert (result.loaded, result.missing, result.unexpected) == (8, [], [])
    for (name, a), b in zip(nn.state_dict(source).items(), nn.state_dict(target).values()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_a_wrong_shape_names_the_tensor_and_changes_nothing(tmp_path):
    model = small_model(0)
    before = nn.state_dict(model)
    bad = dict(before, **{"3.weight": np.zeros((2, 4), np.float32)})
    safetensors.numpy.save_file(bad, tmp_path / "bad.safetensors")
    with pytest.raises(WeightsError, match=r"bad.safetensors: tensor '3.weight' has shape \(2, 4\), "
                                           r"the model's '3.weight' is \(4, 2\)"):
        nn.load_weights(model, tmp_path / "bad.safetensors")
    for name, value in nn.state_dict(model).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_missing_and_unexpected_tensors_are_listed_or_returned():
    model = small_model(0)
    weights = nn.state_dict(model)
    del weights["1.mean"]
    weights["head.weight"] = np.zeros(2, np.float32)
    with pytest.raises(WeightsError, match=r"missing 1 tensor\(s\) the model needs: '1.mean'; "
                                           r"1 tensor\(s\) the model does not have: 'head.weight'"):
        nn.set_state_dict(model, weights)
    result = nn.set_state_dict(model, weights, strict=False)
    assert (result.loaded, result.missing, result.unexpected) == (7, ["1.mean"], ["head.weight"])


def test_floats_are_cast_to_the_variable_dtype_but_integers_are_refused():
    layer = nn.Linear(2, 2)
    nn.set_state_dict(layer, {"weight": np.eye(2, dtype=np.float64), "bias": np.zeros(2, np.float16)})
    assert layer.weight[...].dtype == np.float32 and layer.weight[...].tolist() == [[1, 0], [0, 1]]
    with pytest.raises(WeightsError, match="tensor 'bias' is int32, the model's 'bias' is float32"):
        nn.set_state_dict(layer, {"weight": np.eye(2), "bias": np.zeros(2, np.int32)})


def test_convert_renames_and_transposes_foreign_checkpoints(tmp_path):
    layer = nn.Linear(2, 3)
    torch_style = {"fc.weight": np.arange(6, dtype=np.float32).reshape(3, 2), "fc.bias": np.ones(3, np.float32),
                   "fc.num_batches_tracked": np.zeros((), np.int64)}
    safetensors.numpy.save_file(torch_style, tmp_path / "t.safetensors")

    def convert(name, value):
        if name.endswith("num_batches_tracked"):
            return None
        name = name.removeprefix("fc.")
        return name, (value.T if name == "weight" else value)

    nn.load_weights(layer, tmp_path / "t.safetensors", convert=convert)
    assert layer.weight[...].tolist() == [[0, 2, 4], [1, 3, 5]]


def test_two_sources_mapping_to_one_name_is_an_error(tmp_path):
    safetensors.numpy.save_file({"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}, tmp_path / "t.safetensors")
    with pytest.raises(WeightsError, match="two tensors map to 'bias' \\(the second is 'b'\\)"):
        nn.load_weights(nn.Linear(2, 3), tmp_path / "t.safetensors", convert=lambda n, v: ("bias", v))


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all", b"\xff" * 64])
def test_a_corrupt_file_is_a_weights_error_naming_it(tmp_path, content):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightsError, match="broken.safetensors"):
        nn.load_weights(nn.Linear(2, 3), path)
