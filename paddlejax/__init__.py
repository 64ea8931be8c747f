"""paddlejax: a PaddlePaddle-style program IR, passes and runtime on JAX/XLA.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(x) + 1.0, jnp.ones((2, 3)))
>>> prog(jnp.zeros((2, 3))).tolist()
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""
import importlib

from paddlejax import ops
from paddlejax.capture import CaptureError, InputSpec, trace
from paddlejax.io import ProgramFormatError, load, save
from paddlejax.ir import Program
from paddlejax.stablehlo import export

__version__ = "0.1.0"

_LAZY = {"passes", "models", "slim", "hub"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"paddlejax.{name}")
    raise AttributeError(f"module 'paddlejax' has no attribute '{name}'")


__all__ = ["ops", "trace", "InputSpec", "CaptureError", "Program", "save", "load",
           "ProgramFormatError", "export", "passes", "models", "slim", "hub", "__version__"]
