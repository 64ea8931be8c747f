"""TrainState: the training state as one typed pytree that jit takes and returns whole."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paddlejax.train import LossScale
from paddlejax.train.state import TrainState, learning_rate


def small_state(**kw) -> TrainState:
    params = {"w": jnp.arange(3.0)}
    return TrainState.create(params, {"bn.mean": jnp.zeros(3)}, optax.adam(0.1).init(params), **kw)


def test_the_state_is_a_pytree_that_jit_takes_and_returns_whole():
    state = small_state(ema=True)

    @jax.jit
    def double(s: TrainState) -> TrainState:
        return s.replace(params=jax.tree.map(lambda p: 2 * p, s.params), step=s.step + 1)

    out = double(state)
    assert isinstance(out, TrainState) and int(out.step) == 1
    np.testing.assert_array_equal(out.params["w"], [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(out.ema["w"], state.params["w"])  # the other fields come back as they were
    # every array is a leaf: params, extra, adam's count/mu/nu, ema, the loss scale's two, the step
    assert len(jax.tree.leaves(state)) == 1 + 1 + 3 + 1 + 2 + 1


def test_create_copies_its_arrays_so_a_donating_step_cannot_free_the_callers():
    params = {"w": jnp.ones(2)}
    state = TrainState.create(params, {}, ())
    assert state.params["w"] is not params["w"]
    assert state.merge == {} and state.ema == {} and not state.loss_scale.is_dynamic


def test_as_dict_orders_the_leaves_as_the_dict_state_before_it_did():
    state = small_state()
    assert list(state.as_dict()) == ["params", "extra", "opt", "merge", "ema", "loss_scale", "step"]
    # jax orders a dict's leaves by key, so checkpoints keep the layout of the untyped state
    leaves = jax.tree.leaves(state.as_dict())
    keyed = jax.tree.leaves({k: state.as_dict()[k] for k in sorted(state.as_dict())})
    assert all(a is b for a, b in zip(leaves, keyed))


def test_advance_moves_the_ema_with_paddles_warm_up():
    state = small_state(ema=True)
    params = [{"w": jnp.full(3, float(i))} for i in (1, 2)]
    for p in params:
        state = state.advance(p, state.opt, state.merge, {}, jnp.array(True), ema_decay=0.9)
    ema = np.arange(3.0)
    for t, p in enumerate(params):
        decay = min(0.9, (1 + t) / (10 + t))
        ema = decay * ema + (1 - decay) * np.asarray(p["w"])
    np.testing.assert_allclose(state.ema["w"], ema, rtol=1e-6)
    assert int(state.step) == 2


def test_a_non_finite_fp16_step_keeps_everything_but_the_loss_scale():
    state = small_state(loss_scale=LossScale.dynamic())
    skipped = state.advance({"w": jnp.full(3, jnp.nan)}, state.opt, state.merge, {"bn.mean": jnp.ones(3)},
                            jnp.array(False), ema_decay=None)
    np.testing.assert_array_equal(skipped.params["w"], state.params["w"])
    np.testing.assert_array_equal(skipped.extra["bn.mean"], state.extra["bn.mean"])
    assert float(skipped.loss_scale.scale) == float(state.loss_scale.scale) / 2
    assert int(skipped.step) == 1  # the step counts, as Paddle's does


def test_learning_rate_is_read_from_inject_hyperparams_state():
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.25)
    assert learning_rate(tx.init({"w": jnp.ones(1)})) == 0.25
    assert learning_rate(optax.sgd(0.25).init({"w": jnp.ones(1)})) is None
