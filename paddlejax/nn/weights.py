"""Model weights as flat ``{path name: array}`` dicts in safetensors files (Paddle's
``state_dict`` / ``set_state_dict`` / ``paddle.save`` / ``paddle.load``, without pickle).

The weights of a model are its parameters and its running statistics (batch norm's mean and
variance), named by path as in a program (``layer1.0.conv1.weight``); random-key state is not
part of them. Loading checks every name and shape and names the tensor that is wrong.

>>> import tempfile, os, paddlejax.nn as nn
>>> nn.seed(0); model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1D(3))
>>> sorted(state_dict(model))
['0.bias', '0.weight', '1.bias', '1.mean', '1.variance', '1.weight']
>>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> save_weights(model, path)
>>> nn.seed(1); other = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1D(3))
>>> load_weights(other, path).loaded
6
>>> bool((other[0].weight[...] == model[0].weight[...]).all())
True
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from paddlejax.io import ProgramFormatError, read_tensors
from paddlejax.nn.random import RngKey
from paddlejax.static import ModelState

Convert = Callable[[str, np.ndarray], "tuple[str, np.ndarray] | None"]


class WeightsError(ValueError):
    """Weights that do not fit the model: a missing or unexpected tensor, a wrong shape or
    dtype, or an unreadable file. The message names the tensor."""


@dataclass(frozen=True)
class LoadResult:
    """What :func:`set_state_dict` / :func:`load_weights` did: ``loaded`` tensors, the model
    variables left ``missing`` and the ``unexpected`` source names (both empty when strict)."""

    loaded: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def _weight_variables(model) -> dict[str, nnx.Variable]:
    state = ModelState(model)
    return {n: v for n, v in zip(state.names, state.variables)
            if n in state.values and not isinstance(v, (nnx.RngState, RngKey))}


def state_dict(model) -> dict[str, np.ndarray]:
    """The model's weights as ``{path name: numpy array}`` (parameters and running statistics).

    >>> import paddlejax.nn as nn
    >>> {k: v.shape for k, v in state_dict(nn.Linear(2, 3)).items()}
    {'bias': (3,), 'weight': (2, 3)}
    """
    return {n: np.asarray(v.get_value()) for n, v in sorted(_weight_variables(model).items())}


def _floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def listing(names, limit: int = 5) -> str:
    """Tensor names for an error message: sorted, quoted, at most ``limit`` of them.

    >>> listing(["b", "a", "c"], limit=2)
    "'a', 'b' and 1 more"
    """
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


def set_state_dict(model, weights: Mapping[str, np.ndarray], *, strict: bool = True,
                   source: str = "weights") -> LoadResult:
    """Copy ``weights`` into the model's variables, checking names, shapes and dtypes first, so
    that nothing changes when anything is wrong. Floating values are cast to the variable's
    dtype; anything else must match it. With ``strict=False`` missing and unexpected names are
    returned instead of raised. ``source`` names the weights in errors.

    >>> import numpy as np, paddlejax.nn as nn
    >>> layer = nn.Linear(2, 3)
    >>> set_state_dict(layer, {"weight": np.zeros((2, 3)), "bias": np.ones(3)}).loaded
    2
    >>> set_state_dict(layer, {"weight": np.zeros((3, 2)), "bias": np.ones(3)})
    Traceback (most recent call last):
    paddlejax.nn.weights.WeightsError: weights: tensor 'weight' has shape (3, 2), the model's 'weight' is (2, 3)
    """
    variables = _weight_variables(model)
    missing = sorted(set(variables) - set(weights))
    unexpected = sorted(set(weights) - set(variables))
    if strict and (missing or unexpected):
        parts = ([f"missing {len(missing)} tensor(s) the model needs: {listing(missing)}"] if missing else []) + \
                ([f"{len(unexpected)} tensor(s) the model does not have: {listing(unexpected)}"] if unexpected else [])
        raise WeightsError(f"{source}: " + "; ".join(parts))
    values = {}
    for name in sorted(set(variables) & set(weights)):
        target = variables[name].get_value()
        value = np.asarray(weights[name])
        if tuple(value.shape) != tuple(target.shape):
            raise WeightsError(f"{source}: tensor {name!r} has shape {tuple(value.shape)}, the model's {name!r} "
                               f"is {tuple(target.shape)}")
        if value.dtype != target.dtype and not (_floating(value.dtype) and _floating(target.dtype)):
            raise WeightsError(f"{source}: tensor {name!r} is {value.dtype}, the model's {name!r} is {target.dtype}")
        values[name] = value.astype(target.dtype)
    for name, value in values.items():
        variables[name].set_value(jnp.asarray(value))
    return LoadResult(len(values), missing, unexpected)


def save_weights(model, path: str | os.PathLike) -> None:
    """Write the model's weights (see :func:`state_dict`) to a safetensors file.

    >>> import tempfile, os, paddlejax.nn as nn
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save_weights(nn.Linear(2, 3), path); os.path.getsize(path) > 0
    True
    """
    safetensors.numpy.save_file(state_dict(model), os.fspath(path), metadata={"format": "paddlejax.weights"})


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a safetensors weights file; a missing or malformed file raises
    :class:`WeightsError` naming it.

    >>> read_weights("no/such/file.safetensors")
    Traceback (most recent call last):
    paddlejax.nn.weights.WeightsError: cannot read no/such/file.safetensors: No such file or directory
    """
    try:
        return read_tensors(path)
    except ProgramFormatError as e:
        raise WeightsError(str(e)) from None


def load_weights(model, path: str | os.PathLike, *, convert: Convert | None = None,
                 strict: bool = True) -> LoadResult:
    """Load a safetensors weights file into ``model`` (see :func:`set_state_dict`).

    ``convert(name, array)`` maps each stored tensor to ``(model name, array)`` -- renaming,
    transposing -- or to None to skip it; that is how checkpoints from other libraries load
    (e.g. :func:`paddlejax.models.bert.load_hf_bert`). Errors name the file and the tensor.
    """
    tensors = read_weights(path)
    if convert is not None:
        converted = {}
        for name, value in sorted(tensors.items()):  # sorted: errors must not depend on file order
            out = convert(name, value)
            if out is None:
                continue
            new_name, new_value = out
            if new_name in converted:
                raise WeightsError(f"{os.fspath(path)}: two tensors map to {new_name!r} (the second is {name!r})")
            converted[new_name] = new_value
        tensors = converted
    return set_state_dict(model, tensors, strict=strict, source=os.fspath(path))
