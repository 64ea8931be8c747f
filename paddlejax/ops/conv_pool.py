"""``conv2d_pool``: a 2-D convolution and the pooling after it, as one op.

``conv2d_pool(x, w, b, ...)`` is ``pool2d(conv2d(x, w, b, ...), ...)``: conv2d's attributes (its
fused bias and activation included) and pool2d's, those that would clash prefixed ``pool_``
(``pool_size`` is pool2d's ``kernel_size``), one ``data_format`` for both. The ``fuse_conv_pool``
pass makes it from the two ops for inference. It exists for its ``"onednn"`` kernel: one oneDNN
call that convolves a few images at a time into a buffer that stays in cache and pools them from
there (:func:`paddlejax.ops.onednn.conv2d_pool`), so that the convolution's output is never
written to memory and read back, which on a CPU with little memory bandwidth per core costs as
much as the pooling itself. Its other kernels are conv2d's, each followed by pool2d's reference
kernel, so that tuning the fused op never loses a kernel the convolution alone had.

>>> import jax.numpy as jnp
>>> y = conv2d_pool(jnp.ones((2, 8, 8, 3)), jnp.ones((4, 3, 3, 3)), padding=1, act="relu", pooling_type="max",
...                 pool_size=2, data_format="NHWC")
>>> y.shape, float(y[0, 0, 0, 0])
((2, 4, 4, 4), 27.0)
"""
from __future__ import annotations

import functools
import math

import jax

from paddlejax.ops import onednn
from paddlejax.ops.activation import fused_activation_attrs
from paddlejax.ops.conv import _BALANCE, _check_conv, _conv_attrs, _conv_estimate, _conv_flops, _grouped, conv2d
from paddlejax.ops.pool import _pool_flops, pool2d, pool_geometry
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.traits import Traits

# The fused op's pooling attributes and their names on pool2d.
_POOL_ATTRS = {"pooling_type": "pooling_type", "pool_size": "kernel_size", "pool_stride": "stride",
               "pool_padding": "padding", "ceil_mode": "ceil_mode", "exclusive": "exclusive"}


def _split(attrs: dict) -> tuple[dict, dict]:
    """The fused op's ``attrs`` as conv2d's and pool2d's."""
    conv = {k: v for k, v in attrs.items() if k not in _POOL_ATTRS}
    pool = {name: attrs[k] for k, name in _POOL_ATTRS.items()}
    return conv, {**pool, "global_pooling": False, "data_format": attrs["data_format"]}


def _composed(conv_kernel, doc: str):
    """A conv2d_pool kernel: ``conv_kernel`` (one of conv2d's), then pool2d's reference kernel."""

    def kernel(x, weight, bias=None, **attrs):
        conv, pool = _split(attrs)
        return pool2d.kernel(conv_kernel(x, weight, bias, **conv), **pool)

    kernel.__doc__ = doc
    kernel.__name__ = f"conv2d_pool_{conv_kernel.__name__.removeprefix('conv2d_')}"
    return kernel


_reference = _composed(conv2d.kernel, "2-D convolution (weight [out_c, in_c/groups, kh, kw], bias and "
                                      "activation fused) followed by max or average pooling.")


def _explicit(x, weight, bias, attrs: dict) -> tuple | None:
    """The oneDNN kernel's arguments for this call (explicit pads, hashable), or None where it
    does not compute it (see :func:`paddlejax.ops.onednn.conv2d_pool_fits`)."""
    conv, pool = _split(attrs)
    if conv["data_format"] != "NHWC" or x.ndim != 4:
        return None
    pads, dilation, groups = _check_conv("conv2d_pool", x, weight, bias, conv["stride"], conv["padding"],
                                         conv["dilation"], conv["groups"], "NHWC")
    y = jax.eval_shape(functools.partial(conv2d.kernel, **conv), x, weight, bias)
    kernel, stride, pool_pads = pool_geometry(y.shape[1:3], pool["kernel_size"], pool["stride"], pool["padding"],
                                              pool["ceil_mode"], False)
    if not onednn.conv2d_pool_fits(x, weight, "NHWC", conv["act"], pool["pooling_type"], kernel, pool_pads,
                                   stride=conv["stride"], pads=pads, dilation=dilation):
        return None
    return (("stride", tuple(conv["stride"])), ("pads", tuple(map(tuple, pads))), ("dilation", tuple(dilation)),
            ("groups", groups), ("act", conv["act"]), ("act_alpha", conv["act_alpha"]),
            ("pooling_type", pool["pooling_type"]), ("pool_kernel", tuple(kernel)), ("pool_stride", tuple(stride)),
            ("pool_pads", tuple(map(tuple, pool_pads))), ("exclusive", pool["exclusive"]))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _by_onednn(x, weight, bias, explicit, attrs):
    return onednn.conv2d_pool(x, weight, bias, **dict(explicit))


@_by_onednn.defjvp
def _by_onednn_jvp(explicit, attrs, primals, tangents):
    # the reference kernel's derivative: gradients are the unfused ops' exactly (under jit, XLA
    # drops the reference's own forward pass, which nothing reads)
    _, dy = jax.jvp(lambda *operands: _reference(*operands, **dict(attrs)), primals, tangents)
    return _by_onednn(*primals, explicit, attrs), dy


def _conv2d_pool_onednn(x, weight, bias=None, **attrs):
    """conv2d_pool by one oneDNN call (:func:`paddlejax.ops.onednn.conv2d_pool`), with the reference
    kernel's derivatives; where oneDNN is unavailable or does not fit the case, by the reference."""
    explicit = _explicit(x, weight, bias, attrs) if onednn.available() else None
    if explicit is None:
        return _reference(x, weight, bias, **attrs)
    return _by_onednn(x, weight, bias, explicit, tuple(attrs.items()))


def _conv_output(in_shapes, dtypes, conv_attrs) -> tuple:
    """The shape of the convolution's output inside the fused op."""
    operands = [jax.ShapeDtypeStruct(s, d) for s, d in zip(in_shapes, dtypes)]
    return jax.eval_shape(functools.partial(conv2d.kernel, **conv_attrs), *operands).shape


def _flops(in_shapes, out_shapes, attrs):
    """conv2d's FLOPs plus pool2d's."""
    conv, pool = _split(conv2d_pool.check_attrs(attrs))
    y = _conv_output(in_shapes, ["float32"] * len(in_shapes), conv)
    return _conv_flops(in_shapes, [y], conv) + _pool_flops([y], out_shapes, pool)


def _estimate(variant, in_shapes, dtypes, attrs, platform):
    """The relative time of ``variant`` (conv2d's cost model, see ``_conv_estimate``): conv2d's
    estimate of that kernel plus the bytes the pooling reads and writes; the oneDNN kernel neither
    writes the convolution's output nor reads it back. None where the variant computes as the
    reference kernel does.

    >>> attrs = {"padding": 1, "pooling_type": "max", "pool_size": 2, "data_format": "NHWC"}
    >>> shapes, dtypes = [(32, 32, 32, 32), (32, 32, 3, 3)], ["float32"] * 2
    >>> _estimate("onednn", shapes, dtypes, attrs, "cpu") < _estimate("default", shapes, dtypes, attrs, "cpu")
    True
    """
    attrs = conv2d_pool.check_attrs(attrs)
    conv, pool = _split(attrs)
    y = _conv_output(in_shapes, dtypes, conv)
    out = jax.eval_shape(functools.partial(pool2d.kernel, **pool), jax.ShapeDtypeStruct(y, dtypes[0])).shape
    itemsize, balance = jax.numpy.dtype(dtypes[0]).itemsize, _BALANCE.get(platform, _BALANCE["cpu"])
    conv_bytes, out_bytes = math.prod(y) * itemsize * balance, math.prod(out) * itemsize * balance
    conv_time = _conv_estimate(variant, in_shapes, dtypes, conv, platform)
    if conv_time is None:
        return None
    if variant != "onednn":
        return conv_time + conv_bytes + out_bytes
    x, w = (jax.ShapeDtypeStruct(s, d) for s, d in zip(in_shapes[:2], dtypes))
    if platform != "cpu" or _explicit(x, w, None, attrs) is None:
        return None
    return conv_time - conv_bytes + out_bytes


_COMPOSED = {name: _composed(kernel, f"conv2d's {name!r} kernel, then pool2d's reference kernel.")
             for name, kernel in conv2d.variants.items() if name != "onednn"}

conv2d_pool = define(
    "conv2d_pool", _reference,
    inputs=[Input("x", rank=4, dtype="float"), Input("weight", rank=4, dtype="float"),
            Input("bias", rank=1, dtype="float", optional=True)],
    attrs={**_conv_attrs(groups=Attr("int", 1, minimum=1)), **fused_activation_attrs(),
           "pooling_type": pool2d.attrs["pooling_type"], "pool_size": Attr("ints", length=2, minimum=1),
           "pool_stride": pool2d.attrs["stride"], "pool_padding": pool2d.attrs["padding"],
           "ceil_mode": pool2d.attrs["ceil_mode"], "exclusive": pool2d.attrs["exclusive"]},
    variants={**_COMPOSED, "onednn": _conv2d_pool_onednn},
    requires={**{v: p for v, p in conv2d.requires.items() if v in _COMPOSED}, "onednn": onednn.available},
    reduced_precision=conv2d.reduced_precision & set(_COMPOSED), flops=_flops, estimate=_estimate,
    traits=Traits(amp="white", layout_sensitive=True, channels=_grouped, saved_for_backward=("operands",)))
