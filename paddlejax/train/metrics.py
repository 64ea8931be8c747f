"""Metrics: per-batch sums computed on device inside the jitted step, reduced on the host.

A metric's ``update(outputs, labels)`` returns a dict of summable arrays; the trainer adds
them up over an epoch and ``result(totals)`` turns the totals into numbers. Summing counts
(not averaging averages) makes the result exact for any batch split.

>>> import jax.numpy as jnp
>>> acc = Accuracy(topk=(1, 2))
>>> sums = acc.update(jnp.array([[0.1, 0.9, 0.0], [0.8, 0.15, 0.05]]), jnp.array([1, 1]))
>>> acc.result(sums)
{'acc': 0.5, 'acc_top2': 1.0}
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


class Metric:
    """Base class: ``update`` gives sums for one batch, ``result`` the metric from totals."""

    name = "metric"

    def update(self, outputs, labels) -> dict:
        raise NotImplementedError

    def result(self, totals: dict) -> dict[str, float]:
        raise NotImplementedError


class Accuracy(Metric):
    """Top-k classification accuracy (``acc`` for k=1, ``acc_top{k}`` otherwise).

    ``outputs`` are logits or probabilities ``[..., classes]``, ``labels`` integer classes.
    """

    name = "acc"

    def __init__(self, topk=(1,)):
        self.topk = tuple(topk)

    def update(self, outputs, labels):
        labels = jnp.asarray(labels).reshape(outputs.shape[:-1])
        k_max = max(self.topk)
        top = jax.lax.top_k(outputs, k_max)[1]
        hits = top == labels[..., None].astype(top.dtype)
        sums = {f"correct{k}": jnp.sum(jnp.any(hits[..., :k], axis=-1)) for k in self.topk}
        sums["count"] = jnp.asarray(labels.size, jnp.int32)
        return sums

    def result(self, totals):
        return {("acc" if k == 1 else f"acc_top{k}"): float(totals[f"correct{k}"]) / max(int(totals["count"]), 1)
                for k in self.topk}


class Precision(Metric):
    """Binary precision: TP / (TP + FP); ``outputs`` are probabilities of the positive class
    (or logits with ``from_logits=True``), thresholded at 0.5.

    >>> import jax.numpy as jnp
    >>> Precision().result(Precision().update(jnp.array([0.9, 0.8, 0.1]), jnp.array([1, 0, 0])))
    {'precision': 0.5}
    """

    name = "precision"

    def __init__(self, from_logits: bool = False):
        self.from_logits = from_logits

    def _confusion(self, outputs, labels):
        pred = (outputs > 0) if self.from_logits else (outputs >= 0.5)
        pred, truth = pred.reshape(-1), jnp.asarray(labels).reshape(-1).astype(bool)
        return {"tp": jnp.sum(pred & truth), "fp": jnp.sum(pred & ~truth), "fn": jnp.sum(~pred & truth)}

    def update(self, outputs, labels):
        return self._confusion(outputs, labels)

    def result(self, totals):
        tp, fp = int(totals["tp"]), int(totals["fp"])
        return {"precision": tp / (tp + fp) if tp + fp else 0.0}


class Recall(Precision):
    """Binary recall: TP / (TP + FN), same inputs as :class:`Precision`.

    >>> import jax.numpy as jnp
    >>> Recall().result(Recall().update(jnp.array([0.9, 0.2, 0.1]), jnp.array([1, 1, 0])))
    {'recall': 0.5}
    """

    name = "recall"

    def result(self, totals):
        tp, fn = int(totals["tp"]), int(totals["fn"])
        return {"recall": tp / (tp + fn) if tp + fn else 0.0}


class Perplexity(Metric):
    """exp(mean token negative log-likelihood) of logits ``[..., vocab]`` against token ids;
    tokens equal to ``ignore_index`` (padding) are left out.

    >>> import jax.numpy as jnp
    >>> ppl = Perplexity().result(Perplexity().update(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), int)))
    >>> round(ppl["ppl"], 4)   # uniform over 4 tokens
    4.0
    """

    name = "ppl"

    def __init__(self, ignore_index: int | None = None):
        self.ignore_index = ignore_index

    def update(self, outputs, labels):
        labels = jnp.asarray(labels).reshape(outputs.shape[:-1])
        logp = jax.nn.log_softmax(outputs.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
        keep = jnp.ones_like(nll, bool) if self.ignore_index is None else labels != self.ignore_index
        return {"nll": jnp.sum(jnp.where(keep, nll, 0.0)), "tokens": jnp.sum(keep)}

    def result(self, totals):
        return {"ppl": math.exp(float(totals["nll"]) / max(int(totals["tokens"]), 1))}


class Auc(Metric):
    """Area under the ROC curve of a binary classifier (Paddle's ``paddle.metric.Auc``): each
    batch adds its predictions to histograms of positives and negatives over ``num_thresholds + 1``
    buckets of the positive class's probability, and the area is summed bucket by bucket (exact
    to the bucket width). ``outputs``: the positive class's probability ``[N]`` or ``[N, 1]``, the
    two classes' ``[N, 2]``, or logits of either with ``from_logits=True``.

    >>> import jax.numpy as jnp
    >>> auc = Auc()
    >>> auc.result(auc.update(jnp.array([0.9, 0.8, 0.3, 0.1]), jnp.array([1, 0, 1, 0])))
    {'auc': 0.75}
    """

    name = "auc"

    def __init__(self, num_thresholds: int = 4095, from_logits: bool = False):
        if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) or num_thresholds < 1:
            raise ValueError(f"Auc: num_thresholds expects an int >= 1, got {num_thresholds!r}")
        self.num_thresholds, self.from_logits = num_thresholds, from_logits

    def update(self, outputs, labels):
        outputs = jnp.asarray(outputs, jnp.float32)
        if outputs.ndim > 1 and outputs.shape[-1] == 2:
            probs = jax.nn.softmax(outputs, axis=-1)[..., 1] if self.from_logits else outputs[..., 1]
        else:
            probs = jax.nn.sigmoid(outputs) if self.from_logits else outputs
        probs, truth = probs.reshape(-1), jnp.asarray(labels).reshape(-1).astype(bool)
        bucket = jnp.clip((probs * self.num_thresholds).astype(jnp.int32), 0, self.num_thresholds)
        count = lambda keep: jnp.zeros(self.num_thresholds + 1, jnp.int32).at[bucket].add(keep)  # noqa: E731
        return {"pos": count(truth.astype(jnp.int32)), "neg": count((~truth).astype(jnp.int32))}

    def result(self, totals):
        pos, neg = (np.asarray(totals[k], np.float64)[::-1] for k in ("pos", "neg"))  # highest scores first
        tp, fp = np.cumsum(pos), np.cumsum(neg)
        area = np.sum((fp - np.concatenate([[0.0], fp[:-1]])) * (tp + np.concatenate([[0.0], tp[:-1]])) / 2)
        return {"auc": float(area / (tp[-1] * fp[-1])) if tp[-1] and fp[-1] else 0.0}


_BY_NAME = {"acc": Accuracy, "accuracy": Accuracy, "precision": Precision, "recall": Recall,
            "ppl": Perplexity, "perplexity": Perplexity, "auc": Auc}


def get(metric) -> Metric:
    """A metric from an instance or a name (``"accuracy"``, ``"precision"``, ``"recall"``, ``"ppl"``,
    ``"auc"``).

    >>> get("accuracy").topk
    (1,)
    """
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str) and metric.lower() in _BY_NAME:
        return _BY_NAME[metric.lower()]()
    raise ValueError(f"metrics: expects a Metric or one of {sorted(_BY_NAME)}, got {metric!r}")


def batch_sums(metrics, outputs, labels, loss) -> dict:
    """One batch's sums: the loss times the number of rows, the row count, and each metric's
    sums under ``"<name>.<key>"``.

    >>> import jax.numpy as jnp
    >>> sums = batch_sums([Accuracy()], jnp.array([[0.0, 1.0], [1.0, 0.0]]), jnp.array([1, 1]), jnp.float32(0.5))
    >>> sorted(sums), float(sums["loss"])
    (['acc.correct1', 'acc.count', 'count', 'loss'], 1.0)
    """
    n = jnp.asarray(labels).shape[0] if jnp.ndim(labels) else 1
    sums = {"loss": loss.astype(jnp.float32) * n, "count": jnp.asarray(n, jnp.float32)}
    for m in metrics:
        sums.update({f"{m.name}.{k}": v for k, v in m.update(outputs, labels).items()})
    return sums


def results(metrics, sums) -> dict[str, float]:
    """The mean loss and each metric's numbers from sums added up over batches.

    >>> import jax.numpy as jnp
    >>> results([Accuracy()], {"loss": 3.0, "count": 4.0, "acc.correct1": 3, "acc.count": 4})
    {'loss': 0.75, 'acc': 0.75}
    """
    totals = jax.device_get(sums)
    out = {"loss": float(totals["loss"]) / max(float(totals["count"]), 1.0)}
    for m in metrics:
        prefix = f"{m.name}."
        out.update(m.result({k[len(prefix):]: v for k, v in totals.items() if k.startswith(prefix)}))
    return out
