"""fp8 conversion: linear layers with e4m3 weights and e4m3 activations.

``convert_fp8`` turns every ``linear`` (and every ``matmul`` whose second operand is a 2-D
parameter, untransposed) of a float program into ``fp8_linear``: the weight is stored as
float8 e4m3 (``<weight>.fp8``, a quarter of its float32 bytes) with a float32 scale, its
absolute maximum per output channel or per tensor (``<weight>.fp8_scale``); the activation is
quantized at run time with its own absolute maximum. No calibration is needed. Run ``dce``
afterwards to drop the float weights.

fp8 dots are fast only on GPUs of compute capability 8.9 or newer (Ada, Hopper); on other
devices the pass refuses with a message pointing to ``convert_int8``, unless ``emulate=true``
(XLA then upcasts the e4m3 operands: the same numbers, slowly -- useful to measure fp8's
accuracy on a CPU). The check looks at the default device of the process running the pass.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 2)),
...                 params={"w": jnp.array([[1.0, -0.5], [0.25, 2.0]])})
>>> fp8 = pj.passes.run(prog, "convert_fp8{emulate=true},dce")
>>> [op.type for op in fp8.walk() if op.type != "param"], fp8.params["w.fp8"].dtype.name
(['fp8_linear', 'return'], 'float8_e4m3fn')
>>> fp8.params["w.fp8_scale"].tolist()   # per output channel
[1.0, 2.0]
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.ir.core import Op, Program, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops.fp8 import quantize_fp8
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.passes.options import op_types
from paddlejax.passes.query import param_name, stored_array, weight_of

CONVERTIBLE = ("linear", "matmul")
MIN_COMPUTE_CAPABILITY = (8, 9)


def fp8_device_problem(device=None) -> str | None:
    """Why ``device`` (default: the first JAX device) cannot run fp8 dots fast, or None if it
    can: that needs a GPU of compute capability >= 8.9. (TPUs are refused too: their fp8
    support has not been checked here.)

    >>> import types
    >>> print(fp8_device_problem(types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100",
    ...                                                compute_capability="9.0")))
    None
    >>> fp8_device_problem(types.SimpleNamespace(platform="gpu", device_kind="NVIDIA A100",
    ...                                          compute_capability="8.0"))
    'this device is gpu (NVIDIA A100, compute capability 8.0)'
    """
    device = device if device is not None else jax.devices()[0]
    capability = getattr(device, "compute_capability", None) if device.platform == "gpu" else None
    if capability is not None:
        version = re.fullmatch(r"(\d+)\.(\d+)", str(capability))
        if version is not None and tuple(map(int, version.groups())) >= MIN_COMPUTE_CAPABILITY:
            return None
        return f"this device is gpu ({device.device_kind}, compute capability {capability})"
    kind = f" ({device.device_kind})" if device.device_kind != device.platform else ""
    return f"this device is {device.platform}{kind}"


def _weight(op: Op) -> str | None:
    """The parameter name of ``op``'s float weight if ``op`` can become ``fp8_linear``."""
    x, w = op.input("x"), weight_of(op)
    name = param_name(w)
    if name is None or len(w.type.shape) != 2 or not all(jnp.issubdtype(v.type.dtype, jnp.floating)
                                                         for v in (x, w)):
        return None
    if op.result.type.dtype != x.type.dtype:  # fp8_linear returns x's dtype
        return None
    if op.type == "matmul" and (op.attrs.get("transpose_x") or op.attrs.get("transpose_y")):
        return None
    return name


@register_pass
@dataclasses.dataclass(frozen=True)
class ConvertFp8(Pass):
    """Replace the ops ``ops`` (colon-separated: ``linear``, ``matmul``) over a stored float
    weight whose name does not match the regular expression ``skip`` by ``fp8_linear`` (see
    the module doc). ``channel_wise`` gives each output channel its own weight scale;
    ``emulate`` converts even where the device has no fp8 dots. A weight shared by several ops
    is stored once.

    Statistics: ``fp8`` ops converted.
    """

    name = "convert_fp8"
    ops: str = ":".join(CONVERTIBLE)
    skip: str = ""
    channel_wise: bool = True
    emulate: bool = False

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        types = op_types(self.ops, CONVERTIBLE, "convert_fp8: cannot convert")
        problem = None if self.emulate else fp8_device_problem()
        if problem is not None:
            raise ValueError(f"convert_fp8: fp8 (e4m3) kernels need a GPU with compute capability >= 8.9 "
                             f"(Ada, Hopper or newer); {problem}. Use int8 (convert_int8) here, or emulate=true "
                             f"to simulate fp8 numerics on this device (slow).")
        skip = re.compile(self.skip) if self.skip else None
        rewriter = Rewriter(program)
        stored: dict[str, tuple[Value, Value]] = {}
        converted = 0
        for op in [op for op in program.walk() if op.type in types]:
            weight = _weight(op)
            if weight is None or skip is not None and skip.search(weight):
                continue
            if weight not in stored:
                stored[weight] = self._store(rewriter, weight, stored_array(program, weight_of(op)))
            attrs = {k: op.attrs[k] for k in ("act", "act_alpha") if k in op.attrs}
            new = Op("fp8_linear", [op.operands[0], *stored[weight], *op.operands[2:]], [op.result.type], attrs,
                     loc=op.loc)
            rewriter.replace_op(op, [rewriter.insert_before(op, new).result])
            converted += 1
        return PassResult(rewriter.changed, {"fp8": converted})

    def _store(self, rewriter: Rewriter, name: str, w: np.ndarray) -> tuple[Value, Value]:
        """The e4m3 weight and its scale as new parameters ``<name>.fp8``, ``<name>.fp8_scale``."""
        scale = np.abs(w).max(axis=0 if self.channel_wise else None).astype(np.float32)
        w_fp8 = quantize_fp8(w, scale, axis=1 if self.channel_wise else None)
        return rewriter.param(f"{name}.fp8", w_fp8), rewriter.param(f"{name}.fp8_scale", scale)
