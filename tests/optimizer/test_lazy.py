"""Row-wise optimizers: rows no id looked up keep their value and their moments; looked-up rows
move as the dense optimizer moves them."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paddlejax.optimizer import lazy_adagrad, lazy_adam, lazy_rows
from paddlejax.optimizer.lazy import scale_by_adagrad


def run(tx, grads, params):
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def row_grads(rows_per_step, shape=(6, 3), seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for rows in rows_per_step:
        g = np.zeros(shape, np.float32)
        g[rows] = rng.normal(size=(len(rows), shape[1]))
        out.append({"emb": jnp.asarray(g), "bias": jnp.asarray(rng.normal(size=shape[1]).astype(np.float32))})
    return out


@pytest.mark.parametrize("lazy, dense, has_momentum", [
    (lazy_adam(0.1), optax.adam(0.1), True),
    (lazy_adagrad(0.1), optax.chain(scale_by_adagrad(), optax.scale_by_learning_rate(0.1)), False)])
def test_untouched_rows_keep_value_and_state_touched_rows_move_as_dense(lazy, dense, has_momentum):
    params = {"emb": jnp.ones((6, 3)), "bias": jnp.zeros(3)}
    grads = row_grads([[0, 1], [1, 2], [0, 1, 2]])
    got, state = run(lazy, grads, params)
    np.testing.assert_array_equal(np.asarray(got["emb"][3:]), 1.0)  # never looked up
    for leaf in (state[0].mu["emb"], state[0].nu["emb"]) if hasattr(state[0], "mu") else (state[0].moment["emb"],):
        np.testing.assert_array_equal(np.asarray(leaf[3:]), 0.0)
    # row 1 was looked up at every step: exactly the dense optimizer's result; so is the bias
    want, _ = run(dense, grads, params)
    np.testing.assert_allclose(np.asarray(got["emb"][1]), np.asarray(want["emb"][1]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got["bias"]), np.asarray(want["bias"]), rtol=1e-6)
    # row 0 sat out the second step, where dense Adam moved it on its momentum (Adagrad has none)
    assert np.allclose(np.asarray(got["emb"][0]), np.asarray(want["emb"][0])) != has_momentum


def test_a_row_skipped_keeps_its_momentum_for_when_it_is_next_looked_up():
    params = {"emb": jnp.zeros((2, 1))}
    grads = [{"emb": jnp.array([[1.0], [1.0]])}, {"emb": jnp.array([[0.0], [1.0]])}, {"emb": jnp.array([[1.0], [1.0]])}]
    got, _ = run(lazy_rows(optax.sgd(1.0, momentum=0.5)), grads, params)
    # row 0: momentum 1 -> (skipped) -> 0.5 * 1 + 1 = 1.5: moved 1 + 1.5; row 1: 1, 1.5, 1.75
    np.testing.assert_allclose(np.asarray(got["emb"][:, 0]), [-2.5, -4.25])


def test_tables_picks_which_parameters_are_row_wise():
    params = {"emb.weight": jnp.zeros((3, 2)), "fc.weight": jnp.zeros((3, 2))}
    g = {n: jnp.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]) for n in params}
    tx = lazy_adam(0.1, tables="emb.*")
    state = tx.init(params)
    _, state = tx.update(g, state, params)
    _, state = tx.update({n: jnp.zeros((3, 2)) for n in params}, state, params)
    assert float(state[0].mu["emb.weight"][0, 0]) == pytest.approx(0.1)  # row kept: no decay
    assert float(state[0].mu["fc.weight"][0, 0]) == pytest.approx(0.09)  # dense: decayed


def test_a_bad_tables_argument_is_refused():
    with pytest.raises(ValueError, match="tables expects None, a name pattern"):
        lazy_adam(0.1, tables=[3])


def test_adagrad_takes_paddles_formula():
    g = jnp.array([1e-3, 0.5])
    tx = lazy_adagrad(1.0)
    updates, _ = tx.update({"w": g}, tx.init({"w": jnp.zeros(2)}))
    # -g / (sqrt(g * g) + 1e-6): close to -1 for both, where optax's g / sqrt(g * g + 1e-6) gives -0.71 for 1e-3
    np.testing.assert_allclose(np.asarray(updates["w"]), -np.asarray(g) / (np.abs(np.asarray(g)) + 1e-6), rtol=1e-6)
