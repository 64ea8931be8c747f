"""``ResNetSpace``: ResNet stages of basic blocks with searched widths and depths (PaddleSlim's
``ResNetSpace``, token for token).

A 5x5 stride-2 conv-BN-ReLU stem as wide as the first stage, then ``block_num`` (1-4) stages,
each with two tokens ``[width, repeat]`` (indexes into the stage's row of :attr:`filter_num` and
into :attr:`repeat`); every stage after the first starts with a stride-2 block whose shortcut is
a 1x1 conv-BN. The tables are sized for small images; subclass and override them for others.

>>> space = ResNetSpace(input_size=8, output_size=1, block_num=2, input_channels=1, class_dim=10)
>>> [(b.kind, b.out_shape) for b in space.blocks([0, 1, 2, 0])]  # doctest: +NORMALIZE_WHITESPACE
[('conv_bn', (8, 4, 4)), ('basic', (8, 4, 4)), ('basic', (8, 4, 4)), ('basic', (32, 2, 2)),
 ('classifier', (10, 2, 2))]
"""
from __future__ import annotations

from paddlejax import nn
from paddlejax.models.resnet import BasicBlock
from paddlejax.slim.nas.search_space import SearchSpace, chain, conv_bn, register_block, register_search_space


@register_block("basic")
def basic(in_channels: int, out_channels: int, stride: int) -> nn.Layer:
    """The model zoo's :class:`~paddlejax.models.resnet.BasicBlock`, with a 1x1 conv-BN shortcut
    where the shape changes."""
    shortcut = None if stride == 1 and in_channels == out_channels else conv_bn(in_channels, out_channels, 1, stride,
                                                                                 act=None)
    return BasicBlock(in_channels, out_channels, stride, shortcut)


@register_search_space
class ResNetSpace(SearchSpace):
    """ResNet stages in ``block_num`` (1-4) resolution halvings; see the module doc.

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> space = ResNetSpace(input_size=8, output_size=1, block_num=3, input_channels=1, class_dim=10)
    >>> nnx.eval_shape(lambda x: space.token2arch()(x), jnp.zeros((2, 1, 8, 8))).shape
    (2, 10)
    """

    max_blocks = 4
    filter_num = ((8, 16, 24), (16, 24, 32), (24, 32, 48), (32, 48, 64))
    repeat = (1, 2, 3)

    def init_tokens(self) -> list[int]:
        """Each stage at its middle width, one block."""
        return [1, 0] * self.block_num

    def range_table(self) -> list[int]:
        """Each stage's widths and repeats."""
        return [n for row in self.filter_num[:self.block_num] for n in (len(row), len(self.repeat))]

    def blocks(self, tokens):
        """Stem, the stages' basic blocks, then (a classifier) the classifier."""
        tokens = self.check_tokens(tokens)
        widths = [self.filter_num[i][tokens[2 * i]] for i in range(self.block_num)]
        layers = [("conv_bn", dict(out_channels=widths[0], kernel=5, stride=2, act="relu"))]
        for i, width in enumerate(widths):
            layers += [("basic", dict(out_channels=width, stride=2 if j == 0 and i > 0 else 1))
                       for j in range(self.repeat[tokens[2 * i + 1]])]
        if self.output_size == 1:
            layers.append(("classifier", dict(out_channels=self.class_dim)))
        return chain(self.in_shape, layers)
