"""Metrics sum per batch and reduce exactly over any batch split."""
import jax.numpy as jnp
import numpy as np
import pytest

from paddlejax.train import metrics


def totals(metric, outputs, labels, splits):
    parts = [metric.update(o, l) for o, l in zip(np.array_split(outputs, splits), np.array_split(labels, splits))]
    return metric.result({k: sum(np.asarray(p[k]) for p in parts) for k in parts[0]})


def test_accuracy_topk_is_independent_of_batching():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(50, 5)).astype(np.float32), rng.integers(0, 5, 50)
    order = np.argsort(-logits, axis=1)
    expected = {"acc": np.mean(order[:, 0] == labels), "acc_top3": np.mean((order[:, :3] == labels[:, None]).any(1))}
    for splits in (1, 3, 7):
        got = totals(metrics.Accuracy(topk=(1, 3)), jnp.asarray(logits), jnp.asarray(labels), splits)
        assert got == pytest.approx(expected)


def test_precision_recall_and_perplexity_against_formulas():
    probs = np.array([0.9, 0.7, 0.2, 0.6, 0.1], np.float32)
    labels = np.array([1, 0, 1, 1, 0])
    assert totals(metrics.Precision(), probs, labels, 2) == {"precision": pytest.approx(2 / 3)}
    assert totals(metrics.Recall(), probs, labels, 2) == {"recall": pytest.approx(2 / 3)}
    rng = np.random.default_rng(0)
    logits, tokens = rng.normal(size=(4, 6, 7)).astype(np.float32), rng.integers(0, 7, (4, 6))
    tokens[0, 4:] = -1
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.maximum(tokens, 0)[..., None], -1)[..., 0]
    expected = np.exp(nll[tokens >= 0].mean())
    got = totals(metrics.Perplexity(ignore_index=-1), logits, tokens, 2)
    assert got["ppl"] == pytest.approx(expected, rel=1e-5)


def test_metric_names_resolve_and_unknown_ones_are_refused():
    assert isinstance(metrics.get("accuracy"), metrics.Accuracy)
    with pytest.raises(ValueError, match="metrics: expects a Metric or one of"):
        metrics.get("f1")
