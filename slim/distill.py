"""Distillation: a teacher program and a student program merged into one training program
(PaddleSlim's ``merge``), distillation losses added to it, and the student trained with the
Trainer while the teacher stays fixed.

``merge(teacher, student)`` gives a program that runs both on the same inputs and returns
``(student outputs, distillation loss)``; the teacher's parameters are renamed with
``name_prefix``. Each loss function (``soft_label_loss``, ``l2_loss``, ``fsp_loss``, or
``loss`` with your own function) adds its ops to that program and adds its value, times
``weight``, to the returned loss; values are named by the :class:`~paddlejax.ir.Value` s of
the teacher or the student program (their outputs, or any intermediate feature).
:class:`DistillLayer` makes the merged program a layer whose teacher parameters do not train,
:func:`distill_loss` the Trainer's loss (the task loss on labels plus the distillation loss),
and ``DistillLayer.student()`` gives the trained student back as a program of its own.

>>> import jax.numpy as jnp, numpy as np, optax, paddlejax as pj
>>> teacher = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 4)), params={"w": jnp.eye(4)})
>>> student = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 4)), params={"w": jnp.zeros((4, 4))})
>>> merged = merge(teacher, student)
>>> _ = l2_loss(teacher.outputs[0], student.outputs[0], merged)
>>> layer = DistillLayer(merged)
>>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
>>> trainer = pj.Trainer(layer, optax.adam(0.05), loss=distill_loss(task_weight=0.0), progress=False)
>>> _ = trainer.fit((x, np.zeros(64, "int32")), epochs=30, batch_size=16)
>>> bool(np.abs(np.asarray(layer.student().params["w"]) - np.eye(4)).max() < 0.05)
True
"""
from __future__ import annotations

import dataclasses
import weakref

import jax
import jax.numpy as jnp

from paddlejax.capture import emit
from paddlejax.ir.core import Op, Program, Value, clone_block
from paddlejax.ir.rewriter import Rewriter
from paddlejax.nn.program_layer import ProgramLayer
from paddlejax.train import losses


@dataclasses.dataclass
class _Merge:
    student: Program
    teacher_params: frozenset
    values: dict  # id of a teacher or student value -> the merged program's value
    student_outputs: object  # the student's output values in the merged program, as a pytree


_MERGES: "weakref.WeakKeyDictionary[Program, _Merge]" = weakref.WeakKeyDictionary()


def merge(teacher: Program, student: Program, data_name_map: dict[str, str] | None = None,
          name_prefix: str = "teacher_") -> Program:
    """One program running ``teacher`` and ``student`` on the student's inputs, returning
    ``(student outputs, distillation loss)`` (0 until a loss is added). ``data_name_map`` maps
    teacher input names to student input names (default: by position); the teacher's
    parameters and constants are renamed with ``name_prefix``.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda p, x: x * p["s"], pj.InputSpec((None, 2), name="image"), params={"s": jnp.ones(2)})
    >>> s = pj.trace(lambda p, x: x + p["s"], pj.InputSpec((None, 2), name="x"), params={"s": jnp.ones(2)})
    >>> m = merge(t, s, data_name_map={"image": "x"})
    >>> sorted(m.params), [float(v) for v in m(jnp.ones((1, 2)))[0][0]]
    (['s', 'teacher_s'], [2.0, 2.0])
    """
    for which, prog in (("teacher", teacher), ("student", student)):
        if not isinstance(prog, Program):
            raise TypeError(f"merge: {which} must be a Program, got {type(prog).__name__}")
    clash = sorted(n for n in student.params if n.startswith(name_prefix))
    if clash or not name_prefix:
        raise ValueError(f"merge: name_prefix {name_prefix!r} must be non-empty and start no student "
                         f"parameter's name; {clash[:3]} do")
    feeds = _feeds(teacher, student, data_name_map)
    values: dict[int, Value] = {}
    mapping: dict[Value, Value] = {}
    body = clone_block(student.body, mapping)
    values.update((id(old), new) for old, new in mapping.items())
    merged = Program(body, student.params, student.constants, student.in_tree, student.out_tree,
                     f"{student.name}+{teacher.name}")
    rewriter = Rewriter(merged)
    first, ret = next(op for op in body.ops if op.type != "param"), body.terminator
    env = {t: body.args[i] for t, i in zip(teacher.inputs, feeds)}
    for op in teacher.body.ops[:-1]:
        attrs = dict(op.attrs)
        if op.type == "param":
            attrs["name"] = name_prefix + attrs["name"]
            merged.params[attrs["name"]] = teacher.params[op.attrs["name"]]
        elif op.type == "constant" and "name" in attrs:
            attrs["name"] = name_prefix + attrs["name"]
            merged.constants[attrs["name"]] = teacher.constants[op.attrs["name"]]
        blocks = [clone_block(b, env) for b in op.blocks]
        copy = Op(op.type, [env[v] for v in op.operands], [r.type for r in op.results], attrs, blocks, op.loc)
        rewriter.insert_before(first if op.type == "param" else ret, copy)
        env.update(zip(op.results, copy.results))
    values.update((id(old), new) for old, new in env.items())
    outputs = jax.tree_util.tree_unflatten(student.out_tree, list(ret.operands))
    zero = emit(lambda any_output: jnp.zeros((), jnp.float32), ret.operands[0])
    merged.set_outputs((outputs, zero))
    _MERGES[merged] = _Merge(student, frozenset(name_prefix + n for n in teacher.params), values, outputs)
    return merged


def _feeds(teacher: Program, student: Program, data_name_map) -> list[int]:
    """For each teacher input, the index of the student input that feeds it."""
    names = [v.name for v in student.inputs]
    if data_name_map is None:
        if len(teacher.inputs) > len(student.inputs):
            raise ValueError(f"merge: the teacher takes {len(teacher.inputs)} inputs, the student "
                             f"{len(student.inputs)}; say which feeds which with data_name_map")
        feeds = list(range(len(teacher.inputs)))
    else:
        unknown = sorted(set(data_name_map) - {v.name for v in teacher.inputs})
        missing = sorted(set(data_name_map.values()) - set(names))
        if unknown or missing:
            raise ValueError(f"merge: data_name_map names teacher inputs {unknown} or student inputs {missing} "
                             f"that do not exist; teacher inputs {[v.name for v in teacher.inputs]}, "
                             f"student inputs {names}")
        absent = [v.name for v in teacher.inputs if v.name not in data_name_map]
        if absent:
            raise ValueError(f"merge: data_name_map gives no student input for teacher inputs {absent}")
        feeds = [names.index(data_name_map[v.name]) for v in teacher.inputs]
    for t, i in zip(teacher.inputs, feeds):
        s = student.inputs[i]
        if t.type.dtype != s.type.dtype or len(t.type.shape) != len(s.type.shape) or any(
                a != b for a, b in zip(t.type.shape, s.type.shape) if not (isinstance(a, str) or isinstance(b, str))):
            raise ValueError(f"merge: teacher input '{t.name}' {t.type} cannot be fed student input "
                             f"'{s.name}' {s.type}")
    return feeds


def _info(program: Program, caller: str) -> _Merge:
    if program not in _MERGES:
        raise ValueError(f"{caller}: the program was not made by pj.slim.merge (or is a copy of one); "
                         "merge the teacher and the student first")
    return _MERGES[program]


def _resolve(info: _Merge, program: Program, v, caller: str, what: str) -> Value:
    if isinstance(v, Value) and id(v) in info.values:
        return info.values[id(v)]
    if isinstance(v, Value) and any(v is u for u in [*program.body.args, *(r for op in program.body.ops
                                                                          for r in op.results)]):
        return v
    raise ValueError(f"{caller}: {what} must be a value of the teacher, the student or the merged program, "
                     f"got {v!r:.80}")


def loss(loss_func, program: Program, weight: float = 1.0, **values) -> Value:
    """Add ``weight * loss_func(**values)`` (a scalar JAX function of the named values) to
    ``program``'s distillation loss; returns the new loss's value.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 2)))
    >>> s = pj.trace(lambda x: x * 1.0, pj.InputSpec((None, 2)))
    >>> m = merge(t, s)
    >>> _ = loss(lambda a, b: jnp.abs(a - b).mean(), m, a=t.outputs[0], b=s.outputs[0])
    >>> float(m(jnp.ones((1, 2)))[1])
    1.0
    """
    info = _info(program, "loss")
    resolved = {k: _resolve(info, program, v, "loss", k) for k, v in values.items()}
    value = emit(lambda kw: jnp.asarray(loss_func(**kw), jnp.float32), resolved)
    if value.type.shape != ():
        raise ValueError(f"loss: the loss function must return a scalar, got {value.type}")
    total = emit(lambda a, b: a + weight * b, program.outputs[-1], value)
    program.set_outputs((info.student_outputs, total))
    return value


def soft_label_loss(teacher_var, student_var, program: Program, teacher_temperature: float = 1.0,
                    student_temperature: float = 1.0, weight: float = 1.0) -> Value:
    """Cross entropy of the student's softened distribution against the teacher's (Hinton's
    soft labels, PaddleSlim's ``soft_label_loss``), averaged over the batch.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda x: x, pj.InputSpec((None, 3)))
    >>> m = merge(t, pj.trace(lambda x: x, pj.InputSpec((None, 3))))
    >>> _ = soft_label_loss(t.outputs[0], m.outputs[0], m, 2.0, 2.0)
    >>> round(float(m(jnp.zeros((2, 3)))[1]), 4)  # uniform against uniform: log 3
    1.0986
    """
    def soft_label(teacher, student):
        target = jax.nn.softmax(jax.lax.stop_gradient(teacher).astype(jnp.float32) / teacher_temperature, -1)
        return -(target * jax.nn.log_softmax(student.astype(jnp.float32) / student_temperature, -1)).sum(-1).mean()

    return loss(soft_label, program, weight, teacher=teacher_var, student=student_var)


def l2_loss(teacher_var, student_var, program: Program, weight: float = 1.0) -> Value:
    """Mean squared difference of paired features (PaddleSlim's ``l2_loss``); their shapes must match.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda x: x + 1.0, pj.InputSpec((None, 2)))
    >>> m = merge(t, pj.trace(lambda x: x, pj.InputSpec((None, 2))))
    >>> _ = l2_loss(t.outputs[0], m.outputs[0], m)
    >>> float(m(jnp.zeros((4, 2)))[1])
    1.0
    """
    _same_shape("l2_loss", program, [(teacher_var, student_var)])
    return loss(lambda teacher, student: jnp.mean(jnp.square(jax.lax.stop_gradient(teacher).astype(jnp.float32)
                                                             - student.astype(jnp.float32))),
                program, weight, teacher=teacher_var, student=student_var)


def fsp_matrix(a, b, data_format: str = "NCHW"):
    """The flow of solution procedure between two feature maps of one spatial size: the
    ``[N, C_a, C_b]`` matrix of their channels' inner products over positions, divided by
    the number of positions (Yim et al., 2017).

    >>> import jax.numpy as jnp
    >>> fsp_matrix(jnp.ones((1, 2, 3, 3)), jnp.ones((1, 4, 3, 3))).shape
    (1, 2, 4)
    """
    if data_format == "NHWC":
        a, b = jnp.moveaxis(a, -1, 1), jnp.moveaxis(b, -1, 1)
    a = a.reshape(a.shape[0], a.shape[1], -1).astype(jnp.float32)
    b = b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32)
    return jnp.einsum("nap,nbp->nab", a, b) / a.shape[-1]


def fsp_loss(teacher_var1, teacher_var2, student_var1, student_var2, program: Program,
             data_format: str = "NCHW", weight: float = 1.0) -> Value:
    """Mean squared difference of the teacher's and the student's FSP matrices (PaddleSlim's
    ``fsp_loss``): each pair of feature maps shares its spatial size, and the student's
    channel counts match the teacher's.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda x: (x, x * 2.0), pj.InputSpec((None, 2, 4, 4)))
    >>> s = pj.trace(lambda x: (x, x), pj.InputSpec((None, 2, 4, 4)))
    >>> m = merge(t, s)
    >>> _ = fsp_loss(*t.outputs, *s.outputs, m)
    >>> float(m(jnp.ones((1, 2, 4, 4)))[1])
    1.0
    """
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"fsp_loss: data_format must be NCHW or NHWC, got {data_format!r}")
    _same_shape("fsp_loss", program, [(teacher_var1, student_var1), (teacher_var2, student_var2)], spatial=True)

    def fsp(t1, t2, s1, s2):
        teacher = jax.lax.stop_gradient(fsp_matrix(t1, t2, data_format))
        return jnp.mean(jnp.square(teacher - fsp_matrix(s1, s2, data_format)))

    return loss(fsp, program, weight, t1=teacher_var1, t2=teacher_var2, s1=student_var1, s2=student_var2)


def _same_shape(caller: str, program: Program, pairs, spatial: bool = False) -> None:
    info = _info(program, caller)
    for t, s in pairs:
        t, s = _resolve(info, program, t, caller, "teacher_var"), _resolve(info, program, s, caller, "student_var")
        if t.type.shape[1:] != s.type.shape[1:] or len(t.type.shape) != len(s.type.shape):
            raise ValueError(f"{caller}: the teacher's {t.type} and the student's {s.type} do not pair up")
        if spatial and len(t.type.shape) != 4:
            raise ValueError(f"{caller}: FSP matrices are made of 4-d feature maps, got {t.type}")


class DistillLayer(ProgramLayer):
    """A merged program as a layer: the student's parameters train, the teacher's (and those
    ``frozen`` names, such as a fake-quantized student's scales) do not. ``student()`` is the
    student program with the layer's current parameters.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> t = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
    >>> layer = DistillLayer(merge(t, t))
    >>> sorted(k for k, v in layer.params.items() if type(v).__name__ == "Param")
    ['w']
    """

    def __init__(self, merged: Program, frozen=()):
        info = _info(merged, "DistillLayer")
        super().__init__(merged, frozen=info.teacher_params | set(frozen))
        self.student_source = info.student

    def student(self) -> Program:
        source = self.student_source
        out = source.clone()
        out.params = {name: self.params[name][...] for name in source.params}
        return out


def distill_loss(task="cross_entropy", task_weight: float = 1.0):
    """The Trainer's loss for a :class:`DistillLayer`: ``task_weight`` times the task loss
    (a name or a callable, as the Trainer takes) of the student's outputs and the labels, plus
    the distillation loss; ``task_weight=0`` ignores the labels (training on unlabelled data).

    >>> import jax.numpy as jnp
    >>> float(distill_loss(task_weight=0.0)((jnp.zeros((2, 3)), jnp.float32(0.5)), jnp.zeros(2, "int32")))
    0.5
    """
    task_fn = losses.get(task)

    def fn(outputs, labels):
        student, distillation = outputs
        if task_weight == 0:
            return distillation
        return task_weight * task_fn(student, labels) + distillation

    return fn
