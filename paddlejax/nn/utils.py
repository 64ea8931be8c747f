"""Layer utilities (Paddle's ``paddle.nn.utils``): :func:`spectral_norm`, which makes a layer
use its weight divided by the weight's largest singular value.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> nn.seed(0)
>>> conv = nn.utils.spectral_norm(nn.Conv2D(3, 8, 3))
>>> conv(jnp.ones((1, 3, 5, 5))).shape, sorted(nn.state_dict(conv))
((1, 8, 3, 3), ['layer.bias', 'layer.weight', 'spectral_norm.weight_u', 'spectral_norm.weight_v'])
"""
from __future__ import annotations

from flax import nnx

from paddlejax.nn.args import arg_error, is_int, positive_int
from paddlejax.nn.common import Linear
from paddlejax.nn.conv import Conv2DTranspose
from paddlejax.nn.layer import Layer
from paddlejax.nn.norm import SpectralNorm

# layers whose weight keeps its output channels on axis 1 (Paddle's [in, out] Linear weight and
# [in, out, kh, kw] transposed convolution): Paddle's spectral_norm normalises over that axis
_OUTPUT_AXIS_1 = (Linear, Conv2DTranspose)


class SpectralNormWrapper(Layer):
    """``layer`` computing with its weight ``name`` replaced by ``spectral_norm(weight)`` (a
    :class:`~paddlejax.nn.SpectralNorm` of that weight's shape): made by :func:`spectral_norm`.
    Calls take ``layer``'s arguments. ``layer`` keeps its own weight, the trained one
    (``layer.weight``); the power-iteration vectors are ``spectral_norm.weight_u`` and
    ``spectral_norm.weight_v``.

    The wrapped layer runs on a copy holding the normalised weight, so state its own forward
    pass would update (none in convolutions, linear layers and embeddings) is not kept.

    >>> import paddlejax.nn as nn
    >>> wrapped = SpectralNormWrapper(nn.Conv2DTranspose(4, 2, 3), dim=1)
    >>> wrapped.spectral_norm.weight_u[...].shape, wrapped.spectral_norm.weight_v[...].shape  # [out], [in * kh * kw]
    ((2,), (36,))
    """

    def __init__(self, layer, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                 dim: int | None = None):
        weight = getattr(layer, name, None) if isinstance(name, str) else None
        if not isinstance(weight, nnx.Param):
            raise arg_error("spectral_norm", "name", f"the name of a parameter of {type(layer).__name__}", name)
        if dim is not None and not is_int(dim):
            raise arg_error("spectral_norm", "dim", "None or an int", dim)
        if dim is None:
            dim = 1 if isinstance(layer, _OUTPUT_AXIS_1) else 0
        positive_int("spectral_norm", "n_power_iterations", n_power_iterations, minimum=0)
        self.layer = layer
        self._name = name
        self.spectral_norm = SpectralNorm(weight.shape, dim, n_power_iterations, eps, weight.dtype)

    def forward(self, *args, **kwargs):
        weight = self.spectral_norm(getattr(self.layer, self._name)[...])
        graphdef, state = nnx.split(self.layer)
        state[self._name] = state[self._name].replace(weight)
        return nnx.merge(graphdef, state)(*args, **kwargs)


def spectral_norm(layer, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> SpectralNormWrapper:
    """``layer`` with spectral normalisation of its parameter ``name`` (Paddle's
    ``paddle.nn.utils.spectral_norm``; Miyato et al. 2018), as the GAN discriminators of SNGAN
    and BigGAN use it: each call divides the weight by its largest singular value, estimated
    with ``n_power_iterations`` power iterations per training-mode call from vectors kept
    between calls (eval mode reads them). ``dim`` is the weight's output axis: by default 1 for
    ``Linear`` and ``Conv2DTranspose`` (their weights are ``[in, out, ...]``), else 0.

    Paddle changes ``layer`` in place (a forward hook, parameters ``weight_orig``,
    ``weight_u``, ``weight_v``); here the returned :class:`SpectralNormWrapper` holds ``layer``
    and the vectors, so use what it returns, as one does in Paddle.

    >>> import jax.numpy as jnp, numpy as np, paddlejax.nn as nn
    >>> fc = nn.utils.spectral_norm(nn.Linear(4, 3), n_power_iterations=30)
    >>> w = fc.spectral_norm(fc.layer.weight[...])   # the weight the layer computes with
    >>> round(float(np.linalg.svd(np.asarray(w), compute_uv=False)[0]), 4)
    1.0
    >>> nn.utils.spectral_norm(nn.ReLU())
    Traceback (most recent call last):
    ...
    ValueError: spectral_norm: argument 'name' expects the name of a parameter of ReLU, got 'weight'
    """
    return SpectralNormWrapper(layer, name, n_power_iterations, eps, dim)
