"""Quasi-Newton minimisers with Paddle's signatures and results
(``paddle.incubate.optimizer.functional.minimize_bfgs`` / ``minimize_lbfgs``), on optax.

Both run one jittable ``lax.while_loop`` whose step is optax's strong-Wolfe zoom line search
(``optax.scale_by_zoom_linesearch``, the ``'strong_wolfe'`` of Paddle) along a quasi-Newton
direction: optax's ``scale_by_lbfgs`` for L-BFGS, and for BFGS :func:`scale_by_bfgs` here, since
optax has no dense BFGS and Paddle's ``minimize_bfgs`` takes and returns the dense inverse-Hessian
estimate. (``jax.scipy.optimize.minimize(method="BFGS")`` returns that estimate too, but it is
being retired in favour of optax and friends, and takes no initial estimate, no step-change
tolerance and no initial step length.)

The loop follows Paddle's: it stops when the largest gradient entry falls below
``tolerance_grad`` or the largest entry of the search direction below ``tolerance_change``
(both count as converged), when a line search finds no step that lowers the objective (not
converged; the position stays the best one found), or after ``max_iters`` iterations (not
converged). ``num_func_calls`` counts the objective's evaluations (each with its gradient): one
at the start and one per line-search trial.

>>> import jax.numpy as jnp
>>> converged, calls, x, value, grad, inverse_hessian = minimize_bfgs(
...     lambda x: jnp.sum((x - 3.0) ** 2), jnp.zeros(2))
>>> bool(converged), x.tolist(), float(value)
(True, [3.0, 3.0], 0.0)
>>> (inverse_hessian @ jnp.ones(2)).tolist()  # the curvature along the path taken: 1 / 2
[0.5, 0.5]
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

_HIGHEST = jax.lax.Precision.HIGHEST  # accelerators otherwise multiply float32 in reduced precision


class ScaleByBFGSState(NamedTuple):
    count: jax.Array
    params: jax.Array
    grad: jax.Array
    inverse_hessian: jax.Array


def _bfgs_update(h: jax.Array, s: jax.Array, y: jax.Array) -> jax.Array:
    """``(I - rho s y') H (I - rho y s') + rho s s'`` with ``rho = 1 / y's`` (Nocedal & Wright,
    eq. 6.17), written with one matrix-vector product."""
    sy = jnp.dot(s, y, precision=_HIGHEST)
    hy = jnp.dot(h, y, precision=_HIGHEST)
    rho = 1.0 / jnp.where(sy > 0, sy, 1.0)
    updated = (h - rho * (jnp.outer(s, hy) + jnp.outer(hy, s))
               + (rho * rho * jnp.dot(y, hy, precision=_HIGHEST) + rho) * jnp.outer(s, s))
    # A strong-Wolfe step gives y's > 0; without it the update would lose positive definiteness.
    return jnp.where(sy > 0, updated, h)


def scale_by_bfgs(initial_inverse_hessian: jax.Array | None = None) -> optax.GradientTransformation:
    """The BFGS direction ``H g`` for a 1-D parameter vector, ``H`` the dense inverse-Hessian
    estimate kept in the state (``inverse_hessian``; the identity, or ``initial_inverse_hessian``,
    at first). Each update first folds in the step since the previous call, so chain it before a
    line search, as optax's ``scale_by_lbfgs`` is chained.

    >>> tx = scale_by_bfgs()
    >>> state = tx.init(jnp.zeros(2))
    >>> direction, state = tx.update(jnp.array([1.0, 2.0]), state, jnp.zeros(2))
    >>> direction.tolist()
    [1.0, 2.0]
    """

    def init(params):
        n = params.shape[0]
        h = jnp.eye(n, dtype=params.dtype) if initial_inverse_hessian is None else initial_inverse_hessian
        return ScaleByBFGSState(jnp.zeros((), jnp.int32), jnp.zeros_like(params), jnp.zeros_like(params),
                                jnp.asarray(h, params.dtype))

    def update(grad, state, params=None):
        h = jnp.where(state.count > 0, _bfgs_update(state.inverse_hessian, params - state.params,
                                                    grad - state.grad), state.inverse_hessian)
        return jnp.dot(h, grad, precision=_HIGHEST), ScaleByBFGSState(state.count + 1, params, grad, h)

    return optax.GradientTransformation(init, update)


def _in_coordinates(inner: optax.GradientTransformation, factor: jax.Array) -> optax.GradientTransformation:
    """``inner`` run on ``z = factor^-1 x`` (gradients ``factor' g``), its directions mapped back.
    A quasi-Newton method started from the identity in ``z`` is the same method started from
    ``factor factor'`` in ``x`` (BFGS updates transform with the coordinates), which is how
    optax's L-BFGS, which starts from a scaled identity only, takes an initial estimate."""

    def to_z(x):
        return jax.scipy.linalg.solve_triangular(factor, x, lower=True)

    def update(grad, state, params=None):
        direction, state = inner.update(jnp.dot(factor.T, grad, precision=_HIGHEST), state, to_z(params))
        return jnp.dot(factor, direction, precision=_HIGHEST), state

    return optax.GradientTransformation(lambda params: inner.init(to_z(params)), update)


class _Loop(NamedTuple):
    k: jax.Array
    done: jax.Array
    converged: jax.Array
    calls: jax.Array
    x: jax.Array
    value: jax.Array
    grad: jax.Array
    direction_state: optax.OptState
    search_state: optax.OptState


def _check(fn: str, objective_func, initial_position, dtype, line_search_fn, max_iters,
           max_line_search_iters, initial_inverse_hessian_estimate):
    """The start as a 1-D array of ``dtype``, the objective as a function to a scalar, and the
    initial estimate (or None), checked: clear errors for everything Paddle would refuse."""
    if not callable(objective_func):
        raise TypeError(f"{fn}: objective_func must be callable, got {type(objective_func).__name__}")
    if line_search_fn != "strong_wolfe":
        raise ValueError(f"{fn}: line_search_fn must be 'strong_wolfe' (the only one Paddle has), "
                         f"got {line_search_fn!r}")
    try:
        float_type = np.dtype(dtype)
    except TypeError:
        float_type = None
    if float_type not in (np.float32, np.float64):
        raise ValueError(f"{fn}: dtype must be 'float32' or 'float64', got {dtype!r}")
    if jax.dtypes.canonicalize_dtype(float_type) != float_type:
        raise ValueError(f"{fn}: dtype='{float_type}' needs 64-bit JAX (jax.enable_x64(True) or JAX_ENABLE_X64=1)")
    for name, count, least in (("max_iters", max_iters, 0), ("max_line_search_iters", max_line_search_iters, 1)):
        if not isinstance(count, (int, np.integer)) or count < least:
            raise ValueError(f"{fn}: {name} must be an int >= {least}, got {count!r}")
    x0 = jnp.asarray(initial_position, float_type)
    if x0.ndim != 1:
        raise ValueError(f"{fn}: initial_position must be 1-D (flatten the parameters), got shape {x0.shape}")
    out = jax.eval_shape(objective_func, x0)
    if getattr(out, "size", None) != 1:
        raise ValueError(f"{fn}: objective_func must return one number, got shape {getattr(out, 'shape', out)}")

    def objective(x):  # Paddle's objectives may return shape [1]; the loop keeps one dtype
        return jnp.reshape(objective_func(x), ()).astype(float_type)

    if initial_inverse_hessian_estimate is None:
        return x0, objective, None
    h0 = jnp.asarray(initial_inverse_hessian_estimate, float_type)
    if h0.shape != (x0.shape[0],) * 2:
        raise ValueError(f"{fn}: initial_inverse_hessian_estimate must be {x0.shape[0]} x {x0.shape[0]}, got "
                         f"shape {h0.shape}")
    if not isinstance(h0, jax.core.Tracer) and (
            not np.allclose(h0, h0.T) or not np.isfinite(np.asarray(jnp.linalg.cholesky(h0))).all()):
        raise ValueError(f"{fn}: initial_inverse_hessian_estimate must be symmetric positive definite")
    return x0, objective, h0


def _minimize(objective, x0, direction: optax.GradientTransformation, max_iters, tolerance_grad,
              tolerance_change, max_line_search_iters, initial_step_length) -> _Loop:
    search = optax.scale_by_zoom_linesearch(max_linesearch_steps=max_line_search_iters,
                                            initial_guess_strategy="one")
    value, grad = jax.value_and_grad(objective)(x0)

    def step(s: _Loop) -> _Loop:
        d, direction_state = direction.update(s.grad, s.direction_state, s.x)
        # The line search tries step 1 along its input first: scaling the input sets the first trial.
        update, search_state = search.update(-initial_step_length * d, s.search_state, s.x, value=s.value,
                                             grad=s.grad, value_fn=objective)
        lowered = search_state.value < s.value  # False for nan, and for a search that found nothing lower
        x, value, grad = (jnp.where(lowered, new, old) for new, old in
                          ((s.x + update, s.x), (search_state.value, s.value), (search_state.grad, s.grad)))
        converged = (jnp.max(jnp.abs(grad)) < tolerance_grad) | (jnp.max(jnp.abs(d)) < tolerance_change)
        calls = s.calls + search_state.info.num_linesearch_steps.astype(s.calls.dtype)
        return _Loop(s.k + 1, converged | ~lowered, converged, calls, x, value, grad, direction_state, search_state)

    converged = jnp.max(jnp.abs(grad)) < tolerance_grad
    start = _Loop(jnp.zeros((), jnp.int32), converged, converged, jnp.ones((), jnp.int32), x0, value, grad,
                  direction.init(x0), search.init(x0))
    return jax.lax.while_loop(lambda s: (s.k < max_iters) & ~s.done, step, start)


def minimize_bfgs(objective_func: Callable, initial_position, max_iters: int = 50, tolerance_grad: float = 1e-7,
                  tolerance_change: float = 1e-9, initial_inverse_hessian_estimate=None,
                  line_search_fn: str = "strong_wolfe", max_line_search_iters: int = 50,
                  initial_step_length: float = 1.0, dtype: str = "float32", name: str | None = None):
    """Minimise ``objective_func`` (a 1-D array to a number) from ``initial_position`` by BFGS;
    Paddle's ``paddle.incubate.optimizer.functional.minimize_bfgs``. Returns ``(is_converge,
    num_func_calls, position, objective_value, objective_gradient, inverse_hessian_estimate)``;
    the estimate includes the last step. ``name`` is accepted for Paddle's signature.

    >>> rosenbrock = lambda x: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
    >>> out = minimize_bfgs(rosenbrock, jnp.array([-1.2, 1.0]), max_iters=100, tolerance_grad=1e-3)
    >>> bool(out[0]), out[2].round(2).tolist()
    (True, [1.0, 1.0])
    """
    x0, objective, h0 = _check("minimize_bfgs", objective_func, initial_position, dtype, line_search_fn,
                               max_iters, max_line_search_iters, initial_inverse_hessian_estimate)
    direction = scale_by_bfgs(h0)
    end = _minimize(objective, x0, direction, max_iters, tolerance_grad, tolerance_change, max_line_search_iters,
                    initial_step_length)
    # The loop's last step is folded into the estimate only by a next update: make it.
    _, last = direction.update(end.grad, end.direction_state, end.x)
    return end.converged, end.calls, end.x, end.value, end.grad, last.inverse_hessian


def minimize_lbfgs(objective_func: Callable, initial_position, history_size: int = 100, max_iters: int = 50,
                   tolerance_grad: float = 1e-8, tolerance_change: float = 1e-8,
                   initial_inverse_hessian_estimate=None, line_search_fn: str = "strong_wolfe",
                   max_line_search_iters: int = 50, initial_step_length: float = 1.0, dtype: str = "float32",
                   name: str | None = None):
    """Minimise ``objective_func`` (a 1-D array to a number) from ``initial_position`` by L-BFGS
    with the last ``history_size`` steps; Paddle's
    ``paddle.incubate.optimizer.functional.minimize_lbfgs``. Returns ``(is_converge,
    num_func_calls, position, objective_value, objective_gradient)``.

    Without an ``initial_inverse_hessian_estimate`` each iteration starts from optax's scaled
    identity (``s'y / y'y``, the usual choice; Paddle starts from the plain identity); with one,
    from that matrix. ``name`` is accepted for Paddle's signature.

    >>> out = minimize_lbfgs(lambda x: jnp.sum((x - 1.0) ** 4), jnp.zeros(3), tolerance_grad=1e-4)
    >>> bool(out[0]), out[2].round(1).tolist()
    (True, [1.0, 1.0, 1.0])
    """
    x0, objective, h0 = _check("minimize_lbfgs", objective_func, initial_position, dtype, line_search_fn,
                               max_iters, max_line_search_iters, initial_inverse_hessian_estimate)
    if not isinstance(history_size, (int, np.integer)) or history_size < 1:
        raise ValueError(f"minimize_lbfgs: history_size must be an int >= 1, got {history_size!r}")
    direction = optax.scale_by_lbfgs(memory_size=history_size, scale_init_precond=h0 is None)
    if h0 is not None:
        direction = _in_coordinates(direction, jnp.linalg.cholesky(h0))
    end = _minimize(objective, x0, direction, max_iters, tolerance_grad, tolerance_change, max_line_search_iters,
                    initial_step_length)
    return end.converged, end.calls, end.x, end.value, end.grad
