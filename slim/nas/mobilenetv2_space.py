"""``MobileNetV2Space``: MobileNetV2's inverted residual stages with searched widths, expansion
ratios, depths and kernel sizes (PaddleSlim's ``MobileNetV2Space``, token for token).

Tokens: the first picks the width of the head stage (expansion 1, one block, stride 1); then
every stage has four, ``[expansion, width, repeat, kernel]``, indexes into :attr:`multiply`,
the stage's row of :attr:`filter_num`, :attr:`repeat` and :attr:`k_size`. ``block_num`` stages
halve the resolution (the stem and the first block of stages 2-4 have stride 2; ``block_num``
5 and 6 add a strided and an unstrided stage each, as Paddle's do). The tables are sized for
small images (8x8 digits train a candidate in seconds); subclass and override them for others.

>>> space = MobileNetV2Space(input_size=8, output_size=1, block_num=2, input_channels=1, class_dim=10)
>>> space.init_tokens(), space.range_table()
([2, 4, 2, 1, 0], [5, 5, 5, 3, 2])
>>> [(b.kind, b.in_shape) for b in space.blocks([0, 1, 0, 0, 1])]  # doctest: +NORMALIZE_WHITESPACE
[('conv_bn', (1, 8, 8)), ('inverted_residual', (16, 4, 4)), ('inverted_residual', (8, 4, 4)),
 ('conv_bn', (8, 2, 2)), ('classifier', (256, 2, 2))]
"""
from __future__ import annotations

from paddlejax import nn
from paddlejax.models.blocks import ConvNormActivation
from paddlejax.models.mobilenet import InvertedResidual
from paddlejax.slim.nas.search_space import SearchSpace, chain, register_block, register_search_space


@register_block("inverted_residual")
def inverted_residual(in_channels: int, out_channels: int, stride: int, expand: int, kernel: int) -> nn.Layer:
    """The model zoo's :class:`~paddlejax.models.mobilenet.InvertedResidual` with a
    ``kernel`` x ``kernel`` depthwise conv."""
    block = InvertedResidual(in_channels, out_channels, stride, expand)
    if kernel != 3:
        # the zoo's block is fixed at 3x3: the kernel token swaps its depthwise conv-BN-ReLU6
        hidden = int(round(in_channels * expand))
        setattr(block.conv, str(len(block.conv) - 3),
                ConvNormActivation(hidden, hidden, kernel, stride=stride, groups=hidden, activation_layer=nn.ReLU6))
    return block


@register_search_space
class MobileNetV2Space(SearchSpace):
    """MobileNetV2 stages in ``block_num`` (1-6) resolution halvings; see the module doc.

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> space = MobileNetV2Space(input_size=8, output_size=1, block_num=3, input_channels=1, class_dim=10)
    >>> nnx.eval_shape(lambda x: space.token2arch()(x), jnp.zeros((2, 1, 8, 8))).shape
    (2, 10)
    """

    max_blocks = 6
    stem = 16
    last = 256
    head_num = (8, 12, 16, 24, 32)
    # one row of widths, and a stride, per stage after the head, in Paddle's order of stages
    filter_num = ((8, 12, 16, 24, 32), (8, 12, 16, 24, 32), (16, 24, 32, 48, 64), (24, 32, 48, 64, 96),
                  (32, 48, 64, 96, 128), (48, 64, 96, 128, 160), (64, 96, 128, 160, 192))
    strides = (2, 2, 2, 2, 1, 2, 1)
    multiply = (1, 2, 3, 4, 6)
    repeat = (1, 2, 3)
    k_size = (3, 5)

    def _stages(self) -> int:
        """Stages after the head: one per halving, and the unstrided stages of block_num 5 and 6."""
        return self.block_num - 1 + (self.block_num >= 5) + (self.block_num >= 6)

    def init_tokens(self) -> list[int]:
        """Head of 16; each stage: expansion 6, its middle width, 2 blocks, 3x3."""
        return [2] + [4, 2, 1, 0] * self._stages()

    def range_table(self) -> list[int]:
        """The head's widths, then each stage's expansions, widths, repeats and kernels."""
        return [len(self.head_num)] + [n for row in self.filter_num[:self._stages()]
                                       for n in (len(self.multiply), len(row), len(self.repeat), len(self.k_size))]

    def stages(self, tokens) -> list[tuple[int, int, int, int, int]]:
        """Paddle's ``bottleneck_params_list``: ``(expansion, width, repeat, stride, kernel)`` per stage."""
        tokens = self.check_tokens(tokens)
        stages = [(1, self.head_num[tokens[0]], 1, 1, 3)]
        for i in range(self._stages()):
            t, c, n, k = tokens[1 + 4 * i:5 + 4 * i]
            stages.append((self.multiply[t], self.filter_num[i][c], self.repeat[n], self.strides[i], self.k_size[k]))
        return stages

    def blocks(self, tokens):
        """Stem, the stages' inverted residual blocks, then (a classifier) 1x1 conv and classifier."""
        layers = [("conv_bn", dict(out_channels=self.stem, kernel=3, stride=2, act="relu6"))]
        for t, c, n, s, k in self.stages(tokens):
            layers += [("inverted_residual", dict(out_channels=c, stride=s if i == 0 else 1, expand=t, kernel=k))
                       for i in range(n)]
        if self.output_size == 1:
            layers += [("conv_bn", dict(out_channels=self.last, kernel=1, stride=1, act="relu6")),
                       ("classifier", dict(out_channels=self.class_dim))]
        return chain(self.in_shape, layers)
