"""Normalisation ops: batch_norm, sync_batch_norm, layer_norm, group_norm, spectral_norm (Paddle
semantics).

Statistics are computed in at least float32 and the result is cast back to the input dtype.

>>> import jax.numpy as jnp
>>> from paddlejax.ops.norm import batch_norm
>>> out, mean, var = batch_norm(jnp.ones((2, 3, 4, 4)), jnp.zeros(3), jnp.ones(3), training=True)
>>> mean.tolist()  # 0.9 * 0 + 0.1 * 1
[0.10000000149011612, 0.10000000149011612, 0.10000000149011612]
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from paddlejax import adapter
from paddlejax.ops import onednn
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits, data_format_axis
from paddlejax.ops.common import attr_error, channel_axis, from_channels_last, input_error, norm_axis, to_channels_last

# Paddle layout names by rank; only "channels first or last" matters here.
_NORM_LAYOUTS = ("NC", "NCL", "NCHW", "NCDHW", "NLC", "NHWC", "NDHWC")


def _stat_dtype(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def _check_shape(op, name, arr, shape):
    if arr is not None and arr.shape != tuple(shape):
        raise input_error(op, name, f"shape {tuple(shape)}", arr.shape)


def _normalise(x, mean, var, epsilon, weight, bias):
    """``(x - mean) / sqrt(var + eps) * weight + bias``, all already broadcastable."""
    y = (x - mean) * lax.rsqrt(var + epsilon)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def _local_mean(xs, axes):
    return jnp.mean(xs, axes)


def _synced_mean(xs, axes):
    """The mean over ``axes`` and, inside ``shard_map``, over every mesh axis ``xs`` varies
    over (the devices its batch is split over): the whole batch's."""
    mesh_axes = tuple(sorted(adapter.varying_axes(xs)))
    if not mesh_axes:
        return _local_mean(xs, axes)
    count = math.prod(xs.shape[i] for i in axes) * math.prod(lax.axis_size(a) for a in mesh_axes)
    return lax.psum(jnp.sum(xs, axes), mesh_axes) / count


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _standardise(xs, axes, epsilon, mean):
    """``((x - m) / sqrt(v + epsilon), m, v)`` with the batch mean ``m`` and biased variance
    ``v`` over ``axes`` (reduced by ``mean(xs, axes)``, which may add up over devices).

    Its derivative is stated in closed form, which is what training spends its time on: XLA's
    derivative of the statistics takes several more passes over the activations (ResNet-18's
    batch norms at 32x32, batch 64: 1.3-2.4x slower on a CPU)."""
    m = mean(xs, axes)
    centred = xs - jnp.expand_dims(m, axes)  # centred: the difference of squares loses digits
    v = mean(jnp.square(centred), axes)
    return centred * lax.rsqrt(jnp.expand_dims(v, axes) + epsilon), m, v


@_standardise.defjvp
def _standardise_jvp(axes, epsilon, mean, primals, tangents):
    (xs,), (dx,) = primals, tangents
    xhat, m, v = _standardise(xs, axes, epsilon, mean)
    rstd = lax.rsqrt(v + epsilon)
    dm = mean(dx, axes)
    projection = mean(dx * xhat, axes)
    dxhat = jnp.expand_dims(rstd, axes) * (dx - jnp.expand_dims(dm, axes) - xhat * jnp.expand_dims(projection, axes))
    return (xhat, m, v), (dxhat, dm, 2 * projection / rstd)


def _check_batch_norm(x, running_mean, running_var, weight, bias, data_format) -> int:
    """The channel axis, once every per-channel input has the channel count."""
    axis = channel_axis(data_format, x.ndim)
    for name, arr in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                      ("bias", bias)):
        _check_shape("batch_norm", name, arr, (x.shape[axis],))
    return axis


def _updated(running, batch, momentum):
    """Paddle's running statistic: ``momentum * running + (1 - momentum) * batch``."""
    return momentum * running + (1 - momentum) * batch.astype(running.dtype)


def _batch_norm(x, running_mean, running_var, weight=None, bias=None, *, epsilon, momentum, training, data_format,
                mean=_local_mean):
    """Batch norm over all axes but the channel one; returns (out, mean_out, variance_out).

    Training normalises with the batch mean and biased batch variance and updates the
    running stats as ``momentum * running + (1 - momentum) * batch`` (Paddle also uses the
    biased variance there). Inference uses the running stats and passes them through.
    """
    axis = _check_batch_norm(x, running_mean, running_var, weight, bias, data_format)
    bshape = [1] * x.ndim
    bshape[axis] = x.shape[axis]
    xs = x.astype(_stat_dtype(x))
    b = lambda a: None if a is None else a.reshape(bshape)  # noqa: E731
    if not training:
        out = _normalise(xs, b(running_mean), b(running_var), epsilon, b(weight), b(bias))
        return out.astype(x.dtype), running_mean, running_var
    xhat, m, v = _standardise(xs, tuple(i for i in range(x.ndim) if i != axis), epsilon, mean)
    out = xhat if weight is None else xhat * b(weight)
    out = out if bias is None else out + b(bias)
    return out.astype(x.dtype), _updated(running_mean, m, momentum), _updated(running_var, v, momentum)


def _batch_norm_onednn(x, running_mean, running_var, weight=None, bias=None, *, epsilon, momentum, training,
                       data_format):
    """Batch norm in training by oneDNN's kernels (:func:`paddlejax.ops.onednn.batch_norm_training`),
    which take the statistics, the normalisation and their backward pass in few passes over the
    activations (ResNet-18's, batch 64 at 32x32 on a 2-core CPU: forward and backward 3x faster
    than XLA's); inference, and what oneDNN does not fit, by the reference kernel."""
    if not (training and onednn.batch_norm_fits(x, data_format) and onednn.available()):
        return _batch_norm(x, running_mean, running_var, weight, bias, epsilon=epsilon, momentum=momentum,
                           training=training, data_format=data_format)
    _check_batch_norm(x, running_mean, running_var, weight, bias, data_format)
    out, m, v = onednn.batch_norm_training(x, weight, bias, epsilon=epsilon, data_format=data_format)
    return out, _updated(running_mean, m, momentum), _updated(running_var, v, momentum)


def _sync_batch_norm(x, running_mean, running_var, weight=None, bias=None, *, epsilon, momentum, training,
                     data_format):
    """Batch norm whose training statistics are those of the whole batch when it is split over
    devices: inside ``shard_map``, the sums behind mean and variance are added up (``psum``)
    over every mesh axis the input varies over. Elsewhere it is ``batch_norm``."""
    return _batch_norm(x, running_mean, running_var, weight, bias, epsilon=epsilon, momentum=momentum,
                       training=training, data_format=data_format, mean=_synced_mean)


def _layer_norm(x, weight=None, bias=None, *, epsilon, begin_norm_axis):
    """Normalise over axes ``[begin_norm_axis:]``; weight/bias cover those axes (or are flat)."""
    begin = norm_axis("layer_norm", "begin_norm_axis", begin_norm_axis, x.ndim)
    shape = x.shape[begin:]
    size = math.prod(shape)
    affine = []
    for name, arr in (("weight", weight), ("bias", bias)):
        if arr is not None and arr.shape not in (shape, (size,)):
            raise input_error("layer_norm", name, f"shape {shape} or ({size},)", arr.shape)
        affine.append(None if arr is None else arr.reshape(shape))
    xs = x.astype(_stat_dtype(x))
    axes = tuple(range(begin, x.ndim))
    mean, var = jnp.mean(xs, axes, keepdims=True), jnp.var(xs, axes, keepdims=True)
    return _normalise(xs, mean, var, epsilon, *affine).astype(x.dtype)


def _group_norm(x, weight=None, bias=None, *, groups, epsilon, data_format):
    """Normalise each group of ``channels / groups`` channels (and all spatial positions)."""
    xl = to_channels_last(x, data_format)
    c = xl.shape[-1]
    if c % groups:
        raise attr_error("group_norm", "groups", f"a divisor of the channels ({c})", groups)
    _check_shape("group_norm", "weight", weight, (c,))
    _check_shape("group_norm", "bias", bias, (c,))
    xs = xl.astype(_stat_dtype(x))
    g = xs.reshape(xs.shape[0], -1, groups, c // groups)
    mean, var = jnp.mean(g, (1, 3), keepdims=True), jnp.var(g, (1, 3), keepdims=True)
    per_group = lambda a: None if a is None else a.reshape(groups, c // groups)  # noqa: E731
    out = _normalise(g, mean, var, epsilon, per_group(weight), per_group(bias)).reshape(xl.shape)
    return from_channels_last(out.astype(x.dtype), data_format)


def _spectral_norm(weight, u, v, *, dim, power_iters, eps):
    """``weight / sigma``, ``sigma`` the largest singular value of ``weight`` seen as an ``[h, w]``
    matrix (``h = weight.shape[dim]``, that axis moved first, the rest flattened), estimated by
    ``power_iters`` steps of power iteration from ``u [h]`` and ``v [w]``:
    ``v = normalize(W^T u); u = normalize(W v)`` with ``normalize(x) = x / (|x| + eps)``, then
    ``sigma = u^T W v``. Returns ``(out, u_out, v_out)``, the vectors after the iteration (with
    ``power_iters=0``, ``u`` and ``v`` as given), for the caller to keep for the next call.

    As in Paddle's kernel, gradients treat ``u`` and ``v`` as constants: ``weight`` gets
    ``(g - (sum(g * W) / sigma) u v^T) / sigma`` for an output gradient ``g``, the vectors none.
    """
    axis = norm_axis("spectral_norm", "dim", dim, weight.ndim)
    mat = jnp.moveaxis(weight, axis, 0).astype(_stat_dtype(weight))
    mat = mat.reshape(mat.shape[0], -1)
    _check_shape("spectral_norm", "u", u, mat.shape[:1])
    _check_shape("spectral_norm", "v", v, mat.shape[1:])
    us, vs = u.astype(mat.dtype), v.astype(mat.dtype)
    for _ in range(power_iters):
        vs = mat.T @ us
        vs = vs / (jnp.linalg.norm(vs) + eps)
        us = mat @ vs
        us = us / (jnp.linalg.norm(us) + eps)
    us, vs = lax.stop_gradient(us), lax.stop_gradient(vs)
    sigma = us @ (mat @ vs)
    return (weight / sigma).astype(weight.dtype), us.astype(u.dtype), vs.astype(v.dtype)


def _spectral_norm_flops(in_shapes, out_shapes, attrs):
    """Two multiply-adds per weight element for each matrix-vector product (two per power
    iteration, one for sigma), and the division."""
    size = math.prod(in_shapes[0])
    return 2 * size * (2 * attrs.get("power_iters", 1) + 1) + size


def _norm_flops(in_shapes, out_shapes, attrs):
    """About five FLOPs per output element (subtract, square, scale, shift, plus statistics)."""
    return 5 * math.prod(out_shapes[0])


def _batch_norm_estimate(variant, in_shapes, dtypes, attrs, platform):
    """The relative time of ``variant`` on a batch norm of ``in_shapes`` (per element of the
    activations, forward and backward: XLA's reductions and elementwise passes 3x oneDNN's
    fused kernels, which measured 1.4-4.8x faster on ResNet-18's at batch 64 on a 2-core CPU),
    or ``None`` where the oneDNN kernel computes as the reference does (inference, and the
    cases it does not fit), so that timing it would teach nothing.

    >>> attrs = {"training": True, "data_format": "NHWC"}
    >>> _batch_norm_estimate("onednn", [(64, 8, 8, 256)], ["float32"], attrs, "cpu") < _batch_norm_estimate(
    ...     "default", [(64, 8, 8, 256)], ["float32"], attrs, "cpu")
    True
    >>> _batch_norm_estimate("onednn", [(64, 8, 8, 256)], ["float32"], {**attrs, "training": False}, "cpu") is None
    True
    """
    if variant == "onednn" and not (attrs.get("training") and onednn.batch_norm_fits(
            jax.ShapeDtypeStruct(in_shapes[0], dtypes[0]), attrs.get("data_format", "NCHW"))):
        return None
    return math.prod(in_shapes[0]) * (1 if variant == "onednn" else 3)


_float = dict(dtype="float")
_BATCH_NORM = dict(
    inputs=[Input("x", rank=(2, 3, 4, 5), **_float), Input("running_mean", rank=1, state=True, **_float),
            Input("running_var", rank=1, state=True, **_float), Input("weight", rank=1, optional=True, **_float),
            Input("bias", rank=1, optional=True, **_float)],
    attrs={"epsilon": Attr("float", 1e-5, minimum=0), "momentum": Attr("float", 0.9, minimum=0),
           "training": Attr("bool", False), "data_format": Attr("str", "NCHW", choices=_NORM_LAYOUTS)},
    outputs=("out", "mean_out", "variance_out"),
    flops=_norm_flops,
    traits=Traits(amp="norm", layout_sensitive=True, channels="identity", channel_axis=data_format_axis,
                  batch_coupled=lambda attrs: attrs.get("training", False)))
batch_norm = define("batch_norm", _batch_norm, variants={"onednn": _batch_norm_onednn},
                    requires={"onednn": onednn.available}, estimate=_batch_norm_estimate, **_BATCH_NORM)
sync_batch_norm = define("sync_batch_norm", _sync_batch_norm, **_BATCH_NORM)
layer_norm = define(
    "layer_norm", _layer_norm,
    inputs=[Input("x", **_float), Input("weight", optional=True, **_float), Input("bias", optional=True, **_float)],
    attrs={"epsilon": Attr("float", 1e-5, minimum=0), "begin_norm_axis": Attr("int", -1)},
    # pruning the last axis's channels keeps the op's shape rules; its statistics then cover the kept ones
    flops=_norm_flops, traits=Traits(amp="norm", channels="identity", channel_axis=lambda attrs, rank: rank - 1))
group_norm = define(
    "group_norm", _group_norm,
    inputs=[Input("x", rank=(2, 3, 4, 5), **_float), Input("weight", rank=1, optional=True, **_float),
            Input("bias", rank=1, optional=True, **_float)],
    attrs={"groups": Attr("int", minimum=1), "epsilon": Attr("float", 1e-5, minimum=0),
           "data_format": Attr("str", "NCHW", choices=_NORM_LAYOUTS)},
    flops=_norm_flops, traits=Traits(amp="norm", layout_sensitive=True, channels="identity"))
spectral_norm = define(
    "spectral_norm", _spectral_norm,
    inputs=[Input("weight", rank=(2, 3, 4, 5), **_float), Input("u", rank=1, state=True, **_float),
            Input("v", rank=1, state=True, **_float)],
    attrs={"dim": Attr("int", 0), "power_iters": Attr("int", 1, minimum=0), "eps": Attr("float", 1e-12, minimum=0)},
    outputs=("out", "u_out", "v_out"),
    # norms, and a division by a sum of products: computed in float32 under AMP
    flops=_spectral_norm_flops, traits=Traits(amp="black"))
