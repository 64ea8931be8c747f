"""Generative adversarial networks of PaddleGAN's zoo, in Paddle's NCHW layout with images in
[-1, 1] (the generators end in ``tanh``):

- :class:`DCGANGenerator` / :class:`DCGANDiscriminator`: DCGAN (Radford et al. 2016), optionally
  class-conditional (the generator concatenates a label embedding to the noise; the
  discriminator projects (Miyato & Koyama 2018) or concatenates one-hot label maps) and with
  spectral norm in the discriminator (SNGAN);
- :class:`Pix2PixGenerator` (a U-Net) and :class:`PatchGANDiscriminator`: Pix2Pix (Isola et al.
  2017), paired image-to-image translation;
- :class:`CycleGANGenerator` (ResNet blocks, instance norm, reflection padding): CycleGAN (Zhu et
  al. 2017), unpaired translation, with two of them and two PatchGAN discriminators.

What each trains on and how (losses, the two players' steps) is in
:mod:`paddlejax.models.gan_objectives`; :class:`paddlejax.train.gan.GANTrainer` runs them.

>>> import jax, numpy as np, paddlejax as pj
>>> pj.nn.seed(0)
>>> g = DCGANGenerator(latent_dim=8, num_classes=10, image_size=16, base_channels=8)
>>> d = DCGANDiscriminator(num_classes=10, image_size=16, base_channels=8)
>>> images = g.sample(jax.random.key(0), labels=np.arange(4))
>>> images.shape, d(images, np.arange(4)).shape
((4, 1, 16, 16), (4,))
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax import nn, ops
from paddlejax.models.blocks import check_image
from paddlejax.nn.args import arg_error, choice, is_int, positive_int, probability

NORMS = ("batch", "instance", "none")


def _norm(kind: str, channels: int) -> list:
    """The normalisation layer of ``kind`` (instance norm without affine parameters, as
    PaddleGAN builds it), as a list to splice into a layer list (empty for ``"none"``)."""
    if kind == "batch":
        return [nn.BatchNorm2D(channels)]
    if kind == "instance":
        return [nn.InstanceNorm2D(channels, weight_attr=False, bias_attr=False)]
    return []


def _bias(norm: str):
    """No bias before batch norm, which would cancel it (PaddleGAN's ``use_bias``)."""
    return False if norm == "batch" else None


def _stages(model: str, image_size) -> int:
    """The number of 2x resolution steps between 4x4 and ``image_size`` (a power of 2 >= 8)."""
    if not is_int(image_size) or image_size < 8 or image_size & (image_size - 1):
        raise arg_error(model, "image_size", "a power of 2 >= 8", image_size)
    return int(math.log2(image_size)) - 2


def _check_labels(model: str, labels, num_classes: int, n: int):
    if num_classes == 0:
        if labels is not None:
            raise ValueError(f"{model}: labels given to an unconditional model (num_classes=0)")
        return None
    if labels is None:
        raise ValueError(f"{model}: input 'labels' is required (a conditional model, num_classes={num_classes})")
    labels = np.asarray(labels) if not hasattr(labels, "shape") else labels
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{model}: input 'labels' expects {n} integer class ids (shape ({n},)), got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    return labels


def _check_sides(owner: str, x, channels: int, option: str, halvings: int) -> None:
    """An NCHW image of ``channels`` whose sides survive ``halvings`` halvings (``option``)."""
    check_image(owner, x, "NCHW", channels)
    step = 2 ** halvings
    if x.shape[2] % step or x.shape[3] % step:
        raise ValueError(f"{owner}: input 'x' expects height and width multiples of {step} "
                         f"({option}={halvings}), got {tuple(x.shape)}")

class DCGANGenerator(nn.Layer):
    """DCGAN's generator (PaddleGAN's ``DCGenerator``): noise ``z [N, latent_dim]`` (with
    ``num_classes > 0``, concatenated with an ``embed_dim`` embedding of ``labels [N]``, default
    ``num_classes`` wide) is projected to 4x4 by a 4x4 transposed convolution, then doubled in
    size by stride-2 transposed convolutions (BN, ReLU; channels halving from
    ``base_channels * image_size / 8``) up to ``image_size`` (a power of 2 >= 8), ending in a
    ``channels``-channel ``tanh`` image ``[N, channels, image_size, image_size]``.

    >>> import numpy as np
    >>> g = DCGANGenerator(latent_dim=16, image_size=32, channels=3, base_channels=8)
    >>> g(np.zeros((2, 16), np.float32)).shape
    (2, 3, 32, 32)
    """

    def __init__(self, latent_dim: int = 100, num_classes: int = 0, image_size: int = 64, channels: int = 1,
                 base_channels: int = 64, embed_dim: int | None = None):
        self.latent_dim = positive_int("DCGANGenerator", "latent_dim", latent_dim)
        self.num_classes = positive_int("DCGANGenerator", "num_classes", num_classes, minimum=0)
        self.channels = positive_int("DCGANGenerator", "channels", channels)
        base = positive_int("DCGANGenerator", "base_channels", base_channels)
        stages = _stages("DCGANGenerator", image_size)
        embed = 0
        if self.num_classes:
            embed = positive_int("DCGANGenerator", "embed_dim", self.num_classes if embed_dim is None else embed_dim)
        self.embedding = nn.Embedding(self.num_classes, embed) if self.num_classes else None
        width = base * 2 ** (stages - 1)
        layers = [nn.Conv2DTranspose(self.latent_dim + embed, width, 4, bias_attr=False), nn.BatchNorm2D(width),
                  nn.ReLU()]
        for _ in range(stages - 1):
            layers += [nn.Conv2DTranspose(width, width // 2, 4, stride=2, padding=1, bias_attr=False),
                       nn.BatchNorm2D(width // 2), nn.ReLU()]
            width //= 2
        layers += [nn.Conv2DTranspose(width, self.channels, 4, stride=2, padding=1), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z, labels=None):
        if len(z.shape) != 2 or z.shape[1] != self.latent_dim:
            raise ValueError(f"DCGANGenerator: input 'z' expects shape [N, {self.latent_dim}], got {tuple(z.shape)}")
        labels = _check_labels("DCGANGenerator", labels, self.num_classes, z.shape[0])
        h = z if labels is None else ops.concat(z, self.embedding(labels), axis=1)
        return self.net(ops.reshape(h, shape=(0, -1, 1, 1)))

    def sample(self, key, labels=None, num: int | None = None):
        """Images from standard normal noise drawn with ``key``: one per label of ``labels``
        (conditional), or ``num`` of them (unconditional).

        >>> import jax
        >>> DCGANGenerator(latent_dim=4, image_size=8, base_channels=4).sample(jax.random.key(0), num=3).shape
        (3, 1, 8, 8)
        """
        n = len(labels) if labels is not None else num
        if not is_int(n) or n < 1:
            raise arg_error("DCGANGenerator.sample", "num", "an int >= 1 (or labels)", num)
        return self(jax.random.normal(key, (int(n), self.latent_dim)), labels)


class DCGANDiscriminator(nn.Layer):
    """DCGAN's discriminator (PaddleGAN's ``DCDiscriminator``): stride-2 4x4 convolutions with
    LeakyReLU(0.2), channels doubling from ``base_channels``, down to 4x4, then a linear layer
    to one logit per image: ``[N]``.

    ``spectral_norm=True`` (SNGAN) normalises every convolution, the linear layer and the
    projection embedding with :func:`paddlejax.nn.utils.spectral_norm` and drops batch norm;
    False uses batch norm after every convolution but the first, as DCGAN does. With
    ``num_classes > 0`` it judges an image as an image of its label: ``condition="projection"``
    adds the inner product of a label embedding with the flattened features to the logit
    (Miyato & Koyama 2018); ``"concat"`` concatenates one-hot label maps to the image.

    >>> import numpy as np
    >>> d = DCGANDiscriminator(num_classes=3, image_size=8, base_channels=4, condition="concat")
    >>> d(np.zeros((2, 1, 8, 8), np.float32), np.array([0, 2])).shape
    (2,)
    """

    def __init__(self, num_classes: int = 0, image_size: int = 64, channels: int = 1, base_channels: int = 64,
                 spectral_norm: bool = True, condition: str = "projection"):
        self.num_classes = positive_int("DCGANDiscriminator", "num_classes", num_classes, minimum=0)
        self.channels = positive_int("DCGANDiscriminator", "channels", channels)
        self.image_size = image_size
        base = positive_int("DCGANDiscriminator", "base_channels", base_channels)
        stages = _stages("DCGANDiscriminator", image_size)
        if not isinstance(spectral_norm, bool):
            raise arg_error("DCGANDiscriminator", "spectral_norm", "a bool", spectral_norm)
        self.condition = choice("DCGANDiscriminator", "condition", condition, ("projection", "concat"))
        sn = nn.utils.spectral_norm if spectral_norm else (lambda layer: layer)
        extra = self.num_classes if self.condition == "concat" else 0
        layers = [sn(nn.Conv2D(self.channels + extra, base, 4, stride=2, padding=1)), nn.LeakyReLU(0.2)]
        width = base
        for _ in range(stages - 1):
            layers += [sn(nn.Conv2D(width, 2 * width, 4, stride=2, padding=1,
                                    bias_attr=None if spectral_norm else False)),
                       *([] if spectral_norm else [nn.BatchNorm2D(2 * width)]), nn.LeakyReLU(0.2)]
            width *= 2
        self.features = nn.Sequential(*layers)
        self.head = sn(nn.Linear(width * 16, 1))
        projection = self.num_classes and self.condition == "projection"
        self.embedding = sn(nn.Embedding(self.num_classes, width * 16)) if projection else None

    def forward(self, x, labels=None):
        check_image("DCGANDiscriminator", x, "NCHW", self.channels)
        if tuple(x.shape[2:]) != (self.image_size, self.image_size):
            raise ValueError(f"DCGANDiscriminator: input 'x' expects {self.image_size}x{self.image_size} images, got "
                             f"{tuple(x.shape)}")
        labels = _check_labels("DCGANDiscriminator", labels, self.num_classes, x.shape[0])
        if labels is not None and self.condition == "concat":
            maps = nn.functional.one_hot(labels, self.num_classes).astype(x.dtype)[:, :, None, None]
            x = ops.concat(x, jnp.broadcast_to(maps, (*maps.shape[:2], *x.shape[2:])), axis=1)
        h = ops.reshape(self.features(x), shape=(0, -1))
        logit = ops.reshape(self.head(h), shape=(-1,))
        if self.embedding is not None:
            logit = logit + ops.reduce_sum(self.embedding(labels) * h, axis=1)
        return logit


class Pix2PixGenerator(nn.Layer):
    """Pix2Pix's U-Net generator (PaddleGAN's ``UnetGenerator``): ``num_downs`` stride-2 4x4
    convolutions (LeakyReLU(0.2) before all but the first, ``norm`` after all but the first and
    the innermost; channels doubling from ``base_channels`` up to 8x) take the image down to
    ``1 / 2**num_downs`` of its size, and as many stride-2 transposed convolutions (ReLU, norm)
    bring it back, each level's output concatenated with the encoder's features of that size
    (the skip connections); the last ends in ``tanh``. ``dropout`` follows the middle decoder
    levels that keep 8x channels, as in PaddleGAN (none when ``num_downs`` < 6). Inputs'
    height and width must be multiples of ``2**num_downs``.

    >>> import numpy as np
    >>> Pix2PixGenerator(1, 1, num_downs=4, base_channels=4)(np.zeros((2, 1, 16, 16), np.float32)).shape
    (2, 1, 16, 16)
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 3, num_downs: int = 8, base_channels: int = 64,
                 norm: str = "batch", dropout: float = 0.5):
        self.in_channels = positive_int("Pix2PixGenerator", "in_channels", in_channels)
        out_channels = positive_int("Pix2PixGenerator", "out_channels", out_channels)
        self.num_downs = positive_int("Pix2PixGenerator", "num_downs", num_downs, minimum=2)
        base = positive_int("Pix2PixGenerator", "base_channels", base_channels)
        norm = choice("Pix2PixGenerator", "norm", norm, NORMS)
        dropout = probability("Pix2PixGenerator", "dropout", dropout)
        widths = [min(base * 2 ** i, base * 8) for i in range(self.num_downs)]
        last = self.num_downs - 1
        downs = [nn.Conv2D(self.in_channels, widths[0], 4, stride=2, padding=1, bias_attr=_bias(norm))]
        for i in range(1, self.num_downs):
            inner = i == last
            downs.append(nn.Sequential(
                nn.LeakyReLU(0.2), nn.Conv2D(widths[i - 1], widths[i], 4, stride=2, padding=1,
                                             bias_attr=None if inner else _bias(norm)),
                *([] if inner else _norm(norm, widths[i]))))
        ups = [nn.Sequential(nn.ReLU(), nn.Conv2DTranspose(2 * widths[0], out_channels, 4, stride=2, padding=1),
                             nn.Tanh())]
        for i in range(1, self.num_downs):
            inner = i == last
            middle = not inner and widths[i - 1] == widths[i] == base * 8
            ups.append(nn.Sequential(
                nn.ReLU(), nn.Conv2DTranspose(widths[i] * (1 if inner else 2), widths[i - 1], 4, stride=2, padding=1,
                                              bias_attr=_bias(norm)),
                *_norm(norm, widths[i - 1]), *([nn.Dropout(dropout)] if middle and dropout else [])))
        self.downs, self.ups = nn.LayerList(downs), nn.LayerList(ups)

    def forward(self, x):
        _check_sides("Pix2PixGenerator", x, self.in_channels, "num_downs", self.num_downs)
        skips = []
        for down in self.downs:
            x = down(x)
            skips.append(x)
        x = self.ups[-1](skips[-1])
        for i in range(self.num_downs - 2, -1, -1):
            x = self.ups[i](ops.concat(skips[i], x, axis=1))
        return x


class PatchGANDiscriminator(nn.Layer):
    """PatchGAN (PaddleGAN's ``NLayerDiscriminator``): ``n_layers`` stride-2 4x4 convolutions
    and one stride-1 (LeakyReLU(0.2), ``norm`` after all but the first; channels doubling from
    ``base_channels`` up to 8x), then a stride-1 4x4 convolution to one logit per patch:
    ``[N, 1, h, w]``, each judging a receptive field of the input. Pix2Pix feeds it the input
    and the (real or generated) output concatenated on channels. Images need at least
    ``3 * 2**n_layers`` pixels a side.

    >>> import numpy as np
    >>> PatchGANDiscriminator(2, base_channels=4, n_layers=2)(np.zeros((1, 2, 16, 16), np.float32)).shape
    (1, 1, 2, 2)
    """

    def __init__(self, in_channels: int = 6, base_channels: int = 64, n_layers: int = 3, norm: str = "batch"):
        self.in_channels = positive_int("PatchGANDiscriminator", "in_channels", in_channels)
        base = positive_int("PatchGANDiscriminator", "base_channels", base_channels)
        self.n_layers = positive_int("PatchGANDiscriminator", "n_layers", n_layers)
        norm = choice("PatchGANDiscriminator", "norm", norm, NORMS)
        layers = [nn.Conv2D(self.in_channels, base, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        width = base
        for n in range(1, self.n_layers + 1):
            new = base * min(2 ** n, 8)
            stride = 2 if n < self.n_layers else 1
            layers += [nn.Conv2D(width, new, 4, stride=stride, padding=1, bias_attr=_bias(norm)), *_norm(norm, new),
                       nn.LeakyReLU(0.2)]
            width = new
        layers.append(nn.Conv2D(width, 1, 4, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        check_image("PatchGANDiscriminator", x, "NCHW", self.in_channels)
        smallest = 3 * 2 ** self.n_layers
        if min(x.shape[2:]) < smallest:
            raise ValueError(f"PatchGANDiscriminator: input 'x' expects images of at least {smallest}x{smallest} "
                             f"with n_layers={self.n_layers}, got {tuple(x.shape)}")
        return self.net(x)


class ResnetBlock(nn.Layer):
    """``x + norm(conv(relu(norm(conv(x)))))`` with 3x3 convolutions on reflection-padded input
    (PaddleGAN's ``ResnetBlock``), ``dropout`` between them.

    >>> import numpy as np
    >>> ResnetBlock(4)(np.zeros((1, 4, 5, 5), np.float32)).shape
    (1, 4, 5, 5)
    """

    def __init__(self, channels: int, norm: str = "instance", dropout: float = 0.0):
        conv = lambda: nn.Conv2D(channels, channels, 3, padding=1, padding_mode="reflect",  # noqa: E731
                                 bias_attr=_bias(norm))
        self.block = nn.Sequential(conv(), *_norm(norm, channels), nn.ReLU(),
                                   *([nn.Dropout(dropout)] if dropout else []), conv(), *_norm(norm, channels))

    def forward(self, x):
        return x + self.block(x)


class CycleGANGenerator(nn.Layer):
    """CycleGAN's generator (PaddleGAN's ``ResnetGenerator``): a 7x7 convolution on
    reflection-padded input, ``n_downsampling`` stride-2 3x3 convolutions (channels doubling
    from ``base_channels``), ``n_blocks`` :class:`ResnetBlock` s, as many stride-2 transposed
    convolutions back, and a 7x7 convolution to a ``tanh`` image; ``norm`` (instance norm by
    default) and ReLU after every convolution but the last. Inputs' height and width must be
    multiples of ``2**n_downsampling``.

    >>> import numpy as np
    >>> CycleGANGenerator(1, 1, base_channels=4, n_blocks=2)(np.zeros((2, 1, 16, 16), np.float32)).shape
    (2, 1, 16, 16)
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 3, base_channels: int = 64, n_blocks: int = 6,
                 norm: str = "instance", n_downsampling: int = 2, dropout: float = 0.0):
        self.in_channels = positive_int("CycleGANGenerator", "in_channels", in_channels)
        out_channels = positive_int("CycleGANGenerator", "out_channels", out_channels)
        base = positive_int("CycleGANGenerator", "base_channels", base_channels)
        n_blocks = positive_int("CycleGANGenerator", "n_blocks", n_blocks, minimum=0)
        self.n_downsampling = positive_int("CycleGANGenerator", "n_downsampling", n_downsampling, minimum=0)
        norm = choice("CycleGANGenerator", "norm", norm, NORMS)
        dropout = probability("CycleGANGenerator", "dropout", dropout)
        bias = _bias(norm)
        layers = [nn.Conv2D(self.in_channels, base, 7, padding=3, padding_mode="reflect", bias_attr=bias),
                  *_norm(norm, base), nn.ReLU()]
        width = base
        for _ in range(self.n_downsampling):
            layers += [nn.Conv2D(width, 2 * width, 3, stride=2, padding=1, bias_attr=bias), *_norm(norm, 2 * width),
                       nn.ReLU()]
            width *= 2
        layers += [ResnetBlock(width, norm, dropout) for _ in range(n_blocks)]
        for _ in range(self.n_downsampling):
            layers += [nn.Conv2DTranspose(width, width // 2, 3, stride=2, padding=1, output_padding=1, bias_attr=bias),
                       *_norm(norm, width // 2), nn.ReLU()]
            width //= 2
        layers += [nn.Conv2D(width, out_channels, 7, padding=3, padding_mode="reflect"), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        _check_sides("CycleGANGenerator", x, self.in_channels, "n_downsampling", self.n_downsampling)
        return self.net(x)
