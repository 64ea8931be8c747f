"""Search spaces (PaddleSlim's ``search_space``): a list of integer tokens names one network.

A space has ``init_tokens()`` (where a search starts), ``range_table()`` (token ``i`` takes the
values ``0 .. range_table()[i] - 1``) and ``token2arch(tokens)``, which builds the network as an
``nn.Sequential`` of :class:`Block` s. A block is data (its kind, arguments and input shape), so
the latency table (:mod:`~paddlejax.slim.nas.latency`) can time each block once and reuse it in
every network that has it.

Spaces are registered by class name (:func:`register_search_space`) and made from Paddle's
configs, ``(name, {"input_size": ..., "output_size": ..., "block_num": ...})``; a list of configs
makes a :class:`CombinedSearchSpace` whose tokens are the spaces' tokens one after another.

>>> space = search_space([("ResNetSpace", {"input_size": 8, "output_size": 1, "block_num": 1,
...                                        "input_channels": 1, "class_dim": 10})])
>>> space.init_tokens(), space.range_table()
([1, 0], [3, 3])
>>> [b.kind for b in space.blocks([0, 0])]
['conv_bn', 'basic', 'classifier']
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from paddlejax import nn
from paddlejax.capture import InputSpec
from paddlejax.models.blocks import ConvNormActivation
from paddlejax.nn.args import arg_error, is_int

# block kind -> builder(in_channels, **args) -> layer
BLOCKS: dict[str, Callable[..., nn.Layer]] = {}
SEARCH_SPACES: dict[str, type] = {}
ACTIVATIONS = {"relu": nn.ReLU, "relu6": nn.ReLU6, None: None}


def register_block(kind: str):
    """Register ``builder(in_channels, **args)`` as the layer of blocks of ``kind``.

    >>> @register_block("doc_identity")
    ... def _identity(in_channels):
    ...     return nn.Identity()
    >>> type(Block("doc_identity", (4, 2, 2)).build()).__name__
    'Identity'
    >>> del BLOCKS["doc_identity"]
    """
    def register(builder):
        if BLOCKS.get(kind, builder) is not builder:
            raise ValueError(f"block kind {kind!r} is registered already")
        BLOCKS[kind] = builder
        return builder
    return register


@dataclasses.dataclass(frozen=True)
class Block:
    """One block of a network: its ``kind`` (a :func:`register_block` name), its arguments as
    sorted ``(name, value)`` pairs, and its input shape ``(channels, height, width)``.

    >>> b = Block.of("conv_bn", (1, 8, 8), out_channels=8, kernel=3, stride=2, act="relu")
    >>> b.describe()
    {'kind': 'conv_bn', 'args': {'act': 'relu', 'kernel': 3, 'out_channels': 8, 'stride': 2}, 'in_shape': [1, 8, 8]}
    >>> b.out_shape
    (8, 4, 4)
    """

    kind: str
    in_shape: tuple[int, int, int]
    args: tuple = ()

    @classmethod
    def of(cls, kind: str, in_shape, **args) -> Block:
        """A block of ``kind`` on inputs of ``in_shape`` with keyword ``args``."""
        return cls(kind, tuple(int(n) for n in in_shape), tuple(sorted(args.items())))

    @property
    def kwargs(self) -> dict:
        """The arguments as a dict."""
        return dict(self.args)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        """Output channels, then the spatial size divided by the stride (rounded up, as 'same' padding gives)."""
        c, h, w = self.in_shape
        stride = self.kwargs.get("stride", 1)
        return self.kwargs.get("out_channels", c), -(-h // stride), -(-w // stride)

    def describe(self) -> dict:
        """A JSON-able description (the latency table's key)."""
        return {"kind": self.kind, "args": self.kwargs, "in_shape": list(self.in_shape)}

    def build(self) -> nn.Layer:
        """The block's layer, freshly initialised from the global parameter stream."""
        if self.kind not in BLOCKS:
            raise KeyError(f"no block kind {self.kind!r}; registered: {sorted(BLOCKS)}")
        return BLOCKS[self.kind](self.in_shape[0], **self.kwargs)


@register_block("conv_bn")
def conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, act: str | None = "relu") -> nn.Layer:
    """Conv (``kernel`` x ``kernel``, 'same' padding) -> BatchNorm -> ``act`` (relu, relu6 or None)."""
    return ConvNormActivation(in_channels, out_channels, kernel, stride=stride, activation_layer=ACTIVATIONS[act])


@register_block("classifier")
def classifier(in_channels: int, out_channels: int) -> nn.Layer:
    """Global average pooling, flatten, Linear to ``out_channels`` classes."""
    return nn.Sequential(nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(in_channels, out_channels))


def register_search_space(cls: type) -> type:
    """Class decorator: make ``cls`` available to :func:`search_space` by its class name (as
    PaddleSlim's ``SEARCHSPACE.register``).

    >>> @register_search_space
    ... class TinySpace(SearchSpace):
    ...     def init_tokens(self): return [0]
    ...     def range_table(self): return [2]
    ...     def blocks(self, tokens):
    ...         return chain(self.in_shape, [("conv_bn", dict(out_channels=4 + 4 * tokens[0], kernel=3, stride=2))])
    >>> search_space(("TinySpace", {"input_size": 8, "output_size": 4, "block_num": 1})).token2arch([1])[0][0]
    ConvNormActivation(...)
    >>> del SEARCH_SPACES["TinySpace"]
    """
    name = cls.__name__
    if SEARCH_SPACES.get(name, cls) is not cls:
        raise ValueError(f"a search space named {name!r} is registered already")
    SEARCH_SPACES[name] = cls
    return cls


def chain(in_shape, layers: Iterable[tuple[str, dict]]) -> list[Block]:
    """Blocks of ``(kind, args)`` applied one after another from ``in_shape``, each on the
    previous block's output shape.

    >>> [b.in_shape for b in chain((1, 8, 8), [("conv_bn", dict(out_channels=4, kernel=3, stride=2))] * 2)]
    [(1, 8, 8), (4, 4, 4)]
    """
    blocks = []
    for kind, args in layers:
        blocks.append(Block.of(kind, in_shape, **args))
        in_shape = blocks[-1].out_shape
    return blocks


class SearchSpace:
    """A family of networks on ``input_size`` x ``input_size`` images with ``input_channels``
    channels, in ``block_num`` stages, that end in a ``class_dim``-way classifier when
    ``output_size`` is 1 and in an ``output_size`` x ``output_size`` feature map otherwise
    (Paddle's arguments; ``input_channels`` and ``class_dim`` are ours and Paddle's model
    arguments). ``block_mask`` (Paddle's per-block reduction flags) is not supported.

    Subclasses define ``init_tokens()``, ``range_table()`` and ``blocks(tokens)``.
    """

    max_blocks = 8

    def __init__(self, input_size: int, output_size: int, block_num: int, block_mask=None, input_channels: int = 3,
                 class_dim: int = 1000):
        name = type(self).__name__
        for key, value, low in (("input_size", input_size, 1), ("output_size", output_size, 1),
                                ("block_num", block_num, 1), ("input_channels", input_channels, 1),
                                ("class_dim", class_dim, 1)):
            if not is_int(value) or value < low:
                raise arg_error(name, key, f"an int >= {low}", value)
        if block_num > self.max_blocks:
            raise arg_error(name, "block_num", f"at most {self.max_blocks}", block_num)
        if block_mask is not None:
            raise arg_error(name, "block_mask", "None (set the stages with block_num)", block_mask)
        if output_size != 1 and input_size != output_size * 2 ** block_num:
            raise ValueError(f"{name}: output_size {output_size} must be 1 (a classifier) or input_size / "
                             f"2 ** block_num = {input_size / 2 ** block_num:g}")
        self.input_size, self.output_size, self.block_num = input_size, output_size, block_num
        self.input_channels, self.class_dim = input_channels, class_dim

    @property
    def in_shape(self) -> tuple[int, int, int]:
        """``(input_channels, input_size, input_size)``."""
        return self.input_channels, self.input_size, self.input_size

    def input_spec(self) -> InputSpec:
        """The networks' input: a batch of NCHW images."""
        return InputSpec((None, *self.in_shape))

    def init_tokens(self) -> list[int]:
        """Where a search starts."""
        raise NotImplementedError

    def range_table(self) -> list[int]:
        """How many values each token takes."""
        raise NotImplementedError

    def blocks(self, tokens) -> list[Block]:
        """The blocks of the network of ``tokens``, in order (see :func:`chain`)."""
        raise NotImplementedError

    def check_tokens(self, tokens) -> list[int]:
        """``tokens`` as a list of ints if each lies in its range; else a ValueError naming the position."""
        ranges = self.range_table()
        if len(tokens) != len(ranges):
            raise ValueError(f"{type(self).__name__}: expected {len(ranges)} tokens, got {len(tokens)}")
        for i, (token, n) in enumerate(zip(tokens, ranges)):
            if not is_int(token) or not 0 <= token < n:
                raise ValueError(f"{type(self).__name__}: token {i} is {token!r}, outside 0..{n - 1}")
        return [int(t) for t in tokens]

    def token2arch(self, tokens=None) -> nn.Sequential:
        """The network of ``tokens`` (default: the initial ones), freshly initialised."""
        tokens = self.init_tokens() if tokens is None else tokens
        return nn.Sequential(*(b.build() for b in self.blocks(self.check_tokens(tokens))))


class CombinedSearchSpace:
    """Several spaces searched together: the tokens are theirs one after another, and
    ``token2arch`` gives one network per space (PaddleSlim's ``combine_search_space``).

    >>> config = {"input_size": 8, "output_size": 1, "block_num": 1, "input_channels": 1, "class_dim": 10}
    >>> both = search_space([("ResNetSpace", config), ("MobileNetV2Space", config)])
    >>> both.range_table(), both.split([0, 1, 2])
    ([3, 3, 5], [[0, 1], [2]])
    """

    def __init__(self, spaces: list[SearchSpace]):
        if not spaces:
            raise ValueError("CombinedSearchSpace: no search space given")
        self.spaces = list(spaces)

    def init_tokens(self) -> list[int]:
        """The spaces' initial tokens, one after another."""
        return [t for s in self.spaces for t in s.init_tokens()]

    def range_table(self) -> list[int]:
        """The spaces' range tables, one after another."""
        return [n for s in self.spaces for n in s.range_table()]

    def split(self, tokens) -> list[list[int]]:
        """``tokens`` cut into each space's part (each part checked against its ranges)."""
        if len(tokens) != len(self.range_table()):
            raise ValueError(f"expected {len(self.range_table())} tokens, got {len(tokens)}")
        parts, start = [], 0
        for s in self.spaces:
            n = len(s.range_table())
            parts.append(s.check_tokens(list(tokens[start:start + n])))
            start += n
        return parts

    def blocks(self, tokens) -> list[Block]:
        """Every block of every space's network."""
        return [b for s, part in zip(self.spaces, self.split(tokens)) for b in s.blocks(part)]

    def token2arch(self, tokens=None) -> list[nn.Sequential]:
        """One network per space."""
        tokens = self.init_tokens() if tokens is None else tokens
        return [s.token2arch(part) for s, part in zip(self.spaces, self.split(tokens))]


def search_space(configs) -> CombinedSearchSpace:
    """The space of PaddleSlim ``configs``: one ``(name, {arguments})`` or a list of them.

    >>> search_space([("NoSuchSpace", {})])
    Traceback (most recent call last):
    ...
    KeyError: "no search space 'NoSuchSpace'; registered: ['MobileNetV2Space', 'ResNetSpace']"
    """
    if isinstance(configs, tuple) and len(configs) == 2 and isinstance(configs[0], str):
        configs = [configs]
    spaces = []
    for entry in configs:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], dict)):
            raise ValueError(f"a search space config is (name, {{arguments}}), got {entry!r}")
        name, args = entry
        if name not in SEARCH_SPACES:
            raise KeyError(f"no search space {name!r}; registered: {sorted(SEARCH_SPACES)}")
        spaces.append(SEARCH_SPACES[name](**args))
    return CombinedSearchSpace(spaces)
