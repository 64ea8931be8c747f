"""Fine-tuning a hub module, PaddleHub's way, on :class:`paddlejax.Trainer`.

    model = pj.hub.Module(name="all_minilm_l6_v2", task="seq-cls", num_classes=5)
    trainer = pj.hub.Trainer(model, optax.adamw(1e-4), checkpoint_dir="bbc_ckpt")
    trainer.train(train_ds, epochs=2, batch_size=16, eval_dataset=test_ds, save_interval=1)
    # bbc_ckpt/epoch_1/, epoch_2/ and best_model/ are modules: install, serve or load them

The module's program becomes a trainable layer (:class:`~paddlejax.nn.program_layer.ProgramLayer`:
its weights fine-tune too) under a fresh head: layer norm, dropout and a linear layer to the
classes. The head normalises its features because a sentence-embedding module gives unit
vectors, whose entries are too small for a linear layer to train at fine-tuning rates.
A dataset is a sequence of ``(text or image, label)`` samples (``pj.data.BBCNews``,
``pj.data.Digits``) or a pair ``(texts or images, labels)``; multi-label tasks take multi-hot
label rows.
"""
from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from paddlejax import nn
from paddlejax.hub.errors import HubError
from paddlejax.train.callbacks import Callback


@dataclasses.dataclass(frozen=True)
class FineTuneSpec:
    """What ``Module(task=..., num_classes=...)`` asked for."""

    task: str
    labels: tuple[str, ...]

    @property
    def multilabel(self) -> bool:
        return self.task.endswith("multilabel")


class ClassifierHead(nn.Layer):
    """``backbone`` (a program layer) under layer norm, dropout and a linear layer."""

    def __init__(self, backbone: nn.Layer, features: int, num_classes: int, dropout: float = 0.1):
        self.backbone = backbone
        self.norm = nn.LayerNorm(features)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(features, num_classes)

    def __call__(self, *inputs):
        features = self.backbone(*inputs)
        features = features[0] if isinstance(features, (tuple, list)) else features
        features = features.reshape(features.shape[0], -1)
        return self.head(self.dropout(self.norm(features)))


def build_model(module, spec: FineTuneSpec) -> ClassifierHead:
    """The trainable model of ``module`` for ``spec``: its ``features`` program (else its
    ``model`` program) as a layer under a fresh classifier head."""
    from paddlejax.nn.program_layer import ProgramLayer

    program = module.programs.get("features", module.program)
    shape = program.outputs[0].type.shape[1:]
    if any(isinstance(d, str) for d in shape):
        raise HubError(f"{module.label}: its features {program.outputs[0].type} have symbolic sizes besides the "
                       f"batch; a classifier head needs a fixed feature size")
    return ClassifierHead(ProgramLayer(program), math.prod(shape), len(spec.labels))


def _sigmoid_cross_entropy(logits, labels):
    import optax

    return optax.sigmoid_binary_cross_entropy(logits, labels.astype(logits.dtype)).mean()


def _samples(dataset, what: str) -> tuple[list, np.ndarray]:
    if isinstance(dataset, tuple) and len(dataset) == 2 and len(dataset[0]) == len(dataset[1]):
        items, labels = list(dataset[0]), np.asarray(dataset[1])
    else:
        pairs = [dataset[i] for i in range(len(dataset))]
        if not pairs or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
            raise HubError(f"{what}: expects (sample, label) pairs or a pair (samples, labels)")
        items, labels = [p[0] for p in pairs], np.asarray([p[1] for p in pairs])
    if not items:
        raise HubError(f"{what} is empty")
    return items, labels


class _SaveModules(Callback):
    """Writes ``epoch_N/`` every ``save_interval`` epochs and ``best_model/`` when the
    evaluation improves: each a module directory."""

    def __init__(self, owner: Trainer, save_interval: int):
        self.owner, self.save_interval = owner, save_interval
        self.best = -math.inf

    def on_epoch_end(self, trainer, epoch, logs) -> None:
        if (epoch + 1) % self.save_interval == 0:
            self.owner.save_module(self.owner.checkpoint_dir / f"epoch_{epoch + 1}")
        score = logs.get(self.owner.monitor)
        score = -score if score is not None and self.owner.monitor.endswith("loss") else score
        if score is not None and score > self.best:
            self.best = score
            self.owner.save_module(self.owner.checkpoint_dir / "best_model")


class Trainer:
    """PaddleHub's ``hub.Trainer``: fine-tune a :class:`~paddlejax.hub.Module` made with
    ``task=`` and ``num_classes=``, writing installable modules to ``checkpoint_dir``.

    Args:
        model: the module (``pj.hub.Module(name=..., task="seq-cls", num_classes=N)``).
        optimizer: an optax transformation (default AdamW at 5e-5, PaddleHub's habit).
        checkpoint_dir: where ``epoch_N/`` and ``best_model/`` go.
        max_seq_len: tokens kept per text while training (default the module's).
        name, version: of the modules written (default ``<module>_<task>``, ``1.0.0``).
        trainer_options: passed to :class:`paddlejax.Trainer` (``grad_clip``, ``ema``, ``amp``,
            ``progress``, ...).
    """

    def __init__(self, model, optimizer=None, checkpoint_dir: str = "ckpt", *, max_seq_len: int | None = None,
                 name: str | None = None, version: str = "1.0.0", **trainer_options):
        import optax

        import paddlejax as pj

        if getattr(model, "finetune", None) is None:
            raise HubError("hub.Trainer: give a module made for fine-tuning, e.g. "
                           "pj.hub.Module(name=..., task='seq-cls', num_classes=2)")
        self.module, self.spec = model, model.finetune
        self.checkpoint_dir = Path(checkpoint_dir)
        self.max_seq_len = max_seq_len or (model.text.max_length if model.text else None)
        self.name = name or f"{model.name}_{self.spec.task.replace('-', '_')}"
        self.version = version
        # best_model is the best evaluation: lowest loss for multi-label, highest accuracy otherwise
        self.monitor = "eval_loss" if self.spec.multilabel else "eval_acc"
        loss = _sigmoid_cross_entropy if self.spec.multilabel else "cross_entropy"
        metrics = [] if self.spec.multilabel else ["accuracy"]
        self.trainer = pj.Trainer(model.model, optimizer or optax.adamw(5e-5, weight_decay=0.01), loss=loss,
                                  metrics=metrics, **trainer_options)

    def _arrays(self, dataset, what: str) -> tuple:
        items, labels = _samples(dataset, what)
        if self.module.text is not None:
            if not all(isinstance(t, str) for t in items):
                raise HubError(f"{what}: {self.module.label} takes texts")
            arrays = self.module.text(items)
            pad = {name: np.pad(a[:, :self.max_seq_len], ((0, 0), (0, max(0, self.max_seq_len - a.shape[1]))),
                                constant_values=self.module.text.pad_id if name == "input_ids" else 0)
                   for name, a in arrays.items()}
            inputs = tuple(pad[name] for name in self.module.text.inputs)
        else:
            inputs = (self.module.image(items),)
        classes = len(self.spec.labels)
        if self.spec.multilabel:
            if labels.ndim != 2 or labels.shape[1] != classes:
                raise HubError(f"{what}: multi-label targets must be rows of {classes} zeros and ones, "
                               f"got shape {labels.shape}")
            labels = labels.astype(np.float32)
        else:
            if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 \
                    or labels.max() >= classes:
                raise HubError(f"{what}: labels must be class numbers in [0, {classes})")
            labels = labels.astype(np.int32)
        return (*inputs, labels)

    def train(self, train_dataset, epochs: int = 1, batch_size: int = 32, eval_dataset=None,
              log_interval: int = 10, save_interval: int = 1, seed: int = 0):
        """Fine-tune for ``epochs``, evaluating on ``eval_dataset`` after every epoch and
        writing modules (``epoch_N`` every ``save_interval`` epochs, ``best_model`` on the
        best evaluation, or on the last epoch without one). Returns the training history."""
        if isinstance(save_interval, bool) or not isinstance(save_interval, int) or save_interval < 1:
            raise HubError(f"hub.Trainer.train: save_interval must be a positive int, got {save_interval!r}")
        train = self._arrays(train_dataset, "train_dataset")
        evaluation = self._arrays(eval_dataset, "eval_dataset") if eval_dataset is not None else None
        saver = _SaveModules(self, save_interval)
        self.trainer.callbacks.append(saver)
        self.trainer.log_every = max(1, log_interval)
        try:
            history = self.trainer.fit(train, eval=evaluation, epochs=epochs, batch_size=batch_size, seed=seed)
        finally:
            self.trainer.callbacks.remove(saver)
        if evaluation is None:
            self.save_module(self.checkpoint_dir / "best_model")
        self.trainer.sync_model()
        return history

    def evaluate(self, eval_dataset, batch_size: int = 32) -> dict[str, float]:
        """Loss and accuracy (multi-label: loss) on ``eval_dataset``."""
        return self.trainer.evaluate(self._arrays(eval_dataset, "eval_dataset"), batch_size=batch_size)

    def save_module(self, directory) -> Path:
        """Write the model as trained so far as a module in ``directory`` (replaced if there):
        its program with a symbolic batch (and sequence length), the source module's
        processor, and the classes as labels."""
        import paddlejax as pj
        from paddlejax.hub.store import temp_dir
        from paddlejax.hub.writer import write_module

        source = self.module
        program = pj.to_static(self.trainer.current_model(), *self._specs())
        processor = {k: v for k, v in source.manifest.processor.items() if k in ("text", "image")}
        processor["labels"] = list(self.spec.labels)
        processor["postprocess"] = ({"kind": "classification", "activation": "sigmoid", "threshold": 0.5}
                                    if self.spec.multilabel else {"kind": "classification"})
        files = {}
        if source.text is not None:
            tokenizer = source.manifest.processor["text"]["tokenizer"]
            files[tokenizer] = source.directory / tokenizer
            processor["text"] = {**processor["text"], "max_length": self.max_seq_len}
        directory = Path(directory)
        staged = temp_dir(f"save-{self.name}") / "module"
        try:
            write_module(staged, programs={"model": program}, files=files, name=self.name, version=self.version,
                         task=self.spec.task, summary=f"{source.name} fine-tuned for {self.spec.task} "
                         f"({len(self.spec.labels)} classes)", license=source.manifest.license,
                         requires=source.manifest.requires, processor=processor,
                         predictor=source.manifest.predictor, inputs=source.manifest.inputs,
                         outputs={"type": "array", "items": {"label": "string", "score": "number"}})
            directory.parent.mkdir(parents=True, exist_ok=True)
            if directory.exists():
                shutil.rmtree(directory)
            shutil.move(str(staged), directory)
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)
        return directory

    def _specs(self) -> list:
        import paddlejax as pj

        program = self.module.programs.get("features", self.module.program)
        specs = []
        for v in program.inputs:
            shape = tuple(None if i == 0 else d for i, d in enumerate(v.type.shape))
            specs.append(pj.InputSpec(shape, v.type.dtype, name=v.name))
        return specs


def finetune_spec(module, task: str | None, num_classes: int | None,
                  label_list: Sequence[str] | None) -> FineTuneSpec | None:
    """The fine-tuning asked of ``module`` (None when nothing was), checked."""
    from paddlejax.hub.module import FINETUNE_TASKS, IMAGE_TASKS, TEXT_TASKS

    if task is None:
        if num_classes is not None or label_list is not None:
            raise HubError("Module: num_classes and label_list go with a fine-tuning task= (e.g. 'seq-cls')")
        return None
    if task not in FINETUNE_TASKS:
        raise HubError(f"Module: task {task!r} is not a fine-tuning task; one of {sorted(FINETUNE_TASKS)}")
    target = FINETUNE_TASKS[task]
    kind = TEXT_TASKS if target.startswith("text") else IMAGE_TASKS
    if module.task not in kind:
        raise HubError(f"Module: {module.label} is a {module.task} module; task {task!r} needs "
                       f"{'a text' if kind is TEXT_TASKS else 'an image'} module")
    if label_list is not None:
        labels = tuple(label_list)
        if not labels or not all(isinstance(x, str) for x in labels) or len(set(labels)) != len(labels):
            raise HubError("Module: label_list must be distinct strings")
        if num_classes is not None and num_classes != len(labels):
            raise HubError(f"Module: num_classes={num_classes} but label_list has {len(labels)} names")
    elif isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2:
        labels = tuple(str(i) for i in range(num_classes))
    else:
        raise HubError(f"Module: task {task!r} needs num_classes >= 2 or a label_list, got num_classes={num_classes!r}")
    return FineTuneSpec(target, labels)
