"""paddlejax: a PaddlePaddle-style program IR, passes and runtime on JAX/XLA.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(x) + 1.0, jnp.ones((2, 3)))
>>> prog(jnp.zeros((2, 3))).tolist()
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""
import importlib

from paddlejax.dispatch import dispatch_from_environment
from paddlejax.host_memory import keep_freed_memory

keep_freed_memory()  # before JAX's first computation: see paddlejax.host_memory
dispatch_from_environment()  # PADDLEJAX_CPU_DISPATCH, before JAX creates its CPU client

from paddlejax import ops  # noqa: E402
from paddlejax.capture import CaptureError, InputSpec, trace  # noqa: E402
from paddlejax.io import ProgramFormatError, load, save  # noqa: E402
from paddlejax.ir import Program  # noqa: E402
from paddlejax.stablehlo import export  # noqa: E402

__version__ = "0.1.0"

_LAZY = {"convert", "passes", "models", "slim", "hub", "nn", "data", "train", "inference", "distributed", "optimizer",
         "distribution", "sparse", "geometric"}
# Runtime functions, imported on first use so that ``import paddlejax`` stays light.
_LAZY_ATTRS = {"to_static": "paddlejax.static", "check_nan_inf": "paddlejax.nancheck",
               "NonFiniteError": "paddlejax.nancheck", "Trainer": "paddlejax.train", "Model": "paddlejax.hapi",
               "summary": "paddlejax.hapi", "StreamingPredictor": "paddlejax.streaming", "parse": "paddlejax.ir.parser", "ParseError": "paddlejax.ir.parser",
               **{n: "paddlejax.autodiff" for n in ("grad", "value_and_grad", "gradients", "jacobian",
                                                    "hessian", "jvp", "vjp")}}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"paddlejax.{name}")
    if name in _LAZY_ATTRS:
        return getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
    raise AttributeError(f"module 'paddlejax' has no attribute '{name}'")


__all__ = ["ops", "trace", "InputSpec", "CaptureError", "Program", "save", "load",
           "ProgramFormatError", "export", "__version__", *sorted(_LAZY), *sorted(_LAZY_ATTRS)]
