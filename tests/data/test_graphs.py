"""Graph datasets: the karate club read from networkx as it ships, and the seeded
stochastic-block citation graph (links mostly within topics, words hinting at topics, disjoint
splits)."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from paddlejax.data import KarateClub, SyntheticCitation
from paddlejax.geometric import Graph


def test_karate_club_is_networkx_graph_with_club_labels():
    club = KarateClub()
    g = nx.karate_club_graph()
    assert isinstance(club.graph, Graph) and club.graph.num_nodes == 34
    assert set(map(tuple, club.edges.tolist())) == {(u, v) for a, b in g.edges for u, v in ((a, b), (b, a))}
    assert club.labels.tolist() == [int(g.nodes[v]["club"] == "Officer") for v in range(34)]
    assert np.bincount(club.labels).tolist() == [17, 17]
    np.testing.assert_array_equal(club.features, np.eye(34))
    assert club.graph.node_feat["feature"] is club.features


@pytest.mark.parametrize("per_class", [1, 2, 5])
def test_karate_club_labels_the_leaders_and_a_seeded_few(per_class):
    club = KarateClub(train_per_class=per_class, seed=3)
    train = np.flatnonzero(club.train_mask)
    assert club.train_mask[[0, 33]].all() and np.bincount(club.labels[train]).tolist() == [per_class] * 2
    np.testing.assert_array_equal(club.test_mask, ~club.train_mask)
    np.testing.assert_array_equal(KarateClub(train_per_class=per_class, seed=3).train_mask, club.train_mask)


def test_citation_graph_is_seeded_undirected_and_mostly_within_topics():
    data = SyntheticCitation(seed=1)
    again = SyntheticCitation(seed=1)
    np.testing.assert_array_equal(data.edges, again.edges)
    np.testing.assert_array_equal(data.features, again.features)
    assert not np.array_equal(data.labels, SyntheticCitation(seed=2).labels)
    assert data.graph.num_nodes == 200 and np.bincount(data.labels).tolist() == [50] * 4
    edges = set(map(tuple, data.edges.tolist()))
    assert all((v, u) in edges for u, v in edges) and all(u != v for u, v in edges)
    same = data.labels[data.edges[:, 0]] == data.labels[data.edges[:, 1]]
    # expected within-topic links 4 * C(50, 2) * 0.1 = 490, across 6 * 2500 * 0.01 = 150
    assert 400 < same.sum() / 2 < 580 and 100 < (~same).sum() / 2 < 200


def test_citation_words_hint_at_the_topic():
    data = SyntheticCitation(seed=0)
    share = data.features.shape[1] // data.num_classes
    topic_words = np.stack([data.features[:, c * share:(c + 1) * share].sum(1) for c in range(data.num_classes)], 1)
    assert set(np.unique(data.features).tolist()) == {0.0, 1.0}
    assert np.mean(topic_words.argmax(1) == data.labels) > 0.8


def test_citation_splits_are_disjoint_and_cover_every_paper():
    data = SyntheticCitation(num_classes=3, nodes_per_class=30, train_per_class=4, num_val=20, seed=0)
    masks = np.stack([data.train_mask, data.val_mask, data.test_mask])
    assert np.all(masks.sum(0) == 1)
    assert masks.sum(1).tolist() == [12, 20, 58]
    assert np.bincount(data.labels[data.train_mask]).tolist() == [4, 4, 4]


BAD = [
    (lambda: KarateClub(train_per_class=17), r"KarateClub: train_per_class expects fewer than 17"),
    (lambda: KarateClub(train_per_class=0), r"KarateClub: train_per_class expects an int >= 1"),
    (lambda: SyntheticCitation(num_classes=1), r"SyntheticCitation: num_classes expects an int >= 2"),
    (lambda: SyntheticCitation(p_in=1.5), r"SyntheticCitation: p_in expects a probability in \[0, 1\]"),
    (lambda: SyntheticCitation(nodes_per_class=10, train_per_class=10),
     r"SyntheticCitation: train_per_class \(10\) and num_val \(40\) leave no papers to test on"),
]


@pytest.mark.parametrize("bad,match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_arguments_raise_naming_the_dataset(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
