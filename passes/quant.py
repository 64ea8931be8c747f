"""Quantization passes: simulate int8 with fake-quant ops, then convert to int8 kernels.

``insert_fake_quant`` puts a ``fake_quantize`` (quantize, then dequantize, with straight-through
gradients) in front of the inputs of every conv2d / depthwise_conv2d / linear / matmul chosen
by its options: on the weight, with the weight's absolute maximum per output channel (or per
tensor) as its scale, and on each activation input, with a scale parameter named
``<op name>.input_scale`` (``.x_scale`` / ``.y_scale`` for a matmul of two activations) that
calibration (:func:`paddlejax.slim.quant.calibrate`) or training sets. The program then
computes what the int8 program will, in float: the one to evaluate, calibrate and train (QAT).

``convert_int8`` turns each op whose inputs are all fake-quantized into its int8 kernel:
``quantize`` of the activation, the weight stored as an int8 parameter (``<weight>.int8``),
and ``quantized_conv2d`` / ``quantized_linear`` / ``quantized_matmul``, which multiply int8 by
int8 with int32 accumulation and rescale once. A linear, matmul or convolution whose activation
is not fake-quantized but whose weight is becomes ``weight_only_linear`` /
``weight_only_conv2d`` (the weight int8, or int4 packed two to a byte as uint8). The
converted program equals the fake-quant one up to float rounding of the rescale (the tests use
1e-5 relative).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 2)),
...                 params={"w": jnp.array([[1.0, -0.5], [0.25, 2.0]])})
>>> fake = pj.passes.run(prog, "insert_fake_quant")
>>> [op.type for op in fake.walk() if op.type != "param"]
['fake_quantize', 'fake_quantize', 'linear', 'return']
>>> fake.params["w.quant_scale"].tolist()   # per output channel
[1.0, 2.0]
>>> int8 = pj.passes.run(fake, "convert_int8,dce")
>>> [op.type for op in int8.walk() if op.type != "param"], int8.params["w.int8"].dtype.name
(['quantize', 'quantized_linear', 'return'], 'int8')
"""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from paddlejax.ir.core import Op, Program, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops.common import channel_axis
from paddlejax.ops.conv import paddle_padding
from paddlejax.ops.quant import abs_max, asym_grid, pack_int4, qmax, quantize
from paddlejax.passes.base import Pass, PassContext, PassResult, register_pass
from paddlejax.ops import registry
from paddlejax.passes.options import op_types
from paddlejax.passes.query import only_reader, param_name, stored_array, weight_of, weighted

# The ops whose traits name a quantizable weight: conv2d, depthwise_conv2d, linear, matmul.
QUANTIZABLE = tuple(name for name, opdef in registry.all_ops().items() if opdef.traits.weight is not None)
SCALE_SUFFIX = {"weight": "quant_scale", "input": "input_scale", "x": "x_scale", "y": "y_scale"}


def weight_axis(op: Op) -> int | None:
    """The output-channel axis of ``op``'s weight, or None for a per-tensor scale, as its
    traits declare: 0 for an OIHW conv weight, the last for a linear ``[in, out]`` weight or
    a matmul ``y``."""
    return op.traits.weight_out_axis(op.attrs, len(weight_of(op).type.shape))


FAKE_QUANT = ("fake_quantize", "fake_quantize_asym")


def is_fake_quantized(v: Value) -> bool:
    """Whether ``v`` is the output of a fake-quant op."""
    return v.producer is not None and v.producer.type in FAKE_QUANT


def quant_layers(program: Program, types=QUANTIZABLE) -> list[tuple[Op, str]]:
    """The ops of ``types`` in ``program`` that ``insert_fake_quant`` can quantize, each with the
    name its ``skip`` option matches: the weight's parameter name (seen through a fake quant),
    or ``<type>_<k>`` for the k-th matmul of two activations. A conv or linear over a computed
    weight is left out: there is nothing to store as int8.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.matmul(pj.ops.linear(x, p["w"]), x), jnp.ones((2, 2)),
    ...                 params={"w": jnp.ones((2, 2))})
    >>> [(op.type, name) for op, name in quant_layers(prog)]
    [('linear', 'w'), ('matmul', 'matmul_0')]
    """
    layers, unnamed = [], 0
    for op in program.walk():
        if op.type not in types:
            continue
        weight = weight_of(op)
        weight = param_name(weight.producer.operands[0] if is_fake_quantized(weight) else weight)
        if weight is None and op.type != "matmul":
            continue
        layers.append((op, weight or f"{op.type}_{unnamed}"))
        unnamed += weight is None
    return layers


@register_pass
@dataclasses.dataclass(frozen=True)
class InsertFakeQuant(Pass):
    """Fake-quantize the inputs of the ops ``ops`` (colon-separated types) whose name -- the
    weight's parameter name, or ``<type>_<k>`` for a matmul of two activations -- does not
    match the regular expression ``skip``. ``weight_bits`` / ``act_bits`` are 8 or 4 (0:
    leave that input in float, e.g. ``act_bits=0`` for weight-only quantization);
    ``channel_wise`` gives each output channel of a weight its own scale;
    ``act_symmetric=false`` quantizes activations asymmetrically, with a calibrated range
    (``<op name>.input_min`` / ``.input_max``; the ``min_max`` observer). An activation read
    by several of the ops has one scale, named after the first. Ops already fake-quantized
    are left alone, so running the pass twice changes nothing. With ``shortcuts`` (and 8-bit
    symmetric activations), a residual add of two quantized ops' outputs (a block's last
    convolution and its projection shortcut) also fake-quantizes the smaller op's output
    (``<weight>.output_scale``, Paddle's output threshold): the ``int8_dataflow`` pass then adds
    that shortcut to the other convolution in int8.

    Statistics: ``ops`` quantized, ``weights`` and ``activations`` fake-quantized, ``shortcuts``.
    """

    name = "insert_fake_quant"
    ops: str = ":".join(QUANTIZABLE)
    skip: str = ""
    weight_bits: int = 8
    act_bits: int = 8
    channel_wise: bool = True
    act_symmetric: bool = True
    shortcuts: bool = True

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        types = op_types(self.ops, QUANTIZABLE, "insert_fake_quant: cannot quantize")
        for option in ("weight_bits", "act_bits"):
            if getattr(self, option) not in (0, 4, 8):
                raise ValueError(f"insert_fake_quant: {option} must be 8, 4 or 0 (float), got {getattr(self, option)}")
        skip = re.compile(self.skip) if self.skip else None
        rewriter = Rewriter(program)
        stats = {"ops": 0, "weights": 0, "activations": 0}
        shared: dict[tuple, Value] = {}  # (activation, block) -> its fake-quantized value
        for op, name in quant_layers(program, types):
            if any(is_fake_quantized(v) for v in (op.input("x"), weight_of(op))):
                continue
            if skip is not None and skip.search(name):
                continue
            weight = param_name(weight_of(op))
            changed = False
            if weight is not None and self.weight_bits:
                axis = weight_axis(op) if self.channel_wise else None
                scale = self._weight_scale(rewriter, op, f"{weight}.{SCALE_SUFFIX['weight']}", axis)
                self._fake_quantize(rewriter, op, 1, scale, self.weight_bits, axis)
                stats["weights"] += 1
                changed = True
            if self.act_bits:
                inputs = [0] if weight is not None else [0, 1]
                for i in inputs:
                    key = (op.operands[i], op.parent)
                    if key in shared:  # one scale per tensor, as PaddleSlim: e.g. q, k and v projections
                        rewriter.set_operand(op, i, shared[key])
                    else:
                        role = "input" if weight is not None else "xy"[i]
                        scale_name = f"{name}.{SCALE_SUFFIX[role]}"
                        if self.act_symmetric:
                            scale = self._activation_scale(rewriter, op, i, scale_name, ctx)
                            shared[key] = self._fake_quantize(rewriter, op, i, scale, self.act_bits, None)
                        else:
                            shared[key] = self._fake_quantize_asym(rewriter, op, i, scale_name)
                        stats["activations"] += 1
                    changed = True
            stats["ops"] += changed
        if self.shortcuts and self.act_bits == 8 and self.act_symmetric:
            stats["shortcuts"] = self._fake_quantize_shortcuts(rewriter, ctx)
        return PassResult(rewriter.changed, stats)

    def _fake_quantize_shortcuts(self, rewriter: Rewriter, ctx: PassContext) -> int:
        """Fake-quantize the smaller summand of each add of two fake-quantized ops' outputs read
        only by it; returns how many."""
        def quantized_output(v: Value, add: Op) -> bool:
            op = v.producer
            return (op is not None and op.type in QUANTIZABLE and weight_of(op) is not None
                    and is_fake_quantized(op.operands[0]) and is_fake_quantized(weight_of(op))
                    and only_reader(v, add) and v.type == add.result.type)

        count = 0
        for add in [op for op in rewriter.program.walk() if op.canonical[0] == "elementwise_add"]:
            if len(add.operands) != 2 or not all(quantized_output(v, add) for v in add.operands):
                continue
            index = min((0, 1), key=lambda i: np.prod(weight_of(add.operands[i].producer).type.shape))
            weight = param_name(weight_of(add.operands[index].producer).producer.operands[0])
            scale = self._activation_scale(rewriter, add, index, f"{weight}.output_scale", ctx)
            self._fake_quantize(rewriter, add, index, scale, 8, None)
            count += 1
        return count

    def _weight_scale(self, rewriter: Rewriter, op: Op, name: str, axis: int | None) -> Value:
        """The weight's absolute maximum (per channel along ``axis``), stored as parameter ``name``."""
        stored = stored_array(rewriter.program, weight_of(op))
        return rewriter.param(name, np.asarray(abs_max(stored, axis=axis), np.float32))

    def _activation_scale(self, rewriter: Rewriter, op: Op, index: int, name: str, ctx: PassContext) -> Value:
        """A scale parameter ``name`` for calibration to set."""
        return rewriter.param(name, np.float32(1.0))

    @staticmethod
    def _fake_quantize(rewriter: Rewriter, op: Op, index: int, scale: Value, bits: int, axis: int | None) -> Value:
        v = op.operands[index]
        fq = rewriter.insert_before(op, Op("fake_quantize", [v, scale], [v.type], {"bits": bits, "axis": axis},
                                           loc=op.loc))
        rewriter.set_operand(op, index, fq.result)
        return fq.result

    def _fake_quantize_asym(self, rewriter: Rewriter, op: Op, index: int, scale_name: str) -> Value:
        """``fake_quantize_asym`` with range parameters named like ``scale_name``, for calibration to set."""
        v, base = op.operands[index], scale_name.removesuffix("_scale")
        low, high = rewriter.param(f"{base}_min", np.float32(0.0)), rewriter.param(f"{base}_max", np.float32(1.0))
        fq = rewriter.insert_before(op, Op("fake_quantize_asym", [v, low, high], [v.type],
                                           {"bits": self.act_bits, "axis": None}, loc=op.loc))
        rewriter.set_operand(op, index, fq.result)
        return fq.result


@register_pass
@dataclasses.dataclass(frozen=True)
class QuantAware(InsertFakeQuant):
    """Fake-quantize for quantization-aware training (PaddleSlim's ``quant_aware``): the same
    choice of ops and options as ``insert_fake_quant``, but a weight's scale is its absolute
    maximum computed in the program (``abs_max``), so it follows the weight as it trains, and
    an activation's scale is PaddleSlim's ``moving_average_abs_max`` with rate
    ``moving_rate``. In a training program (see :class:`~paddlejax.passes.PassContext`) each
    activation's scale and observer state (``<scale>`` and ``<scale>_state`` parameters) are
    updated on every step and returned among the updates, and the step quantizes with the new
    scale; in an inference program the scale is read. ``convert_int8`` turns either into int8.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> train = pj.trace(lambda p, x: (pj.ops.linear(x, p["w"]), {}), pj.InputSpec((None, 2)),
    ...                  params={"w": jnp.ones((2, 3))})
    >>> qat = pj.passes.run(train, "quant_aware", training=True)
    >>> out, updates = qat(jnp.array([[0.5, -2.0]]))
    >>> sorted(updates), float(updates["w.input_scale"])
    (['w.input_scale', 'w.input_state'], 2.0)
    """

    name = "quant_aware"
    moving_rate: float = 0.9

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        if not 0 <= self.moving_rate < 1:
            raise ValueError(f"quant_aware: moving_rate must be in [0, 1), got {self.moving_rate}")
        if not self.act_symmetric:
            raise ValueError("quant_aware: activations train with symmetric moving-average scales; "
                             "act_symmetric=false is for post-training quantization (insert_fake_quant)")
        outputs = jax.tree_util.tree_unflatten(program.out_tree, program.outputs)
        if ctx.training and not (isinstance(outputs, tuple) and len(outputs) == 2 and isinstance(outputs[1], dict)):
            raise ValueError(f"quant_aware: a training program returns (outputs, updates), as "
                             f"to_static(model, train=True) captures it; {program.name} returns "
                             f"{jax.tree_util.tree_structure(outputs)}")
        updates = ctx.cache[self.name] = {}  # filled by _activation_scale
        result = super().apply(program, ctx)
        if updates:
            program.set_outputs((outputs[0], {**outputs[1], **updates}))
        return result

    def _weight_scale(self, rewriter: Rewriter, op: Op, name: str, axis: int | None) -> Value:
        w = weight_of(op)
        shape = () if axis is None else (w.type.shape[axis],)
        return rewriter.insert_before(op, Op("abs_max", [w], [TensorType(shape, "float32")], {"axis": axis},
                                             loc=op.loc)).result

    def _activation_scale(self, rewriter: Rewriter, op: Op, index: int, name: str, ctx: PassContext) -> Value:
        scale = rewriter.param(name, np.float32(1.0))
        if not ctx.training:
            return scale
        state_name = name.removesuffix("_scale") + "_state"
        state = rewriter.param(state_name, np.float32(0.0))
        scalar = TensorType((), "float32")
        observe = rewriter.insert_before(op, Op("moving_average_abs_max", [op.operands[index], scale, state],
                                                [scalar, scalar], {"rate": self.moving_rate}, loc=op.loc))
        ctx.cache[self.name].update({name: observe.results[0], state_name: observe.results[1]})
        return observe.results[0]


def _known_weight_scale(program: Program, fq: Op) -> np.ndarray | None:
    """The scale of a fake-quantized parameter: stored (PTQ), or the ``abs_max`` of the
    parameter computed in the program (QAT); None for anything else."""
    scale = fq.input("scale")
    stored = stored_array(program, scale)
    if stored is None and scale.producer is not None and scale.producer.type == "abs_max" \
            and scale.producer.operands[0] is fq.operands[0]:
        stored = abs_max(stored_array(program, fq.operands[0]), axis=scale.producer.attrs["axis"])
    return None if stored is None else np.asarray(stored, np.float32)


def is_stored_weight(program: Program, fq: Op) -> bool:
    """Whether ``fq`` fake-quantizes a parameter with a stored or computable scale, which
    conversion can store as int8."""
    return param_name(fq.operands[0]) is not None and _known_weight_scale(program, fq) is not None


def quantized_weight(program: Program, fq: Op) -> tuple[np.ndarray, np.ndarray, int, int | None]:
    """(int8 values, scale, bits, axis) of a fake-quantized parameter, by the ``quantize`` op."""
    w = stored_array(program, fq.operands[0])
    scale = _known_weight_scale(program, fq)
    bits, axis = fq.attrs["bits"], fq.attrs["axis"]
    return np.asarray(quantize(w, scale, bits=bits, axis=axis)), scale, bits, axis


def _conv_attrs(op: Op) -> dict:
    """The attributes of a conv or depthwise conv for a quantized conv kernel: without the
    float kernel's variant choice, with the depthwise conv's groups."""
    attrs = {k: v for k, v in op.attrs.items() if k != "kernel"}
    attrs.setdefault("groups", op.operands[0].type.shape[channel_axis(attrs["data_format"], 4)])
    return attrs


@register_pass
@dataclasses.dataclass(frozen=True)
class ConvertInt8(Pass):
    """Replace fake-quantized conv / linear / matmul ops by their int8 kernels (see the module
    doc). Only 8-bit activations run as int8; the weights of a layer with a float activation
    become weight-only (int8, or int4 packed as uint8). ``dce`` afterwards drops the float
    weights.

    An asymmetric activation's zero point is folded into the layer's bias, which needs a
    linear or a convolution (whose padding is then made explicit, with the int8 value of 0.0);
    other layers it reads stay fake-quantized, in float (statistic ``asym_float``).

    Statistics: ``int8`` ops, ``weight_only`` ops and ``asym_float`` ops left.
    """

    name = "convert_int8"

    def apply(self, program: Program, ctx: PassContext) -> PassResult:
        rewriter = Rewriter(program)
        stats = {"int8": 0, "weight_only": 0, "asym_float": 0}
        quantized: dict[Op, Value] = {}  # fake_quantize op -> the int8 value, shared by its readers
        for op in [op for op in program.walk() if op.type in QUANTIZABLE]:
            x, w = op.input("x"), weight_of(op)
            y_fq = w.producer if is_fake_quantized(w) else None
            w_fq = y_fq if y_fq is not None and is_stored_weight(program, y_fq) else None
            x_fq = x.producer if is_fake_quantized(x) and x.producer.attrs["bits"] == 8 else None
            if x_fq is not None and x_fq.type == "fake_quantize_asym" and not self._asym_convertible(program, op, w_fq):
                stats["asym_float"] += 1
                continue
            # int8 x int8: a stored 8-bit weight, or a matmul's second (symmetric) activation
            if x_fq is not None and y_fq is not None and y_fq.attrs["bits"] == 8 and \
                    (w_fq or op.type == "matmul" and y_fq.type == "fake_quantize"):
                self._int8(rewriter, op, x_fq, y_fq, w_fq is not None, quantized)
                stats["int8"] += 1
            elif w_fq is not None and not is_fake_quantized(x) and self._weight_only(rewriter, op, w_fq):
                stats["weight_only"] += 1
        for op in [op for op in program.walk() if op.type in FAKE_QUANT and not op.result.uses]:
            rewriter.erase_op(op)
        return PassResult(rewriter.changed, stats)

    def _int8(self, rewriter: Rewriter, op: Op, x_fq: Op, w_fq: Op, stored: bool, quantized: dict) -> None:
        x_q = self._quantize(rewriter, x_fq, quantized)
        if stored:
            name = param_name(w_fq.operands[0])
            q, scale, _, _ = quantized_weight(rewriter.program, w_fq)
            w_q = rewriter.param(f"{name}.int8", q)
            w_scale = w_fq.input("scale")
            if param_name(w_scale) is None:  # computed by QAT's abs_max: store it
                w_scale = rewriter.param(f"{name}.{SCALE_SUFFIX['weight']}", scale)
        else:  # a matmul of two activations
            w_q, w_scale = self._quantize(rewriter, w_fq, quantized), w_fq.input("scale")
        x_scale, rest = x_fq.operands[1], op.operands[2:]
        conv = op.has_trait("layout_sensitive")
        attrs = _conv_attrs(op) if conv else dict(op.attrs)
        if x_fq.type == "fake_quantize_asym":
            x_scale, rest, zero = self._asym_terms(rewriter, op, x_fq, q, scale, quantized)
            if conv:
                x_q = self._pad_with_zero(rewriter, op, x_q, zero, attrs)
        if conv:
            new = Op("quantized_conv2d", [x_q, w_q, x_scale, w_scale, *rest], [op.result.type], attrs, loc=op.loc)
        elif op.type == "linear":
            new = Op("quantized_linear", [x_q, w_q, x_scale, w_scale, *rest], [op.result.type], attrs, loc=op.loc)
        else:
            new = Op("quantized_matmul", [x_q, w_q, x_scale, w_scale], [op.result.type], attrs, loc=op.loc)
        rewriter.replace_op(op, [rewriter.insert_before(op, new).result])

    @staticmethod
    def _quantize(rewriter: Rewriter, fq: Op, quantized: dict) -> Value:
        """The int8 value of ``fq``'s input, made once, right after ``fq``."""
        if fq not in quantized:
            x = fq.operands[0]
            int8 = TensorType(x.type.shape, "int8")
            new = Op("quantize", fq.operands, [int8], dict(fq.attrs), loc=fq.loc) if fq.type == "fake_quantize" \
                else Op("quantize_asym", fq.operands, [int8], {"bits": fq.attrs["bits"]}, loc=fq.loc)
            quantized[fq] = rewriter.insert_after(fq, new).result
        return quantized[fq]

    @staticmethod
    def _asym_convertible(program: Program, op: Op, w_fq: Op | None) -> bool:
        """Whether an asymmetric activation's zero point folds into ``op``'s bias: a linear or a
        convolution with a stored weight, range and bias (or none)."""
        x_fq = op.operands[0].producer
        bias = op.input("bias") if weighted(op.type) else None
        return weighted(op.type) and w_fq is not None \
            and all(stored_array(program, v) is not None for v in x_fq.operands[1:]) \
            and (bias is None or stored_array(program, bias) is not None)

    @staticmethod
    def _pad_with_zero(rewriter: Rewriter, op: Op, x_q: Value, zero: int, attrs: dict) -> Value:
        """``x_q`` padded for the convolution ``op`` with ``zero``, the int8 value that stands for
        0.0 (a convolution's own padding adds int8 zeros, which stand for ``-zero * step``);
        ``attrs`` then say no padding."""
        shape, fmt = x_q.type.shape, attrs["data_format"]
        spatial = [i for i in range(4) if i not in (0, channel_axis(fmt, 4))]
        pads, dilation = paddle_padding(attrs["padding"], [shape[i] for i in spatial], weight_of(op).type.shape[2:],
                                        attrs["stride"], attrs["dilation"])
        attrs.update(padding=((0, 0), (0, 0)), dilation=tuple(dilation))
        if not any(p for pair in pads for p in pair):
            return x_q
        paddings = [0] * 8
        for i, (lo, hi) in zip(spatial, pads):
            paddings[2 * i:2 * i + 2] = lo, hi
        padded = TensorType(tuple(n + paddings[2 * i] + paddings[2 * i + 1] if i in spatial else n
                                  for i, n in enumerate(shape)), "int8")
        pad = Op("pad", [x_q], [padded], {"paddings": tuple(paddings), "mode": "constant", "value": float(zero)},
                 loc=op.loc)
        return rewriter.insert_before(op, pad).result

    @staticmethod
    def _asym_terms(rewriter: Rewriter, op: Op, x_fq: Op, w_q: np.ndarray, w_scale: np.ndarray,
                    quantized: dict) -> tuple[Value, list[Value], int]:
        """The activation scale and bias that fold an asymmetric activation into a symmetric
        int8 kernel, and the int8 value that stands for 0.0: the kernel sees ``v = q - 128``
        whose zero is ``zero_point - 128``, so ``x_scale = 127 * step`` and the bias loses
        ``step * w_scale / 127 * (zero_point - 128) * (sum of the weight's int8 values per
        output channel)``."""
        program = rewriter.program
        step, zero_point = (np.asarray(v, np.float32) for v in
                            asym_grid(*(stored_array(program, v) for v in x_fq.operands[1:]), x_fq.attrs["bits"]))
        if (x_fq, "scale") not in quantized:
            base = param_name(x_fq.operands[1]).removesuffix("_min")
            quantized[x_fq, "scale"] = rewriter.param(f"{base}_scale", qmax(8) * step)
        sums = w_q.astype(np.int64).sum(axis=0 if op.type == "linear" else (1, 2, 3))
        shift = (step * w_scale / qmax(8) * (zero_point - 2 ** (x_fq.attrs["bits"] - 1)) * sums).astype(np.float32)
        bias = stored_array(program, op.input("bias")) if op.input("bias") is not None else np.zeros_like(shift)
        name = param_name(weight_of(op).producer.input("x"))
        zero = int(zero_point) - 2 ** (x_fq.attrs["bits"] - 1)
        return quantized[x_fq, "scale"], [rewriter.param(f"{name}.zero_point_bias", bias - shift)], zero

    @staticmethod
    def _weight_only(rewriter: Rewriter, op: Op, w_fq: Op) -> bool:
        """``op`` as ``weight_only_linear`` or ``weight_only_conv2d`` (weight int8 or packed int4),
        where one computes it: a linear, a 2-D matmul weight without transposes, a convolution."""
        conv = op.has_trait("layout_sensitive")
        out_axis = weight_axis(op) if op.type != "matmul" else len(weight_of(op).type.shape) - 1
        if w_fq.attrs["axis"] not in (None, out_axis) \
                or op.type == "matmul" and (op.attrs.get("transpose_x") or op.attrs.get("transpose_y")
                                            or len(weight_of(op).type.shape) != 2):
            return False
        q, scale, bits, axis = quantized_weight(rewriter.program, w_fq)
        name = param_name(w_fq.operands[0])
        w_q = rewriter.param(f"{name}.int4" if bits == 4 else f"{name}.int8", pack_int4(q) if bits == 4 else q)
        if axis is None:  # the weight-only ops take a per-output-channel scale
            scale = np.full(q.shape[out_axis], scale, np.float32)
        if conv:
            attrs = {"bits": bits, **_conv_attrs(op)}
        else:
            attrs = {"bits": bits, **{k: op.attrs[k] for k in ("act", "act_alpha") if k in op.attrs}}
        new = Op("weight_only_conv2d" if conv else "weight_only_linear",
                 [op.operands[0], w_q, rewriter.param(f"{name}.weight_scale", scale), *op.operands[2:]],
                 [op.result.type], attrs, loc=op.loc)
        rewriter.replace_op(op, [rewriter.insert_before(op, new).result])
        return True
