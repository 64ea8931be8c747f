"""Node-classification graphs: :class:`KarateClub`, Zachary's karate club as networkx ships it,
and :class:`SyntheticCitation`, a seeded stochastic-block graph shaped like a citation network.

Each is one graph (PGL's dataset habit): ``graph`` (a :class:`paddlejax.geometric.Graph` with
the node features as ``node_feat["feature"]``), ``features [N, F]`` float32, ``labels [N]``
int32, ``edges [E, 2]`` (both directions of every undirected edge), ``num_classes``, and
boolean node masks saying which labels a model may train on (``train_mask``) and which it is
judged on (``test_mask``; the citation graph also has a ``val_mask``).

>>> club = KarateClub()
>>> club.graph.num_nodes, club.graph.num_edges, int(club.train_mask.sum()), club.class_names
(34, 156, 4, ('Mr. Hi', 'Officer'))
"""
from __future__ import annotations

import numpy as np

from paddlejax._extras import require
from paddlejax.geometric import Graph


def _check_count(owner: str, name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{owner}: {name} expects an int >= {minimum}, got {value!r}")
    return int(value)


def _mask(size: int, index) -> np.ndarray:
    mask = np.zeros(size, bool)
    mask[index] = True
    return mask


class KarateClub:
    """Zachary's karate club (from networkx, nothing downloaded): 34 members, 78 friendships,
    labelled by the club each member joined after the split (``'club'``: ``'Mr. Hi'`` 0,
    ``'Officer'`` 1, 17 each). Features are one-hot member ids (``[34, 34]``), so only the graph
    tells members apart. ``train_per_class`` members of each club are labelled for training:
    its leader (member 0, the instructor; member 33, the administrator), then others drawn with
    ``seed``; ``test_mask`` holds the rest.

    >>> club = KarateClub(train_per_class=1)
    >>> np.flatnonzero(club.train_mask).tolist(), club.labels[[0, 33]].tolist()
    ([0, 33], [0, 1])
    """

    class_names = ("Mr. Hi", "Officer")
    num_classes = 2

    def __init__(self, train_per_class: int = 2, seed: int = 0):
        nx = require("networkx", extra="data", feature="pj.data.KarateClub")
        club = nx.karate_club_graph()
        per_class = _check_count("KarateClub", "train_per_class", train_per_class)
        labels = np.array([self.class_names.index(club.nodes[v]["club"]) for v in club.nodes], np.int32)
        if per_class >= np.bincount(labels).min():
            raise ValueError(f"KarateClub: train_per_class expects fewer than {np.bincount(labels).min()} "
                             f"(the members of the smaller club), got {per_class}")
        rng = np.random.default_rng(seed)
        train = []
        for label, leader in enumerate((0, 33)):
            others = np.flatnonzero((labels == label) & (np.arange(labels.size) != leader))
            train += [leader, *rng.choice(others, per_class - 1, replace=False)]
        self.features = np.eye(labels.size, dtype=np.float32)
        self.labels = labels
        self.edges = Graph.from_networkx(club).edges
        self.graph = Graph(self.edges, labels.size, node_feat={"feature": self.features})
        self.train_mask = _mask(labels.size, train)
        self.test_mask = ~self.train_mask


class SyntheticCitation:
    """A citation-like graph drawn from a stochastic block model, seeded: ``num_classes`` topics
    of ``nodes_per_class`` papers; two papers of one topic are linked with probability
    ``p_in``, of different topics with ``p_out``. Each paper is a binary bag of ``num_features``
    words holding ``words_per_node`` draws, each from its topic's own share of the vocabulary
    with probability ``topic_share`` and from the whole vocabulary otherwise, so the words hint
    at the topic and the links confirm it. Papers are numbered in a random order.

    ``train_per_class`` papers of every topic are labelled for training, ``num_val`` others
    for validation, the rest for testing (Planetoid's split, scaled down).

    >>> data = SyntheticCitation(num_classes=3, nodes_per_class=20, num_val=10)
    >>> data.features.shape, data.num_classes, int(data.train_mask.sum()), int(data.val_mask.sum())
    ((60, 64), 3, 15, 10)
    >>> bool((data.labels[data.edges[:, 0]] == data.labels[data.edges[:, 1]]).mean() > 0.6)  # mostly within topics
    True
    """

    def __init__(self, num_classes: int = 4, nodes_per_class: int = 50, num_features: int = 64,
                 p_in: float = 0.1, p_out: float = 0.01, words_per_node: int = 8, topic_share: float = 0.5,
                 train_per_class: int = 5, num_val: int = 40, seed: int = 0):
        owner = "SyntheticCitation"
        self.num_classes = _check_count(owner, "num_classes", num_classes, 2)
        per_class = _check_count(owner, "nodes_per_class", nodes_per_class, 2)
        vocabulary = _check_count(owner, "num_features", num_features, self.num_classes)
        words = _check_count(owner, "words_per_node", words_per_node)
        train = _check_count(owner, "train_per_class", train_per_class)
        val = _check_count(owner, "num_val", num_val, 0)
        for name, value in (("p_in", p_in), ("p_out", p_out), ("topic_share", topic_share)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{owner}: {name} expects a probability in [0, 1], got {value!r}")
        n = self.num_classes * per_class
        if train >= per_class or self.num_classes * train + val >= n:
            raise ValueError(f"{owner}: train_per_class ({train}) and num_val ({val}) leave no papers to test on "
                             f"({per_class} per topic, {n} in all)")
        rng = np.random.default_rng(seed)
        labels = rng.permutation(np.repeat(np.arange(self.num_classes, dtype=np.int32), per_class))

        u, v = np.triu_indices(n, k=1)
        linked = rng.random(u.size) < np.where(labels[u] == labels[v], p_in, p_out)
        self.edges = np.concatenate([np.stack([u[linked], v[linked]], 1), np.stack([v[linked], u[linked]], 1)])

        # topic c owns words [c * share, (c + 1) * share) of the vocabulary
        share = vocabulary // self.num_classes
        from_topic = rng.random((n, words)) < topic_share
        topical = labels[:, None] * share + rng.integers(0, share, (n, words))
        drawn = np.where(from_topic, topical, rng.integers(0, vocabulary, (n, words)))
        self.features = np.zeros((n, vocabulary), np.float32)
        np.put_along_axis(self.features, drawn, 1.0, axis=1)
        self.labels = labels

        train_index = np.concatenate([rng.choice(np.flatnonzero(labels == c), train, replace=False)
                                      for c in range(self.num_classes)])
        rest = rng.permutation(np.setdiff1d(np.arange(n), train_index))
        self.train_mask, self.val_mask, self.test_mask = (_mask(n, train_index), _mask(n, rest[:val]),
                                                          _mask(n, rest[val:]))
        self.graph = Graph(self.edges, n, node_feat={"feature": self.features})
