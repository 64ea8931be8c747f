"""Row-wise ("lazy") optimizers for embedding tables: a step moves only the rows the batch looked
up, and only their optimizer state changes (Paddle's ``Adam(lazy_mode=True)`` and the
parameter server's sparse Adagrad). A row nobody looked up keeps its value and its moments, instead
of drifting on stale momentum, and a table split over devices is updated where each row lives.

A row counts as looked up when its gradient is not all zero (an embedding's gradient is zero
exactly on the rows no id picked). Parameters of rank 0 or 1 are always updated densely; so are
those ``tables`` leaves out. Add weight decay to such a table as a decoupled term after the
update, or every row's gradient is non-zero.

>>> import jax.numpy as jnp
>>> tx = lazy_adam(0.1)
>>> table = {"emb": jnp.ones((3, 2))}
>>> state = tx.init(table)
>>> updates, state = tx.update({"emb": jnp.array([[1.0, 1.0], [0.0, 0.0], [0.0, -1.0]])}, state, table)
>>> [round(float(u), 3) for u in updates["emb"][:, 1]]   # row 1 was not looked up: it stays
[-0.1, 0.0, 0.1]
"""
from __future__ import annotations

import fnmatch
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax


def _name(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _selector(tables) -> Callable[[str], bool]:
    if tables is None:
        return lambda name: True
    if callable(tables):
        return tables
    patterns = (tables,) if isinstance(tables, str) else tuple(tables)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"lazy_rows: tables expects None, a name pattern, patterns or a callable, got {tables!r}")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def lazy_rows(inner: optax.GradientTransformation, tables: str | Sequence[str] | Callable | None = None
              ) -> optax.GradientTransformation:
    """``inner`` applied row-wise: in each parameter of rank >= 2 that ``tables`` picks (fnmatch
    patterns on the dotted parameter name, a predicate on it, or None: all), rows whose gradient
    is all zero get a zero update and keep their optimizer state (every state tree shaped like
    the parameters: Adam's moments, Adagrad's sums, momentum). Counters (Adam's step count for bias
    correction) advance every step, as Paddle's lazy Adam's do.

    >>> tx = lazy_rows(optax.sgd(0.1, momentum=0.9), tables="*emb*")
    """
    pick = _selector(tables)

    def rows_touched(path, grad):
        if grad.ndim < 2 or not pick(_name(path)):
            return None
        touched = jnp.any(grad != 0, axis=tuple(range(1, grad.ndim)))
        return touched.reshape(-1, *([1] * (grad.ndim - 1)))

    def update(updates, state, params=None):
        new_updates, new_state = inner.update(updates, state, params)
        masks = jax.tree_util.tree_map_with_path(rows_touched, updates)
        shape = jax.tree.structure(updates)
        keep = lambda mask, new, old: new if mask is None else jnp.where(mask, new, old)  # noqa: E731

        def rowwise(new, old):
            if jax.tree.structure(new) != shape:
                return new
            return jax.tree.map(keep, masks, new, old, is_leaf=lambda x: x is None)

        like_params = lambda x: jax.tree.structure(x) == shape  # noqa: E731
        new_state = jax.tree.map(rowwise, new_state, state, is_leaf=like_params)
        zeros = jax.tree.map(lambda u: jnp.zeros_like(u), new_updates)
        return jax.tree.map(keep, masks, new_updates, zeros, is_leaf=lambda x: x is None), new_state

    return optax.GradientTransformation(inner.init, update)


def lazy_adam(learning_rate, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
              tables: str | Sequence[str] | Callable | None = None) -> optax.GradientTransformation:
    """Adam updating only the rows each batch looked up (Paddle's ``Adam(lazy_mode=True)``);
    ``tables`` as :func:`lazy_rows`.

    >>> tx = lazy_adam(1e-3, tables="*embedding*")
    """
    return lazy_rows(optax.adam(learning_rate, b1=beta1, b2=beta2, eps=epsilon), tables)


class AdagradState(NamedTuple):
    moment: optax.Updates


def scale_by_adagrad(epsilon: float = 1e-6, initial_accumulator_value: float = 0.0) -> optax.GradientTransformation:
    """Paddle's Adagrad step direction: ``moment += g * g``, ``g / (sqrt(moment) + epsilon)``
    (optax's ``adagrad`` divides by ``sqrt(moment + epsilon)``, which differs for small gradients).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adagrad()
    >>> float(tx.update({"w": jnp.array(0.001)}, tx.init({"w": jnp.array(0.0)}))[0]["w"])
    0.999...
    """
    def init(params):
        return AdagradState(jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator_value), params))

    def update(updates, state, params=None):
        moment = jax.tree.map(lambda m, g: m + g * g, state.moment, updates)
        return jax.tree.map(lambda g, m: g / (jnp.sqrt(m) + epsilon), updates, moment), AdagradState(moment)

    return optax.GradientTransformation(init, update)


def lazy_adagrad(learning_rate, epsilon: float = 1e-6, initial_accumulator_value: float = 0.0,
                 tables: str | Sequence[str] | Callable | None = None) -> optax.GradientTransformation:
    """Adagrad updating only the rows each batch looked up (the parameter server's sparse
    Adagrad, Paddle's formula and defaults: :func:`scale_by_adagrad`); ``tables`` as
    :func:`lazy_rows`.

    >>> tx = lazy_adagrad(0.05)
    """
    return lazy_rows(optax.chain(scale_by_adagrad(epsilon, initial_accumulator_value),
                                 optax.scale_by_learning_rate(learning_rate)), tables)
