"""The ``moe_ffn`` op: each token's output is its experts' feed-forward networks weighted by
their gates, as a token-by-token computation gives; bad attributes and operands are refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def operands(seed=0, tokens=6, d=4, h=8, experts=3):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    return f(tokens, d), f(d, experts), f(experts, d, h), f(experts, h), f(experts, h, d), f(experts, d)


@pytest.mark.parametrize("top_k", [1, 2])
def test_every_token_gets_its_experts_outputs_weighted_by_their_gates(top_k):
    x, gate, w1, b1, w2, b2 = operands(top_k)
    y, aux, dropped, load = pj.ops.moe_ffn(x, gate, w1, b1, w2, b2, top_k=top_k, capacity_factor=10.0,
                                           activation="relu")
    probs = np.asarray(jax.nn.softmax(x @ gate, axis=-1))
    want = np.zeros_like(np.asarray(x))
    for t in range(x.shape[0]):
        chosen = np.argsort(-probs[t])[:top_k]
        weights = probs[t, chosen] / (probs[t, chosen].sum() if top_k > 1 else 1.0)
        for e, w in zip(chosen, weights):
            want[t] += w * (np.maximum(x[t] @ w1[e] + b1[e], 0) @ w2[e] + b2[e])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert int(dropped) == 0 and int(load.sum()) == top_k * x.shape[0]


@pytest.mark.parametrize("change, message", [
    (dict(top_k=3), "top_k"),
    (dict(activation="tanh"), "activation"),
])
def test_bad_attributes_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        pj.ops.moe_ffn(*operands(), **change)


def test_a_weight_of_the_wrong_rank_is_refused():
    x, gate, w1, b1, w2, b2 = operands()
    with pytest.raises(ValueError, match="w1"):
        pj.ops.moe_ffn(x, gate, w1[0], b1, w2, b2)
