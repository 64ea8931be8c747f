"""Deformable convolution (Paddle's ``paddle.vision.ops.deform_conv2d``): v1 (Dai et al. 2017)
and, with a ``mask``, the modulated v2 (Zhu et al. 2019).

Each kernel tap of each output position reads the input not on the regular grid but shifted by a
learned fractional offset, bilinearly interpolated (a position outside the image reads 0), and
v2 multiplies what it read by a learned modulation. ``offset`` is ``[N, 2 * dg * kh * kw, Ho, Wo]``,
for each deformable group ``g`` and tap ``k = i * kw + j`` the ``(dy, dx)`` pair at channels
``2 * (g * kh * kw + k)`` and the one after; ``mask`` is ``[N, dg * kh * kw, Ho, Wo]``. The
input channels split into ``deformable_groups`` groups that share offsets, and independently into
``groups`` as in a grouped convolution. The weight is ``[out_c, in_c / groups, kh, kw]``.

With zero offsets (and a mask of ones) it is the plain convolution:

>>> import jax.numpy as jnp
>>> from paddlejax.ops.conv import conv2d
>>> x, w = jnp.arange(32.0).reshape(1, 2, 4, 4), jnp.ones((3, 2, 3, 3))
>>> y = deformable_conv2d(x, jnp.zeros((1, 18, 4, 4)), w, padding=1)
>>> bool(jnp.allclose(y, conv2d(x, w, padding=1)))
True

A mask and a bias may both be given; a v1 convolution with a bias passes a mask of ones, since
optional inputs are trailing.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from paddlejax.ops.common import attr_error, input_error
from paddlejax.ops.registry import Attr, Input, define
from paddlejax.ops.sampling import gather_taps, linear_taps
from paddlejax.ops.traits import Traits

_OP = "deformable_conv2d"


def _output_size(op, size, kernel, stride, pad, dilation, padding):
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise attr_error(op, "padding", f"a padded input at least as large as the dilated kernel "
                         f"(input size {size}, kernel {kernel}, dilation {dilation})", padding)
    return out


def _check(x, offset, weight, mask, bias, stride, padding, dilation, deformable_groups, groups):
    """The output's spatial size, after checking every input against the others."""
    _, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    if weight.dtype != x.dtype:
        raise input_error(_OP, "weight", f"the dtype of 'x' ({x.dtype}); cast one of them", str(weight.dtype))
    if cin_g * groups != cin:
        raise input_error(_OP, "weight", f"shape [out_c, {cin} / groups={groups}, kh, kw] (x has {cin} channels)",
                          tuple(weight.shape))
    if cout % groups:
        raise input_error(_OP, "weight", f"an out_c divisible by groups={groups}", tuple(weight.shape))
    if cin % deformable_groups:
        raise attr_error(_OP, "deformable_groups", f"a divisor of the input channels ({cin})", deformable_groups)
    ho = _output_size(_OP, h, kh, stride[0], padding[0], dilation[0], padding)
    wo = _output_size(_OP, w, kw, stride[1], padding[1], dilation[1], padding)
    taps = deformable_groups * kh * kw
    if offset.shape != (x.shape[0], 2 * taps, ho, wo):
        raise input_error(_OP, "offset", f"shape {(x.shape[0], 2 * taps, ho, wo)} ((dy, dx) per deformable group "
                          "and kernel tap, at each output position)", tuple(offset.shape))
    if mask is not None and mask.shape != (x.shape[0], taps, ho, wo):
        raise input_error(_OP, "mask", f"shape {(x.shape[0], taps, ho, wo)} (one per deformable group and "
                          "kernel tap, at each output position)", tuple(mask.shape))
    if bias is not None and bias.shape != (cout,):
        raise input_error(_OP, "bias", f"shape ({cout},)", tuple(bias.shape))
    return ho, wo


# Jitted so that eager calls reuse one compiled kernel per shape and attributes, not dispatch
# its many small operations one by one. Under tracing it is just a nested call.
@functools.partial(jax.jit, static_argnames=("stride", "padding", "dilation", "deformable_groups", "groups"))
def _deformable_conv2d(x, offset, weight, mask=None, bias=None, *, stride, padding, dilation, deformable_groups,
                       groups):
    """Deformable 2-D convolution (v2 with a ``mask``), weight [out_c, in_c/groups, kh, kw]."""
    ho, wo = _check(x, offset, weight, mask, bias, stride, padding, dilation, deformable_groups, groups)
    n, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    dg, taps = deformable_groups, kh * kw
    dtype = jnp.promote_types(offset.dtype, jnp.float32)  # pixel positions need float32's mantissa
    # where each tap of each output position reads on the regular grid: [taps, Ho, 1] and [taps, 1, Wo]
    tap_y = jnp.repeat(jnp.arange(kh) * dilation[0], kw).reshape(taps, 1, 1)
    tap_x = jnp.tile(jnp.arange(kw) * dilation[1], kh).reshape(taps, 1, 1)
    grid_y = tap_y + (jnp.arange(ho) * stride[0] - padding[0]).reshape(1, ho, 1)
    grid_x = tap_x + (jnp.arange(wo) * stride[1] - padding[1]).reshape(1, 1, wo)
    shift = offset.astype(dtype).reshape(n, dg, taps, 2, ho, wo)
    pos_y, pos_x = grid_y + shift[:, :, :, 0], grid_x + shift[:, :, :, 1]  # [N, dg, taps, Ho, Wo]
    # each deformable group of channels is an image of its own: image n * dg + g
    images = x.reshape(n * dg, cin // dg, h, w)
    batch = jnp.arange(n * dg).reshape(n, dg, 1, 1, 1)
    sampled = gather_taps(images, batch, linear_taps(pos_y), linear_taps(pos_x))  # [N, dg, taps, Ho, Wo, cin/dg]
    if mask is not None:
        sampled = sampled * mask.reshape(n, dg, taps, ho, wo, 1).astype(sampled.dtype)
    # channels in order (dg, cin/dg) are the input channels, regrouped for the grouped product
    sampled = jnp.moveaxis(sampled, 1, -2).reshape(n, taps, ho, wo, groups, cin_g)
    out = jnp.einsum("nkhwgc,gock->ngohw", sampled, weight.reshape(groups, cout // groups, cin_g, taps))
    out = out.reshape(n, cout, ho, wo)
    return out if bias is None else out + bias.reshape(1, cout, 1, 1)


def _flops(in_shapes, out_shapes, attrs):
    """The convolution's multiply-adds, plus per sampled value 4 taps and the modulation."""
    n, cout, ho, wo = out_shapes[0]
    cin = in_shapes[0][1]
    taps = math.prod(in_shapes[2][2:])
    return 2 * n * cout * ho * wo * in_shapes[2][1] * taps + 9 * n * cin * taps * ho * wo


deformable_conv2d = define(
    _OP, _deformable_conv2d,
    inputs=[Input("x", rank=4, dtype="float"), Input("offset", rank=4, dtype="float"),
            Input("weight", rank=4, dtype="float"), Input("mask", rank=4, dtype="float", optional=True),
            Input("bias", rank=1, dtype="float", optional=True)],
    attrs={"stride": Attr("ints", (1, 1), length=2, minimum=1),
           "padding": Attr("ints", (0, 0), length=2, minimum=0),
           "dilation": Attr("ints", (1, 1), length=2, minimum=1),
           "deformable_groups": Attr("int", 1, minimum=1),
           "groups": Attr("int", 1, minimum=1)},
    flops=_flops, traits=Traits(saved_for_backward=("operands",)))
