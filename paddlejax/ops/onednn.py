"""oneDNN kernels for XLA's CPU backend, through typed XLA FFI custom calls (``jax.ffi``).

XLA's CPU convolutions run below the oneDNN kernels Paddle Inference and PyTorch call; this
module offers oneDNN's to the autotuner as more kernel variants (``conv2d`` / ``depthwise_conv2d``
variant ``"onednn"``: float32, bias and activation fused into the convolution; ``quantized_conv2d``
variant ``"onednn"``: int8, with the requantize and an int8 residual fused too; ``batch_norm`` in
training; ``pool2d``: max and average pooling, max pooling of int8 too; ``conv2d_pool``: a
channels-last convolution and the pooling after it in one call, the convolution's output pooled
chunk by chunk while in cache instead of written to memory and read back). The handlers live
in a small C++ extension (``paddlejax/ops/onednn.cc``) built at install time against the
``onednn-cpu-gomp`` wheel; where it is missing or fails to load, :func:`available` is False, the
tuner skips the variant, and a program that names it runs XLA's kernel instead.

Threads: on two or more CPUs a channels-last convolution is cut into parts (slices of the batch,
or bands of output rows for one image), and a pooling or a fused convolution + pooling into slices
of the batch, that run at once on XLA's own intra-op pool, each a one-thread oneDNN primitive.
XLA's pool threads are awake (they run the program's other ops), where oneDNN's OpenMP team,
one per calling XLA thread, mostly had to be woken: PP-OCRv4 det at two threads went from 10.3
to 8.3 ms.
``PADDLEJAX_ONEDNN_SPLIT=0`` turns the cutting off: every call runs whole on the caller's
OpenMP team, as channels-first convolutions always run (a fused convolution + pooling chunk by
chunk). Which is faster depends on the whole program: on two cores the OpenMP team won where
every convolution and pooling ran oneDNN's kernels (the int8 digits CNN 0.13 against 0.20 ms,
int8 SmallCNN 0.66 against 0.77 ms) and lost where XLA's kernels ran between them, its threads
and XLA's then taking turns on the cores (the same SmallCNN with one XLA pooling: 1.07 against
0.73 ms; int8 ResNet-18: 11.0 against 9.8 ms).

>>> import jax.numpy as jnp
>>> x, w = jnp.ones((1, 2, 5, 5)), jnp.ones((3, 2, 3, 3))
>>> if available():  # else unavailable_reason() says why
...     y = conv2d(x, w, None, stride=(1, 1), pads=((1, 1), (1, 1)), dilation=(1, 1), groups=1,
...                data_format="NCHW", act="relu")
...     assert y.shape == (1, 3, 5, 5) and float(y[0, 0, 2, 2]) == 18.0
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import math
import os
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax import adapter

# Activation codes, as the C++ side numbers them.
_ACTS = {None: 0, "relu": 1, "leaky_relu": 2, "relu6": 3, "sigmoid": 4, "tanh": 5, "gelu": 6, "gelu_tanh": 7,
         "silu": 8, "hard_swish": 9}
_TARGETS = {"paddlejax_onednn_conv2d": "PaddlejaxOnednnConv2d",
            "paddlejax_onednn_conv2d_backward_data": "PaddlejaxOnednnConv2dBackwardData",
            "paddlejax_onednn_conv2d_backward_weights": "PaddlejaxOnednnConv2dBackwardWeights",
            "paddlejax_onednn_quantized_conv2d": "PaddlejaxOnednnQuantizedConv2d",
            "paddlejax_onednn_requantized_conv2d": "PaddlejaxOnednnRequantizedConv2d",
            "paddlejax_onednn_residual_conv2d": "PaddlejaxOnednnResidualConv2d",
            "paddlejax_onednn_batch_norm_training": "PaddlejaxOnednnBatchNormTraining",
            "paddlejax_onednn_batch_norm_backward": "PaddlejaxOnednnBatchNormBackward",
            "paddlejax_onednn_pool2d": "PaddlejaxOnednnPool2d",
            "paddlejax_onednn_conv2d_pool": "PaddlejaxOnednnConv2dPool"}


def _extension() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_onednn{suffix}").exists():
            return here / f"_onednn{suffix}"
    return None


def _load_dnnl() -> None:
    """Load ``libdnnl.so.3`` from the environment's ``lib`` (where the ``onednn-cpu-gomp`` wheel
    puts it), so that the extension's dependency resolves in an editable install too."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX") or sys.prefix)):
        path = Path(prefix) / "lib" / "libdnnl.so.3"
        if path.exists():
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            return
    ctypes.CDLL("libdnnl.so.3", mode=ctypes.RTLD_GLOBAL)  # the system's, or a clear OSError


@functools.cache
def _load() -> str | None:
    """Register the FFI targets; None on success, else why the kernels are unavailable."""
    if os.environ.get("PADDLEJAX_ONEDNN", "1") == "0":
        return "disabled by PADDLEJAX_ONEDNN=0"
    path = _extension()
    if path is None:
        return "the compiled extension paddlejax/ops/_onednn is not built (reinstall paddlejax with g++ available)"
    try:
        _load_dnnl()
        library = ctypes.CDLL(str(path))
    except OSError as e:
        return f"cannot load the oneDNN extension: {e}"
    _warn_if_stale(library, path.parent / "onednn.cc")
    try:
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    except (AttributeError, RuntimeError) as e:  # e.g. built against a newer XLA FFI than this jaxlib's
        return f"cannot register the oneDNN kernels with this jaxlib ({jax.__version__}): {e}"
    return None


def _warn_if_stale(library: ctypes.CDLL, source: Path) -> None:
    """Warn when the library was built from another ``onednn.cc`` than the one beside it (a
    source tree whose last rebuild failed keeps running the old kernels)."""
    if not source.exists():  # an installed wheel ships the library alone
        return
    built_from = getattr(library, "PaddlejaxOnednnSourceSha256", None)
    if built_from is not None:
        built_from.restype = ctypes.c_char_p
        built_from = built_from().decode()
    if built_from != hashlib.sha256(source.read_bytes()).hexdigest():
        warnings.warn(f"the oneDNN extension {source.parent / '_onednn'}* was built from another {source.name} "
                      "than the one beside it: it runs the old kernels; rebuild with `pip install -e .` "
                      "(`-v` shows compile errors)", RuntimeWarning, stacklevel=3)


def available() -> bool:
    """Whether the oneDNN kernels can run here (the extension built and loaded; a CPU backend).

    >>> isinstance(available(), bool)
    True
    """
    return jax.default_backend() == "cpu" and _load() is None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True).

    >>> unavailable_reason() is None or isinstance(unavailable_reason(), str)
    True
    """
    if jax.default_backend() != "cpu":
        return f"oneDNN kernels run on the CPU backend, not {jax.default_backend()}"
    return _load()


def cuts_calls() -> bool:
    """Whether calls are cut across threads on two or more CPUs (unless ``PADDLEJAX_ONEDNN_SPLIT=0``,
    which the extension reads once, when it first runs).

    >>> cuts_calls() == (os.environ.get("PADDLEJAX_ONEDNN_SPLIT") != "0")
    True
    """
    return os.environ.get("PADDLEJAX_ONEDNN_SPLIT") != "0"


def conv2d_fits(x, w, data_format: str, act) -> bool:
    """Whether the oneDNN convolution computes this case: 2-D, float32 operands, an activation
    it fuses; other cases take XLA's convolution.

    >>> conv2d_fits(jnp.ones((1, 2, 4, 4)), jnp.ones((3, 2, 3, 3)), "NCHW", "relu")
    True
    >>> conv2d_fits(jnp.ones((1, 2, 4, 4), jnp.bfloat16), jnp.ones((3, 2, 3, 3)), "NCHW", None)
    False
    """
    return (x.ndim == 4 and data_format in ("NCHW", "NHWC") and act in _ACTS
            and x.dtype == jnp.float32 and w.dtype == jnp.float32)


def conv2d(x, w, bias, *, stride, pads, dilation, groups, data_format, act=None, act_alpha=None):
    """``act(conv(x, w) + bias)`` by oneDNN, with Paddle's ``[out_c, in_c / groups, kh, kw]``
    weight and explicit ``pads`` ``((top, bottom), (left, right))``. Differentiable in forward and
    reverse mode, to any order, by oneDNN's backward-data and backward-weights kernels (training
    runs them), and batchable. Callers check :func:`conv2d_fits`; where the kernels are not
    :func:`available`, a RuntimeError says why."""
    if not available():
        raise RuntimeError(f"oneDNN conv2d: {unavailable_reason()}")
    config = _config(stride, pads, dilation, groups, data_format, act, act_alpha)
    if bias is None:
        return _conv2d(config, x, w, jnp.zeros((w.shape[0],), x.dtype), False, _weights_id(w))
    return _conv2d(config, x, w, bias, True, _weights_id(w))


def _weights_id(w) -> int:
    """A hash of the content of weights frozen into the executable (concrete when traced), so
    that the kernel trusts the buffer it reordered before instead of comparing its bytes every
    call; 0 for weights that arrive as arguments.

    >>> _weights_id(np.ones((2, 2), np.float32)) == _weights_id(np.ones((2, 2), np.float32)) != 0
    True
    """
    if isinstance(w, jax.core.Tracer):
        return 0
    data = np.ascontiguousarray(w)
    digest = hashlib.blake2b(data.view(np.uint8).reshape(-1), digest_size=8,
                             person=f"{data.dtype}{data.shape}".encode()[:16]).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


def _attrs(geometry) -> dict:
    stride, pads, dilation, groups, fmt = geometry
    return dict(stride=np.array(stride, np.int64), pad_lo=np.array([p[0] for p in pads], np.int64),
                pad_hi=np.array([p[1] for p in pads], np.int64), dilation=np.array(dilation, np.int64),
                groups=np.int64(groups), nhwc=fmt == "NHWC")


def _out_shape(geometry, x_shape, w_shape) -> tuple:
    stride, pads, dilation, _, fmt = geometry
    spatial = x_shape[2:] if fmt == "NCHW" else x_shape[1:3]
    out_hw = [(size + lo + hi - d * (k - 1) - 1) // s + 1
              for size, (lo, hi), d, k, s in zip(spatial, pads, dilation, w_shape[2:], stride)]
    return (x_shape[0], w_shape[0], *out_hw) if fmt == "NCHW" else (x_shape[0], *out_hw, w_shape[0])


def _ffi(target, shape, dtype, *operands, aliases=None, **attrs):
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, dtype), vmap_method="sequential",
                            input_output_aliases=aliases)
    return call(*operands, **attrs)


def _call(target, config, *operands, has_bias, weights_id=0, dtype=jnp.float32, aliases=None, **int8_attrs):
    """The FFI call of ``target`` on ``operands`` (x first, weight second, its content hash
    ``weights_id`` when frozen) with ``config``'s attributes and ``int8_attrs``; the output is
    ``dtype``, of the convolution's shape (written over the operands ``aliases`` names, as
    ``jax.ffi.ffi_call``'s ``input_output_aliases``)."""
    geometry, (act, alpha) = config[:5], config[5:]
    x, w = operands[:2]
    return _ffi(target, _out_shape(geometry, x.shape, w.shape), dtype, *operands, **_attrs(geometry),
                aliases=aliases, has_bias=bool(has_bias), act=np.int64(_ACTS[act]), alpha=np.float32(alpha),
                weights_id=np.int64(weights_id), **int8_attrs)


def _config(stride, pads, dilation, groups, data_format, act, act_alpha) -> tuple:
    return (tuple(stride), tuple(map(tuple, pads)), tuple(dilation), int(groups), data_format, act,
            0.01 if act_alpha is None else float(act_alpha))


# The plain convolution and its two backward passes, as bilinear primitives that transpose into
# one another (as XLA's convolution does), so that gradients of any order run oneDNN's kernels.
def _forward_kernel(x, w, *, geometry):
    return _call("paddlejax_onednn_conv2d", (*geometry, None, 0.0), x, w, jnp.zeros((w.shape[0],), x.dtype),
                 has_bias=False)


def _backward_data_kernel(dy, w, *, geometry, x_shape):
    return _ffi("paddlejax_onednn_conv2d_backward_data", x_shape, dy.dtype, dy, w, **_attrs(geometry))


def _backward_weights_kernel(x, dy, *, geometry, w_shape):
    return _ffi("paddlejax_onednn_conv2d_backward_weights", w_shape, x.dtype, x, dy, **_attrs(geometry))


_conv = adapter.make_bilinear_primitive(
    "onednn_conv2d", _forward_kernel,
    lambda ct, w, x_shape, *, geometry: _backward_data(ct, w, geometry=geometry, x_shape=tuple(x_shape)),
    lambda ct, x, w_shape, *, geometry: _backward_weights(x, ct, geometry=geometry, w_shape=tuple(w_shape)))
_backward_data = adapter.make_bilinear_primitive(
    "onednn_conv2d_backward_data", _backward_data_kernel,
    lambda ct, w, dy_shape, *, geometry, x_shape: _conv(ct, w, geometry=geometry),
    lambda ct, dy, w_shape, *, geometry, x_shape: _backward_weights(ct, dy, geometry=geometry,
                                                                    w_shape=tuple(w_shape)))
_backward_weights = adapter.make_bilinear_primitive(
    "onednn_conv2d_backward_weights", _backward_weights_kernel,
    lambda ct, dy, x_shape, *, geometry, w_shape: _backward_data(dy, ct, geometry=geometry,
                                                                 x_shape=tuple(x_shape)),
    lambda ct, x, dy_shape, *, geometry, w_shape: _conv(x, ct, geometry=geometry))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 4, 5))
def _conv2d(config, x, w, bias, has_bias, weights_id):
    return _call("paddlejax_onednn_conv2d", config, x, w, bias, has_bias=has_bias, weights_id=weights_id)


def _activation_slope(act, alpha, y):
    """The fused activation's derivative, read from its output ``y`` where that determines it
    (None for the others)."""
    if act == "relu" or act == "leaky_relu" and alpha == 0:
        return y > 0
    if act == "leaky_relu" and alpha > 0:
        return jnp.where(y > 0, 1.0, alpha).astype(y.dtype)
    if act == "relu6":
        return (y > 0) & (y < 6)
    return None


@functools.partial(_conv2d.defjvp, symbolic_zeros=True)
def _conv2d_jvp(config, has_bias, weights_id, primals, tangents):
    from paddlejax.ops.activation import fused_activation

    x, w, bias = primals
    dx, dw, dbias = tangents
    geometry, (act, alpha) = config[:5], config[5:]
    zero = jax.custom_derivatives.SymbolicZero
    parts = []
    if not isinstance(dx, zero):
        parts.append(_conv(dx, w, geometry=geometry))
    if not isinstance(dw, zero):
        parts.append(_conv(x, dw, geometry=geometry))
    if has_bias and not isinstance(dbias, zero):
        parts.append(dbias[:, None, None] if geometry[4] == "NCHW" else dbias)
    y = _conv2d(config, x, w, bias, has_bias, weights_id)
    dz = functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(y)
    if act is None:
        return y, jnp.broadcast_to(dz, y.shape)
    slope = _activation_slope(act, alpha, y)
    if slope is not None:
        return y, dz * slope
    z = _conv2d((*geometry, None, alpha), x, w, bias, has_bias, weights_id)
    return jax.jvp(lambda z: fused_activation(z, act, alpha), (z,), (jnp.broadcast_to(dz, z.shape),))


def quantized_conv2d_fits(x_q, w_q, w_scale, data_format: str, act) -> bool:
    """Whether the oneDNN int8 convolution computes this ``quantized_conv2d``: 2-D, int8
    operands, a scalar or per-output-channel weight scale, an activation it fuses.

    >>> quantized_conv2d_fits(jnp.ones((1, 2, 4, 4), jnp.int8), jnp.ones((3, 2, 3, 3), jnp.int8),
    ...                       jnp.ones(3), "NHWC", None)
    True
    """
    return (x_q.ndim == 4 and data_format in ("NCHW", "NHWC") and act in _ACTS and x_q.dtype == jnp.int8
            and w_q.dtype == jnp.int8 and w_scale.size in (1, w_q.shape[0]))


def quantized_conv2d(x_q, w_q, x_scale, w_scale, bias, *, stride, pads, dilation, groups, data_format, act=None,
                     act_alpha=None, out_scale=None, residual=None, residual_scale=None, x_unsigned=False):
    """``act(conv(x_q, w_q) * x_scale * w_scale / 127**2 + bias)`` by oneDNN's int8 convolution
    (int32 accumulation, the rescale, bias and activation fused), the ``quantized_conv2d`` op's
    function with explicit ``pads``; with ``out_scale`` that result requantized to int8
    (``round(y * 127 / out_scale)``, clipped to [-127, 127] as the reference clips). With
    ``out_scale``, an int8 ``residual`` of the output's shape (and its ``residual_scale``) is
    added before the activation, in place (oneDNN's ``sum`` post-op, as Paddle Inference fuses
    residual connections). ``x_unsigned`` says that ``x_q`` holds no negative value: oneDNN reads it as
    uint8 (the same bytes), and skips the compensation a signed input needs. Callers check
    :func:`quantized_conv2d_fits`."""
    if not available():
        raise RuntimeError(f"oneDNN quantized_conv2d: {unavailable_reason()}")
    config = _config(stride, pads, dilation, groups, data_format, act, act_alpha)
    per_tensor = lambda s: jnp.reshape(s, (1,)).astype(jnp.float32) / 127  # noqa: E731
    scales = (per_tensor(x_scale), jnp.reshape(w_scale, (-1,)).astype(jnp.float32) / 127)
    has_bias, frozen = bias is not None, _weights_id(w_q)
    bias = jnp.zeros((w_q.shape[0],), jnp.float32) if bias is None else bias.astype(jnp.float32)
    if out_scale is None:
        if residual is not None:
            raise ValueError("oneDNN quantized_conv2d: a residual is fused into an int8 output only (give out_scale)")
        return _call("paddlejax_onednn_quantized_conv2d", config, x_q, w_q, *scales, bias, has_bias=has_bias,
                     weights_id=frozen, x_unsigned=bool(x_unsigned))
    if residual is None:
        return _call("paddlejax_onednn_requantized_conv2d", config, x_q, w_q, *scales, bias, per_tensor(out_scale),
                     has_bias=has_bias, weights_id=frozen, x_unsigned=bool(x_unsigned), dtype=jnp.int8)
    if residual.dtype != jnp.int8 or residual_scale is None:
        raise ValueError(f"oneDNN quantized_conv2d: the fused residual is int8 with its residual_scale, got "
                         f"{residual.dtype}" + " without a scale" * (residual_scale is None))
    return _call("paddlejax_onednn_residual_conv2d", config, x_q, w_q, *scales, bias, per_tensor(out_scale),
                 residual, per_tensor(residual_scale), has_bias=has_bias, weights_id=frozen,
                 x_unsigned=bool(x_unsigned), dtype=jnp.int8, aliases={6: 0})


def pool2d_fits(x, pooling_type: str, kernel, pads, data_format: str) -> bool:
    """Whether oneDNN's pooling computes this ``pool2d`` over ``kernel`` windows with explicit
    ``pads`` ``((top, bottom), (left, right))``: a non-empty 4-D input; max or average pooling of
    float32 channels first or last, and max pooling of int8 or uint8 (the int8 dataflow's tensors)
    channels last (oneDNN's channels-first int8 pooling is its scalar reference code); each pad
    smaller than the window, so that every window covers an input element (the reference's max
    over padding alone is -inf, oneDNN's the lowest finite float; its average refuses such windows).

    >>> pool2d_fits(jnp.ones((2, 5, 5, 3), jnp.int8), "max", (2, 2), ((0, 1), (0, 1)), "NHWC")
    True
    >>> pool2d_fits(jnp.ones((2, 5, 5, 3), jnp.int8), "avg", (2, 2), ((0, 1), (0, 1)), "NHWC")
    False
    >>> pool2d_fits(jnp.ones((2, 3, 5, 5)), "max", (2, 2), ((2, 0), (0, 0)), "NCHW")
    False
    """
    if x.dtype == jnp.float32:
        fits_type = data_format in ("NCHW", "NHWC")
    else:
        fits_type = x.dtype in (jnp.int8, jnp.uint8) and pooling_type == "max" and data_format == "NHWC"
    return x.ndim == 4 and x.size > 0 and fits_type and all(lo < k and hi < k for (lo, hi), k in zip(pads, kernel))


def pool2d(x, *, pooling_type, kernel, stride, pads, exclusive, data_format):
    """Max (``pooling_type="max"``) or average pooling by oneDNN over ``kernel`` windows at
    ``stride``, with explicit ``pads`` ``((top, bottom), (left, right))`` (Paddle's ceil mode is
    more bottom and right padding); an average divides by the input elements under its window
    (``exclusive``) or by ``kh * kw``. Batchable; not differentiable on its own (``pool2d``'s
    variant gives it the reference kernel's derivatives). Callers check :func:`pool2d_fits`.
    Unlike the reference (XLA's max), a max window holding a NaN gives the largest of its other
    values, as Paddle Inference's oneDNN pooling does: check a program for NaNs untuned
    (:mod:`paddlejax.nancheck`).

    >>> if available():
    ...     y = pool2d(jnp.arange(16.0).reshape(1, 4, 4, 1), pooling_type="max", kernel=(2, 2), stride=(2, 2),
    ...                pads=((0, 0), (0, 0)), exclusive=True, data_format="NHWC")
    ...     assert y[0, :, :, 0].tolist() == [[5.0, 7.0], [13.0, 15.0]]
    """
    if not available():
        raise RuntimeError(f"oneDNN pool2d: {unavailable_reason()}")
    nhwc = data_format == "NHWC"
    c = x.shape[3 if nhwc else 1]
    # the output's shape is a depthwise convolution's with the window for its kernel
    shape = _out_shape((stride, pads, (1, 1), c, data_format), x.shape, (c, 1, *kernel))
    return _ffi("paddlejax_onednn_pool2d", shape, x.dtype, x, max=pooling_type == "max", exclusive=bool(exclusive),
                kernel=np.array(kernel, np.int64), stride=np.array(stride, np.int64),
                pad_lo=np.array([p[0] for p in pads], np.int64), pad_hi=np.array([p[1] for p in pads], np.int64),
                nhwc=nhwc)


def conv2d_pool_fits(x, w, data_format: str, act, pooling_type: str, pool_kernel, pool_pads, *, stride, pads,
                     dilation) -> bool:
    """Whether :func:`conv2d_pool` computes this convolution (``pads`` explicit) and the pooling
    after it: float32 channels last (:func:`conv2d_fits`), and a pooling :func:`pool2d_fits`
    accepts on the convolution's output.

    >>> x, w = jnp.ones((2, 6, 6, 3)), jnp.ones((4, 3, 3, 3))
    >>> conv = dict(stride=(1, 1), pads=((1, 1), (1, 1)), dilation=(1, 1))
    >>> conv2d_pool_fits(x, w, "NHWC", "relu", "max", (2, 2), ((0, 0), (0, 0)), **conv)
    True
    >>> conv2d_pool_fits(x, w, "NCHW", "relu", "max", (2, 2), ((0, 0), (0, 0)), **conv)
    False
    """
    if data_format != "NHWC" or not conv2d_fits(x, w, data_format, act):
        return False
    y = jax.ShapeDtypeStruct(_out_shape((stride, pads, dilation, 1, data_format), x.shape, w.shape), x.dtype)
    return pool2d_fits(y, pooling_type, pool_kernel, pool_pads, data_format)


def conv2d_pool(x, w, bias, *, stride, pads, dilation, groups, act, act_alpha, pooling_type, pool_kernel,
                pool_stride, pool_pads, exclusive):
    """``pool(act(conv(x, w) + bias))`` by oneDNN in one call, channels last: :func:`conv2d`
    (``bias`` may be None) and then :func:`pool2d` with ``pool_kernel``, ``pool_stride`` and
    explicit ``pool_pads``, where the convolution's output goes through the cache a few images at
    a time and never to memory whole. Batchable; not differentiable on its own (the
    ``conv2d_pool`` op's variant gives it the reference kernel's derivatives). Callers check
    :func:`conv2d_pool_fits`. Max pooling passes NaNs over, as :func:`pool2d` does.

    >>> if available():
    ...     y = conv2d_pool(jnp.ones((1, 4, 4, 1)), jnp.ones((1, 1, 3, 3)), None, stride=(1, 1),
    ...                     pads=((1, 1), (1, 1)), dilation=(1, 1), groups=1, act=None, act_alpha=None,
    ...                     pooling_type="max", pool_kernel=(2, 2), pool_stride=(2, 2),
    ...                     pool_pads=((0, 0), (0, 0)), exclusive=True)
    ...     assert y[0, :, :, 0].tolist() == [[9.0, 9.0], [9.0, 9.0]]
    """
    if not available():
        raise RuntimeError(f"oneDNN conv2d_pool: {unavailable_reason()}")
    config = _config(stride, pads, dilation, groups, "NHWC", act, act_alpha)
    geometry, (act, alpha) = config[:5], config[5:]
    conv_shape = _out_shape(geometry, x.shape, w.shape)
    c = w.shape[0]
    # the pooling's output shape is a depthwise convolution's, as in pool2d
    shape = _out_shape((pool_stride, pool_pads, (1, 1), c, "NHWC"), conv_shape, (c, 1, *pool_kernel))
    has_bias = bias is not None
    bias = jnp.zeros((c,), x.dtype) if bias is None else bias
    return _ffi("paddlejax_onednn_conv2d_pool", shape, x.dtype, x, w, bias, **_attrs(geometry),
                has_bias=has_bias, act=np.int64(_ACTS[act]), alpha=np.float32(alpha),
                weights_id=np.int64(_weights_id(w)),
                max=pooling_type == "max", exclusive=bool(exclusive), pool_kernel=np.array(pool_kernel, np.int64),
                pool_stride=np.array(pool_stride, np.int64),
                pool_pad_lo=np.array([p[0] for p in pool_pads], np.int64),
                pool_pad_hi=np.array([p[1] for p in pool_pads], np.int64))


def batch_norm_fits(x, data_format: str) -> bool:
    """Whether oneDNN's batch norm computes this training-mode ``batch_norm``: float32, at least
    2-D, channels first or last (``data_format`` one of the op's layouts).

    >>> batch_norm_fits(jnp.ones((2, 4, 4, 3)), "NHWC"), batch_norm_fits(jnp.ones((2, 3), jnp.bfloat16), "NC")
    (True, False)
    """
    return x.ndim >= 2 and x.dtype == jnp.float32 and (data_format.startswith("NC") or data_format.endswith("C"))


def batch_norm_training(x, weight, bias, *, epsilon: float, data_format: str):
    """Batch norm in training by oneDNN: ``(out, batch mean, biased batch variance)``, the
    mean and variance over every axis but the channel one. Differentiable in forward and
    reverse mode, to any order; reverse mode runs oneDNN's backward kernel. ``weight`` and
    ``bias`` may be None. Callers check :func:`batch_norm_fits`.

    >>> if available():
    ...     out, mean, var = batch_norm_training(jnp.arange(8.0).reshape(4, 2), None, None, epsilon=0.0,
    ...                                          data_format="NC")
    ...     assert mean.tolist() == [3.0, 4.0] and var.tolist() == [5.0, 5.0]
    """
    if not available():
        raise RuntimeError(f"oneDNN batch_norm: {unavailable_reason()}")
    nhwc = x.ndim > 2 and data_format[-1] == "C"
    c = x.shape[-1] if nhwc else x.shape[1]
    # every layout as a 4-D one oneDNN knows: (N, C, H, W) in nchw or nhwc order
    view = (x.shape[0], math.prod(x.shape[1:-1]), 1, c) if nhwc else (x.shape[0], c, math.prod(x.shape[2:]), 1)
    weight = jnp.ones((c,), x.dtype) if weight is None else weight.astype(x.dtype)
    bias = jnp.zeros((c,), x.dtype) if bias is None else bias.astype(x.dtype)
    out, mean, var = _batch_norm(x.reshape(view), weight, bias, float(epsilon), nhwc)
    return out.reshape(x.shape), mean, var


def _bn_ffi(target, operands, shapes, epsilon, nhwc):
    call = jax.ffi.ffi_call(target, [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes],
                            vmap_method="sequential")
    return tuple(call(*operands, epsilon=np.float32(epsilon), nhwc=bool(nhwc)))


def _bn_view(nhwc, c):
    """(the reduced axes, the shape a per-channel vector broadcasts in) of a 4-D view."""
    return ((0, 1, 2), (1, 1, 1, c)) if nhwc else ((0, 2, 3), (1, c, 1, 1))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _batch_norm(x, weight, bias, epsilon, nhwc):
    c = weight.shape[0]
    return _bn_ffi("paddlejax_onednn_batch_norm_training", (x, weight, bias), (x.shape, (c,), (c,)), epsilon, nhwc)


@_batch_norm.defjvp
def _batch_norm_jvp(epsilon, nhwc, primals, tangents):
    x, weight, _ = primals
    dx = tangents[0]
    out, mean, var = _batch_norm(*primals, epsilon, nhwc)
    axes, vector = _bn_view(nhwc, weight.shape[0])
    dout = _bn_tangent(*tangents, x, weight, mean, var, epsilon=epsilon, nhwc=nhwc)
    dvar = 2 * jnp.mean(dx * (x - mean.reshape(vector)), axes)
    return (out, mean, var), (dout, jnp.mean(dx, axes), dvar)


# The derivative of the batch-normalised output with respect to (x, weight, bias), and its
# transpose, as linear primitives that transpose into one another: reverse mode runs
# oneDNN's backward kernel, forward mode and second derivatives the plain-JAX references.
def _standardised(x, mean, var, epsilon, nhwc):
    _, vector = _bn_view(nhwc, mean.shape[0])
    rstd = jax.lax.rsqrt(var + epsilon).reshape(vector)
    return (x - mean.reshape(vector)) * rstd, rstd


def _tangent_reference(dx, dweight, dbias, x, weight, mean, var, *, epsilon, nhwc):
    axes, vector = _bn_view(nhwc, weight.shape[0])
    xhat, rstd = _standardised(x, mean, var, epsilon, nhwc)
    dxhat = rstd * (dx - jnp.mean(dx, axes, keepdims=True) - xhat * jnp.mean(dx * xhat, axes, keepdims=True))
    return dxhat * weight.reshape(vector) + xhat * dweight.reshape(vector) + dbias.reshape(vector)


def _backward_reference(dout, x, weight, mean, var, *, epsilon, nhwc):
    axes, vector = _bn_view(nhwc, weight.shape[0])
    xhat, rstd = _standardised(x, mean, var, epsilon, nhwc)
    dbias, dweight = jnp.sum(dout, axes), jnp.sum(dout * xhat, axes)
    count = x.size // weight.shape[0]
    dx = (weight.reshape(vector) * rstd) * (dout - (dbias.reshape(vector) + xhat * dweight.reshape(vector)) / count)
    return dx, dweight, dbias


def _backward_kernel(dout, x, weight, mean, var, *, epsilon, nhwc):
    c = weight.shape[0]
    return _bn_ffi("paddlejax_onednn_batch_norm_backward", (x, dout, weight, mean, var), (x.shape, (c,), (c,)),
                   epsilon, nhwc)


_bn_tangent = adapter.make_linear_primitive(
    "onednn_batch_norm_tangent", _tangent_reference, _tangent_reference,
    lambda ct, *rest, **params: _bn_backward(ct, *rest, **params), n_linear=3)
_bn_backward = adapter.make_linear_primitive(
    "onednn_batch_norm_backward", _backward_kernel, _backward_reference,
    lambda cts, *rest, **params: [_bn_tangent(*cts, *rest, **params)], n_linear=1, multiple_results=True)
