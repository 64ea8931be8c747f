"""Distillation: teacher and student merged into one program, losses added to it, the student
trained with the Trainer while the teacher stays as it was."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import paddlejax as pj
from paddlejax.slim.distill import (DistillLayer, distill_loss, fsp_loss, fsp_matrix, l2_loss, loss, merge,
                                    soft_label_loss)


def linear_program(w, name="x", scale=1.0):
    return pj.trace(lambda p, x: (x @ p["w"]) * scale, pj.InputSpec((None, w.shape[0]), name=name),
                    params={"w": jnp.asarray(w, jnp.float32)})


def test_merge_runs_the_student_and_keeps_the_teacher_under_a_prefix():
    rng = np.random.default_rng(0)
    teacher, student = linear_program(rng.normal(size=(3, 2))), linear_program(rng.normal(size=(3, 2)))
    merged = merge(teacher, student)
    assert sorted(merged.params) == ["teacher_w", "w"]
    x = rng.normal(size=(4, 3)).astype("float32")
    outputs, distillation = merged(x)
    np.testing.assert_allclose(np.asarray(outputs), np.asarray(student(x)), rtol=1e-6)
    assert float(distillation) == 0.0  # no loss added yet
    merged.verify()


def test_data_name_map_feeds_teacher_inputs_by_name_and_refuses_what_does_not_fit():
    teacher = linear_program(np.eye(3), name="image")
    student = linear_program(np.eye(3), name="x")
    assert sorted(merge(teacher, student, {"image": "x"}).params) == ["teacher_w", "w"]
    with pytest.raises(ValueError, match="teacher inputs \\['pixels'\\]"):
        merge(teacher, student, {"pixels": "x"})
    with pytest.raises(ValueError, match="cannot be fed"):
        merge(linear_program(np.eye(4)), student)
    with pytest.raises(ValueError, match="name_prefix"):
        merge(teacher, student, name_prefix="")
    with pytest.raises(TypeError, match="teacher must be a Program"):
        merge(object(), student)


def test_soft_label_loss_is_the_cross_entropy_of_softened_distributions():
    rng = np.random.default_rng(1)
    teacher, student = linear_program(rng.normal(size=(4, 5))), linear_program(rng.normal(size=(4, 5)))
    merged = merge(teacher, student)
    soft_label_loss(teacher.outputs[0], student.outputs[0], merged, teacher_temperature=2.0, student_temperature=3.0)
    x = rng.normal(size=(6, 4)).astype("float32")
    t, s = np.asarray(teacher(x), np.float64), np.asarray(student(x), np.float64)
    p = np.exp(t / 2) / np.exp(t / 2).sum(1, keepdims=True)
    log_q = s / 3 - np.log(np.exp(s / 3).sum(1, keepdims=True))
    np.testing.assert_allclose(float(merged(x)[1]), -(p * log_q).sum(1).mean(), rtol=1e-5)


def test_losses_add_up_with_their_weights_and_fsp_is_the_feature_flow_matrix():
    rng = np.random.default_rng(2)
    maps = lambda s: pj.trace(lambda x: (x * s, jnp.tanh(x) * s), pj.InputSpec((None, 2, 3, 3)))  # noqa: E731
    teacher, student = maps(2.0), maps(1.0)
    merged = merge(teacher, student)
    l2_loss(teacher.outputs[0], student.outputs[0], merged, weight=0.5)
    fsp_loss(*teacher.outputs, *student.outputs, merged)
    x = rng.normal(size=(2, 2, 3, 3)).astype("float32")
    (t1, t2), (s1, s2) = [np.asarray(v, np.float64) for v in teacher(x)], [np.asarray(v, np.float64) for v in student(x)]

    def fsp(a, b):
        return np.einsum("nap,nbp->nab", a.reshape(2, 2, 9), b.reshape(2, 2, 9)) / 9

    expected = 0.5 * np.mean((t1 - s1) ** 2) + np.mean((fsp(t1, t2) - fsp(s1, s2)) ** 2)
    np.testing.assert_allclose(float(merged(x)[1]), expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fsp_matrix(x, x)), fsp(x.astype(np.float64), x), rtol=1e-5)


def test_losses_refuse_values_of_other_programs_and_programs_not_merged():
    teacher, student = linear_program(np.eye(2)), linear_program(np.eye(2))
    merged = merge(teacher, student)
    stranger = linear_program(np.eye(2))
    with pytest.raises(ValueError, match="value of the teacher, the student or the merged program"):
        l2_loss(stranger.outputs[0], student.outputs[0], merged)
    with pytest.raises(ValueError, match="not made by pj.slim.merge"):
        l2_loss(teacher.outputs[0], student.outputs[0], student)
    wide = linear_program(np.ones((2, 3)))
    with pytest.raises(ValueError, match="do not pair up"):
        l2_loss(teacher.outputs[0], wide.outputs[0], merge(teacher, wide))
    with pytest.raises(ValueError, match="must return a scalar"):
        loss(lambda a: a, merged, a=teacher.outputs[0])



def small_student():
    pj.nn.seed(1)
    model = pj.nn.Sequential(pj.nn.Flatten(), pj.nn.Linear(64, 32), pj.nn.ReLU(), pj.nn.Linear(32, 10))
    return pj.to_static(model, pj.InputSpec((None, 1, 8, 8)))


def test_a_student_learns_a_batch_norm_teacher_and_the_teacher_does_not_move(untrained_digits):
    teacher, student = untrained_digits, small_student()
    merged = merge(teacher, student)
    soft_label_loss(teacher.outputs[0], student.outputs[0], merged, 2.0, 2.0)
    layer = DistillLayer(merged)
    kinds = {name: type(v).__name__ for name, v in layer.params.items()}
    assert kinds["teacher_features.1.mean"] == "BatchStat" and kinds["teacher_features.0.weight"] == "Variable"
    assert {kinds[n] for n in student.params} == {"Param"}
    x = np.random.default_rng(0).random((256, 1, 8, 8)).astype("float32")
    agree = lambda s: float((np.asarray(s(x)).argmax(1) == np.asarray(teacher(x)).argmax(1)).mean())  # noqa: E731
    before = agree(student)
    trainer = pj.Trainer(layer, optax.adam(3e-3), loss=distill_loss(task_weight=0.0), progress=False)
    history = trainer.fit((x, np.zeros(len(x), "int32")), epochs=25, batch_size=64)
    losses = history.series("train", "loss")[1]
    p = np.asarray(jax.nn.softmax(np.asarray(teacher(x), np.float64) / 2.0))
    floor = float(-(p * np.log(p)).sum(1).mean())  # the teacher's own entropy: the least the loss can be
    assert losses[-1] - floor < 0.25 * (losses[0] - floor)
    trained = layer.student()
    assert sorted(trained.params) == sorted(student.params)  # the teacher is gone
    assert agree(trained) > max(0.8, before + 0.3)
    for name, value in teacher.params.items():
        np.testing.assert_array_equal(np.asarray(layer.params["teacher_" + name][...]), np.asarray(value))


def test_distill_loss_adds_the_task_loss_on_labels():
    logits, labels = jnp.array([[2.0, 0.0]]), jnp.array([0])
    task = float(pj.ops.cross_entropy(logits, labels))
    assert float(distill_loss(task_weight=2.0)((logits, jnp.float32(1.0)), labels)) == pytest.approx(2 * task + 1)


def test_a_bfloat16_teacher_distils_into_a_float32_student():
    teacher = pj.trace(lambda p, x: x.astype(jnp.bfloat16) @ p["w"], pj.InputSpec((None, 3)),
                       params={"w": jnp.eye(3, dtype=jnp.bfloat16)})
    student = linear_program(np.zeros((3, 3)))
    merged = merge(teacher, student)
    l2_loss(teacher.outputs[0], student.outputs[0], merged)
    x = np.ones((2, 3), np.float32)
    assert float(merged(x)[1]) == pytest.approx(1.0)  # teacher x @ I = 1 everywhere, student 0
    grads = jax.grad(lambda p: merged.apply(p, x)[1])(merged.params)
    assert float(jnp.abs(grads["w"]).sum()) > 0
