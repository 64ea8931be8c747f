"""Skip-gram with negative sampling: the (center, context) pairs of a window, and DeepWalk
embeddings of the karate club that a logistic regression on four labelled members reads the
clubs from."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from paddlejax.data import KarateClub
from paddlejax.geometric import deepwalk_walks, node2vec_walks, skipgram_pairs, train_skipgram


def test_pairs_are_every_two_nodes_within_the_window_both_ways():
    walks = np.array([[3, 1, 4, 1, 5], [9, 2, 6, -1, -1]])
    want = sorted((int(w[i]), int(w[j])) for w in walks for i in range(5) for j in range(5)
                  if i != j and abs(i - j) <= 2 and w[i] >= 0 and w[j] >= 0)
    centers, contexts = skipgram_pairs(walks, window=2)
    assert sorted(zip(centers.tolist(), contexts.tolist())) == want
    assert skipgram_pairs(walks, window=50)[0].size == 2 * (10 + 3)  # a window past the walk: all pairs


@pytest.fixture(scope="module")
def club():
    return KarateClub(train_per_class=2)


@pytest.mark.parametrize("walk", ["deepwalk", "node2vec"])
def test_walk_embeddings_separate_the_clubs(club, walk):
    start = np.repeat(np.arange(34), 10)
    walks = (deepwalk_walks(club.graph, start, 20, seed=0) if walk == "deepwalk"
             else node2vec_walks(club.graph, start, 20, p=1.0, q=0.5, seed=0))
    emb = train_skipgram(walks, 34, embed_dim=16, window=5, epochs=5, seed=0)
    assert emb.shape == (34, 16) and emb.dtype == np.float32
    classifier = LogisticRegression(max_iter=1000).fit(emb[club.train_mask], club.labels[club.train_mask])
    # measured 0.93 (deepwalk); untrained embeddings read about half the members right
    assert classifier.score(emb[club.test_mask], club.labels[club.test_mask]) >= 0.8
    untrained = train_skipgram(walks, 34, embed_dim=16, epochs=1, batch_size=10**9, learning_rate=1e-9, seed=0)
    chance = LogisticRegression(max_iter=1000).fit(untrained[club.train_mask], club.labels[club.train_mask])
    assert chance.score(untrained[club.test_mask], club.labels[club.test_mask]) < 0.8


def test_training_is_seeded(club):
    walks = deepwalk_walks(club.graph, np.arange(34), 10, seed=0)
    np.testing.assert_array_equal(train_skipgram(walks, 34, epochs=2, seed=3), train_skipgram(walks, 34, epochs=2,
                                                                                              seed=3))


BAD = [
    (lambda: skipgram_pairs(np.zeros(5, int), 2), r"skipgram_pairs: walks expects a \[num_walks, walk_length\]"),
    (lambda: skipgram_pairs(np.zeros((2, 5), int), 0), r"skipgram_pairs: window expects an int >= 1"),
    (lambda: train_skipgram(np.array([[0], [1]]), 2), r"train_skipgram: the walks hold no pair"),
    (lambda: train_skipgram(np.array([[0, 5]]), 3), r"train_skipgram: walks visit node 5, beyond num_nodes = 3"),
    (lambda: train_skipgram(np.array([[0, 1]]), 2, embed_dim=0), r"train_skipgram: embed_dim expects an int >= 1"),
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_function(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
