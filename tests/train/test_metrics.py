"""Metrics sum per batch and reduce exactly over any batch split."""
import jax
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


def test_auc_matches_sklearn_for_any_batch_split():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 3000)
    probs = np.clip(rng.normal(0.4 + 0.2 * labels, 0.2), 0, 1).astype(np.float32)
    auc = metrics.Auc()
    whole = auc.result(auc.update(jnp.asarray(probs), jnp.asarray(labels)))["auc"]
    parts = [auc.update(jnp.asarray(probs[i:i + 700]), jnp.asarray(labels[i:i + 700])) for i in range(0, 3000, 700)]
    summed = {k: sum(p[k] for p in parts) for k in parts[0]}
    assert whole == pytest.approx(roc_auc_score(labels, probs), abs=1e-4)
    assert auc.result(summed)["auc"] == whole


def test_auc_reads_logits_and_two_class_outputs():
    labels = jnp.array([1, 0, 1, 0])
    logits = jnp.array([2.0, -1.0, 0.5, 0.7])
    want = metrics.Auc().result(metrics.Auc().update(jax.nn.sigmoid(logits), labels))["auc"]
    auc = metrics.Auc(from_logits=True)
    assert auc.result(auc.update(logits, labels))["auc"] == want == 0.75
    two = jnp.stack([-logits, logits], axis=1)
    assert auc.result(auc.update(two, labels))["auc"] == want
    assert metrics.get("auc").name == "auc"
    with pytest.raises(ValueError, match="Auc: num_thresholds expects an int >= 1"):
        metrics.Auc(num_thresholds=0)
