"""Fusion passes for inference: fold batch norms into the conv/linear before them, fuse bias
adds and activations into the op that computes into them, and cancel transposes.

- ``fold_conv_bn`` / ``fold_linear_bn``: an inference-mode ``batch_norm`` that is the only
  reader of a convolution / linear with parameter weights becomes that op with new
  parameters ``w * s`` and ``(b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)`` per output
  channel (named ``<weight>.folded`` and ``<bias>.folded``; ``dce`` then drops the old ones).
  A multiply by a stored number, or by one per output channel (an exporter's affine scale),
  folds the same way (``<weight>.scaled``); so does an affine ``z * a + c`` of the input (one
  number or one per input channel) into a linear or an unpadded single-group convolution
  (``<weight>.affine``, bias ``+ sum(w * c)``). Tolerance: float32 rounding of the folded
  weights, about 1e-5 relative.
- ``fuse_bias_act``: a conv / linear without a bias, followed by an add of a per-channel
  vector (or of one stored number, as C copies), takes the vector as its bias input; an
  activation that is the only reader of such an op (or of its int8 or weight-only version)
  becomes its ``act`` attribute. Exact up to float rounding (1e-6).
- ``fuse_elementwise_act``: the same for an activation after an ``elementwise_*`` binary op.
- ``fuse_conv_pool``: a ``pool2d`` (not global) that is the only reader of a ``conv2d`` of the
  same ``data_format`` becomes one ``conv2d_pool``, whose oneDNN kernel pools the convolution's
  output while it is in cache instead of writing it to memory. Exact: the fused op's kernels are
  the two ops' (a ``kernel`` the conv carried is dropped: ``autotune`` chooses again).

Which ops qualify is read from the op library, not listed here: a *weighted* op is one whose
traits name a quantizable ``weight`` with an output-channel axis and that takes an optional
``bias`` input (conv2d, depthwise_conv2d, linear); it *fuses activations* when it has an
``act`` attribute; convolutions are the layout-sensitive ones among them.
- ``eliminate_transposes``: ``transpose(transpose(x, p), q)`` becomes ``x`` when the two cancel
  and one transpose by the composed permutation otherwise; identity transposes disappear; a
  pointwise op (the ``pointwise`` trait) whose tensor operands are all transposes by one permutation
  runs before the transpose instead (it sinks), so that it can meet and cancel its inverse.
  Exact.

Intermediate values must have no other readers, so nothing is computed twice.

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.relu(pj.ops.elementwise_add(x, x)), jnp.ones(3))
>>> print(pj.passes.run(prog, "fuse_elementwise_act"))
program @<lambda>(%x: f32[3]) -> (f32[3]) {
  %0 = elementwise_add(%x, %x) {act="relu"} : f32[3]
  return %0
}
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from paddlejax.ir.core import Op, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops import registry
from paddlejax.ops.activation import as_fused_activation
from paddlejax.ops.common import channel_axis
from paddlejax.ops.traits import traits_of
from paddlejax.passes.base import register_pass
from paddlejax.passes.query import (fuses_activation, only_reader, scalar_constant, stored_array, transpose_perm,
                                    weighted)
from paddlejax.passes.rewrite import PatternPass, RewritePattern


def _channel_axis(op: Op) -> int:
    """The output-channel axis of a weighted op's result."""
    rank = len(op.result.type.shape)
    return channel_axis(op.attrs["data_format"], rank) if op.has_trait("layout_sensitive") else rank - 1


@dataclasses.dataclass(frozen=True)
class _FoldBatchNorm(RewritePattern):
    """``batch_norm(producer(x, w[, b]))`` in inference mode -> ``producer(x, w', b')``."""

    convolutions: bool  # fold into convolutions (layout-sensitive weighted ops), or into linears

    @property
    def label(self) -> str:
        return "folded"

    def folds_into(self, op: Op | None) -> bool:
        return (op is not None and weighted(op.type) and op.has_trait("layout_sensitive") == self.convolutions
                and op.attrs.get("act") is None)

    def match_and_rewrite(self, bn: Op, rewriter: Rewriter) -> bool:
        if bn.type != "batch_norm" or bn.attrs["training"] or any(r.uses for r in bn.results[1:]):
            return False
        x = bn.operands[0]
        op = x.producer
        if not self.folds_into(op) or not only_reader(x, bn):
            return False
        if _channel_axis(op) != channel_axis(bn.attrs["data_format"], len(x.type.shape)):
            return False
        weight, bias = op.input(op.traits.weight), op.input("bias")
        stored = [stored_array(rewriter.program, v) for v in (weight, bias, *bn.operands[1:]) if v is not None]
        if any(a is None for a in stored):
            return False
        w, b = stored[0], (stored[1] if bias is not None else None)
        mean, var = stored_array(rewriter.program, bn.input("running_mean")), \
            stored_array(rewriter.program, bn.input("running_var"))
        gamma, beta = (stored_array(rewriter.program, v) if v is not None else None
                       for v in (bn.input("weight"), bn.input("bias")))
        axis = op.traits.weight_out_axis(op.attrs, w.ndim)
        c = w.shape[axis]
        f64 = lambda a, default: np.full(c, default) if a is None else a.astype(np.float64)  # noqa: E731
        scale = f64(gamma, 1.0) / np.sqrt(f64(var, 0.0) + bn.attrs["epsilon"])
        shape = [1] * w.ndim
        shape[axis] = c
        new_w = (w.astype(np.float64) * scale.reshape(shape)).astype(w.dtype)
        new_b = ((f64(b, 0.0) - f64(mean, 0.0)) * scale + f64(beta, 0.0)).astype(w.dtype)
        w_name = weight.producer.attrs["name"]  # a param or named constant: both are named
        b_name = f"{bias.producer.attrs['name']}.folded" if b is not None else f"{w_name}.folded_bias"
        operands = [op.operands[0], rewriter.param(f"{w_name}.folded", new_w),
                    rewriter.param(b_name, new_b)]
        fused = rewriter.insert_before(bn, Op(op.type, operands, [x.type], op.attrs, loc=op.loc))
        rewriter.replace_all_uses_with(bn.results[0], fused.result)
        rewriter.erase_op(bn)
        rewriter.erase_op(op)
        return True


@dataclasses.dataclass(frozen=True)
class _FoldScale(RewritePattern):
    """``mul(producer(x, w[, b]), s)`` with a stored ``s`` that is one number or one per output
    channel (an exporter's affine scale: PP-LCNet's learnable affine blocks) -> ``producer(x,
    w * s, b * s)``."""

    convolutions: bool

    @property
    def label(self) -> str:
        return "scales"

    def match_and_rewrite(self, mul: Op, rewriter: Rewriter) -> bool:
        if mul.canonical[0] != "elementwise_mul" or mul.attrs.get("act") is not None:
            return False
        for i, v in enumerate(mul.operands):
            op = v.producer
            if not _FoldBatchNorm(self.convolutions).folds_into(op) or not only_reader(v, mul) \
                    or v.type != mul.result.type:
                continue
            axis = _channel_axis(op)
            scale = _channel_values(rewriter.program, mul.operands[1 - i], v.type, axis)
            weight, bias = op.input(op.traits.weight), op.input("bias")
            w = stored_array(rewriter.program, weight)
            b = stored_array(rewriter.program, bias) if bias is not None else None
            if scale is None or w is None or bias is not None and b is None:
                continue
            shape = [1] * w.ndim
            shape[op.traits.weight_out_axis(op.attrs, w.ndim)] = -1
            w_name = weight.producer.attrs["name"]
            operands = [op.operands[0], rewriter.param(f"{w_name}.scaled", (w * scale.reshape(shape)).astype(w.dtype))]
            if b is not None:
                operands.append(rewriter.param(f"{bias.producer.attrs['name']}.scaled", (b * scale).astype(b.dtype)))
            fused = rewriter.insert_before(mul, Op(op.type, operands, [v.type], op.attrs, loc=op.loc))
            rewriter.replace_op(mul, [fused.result])
            rewriter.erase_op(op)
            return True
        return False


@dataclasses.dataclass(frozen=True)
class _FoldInputAffine(RewritePattern):
    """``producer(z * a + c, w, b)`` with stored ``a`` and ``c`` (one number or one per input
    channel; either may be missing) -> ``producer(z, w * a, b + sum(w * c))``, for a linear or a
    convolution with no padding and one group, where the fold is exact (padding would add
    ``c`` at the border, where the original adds zeros). PP-LCNet puts such an affine between
    each activation and the 1x1 convolution after it."""

    convolutions: bool

    @property
    def label(self) -> str:
        return "input affines"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if not (weighted(op.type) and op.has_trait("layout_sensitive") == self.convolutions) or \
                self.convolutions and (op.attrs.get("groups", 1) != 1 or any(p != (0, 0) for p in op.attrs["padding"])):
            return False
        program = rewriter.program
        x = op.operands[0]
        axis = channel_axis(op.attrs["data_format"], len(x.type.shape)) if self.convolutions else len(x.type.shape) - 1
        scale, shift, source, reader, chain = None, None, x, op, []
        for kind in ("elementwise_add", "elementwise_mul"):  # z * a + c, outermost first
            step = source.producer
            if step is None or step.canonical[0] != kind or step.attrs.get("act") is not None \
                    or not only_reader(source, reader):
                continue
            for i in (0, 1):
                values = _channel_values(program, step.operands[1 - i], source.type, axis)
                if values is not None and step.operands[i].type == source.type:
                    scale, shift = (values, shift) if kind == "elementwise_mul" else (scale, values)
                    source, reader = step.operands[i], step
                    chain.append(step)
                    break
        weight, bias = op.input(op.traits.weight), op.input("bias")
        w = stored_array(program, weight)
        b = stored_array(program, bias) if bias is not None else None
        if not chain or w is None or bias is not None and b is None:
            return False
        out_axis = op.traits.weight_out_axis(op.attrs, w.ndim)
        shape = [1] * w.ndim
        shape[1 - out_axis] = -1  # the input-channel axis: OIHW convolutions, [in, out] linears
        new_w = w if scale is None else (w * scale.reshape(shape)).astype(w.dtype)
        new_b = np.zeros(w.shape[out_axis], w.dtype) if b is None else b
        if shift is not None:
            reduce = tuple(a for a in range(w.ndim) if a != out_axis)
            new_b = (new_b + (w.astype(np.float64) * shift.reshape(shape)).sum(axis=reduce)).astype(w.dtype)
        w_name = weight.producer.attrs["name"]
        operands = [source, rewriter.param(f"{w_name}.affine", new_w), rewriter.param(f"{w_name}.affine_bias", new_b)]
        fused = rewriter.insert_before(op, Op(op.type, operands, [r.type for r in op.results], op.attrs, loc=op.loc))
        rewriter.replace_op(op, fused.results)
        for step in chain:
            rewriter.erase_op(step)
        return True


def _channel_values(program, v: Value, out: TensorType, axis: int) -> np.ndarray | None:
    """The ``[C]`` values of a stored ``v`` that, broadcast against ``out``, is one number or
    varies along ``axis`` only; None otherwise."""
    c, rank = out.shape[axis], len(out.shape)
    shape = v.type.shape
    offset = rank - len(shape)
    if offset < 0 or v.type.dtype != out.dtype or \
            any(d not in (1, c if offset + i == axis else 1) for i, d in enumerate(shape)):
        return None
    source = v  # a stored vector reshaped (or broadcast to unit dims) keeps its values' order
    while source.producer is not None and source.producer.has_trait("reshaping") and source.producer.operands \
            and math.prod(source.type.shape) == c and math.prod(source.producer.operands[0].type.shape) == c:
        source = source.producer.operands[0]
    stored = stored_array(program, source)
    if stored is None:
        scalar = scalar_constant(program, v)
        return None if scalar is None else np.full(c, scalar, np.dtype(out.dtype))
    if stored.size == 1:
        return np.full(c, stored.reshape(-1)[0], stored.dtype)
    return stored.reshape(c) if stored.size == c else None


def _per_channel_vector(rewriter: Rewriter, anchor: Op, v: Value, out: TensorType, axis: int,
                        name: str) -> Value | None:
    """``v`` as a ``[C]`` vector if, broadcast against ``out``, it varies along ``axis`` only;
    a stored single number becomes a new parameter ``name`` of C copies."""
    c, rank = out.shape[axis], len(out.shape)
    shape = v.type.shape
    offset = rank - len(shape)
    if c != 1 and all(d == 1 for d in shape) and v.type.dtype == out.dtype and offset >= 0:
        values = _channel_values(rewriter.program, v, out, axis)
        return None if values is None else rewriter.param(name, values)
    if offset < 0 or offset > axis or v.type.dtype != out.dtype or \
            any(d != (c if offset + i == axis else 1) for i, d in enumerate(shape)):
        return None
    if shape == (c,):
        return v
    source = v.producer.operands[0] if v.producer is not None and v.producer.has_trait("reshaping") else None
    if source is not None and source.type.shape == (c,):
        return source
    return rewriter.insert_before(anchor, Op("reshape", [v], [TensorType((c,), out.dtype)], {"shape": (c,)})).result


class _FuseBias(RewritePattern):
    """``add(op(x, w), bias)`` with a per-channel ``bias`` -> ``op(x, w, bias)``; when ``op``
    has a stored bias already and the added vector is stored too, their sum."""

    label = "biases"

    def match_and_rewrite(self, add: Op, rewriter: Rewriter) -> bool:
        if add.canonical[0] != "elementwise_add":
            return False
        for i, v in enumerate(add.operands):
            op = v.producer
            if op is None or not weighted(op.type) or op.attrs.get("act") is not None or not only_reader(v, add) \
                    or v.type != add.result.type:
                continue
            bias = self._bias(rewriter, add, op, add.operands[1 - i], v.type)
            if bias is None:
                continue
            attrs = {**op.attrs, "act": add.attrs.get("act"), "act_alpha": add.attrs.get("act_alpha")}
            operands = [*op.operands[:2], bias]
            fused = rewriter.insert_before(add, Op(op.type, operands, [v.type], attrs, loc=op.loc))
            rewriter.replace_op(add, [fused.result])
            rewriter.erase_op(op)
            return True
        return False

    @staticmethod
    def _bias(rewriter: Rewriter, add: Op, op: Op, other: Value, out: TensorType) -> Value | None:
        axis = _channel_axis(op)
        existing = op.input("bias")
        if existing is None:
            weight = op.input(op.traits.weight)
            base = weight.producer.attrs.get("name", op.type) if weight.producer is not None else op.type
            return _per_channel_vector(rewriter, add, other, out, axis, f"{base}.bias")
        b = stored_array(rewriter.program, existing)
        shift = _channel_values(rewriter.program, other, out, axis)
        if b is None or shift is None:
            return None
        return rewriter.param(f"{existing.producer.attrs['name']}.shifted", (b + shift).astype(b.dtype))


@dataclasses.dataclass(frozen=True)
class _FuseActivation(RewritePattern):
    """``act(op(...))`` -> ``op(...) {act}`` for an ``op`` that ``accepts``."""

    accepts: Callable[[str], bool]

    @property
    def label(self) -> str:
        return "activations"

    def match_and_rewrite(self, act: Op, rewriter: Rewriter) -> bool:
        fused = as_fused_activation(act.type, act.attrs)
        if fused is None or not act.operands:
            return False
        v = act.operands[0]
        op = v.producer
        if op is None or not self.accepts(op.type) or op.attrs.get("act") is not None \
                or not only_reader(v, act) or v.type != act.result.type:
            return False
        for key, value in fused.items():
            rewriter.set_attr(op, key, value)
        rewriter.replace_op(act, [v])
        return True


class _FuseConvPool(RewritePattern):
    """``pool2d(conv2d(x, w[, b]))`` -> ``conv2d_pool(x, w[, b])``."""

    label = "pools"

    def match_and_rewrite(self, pool: Op, rewriter: Rewriter) -> bool:
        if pool.type != "pool2d" or pool.attrs.get("global_pooling"):
            return False
        v = pool.operands[0]
        conv = v.producer
        if conv is None or conv.type != "conv2d" or not only_reader(v, pool) \
                or conv.attrs.get("data_format") != pool.attrs.get("data_format"):
            return False
        fused_attrs = registry.get("conv2d_pool").attrs
        pool_attrs = registry.get("pool2d").check_attrs({k: pool.attrs[k] for k in pool.attrs if k != "kernel"})
        attrs = {k: val for k, val in conv.attrs.items() if k in fused_attrs}  # a `kernel` annotation goes
        attrs.update(pooling_type=pool_attrs["pooling_type"], pool_size=pool_attrs["kernel_size"],
                     pool_stride=pool_attrs["stride"], pool_padding=pool_attrs["padding"],
                     ceil_mode=pool_attrs["ceil_mode"], exclusive=pool_attrs["exclusive"])
        fused = rewriter.insert_before(pool, Op("conv2d_pool", list(conv.operands), [pool.result.type], attrs,
                                                loc=conv.loc))
        rewriter.replace_op(pool, [fused.result])
        rewriter.erase_op(conv)
        return True


class _ComposeTransposes(RewritePattern):
    """Identity transposes vanish; a transpose of a transpose becomes one (or none)."""

    label = "transposes"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        outer = transpose_perm(op)
        if outer is None:
            return False
        x = op.operands[0]
        if outer == tuple(range(len(outer))):
            rewriter.replace_op(op, [x])
            return True
        inner_op = x.producer
        inner = transpose_perm(inner_op)
        if inner is None:
            return False
        source = inner_op.operands[0]
        perm = tuple(inner[i] for i in outer)  # out axis i is x axis outer[i], i.e. source axis inner[outer[i]]
        if perm == tuple(range(len(perm))):
            rewriter.replace_op(op, [source])
        else:
            new = Op("transpose", [source], [op.result.type], {"perm": perm}, loc=op.loc)
            rewriter.replace_op(op, [rewriter.insert_before(op, new).result])
        if not x.uses:
            rewriter.erase_op(inner_op)
        return True


def _sinks_away(transpose: Op) -> bool:
    """Every reader of ``transpose`` is a transpose or pointwise, so sinking can retire it."""
    return all(transpose_perm(u) is not None or u.has_trait("pointwise") for u in transpose.users)


class _SinkTransposes(RewritePattern):
    """``f(transpose(a, p), transpose(b, p))`` -> ``transpose(f(a, b), p)`` for pointwise ``f``
    (scalar operands stay as they are), when the transposes' other readers can sink them too."""

    label = "sunk"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if not op.has_trait("pointwise") or len(op.results) != 1 or op.blocks:
            return False
        shape = op.result.type.shape
        tensors = [v for v in op.operands if v.type.shape != ()]
        producers = [v.producer for v in tensors]
        if not tensors or any(v.type.shape != shape for v in tensors) \
                or any(transpose_perm(p) is None or not _sinks_away(p) for p in producers):
            return False
        perms = {transpose_perm(p) for p in producers}
        if len(perms) != 1:
            return False
        (perm,) = perms
        source = producers[0].operands[0]
        inner = Op(op.type, [v.producer.operands[0] if v.type.shape != () else v for v in op.operands],
                   [TensorType(source.type.shape, op.result.type.dtype)], dict(op.attrs), loc=op.loc)
        rewriter.insert_before(op, inner)
        out = rewriter.insert_before(op, Op("transpose", [inner.result], [op.result.type], {"perm": perm},
                                            loc=op.loc))
        rewriter.replace_op(op, [out.result])
        for p in dict.fromkeys(producers):
            if not p.result.uses:
                rewriter.erase_op(p)
        return True


def _elementwise_binary(op_type: str) -> bool:
    """Paddle's ``elementwise_*`` ops: pointwise, broadcasting, with a fused activation."""
    traits = traits_of(op_type)
    return traits.pointwise and traits.broadcasting and fuses_activation(op_type)


@register_pass
@dataclasses.dataclass(frozen=True)
class FoldConvBatchNorm(PatternPass):
    """Fold inference-mode batch norms into the conv2d / depthwise_conv2d before them (NCHW or
    NHWC; with or without a conv bias). See the module doc; tolerance about 1e-5 relative.

    >>> import paddlejax as pj
    >>> model = pj.nn.Sequential(pj.nn.Conv2D(3, 4, 3), pj.nn.BatchNorm2D(4))
    >>> model.eval()
    >>> prog = pj.to_static(model, pj.InputSpec((None, 3, 8, 8)))
    >>> [op.type for op in pj.passes.run(prog, "fold_conv_bn,dce").walk()]
    ['param', 'param', 'conv2d', 'return']
    """

    name = "fold_conv_bn"

    def patterns(self) -> list[RewritePattern]:
        return [_FoldBatchNorm(convolutions=True), _FoldScale(convolutions=True), _FoldInputAffine(convolutions=True)]


@register_pass
@dataclasses.dataclass(frozen=True)
class FoldLinearBatchNorm(PatternPass):
    """Fold inference-mode batch norms over the features into the linear before them.
    Tolerance about 1e-5 relative."""

    name = "fold_linear_bn"

    def patterns(self) -> list[RewritePattern]:
        return [_FoldBatchNorm(convolutions=False), _FoldScale(convolutions=False),
                _FoldInputAffine(convolutions=False)]


@register_pass
@dataclasses.dataclass(frozen=True)
class FuseBiasActivation(PatternPass):
    """Fuse per-channel bias adds and activations into conv2d / depthwise_conv2d / linear.
    Tolerance 1e-6 (the same operations in the same order).

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.relu(pj.ops.linear(x, p["w"]) + p["b"]), jnp.ones((2, 3)),
    ...                 params={"w": jnp.ones((3, 4)), "b": jnp.ones(4)})
    >>> [(op.type, op.attrs.get("act")) for op in pj.passes.run(prog, "fuse_bias_act,dce").walk()]
    [('param', None), ('param', None), ('linear', 'relu'), ('return', None)]
    """

    name = "fuse_bias_act"

    def patterns(self) -> list[RewritePattern]:
        # activations fuse into the int8 and weight-only versions of those ops too
        return [_FuseBias(), _FuseActivation(lambda t: fuses_activation(t) and not _elementwise_binary(t))]


@register_pass
@dataclasses.dataclass(frozen=True)
class FuseElementwiseActivation(PatternPass):
    """Fuse an activation into the ``elementwise_*`` op before it. Tolerance 1e-6."""

    name = "fuse_elementwise_act"

    def patterns(self) -> list[RewritePattern]:
        return [_FuseActivation(_elementwise_binary)]


@register_pass
@dataclasses.dataclass(frozen=True)
class FuseConvPool(PatternPass):
    """Fuse a pool2d into the conv2d before it (``conv2d_pool``) when the pool is the
    convolution's only reader, is not global and has its data_format. Exact.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.pool2d(pj.ops.conv2d(x, p["w"], act="relu"), kernel_size=2),
    ...                 jnp.ones((1, 3, 6, 6)), params={"w": jnp.ones((4, 3, 3, 3))})
    >>> [(op.type, op.attrs.get("act")) for op in pj.passes.run(prog, "fuse_conv_pool").walk()]
    [('param', None), ('conv2d_pool', 'relu'), ('return', None)]
    """

    name = "fuse_conv_pool"

    def patterns(self) -> list[RewritePattern]:
        return [_FuseConvPool()]


@register_pass
@dataclasses.dataclass(frozen=True)
class EliminateTransposes(PatternPass):
    """Cancel inverse transpose pairs, compose the others into one, drop identity transposes,
    and sink transposes below pointwise ops. Exact.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x.T.T, jnp.ones((2, 3)))
    >>> [op.type for op in pj.passes.run(prog, "eliminate_transposes").walk()]
    ['return']
    """

    name = "eliminate_transposes"

    def patterns(self) -> list[RewritePattern]:
        return [_ComposeTransposes(), _SinkTransposes()]
