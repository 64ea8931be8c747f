"""Node embeddings from random walks: skip-gram with negative sampling, word2vec's objective as
DeepWalk and node2vec train it (PGL's ``SkipGramModel``).

Nodes that appear within ``window`` steps of each other in a walk form (center, context) pairs
(:func:`skipgram_pairs`). :func:`train_skipgram` learns an input and an output vector per node so
that ``sigmoid(in[center] . out[context])`` is high for those pairs and low for ``neg_num``
negative contexts per pair, drawn from the nodes' walk frequencies to the power 3/4. The pairs
and negatives are prepared on the host with numpy; the updates run in one jitted optax step.

>>> import numpy as np
>>> centers, contexts = skipgram_pairs(np.array([[0, 1, 2, -1]]), window=1)
>>> sorted(zip(centers.tolist(), contexts.tolist()))
[(0, 1), (1, 0), (1, 2), (2, 1)]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax


def skipgram_pairs(walks, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(centers, contexts)``: every two nodes at most ``window`` steps apart in a walk of
    ``walks [W, L]``, in both directions; -1 (the padding after a walk's end) pairs with nothing.

    >>> [a.tolist() for a in skipgram_pairs(np.array([[4, 5, 6]]), window=2)]
    [[4, 5, 5, 6, 4, 6], [5, 6, 4, 5, 6, 4]]
    """
    walks = np.asarray(walks)
    if walks.ndim != 2 or not np.issubdtype(walks.dtype, np.integer):
        raise ValueError(f"skipgram_pairs: walks expects a [num_walks, walk_length] int array, "
                         f"got {walks.dtype}{list(walks.shape)}")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"skipgram_pairs: window expects an int >= 1, got {window!r}")
    centers, contexts = [], []
    for offset in range(1, min(window, walks.shape[1] - 1) + 1):
        a, b = walks[:, :-offset].ravel(), walks[:, offset:].ravel()
        keep = (a >= 0) & (b >= 0)
        centers += [a[keep], b[keep]]
        contexts += [b[keep], a[keep]]
    if not centers:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(centers).astype(np.int64), np.concatenate(contexts).astype(np.int64)


def _loss(params, centers, contexts, negatives):
    """Negative log-likelihood of the true contexts against the negatives, averaged over pairs."""
    center = jnp.take(params["input"], centers, axis=0)
    positive = jnp.sum(center * jnp.take(params["output"], contexts, axis=0), axis=-1)
    negative = jnp.einsum("bd,bkd->bk", center, jnp.take(params["output"], negatives, axis=0))
    return -jnp.mean(jax.nn.log_sigmoid(positive) + jnp.sum(jax.nn.log_sigmoid(-negative), axis=-1))


@functools.partial(jax.jit, static_argnums=0)
def _step(optimizer, params, state, centers, contexts, negatives):
    loss, grads = jax.value_and_grad(_loss)(params, centers, contexts, negatives)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


def train_skipgram(walks, num_nodes: int, embed_dim: int = 16, window: int = 5, neg_num: int = 5, epochs: int = 5,
                   batch_size: int = 512, learning_rate: float = 0.01, seed: int = 0) -> np.ndarray:
    """Node embeddings ``[num_nodes, embed_dim]`` (float32 numpy) trained with skip-gram and
    negative sampling on ``walks`` (:func:`~paddlejax.geometric.deepwalk_walks`,
    :func:`~paddlejax.geometric.node2vec_walks`) with Adam, ``epochs`` passes over the shuffled
    pairs in batches of ``batch_size`` (a last partial batch waits for the next shuffle).
    Seeded: the same arguments give the same embeddings.

    >>> from paddlejax.geometric import Graph, deepwalk_walks
    >>> g = Graph([[0, 1], [1, 0], [2, 3], [3, 2]])  # two separate pairs
    >>> emb = train_skipgram(deepwalk_walks(g, [0, 1, 2, 3] * 5, 6, seed=0), 4, embed_dim=4, window=2, epochs=20)
    >>> cos = emb @ emb.T / np.outer(np.linalg.norm(emb, axis=1), np.linalg.norm(emb, axis=1))
    >>> bool(cos[0, 1] > cos[0, 2] and cos[2, 3] > cos[2, 1])
    True
    """
    for name, value in (("num_nodes", num_nodes), ("embed_dim", embed_dim), ("neg_num", neg_num),
                        ("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"train_skipgram: {name} expects an int >= 1, got {value!r}")
    centers, contexts = skipgram_pairs(walks, window)
    if centers.size == 0:
        raise ValueError("train_skipgram: the walks hold no pair of nodes within the window")
    if centers.max() >= num_nodes:
        raise ValueError(f"train_skipgram: walks visit node {centers.max()}, beyond num_nodes = {num_nodes}")
    rng = np.random.default_rng(seed)
    frequency = np.bincount(centers, minlength=num_nodes) ** 0.75
    noise = frequency / frequency.sum()
    params = {"input": jnp.asarray(rng.uniform(-0.5, 0.5, (num_nodes, embed_dim)) / embed_dim, jnp.float32),
              "output": jnp.zeros((num_nodes, embed_dim), jnp.float32)}
    optimizer = optax.adam(learning_rate)
    state = optimizer.init(params)
    batch = min(batch_size, centers.size)
    for _ in range(epochs):
        order = rng.permutation(centers.size)
        negatives = rng.choice(num_nodes, size=(centers.size, neg_num), p=noise)
        for start in range(0, centers.size - batch + 1, batch):
            take = order[start:start + batch]
            params, state, _ = _step(optimizer, params, state, centers[take], contexts[take], negatives[take])
    return np.asarray(params["input"])
