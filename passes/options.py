"""Parsing pass options written on a command line (``insert_fake_quant{ops=linear:conv2d}``):
lists are joined by ``:``, since commas separate the options themselves.

>>> parse_sizes("b=32:s=128")
{'b': 32, 's': 128}
>>> op_types("linear:conv2d", ("linear", "conv2d", "matmul"), "cannot quantize")
['linear', 'conv2d']
>>> op_names("gelu:lax.exp", "amp: option 'black' names")
['gelu', 'lax.exp']
"""
from __future__ import annotations

from paddlejax.ops.traits import declared_traits


def _items(option: str) -> list[str]:
    return [t.strip() for t in option.replace(",", ":").split(":") if t.strip()]


def op_types(option: str, known: tuple[str, ...], refusal: str) -> list[str]:
    """The op types of an ``ops`` option (separated by ``:`` or ``,``), all in ``known``; the
    error starts with ``refusal``."""
    types = _items(option)
    unknown = sorted(set(types) - set(known))
    if unknown:
        raise ValueError(f"{refusal} op types {unknown}; known: {list(known)}")
    return types


def op_names(option: str, refusal: str) -> list[str]:
    """The op types an option names (separated by ``:`` or ``,``), each one that exists and
    declares its traits (a registry op, ``lax.<primitive>``, or a structural op); the error
    starts with ``refusal``."""
    names = _items(option)
    unknown = [n for n in names if declared_traits(n) is None]
    if unknown:
        raise ValueError(f"{refusal} unknown op types {unknown}: give registry op names (conv2d, gelu ...) "
                         "or lax.<primitive>")
    return names


def parse_sizes(text: str, option: str = "sizes") -> dict[str, int]:
    """A pass's ``sizes`` option (``"b=32"``, several joined by ``:``) as a dict; errors name
    ``option``."""
    sizes = {}
    for item in filter(None, text.replace(":", ",").split(",")):
        name, eq, value = item.partition("=")
        if not eq or not value.strip().isdigit():
            raise ValueError(f"{option} expects NAME=N, got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes
