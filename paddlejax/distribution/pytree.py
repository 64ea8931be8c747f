"""Pytree registration of distributions and transforms, so that they pass through
``jax.jit``, ``jax.grad`` and ``jax.vmap`` like the arrays they hold.

A subclass of :class:`Parametrised` that lists its array attributes in ``_params`` (and its
Python-valued settings in ``_static``) is registered when it is defined: the parameters are the
leaves (an attribute may itself hold pytrees, such as a base distribution or a list of
transforms) and the settings are the static part.

>>> class Shift(Parametrised):
...     _params = ("by",)
...     def __init__(self, by):
...         self.by = jax.numpy.asarray(by)
>>> jax.jit(lambda s: s.by + 1)(Shift(2.0)).item()
3.0
"""
from __future__ import annotations

import jax


class Parametrised:
    """The base of objects whose ``_params`` attributes are pytree leaves (see the module), and
    which compute through a library object built from them (:meth:`_make`, :meth:`_built`)."""

    _params: tuple[str, ...] | None = None  # attributes that are pytree leaves
    _static: tuple[str, ...] = ()  # attributes that are fixed Python values (pytree aux data)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._params is not None:
            jax.tree_util.register_pytree_node(cls, _flatten, lambda aux, leaves: _unflatten(cls, aux, leaves))

    def _make(self):
        """The library object (a ``tfd`` distribution, a ``tfb`` bijector) of the parameters."""
        raise NotImplementedError(f"{type(self).__name__}._make")

    def _built(self):
        """:meth:`_make`'s object, built on first use: not in ``__init__``, which pytree
        unflattening skips."""
        if "_library_object" not in self.__dict__:
            self.__dict__["_library_object"] = self._make()
        return self.__dict__["_library_object"]


def _flatten(obj: Parametrised):
    return [getattr(obj, n) for n in obj._params], tuple(getattr(obj, n) for n in obj._static)


def _unflatten(cls, aux, leaves):
    obj = cls.__new__(cls)  # no __init__: leaves may be tracers or placeholders, never checked here
    for n, v in zip(cls._static, aux):
        setattr(obj, n, v)
    for n, v in zip(cls._params, leaves):
        setattr(obj, n, v)
    return obj
