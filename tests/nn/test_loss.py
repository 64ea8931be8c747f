"""Loss layers against numpy references written from Paddle's documented formulas: class
weights, ignore_index, label smoothing, soft labels, probabilities, every reduction;
gradients, bfloat16 inputs, argument errors, and a traced program that saves and loads."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import paddlejax.nn as nn

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def np_log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    z = x - x.max(axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis, keepdims=True))


def reduce(loss, reduction, total=None):
    """Paddle's reductions; "mean" divides by ``total`` (the weight sum) when given."""
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / total if total is not None else loss.mean()}[
        reduction]


def np_soft_ce(logp, target, weight=None):
    """Cross entropy of a soft target (class axis last); with a weight, entries weigh
    ``target @ weight`` and the mean divides by their sum (Paddle's weighted soft label)."""
    loss = -(target * logp).sum(-1)
    wg = np.ones(loss.shape) if weight is None else target @ weight
    return loss * wg, wg


LOGITS, LABEL = rand(6, 5), rng.integers(0, 5, 6)
LABEL[2] = -100
WEIGHT = rng.uniform(0.5, 2.0, 5).astype(np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_weighted_with_ignore_index(reduction):
    keep = LABEL != -100
    safe = np.where(keep, LABEL, 0)
    w = np.where(keep, WEIGHT[safe], 0)
    per = -np.take_along_axis(np_log_softmax(LOGITS), safe[:, None], -1)[:, 0] * w
    got = nn.CrossEntropyLoss(weight=WEIGHT, reduction=reduction)(LOGITS, LABEL)
    np.testing.assert_allclose(got, reduce(per, reduction, w.sum()), rtol=1e-5, atol=1e-6)


def test_label_smoothing_is_the_smoothed_one_hot_target_with_its_weight():
    # Paddle turns hard labels into (1 - eps) * one_hot + eps / C and weighs each entry by
    # target @ weight
    label = rng.integers(0, 5, 6)
    target = 0.9 * np.eye(5)[label] + 0.1 / 5
    loss, wg = np_soft_ce(np_log_softmax(LOGITS), target, WEIGHT)
    got = nn.CrossEntropyLoss(weight=WEIGHT, label_smoothing=0.1)(LOGITS, label)
    np.testing.assert_allclose(got, loss.sum() / wg.sum(), rtol=1e-5)
    unweighted, _ = np_soft_ce(np_log_softmax(LOGITS), target)
    np.testing.assert_allclose(nn.CrossEntropyLoss(label_smoothing=0.1)(LOGITS, label), unweighted.mean(), rtol=1e-5)


def test_soft_labels_probabilities_and_axis():
    target = np.exp(rand(6, 5))
    target /= target.sum(-1, keepdims=True)
    loss, wg = np_soft_ce(np_log_softmax(LOGITS), target, WEIGHT)
    np.testing.assert_allclose(nn.CrossEntropyLoss(weight=WEIGHT, soft_label=True)(LOGITS, target),
                               loss.sum() / wg.sum(), rtol=1e-5)
    probs = np.exp(np_log_softmax(LOGITS)).astype(np.float32)
    label = rng.integers(0, 5, 6)
    np.testing.assert_allclose(nn.CrossEntropyLoss(use_softmax=False, reduction="sum")(probs, label),
                               -np.log(probs[np.arange(6), label]).sum(), rtol=1e-5)
    x, y = rand(2, 5, 3), rng.integers(0, 5, (2, 3))  # classes on axis 1, Paddle's [N, C, L] form
    want = -np.take_along_axis(np_log_softmax(x, 1), y[:, None], 1)[:, 0]
    np.testing.assert_allclose(nn.CrossEntropyLoss(axis=1, reduction="none")(x, y), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_on_log_probabilities_with_spatial_dims(reduction):
    logp = np_log_softmax(rand(2, 5, 3), 1).astype(np.float32)
    label = rng.integers(0, 5, (2, 3))
    label[1, 2] = 7  # ignored, and out of range
    keep = label != 7
    w = np.where(keep, WEIGHT[np.where(keep, label, 0)], 0)
    per = -np.take_along_axis(logp, np.where(keep, label, 0)[:, None], 1)[:, 0] * w
    got = nn.NLLLoss(weight=WEIGHT, ignore_index=7, reduction=reduction)(logp, label)
    np.testing.assert_allclose(got, reduce(per, reduction, w.sum()), rtol=1e-5, atol=1e-6)


X, Y = rand(3, 4), rand(3, 4)
P, T = 1 / (1 + np.exp(-X)), rng.uniform(0, 1, (3, 4)).astype(np.float32)
POS = rng.uniform(0.5, 3.0, 4).astype(np.float32)


def np_kl(x, y, log_target=False):
    if log_target:
        return np.exp(y) * (y - x)
    return np.where(y > 0, y * (np.log(np.where(y > 0, y, 1)) - x), 0)


def np_huber(d, delta):
    d = np.abs(d)
    return np.where(d < delta, 0.5 * d ** 2, delta * d - 0.5 * delta ** 2)


def np_bce_logits(x, y, pos=1.0, w=1.0):
    s = 1 / (1 + np.exp(-x.astype(np.float64)))
    return -(pos * y * np.log(s) + (1 - y) * np.log(1 - s)) * w


ELEMENTWISE = [
    (lambda r: nn.MSELoss(r), (X, Y), lambda x, y: (x - y) ** 2),
    (lambda r: nn.L1Loss(r), (X, Y), lambda x, y: np.abs(x - y)),
    (lambda r: nn.SmoothL1Loss(r), (X, Y), lambda x, y: np_huber(x - y, 1.0)),
    (lambda r: nn.SmoothL1Loss(r, delta=0.5), (X, Y), lambda x, y: np_huber(x - y, 0.5)),
    (lambda r: nn.KLDivLoss(r), (np_log_softmax(X).astype(np.float32), np.where(T > 0.3, T, 0)), np_kl),
    (lambda r: nn.KLDivLoss(r, log_target=True), (np_log_softmax(X).astype(np.float32), np.log(T)),
     lambda x, y: np_kl(x, y, True)),
    (lambda r: nn.BCELoss(weight=POS, reduction=r), (P, T),
     lambda p, t: -(t * np.log(p) + (1 - t) * np.log(1 - p)) * POS),
    (lambda r: nn.BCEWithLogitsLoss(reduction=r), (X, T), np_bce_logits),
    (lambda r: nn.BCEWithLogitsLoss(weight=POS[::-1].copy(), reduction=r, pos_weight=POS), (X, T),
     lambda x, t: np_bce_logits(x, t, POS, POS[::-1])),
]
IDS = ["mse", "l1", "smooth_l1", "smooth_l1_delta", "kl_div", "kl_div_log_target", "bce", "bce_logits",
       "bce_logits_pos_weight"]


@pytest.mark.parametrize("make,args,ref", ELEMENTWISE, ids=IDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_elementwise_losses_match_paddle_formulas(make, args, ref, reduction):
    want = reduce(ref(*(a.astype(np.float64) for a in args)), reduction)
    np.testing.assert_allclose(make(reduction)(*args), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make,args,ref", ELEMENTWISE, ids=IDS)
def test_elementwise_loss_gradients(make, args, ref):
    loss = make("sum")
    with jax.enable_x64(True):
        label = jnp.asarray(args[1], jnp.float64)
        check_grads(lambda x: loss(x, label), (jnp.asarray(args[0], jnp.float64),), order=1, modes=("rev",),
                    atol=1e-5, rtol=1e-5)


def test_kl_div_batchmean_divides_the_sum_by_the_batch_size():
    x, y = np_log_softmax(X).astype(np.float32), T
    np.testing.assert_allclose(nn.KLDivLoss("batchmean")(x, y), np_kl(x, y.astype(np.float64)).sum() / 3, rtol=1e-5)


def test_bce_clips_the_log_at_minus_100():
    got = nn.BCELoss(reduction="none")(np.array([0.0, 1.0], np.float32), np.array([1.0, 0.0], np.float32))
    np.testing.assert_allclose(got, [100.0, 100.0])


def test_cross_entropy_and_nll_gradients():
    with jax.enable_x64(True):
        logits = jnp.asarray(LOGITS, jnp.float64)
        check_grads(lambda x: nn.CrossEntropyLoss(weight=WEIGHT, label_smoothing=0.2)(x, LABEL), (logits,), order=1,
                    modes=("rev",), atol=1e-5, rtol=1e-5)
        check_grads(lambda x: nn.NLLLoss(weight=WEIGHT)(x, np.maximum(LABEL, 0)), (logits,), order=1,
                    modes=("rev",), atol=1e-5, rtol=1e-5)
        probs = jnp.asarray(np.exp(np_log_softmax(LOGITS)))
        check_grads(lambda p: nn.CrossEntropyLoss(use_softmax=False)(p, np.maximum(LABEL, 0)), (probs,), order=1,
                    modes=("rev",), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("loss,args", [
    (nn.CrossEntropyLoss(weight=WEIGHT), (LOGITS, LABEL)),
    (nn.NLLLoss(), (np_log_softmax(LOGITS).astype(np.float32), np.maximum(LABEL, 0))),
    (nn.MSELoss(), (X, Y)),
    (nn.SmoothL1Loss(), (X, Y)),
    (nn.KLDivLoss(), (np_log_softmax(X).astype(np.float32), T)),
    (nn.BCEWithLogitsLoss(pos_weight=POS), (X, T)),
], ids=["cross_entropy", "nll", "mse", "smooth_l1", "kl_div", "bce_logits"])
def test_bfloat16_inputs_give_bfloat16_losses_close_to_float32(loss, args):
    low = [a.astype(jnp.bfloat16) if a.dtype == np.float32 else a for a in args]
    got = loss(*low)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), loss(*[np.asarray(a, np.float32) if a.dtype == jnp.bfloat16 else a
                                                        for a in low]), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("make,match", [
    (lambda: nn.MSELoss("avg"), r"MSELoss: argument 'reduction' expects one of \['mean', 'sum', 'none'\]"),
    (lambda: nn.KLDivLoss("avg"), r"KLDivLoss: argument 'reduction' expects one of \['mean', 'sum', 'none', "
                                  r"'batchmean'\]"),
    (lambda: nn.CrossEntropyLoss(weight=[1, 2]), r"CrossEntropyLoss: argument 'weight' expects None or a float array"),
    (lambda: nn.CrossEntropyLoss(label_smoothing=1.5), r"CrossEntropyLoss: argument 'label_smoothing'"),
    (lambda: nn.CrossEntropyLoss(soft_label=1), r"CrossEntropyLoss: argument 'soft_label' expects a bool"),
    (lambda: nn.SmoothL1Loss(delta=0), r"SmoothL1Loss: argument 'delta' expects a positive number"),
    (lambda: nn.CrossEntropyLoss(weight=np.ones(4, np.float32))(LOGITS, LABEL),
     r"cross_entropy: input 'weight' expects shape \(5,\)"),
    (lambda: nn.MSELoss()(X, Y[:2]), r"mse_loss: input 'label' expects the shape of 'input' \(3, 4\), got \(2, 4\)"),
    (lambda: nn.BCELoss(weight=np.ones(3, np.float32))(np.full((2, 2), 0.5, np.float32), np.zeros((2, 2), np.float32)),
     r"binary_cross_entropy: input 'weight' expects a shape that broadcasts to \(2, 2\), got \(3,\)"),
    (lambda: nn.BCEWithLogitsLoss(pos_weight=np.ones(3, np.float32))(np.zeros((2, 2), np.float32),
                                                                      np.zeros((2, 2), np.float32)),
     r"binary_cross_entropy_with_logits: input 'pos_weight' expects a shape that broadcasts to \(2, 2\), got \(3,\)"),
    (lambda: nn.BCEWithLogitsLoss(weight=np.ones((2, 2, 2), np.float32))(np.zeros((2, 2), np.float32),
                                                                          np.zeros((2, 2), np.float32)),
     r"binary_cross_entropy_with_logits: input 'weight' expects a shape that broadcasts to \(2, 2\)"),
])
def test_bad_arguments_name_the_layer_and_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_numpy_scalars_are_numbers_and_bools():
    x, y = np.zeros((2, 3), np.float32), np.array([0, 1])
    loss = nn.CrossEntropyLoss(label_smoothing=np.float32(0.1), soft_label=np.bool_(False))
    assert float(loss(x, y)) == pytest.approx(np.log(3), rel=1e-6)
    assert nn.SmoothL1Loss(reduction="none", delta=np.float32(2.0))(np.array([4.0], np.float32),
                                                                    np.zeros(1, np.float32)).tolist() == [6.0]
    assert float(nn.KLDivLoss("sum", log_target=np.bool_(True))(np.zeros(2, np.float32), np.zeros(2, np.float32))) == 0
    assert nn.Pad1D(1, value=np.float32(2.0))(np.ones((1, 1, 1), np.float32)).tolist() == [[[2.0, 1.0, 2.0]]]
    assert nn.PReLU(init=np.float64(0.5))(-np.ones((1, 1), np.float32)).tolist() == [[-0.5]]


class Criteria(nn.Layer):
    """Several losses over one batch, with their class weights."""

    def __init__(self):
        self.ce = nn.CrossEntropyLoss(weight=WEIGHT, label_smoothing=0.1)
        self.nll = nn.NLLLoss(weight=WEIGHT)
        self.bce = nn.BCEWithLogitsLoss(pos_weight=POS[:1])
        self.huber = nn.SmoothL1Loss(delta=0.5)

    def forward(self, logits, label):
        logp = jax.nn.log_softmax(logits)
        return {"ce": self.ce(logits, label), "nll": self.nll(logp, label),
                "bce": self.bce(logits[:, :1], (label[:, None] > 2).astype(logits.dtype)),
                "huber": self.huber(logits, logp)}


def test_losses_trace_to_a_program_that_saves_and_loads(round_trip):
    label = np.maximum(LABEL, 0).astype(np.int32)
    text = round_trip(Criteria(), LOGITS, label, tol=1e-5)
    assert "cross_entropy(" in text and "nll_loss(" in text and "@ce.weight" in text and "@bce.pos_weight" in text
    assert Criteria().named_parameters() == []  # class weights are not trained
