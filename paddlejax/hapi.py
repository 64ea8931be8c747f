"""Paddle's high-level API: :class:`Model` (``paddle.Model``) and :func:`summary` (``paddle.summary``).

``Model`` wraps a network in Paddle's ``prepare`` / ``fit`` / ``evaluate`` / ``predict`` /
``save`` / ``load`` calls; the training itself is the :class:`~paddlejax.Trainer`'s (one
training loop), which ``model.trainer`` exposes after ``prepare``.

>>> import numpy as np, optax, paddlejax as pj
>>> pj.nn.seed(0)
>>> net = pj.nn.Sequential(pj.nn.Linear(4, 8), pj.nn.ReLU(), pj.nn.Linear(8, 2))
>>> model = pj.Model(net, inputs=pj.InputSpec((None, 4)), labels=pj.InputSpec((None,), "int32"))
>>> model.prepare(optax.adam(0.05), "cross_entropy", metrics=["accuracy"])
>>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
>>> y = (x[:, 0] > 0).astype("int32")
>>> model.fit((x, y), epochs=10, batch_size=16, verbose=0)
>>> model.evaluate((x, y), batch_size=64, verbose=0)["acc"] > 0.9
True
>>> [out.shape for out in model.predict(x, batch_size=32)]
[(64, 2)]
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import numpy as np

from paddlejax.capture import InputSpec, input_structs

_VERBOSE = {0: False, 1: True, 2: "epoch"}


def _specs(owner: str, name: str, value) -> tuple[InputSpec, ...] | None:
    """``value`` (a spec or a list of them) as a tuple, Paddle's batch size -1 read as None."""
    if value is None:
        return None
    specs = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    for spec in specs:
        if not isinstance(spec, InputSpec):
            raise TypeError(f"{owner}: {name} expects pj.InputSpec or a list of them, got {type(spec).__name__}")
    return tuple(InputSpec(tuple(None if d == -1 else d for d in s.shape), s.dtype, s.name) for s in specs)


def _verbose(owner: str, verbose) -> bool | str:
    if verbose not in _VERBOSE:
        raise ValueError(f"{owner}: verbose expects 0 (silent), 1 (progress bar) or 2 (a line per epoch), "
                         f"got {verbose!r}")
    return _VERBOSE[verbose]


class Model:
    """A network with Paddle's ``Model`` calls, trained by a :class:`~paddlejax.Trainer`.

    Args:
        network: a ``paddlejax.nn`` layer or any ``nnx.Module``.
        inputs: :class:`~paddlejax.InputSpec` (or a list, one per input; batch size None or -1).
            With them, ``prepare`` sets the model up without data, and ``summary``, ``predict``
            and ``save`` work before training; without them the first batch decides.
        labels: the labels' specs (documentation only: the loss takes whatever the data holds).

    See the module docstring for an example.
    """

    def __init__(self, network, inputs=None, labels=None):
        self.network = network
        self._inputs = _specs("Model", "inputs", inputs)
        self._labels = _specs("Model", "labels", labels)
        self._trainer = None

    @property
    def trainer(self):
        """The :class:`~paddlejax.Trainer` that ``prepare`` made."""
        if self._trainer is None:
            raise RuntimeError("Model: call prepare(optimizer, loss, metrics) first")
        return self._trainer

    def prepare(self, optimizer=None, loss=None, metrics=None, **trainer_options) -> None:
        """Choose the optimizer (an optax transformation; ``pj.optimizer.lr`` schedulers go in
        its learning rate), the loss (``"cross_entropy"``, ``"mse"`` or ``fn(outputs, labels)``,
        e.g. a loss layer) and the metrics (instances or names). ``trainer_options`` go to the
        Trainer (``amp``, ``grad_clip``, ``ema``, ``strategy``, ...)."""
        from paddlejax.train import Trainer

        metrics = [] if metrics is None else list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        self._trainer = Trainer(self.network, optimizer, "cross_entropy" if loss is None else loss, metrics,
                                progress=False, **trainer_options)
        if self._inputs is not None:
            self._trainer.build(*self._inputs)

    def fit(self, train_data=None, eval_data=None, batch_size: int = 1, epochs: int = 1, eval_freq: int = 1,
            log_freq: int = 10, save_dir: str | None = None, save_freq: int = 1, verbose: int = 2,
            drop_last: bool = False, shuffle: bool = True, num_workers: int = 0, callbacks: Sequence = ()) -> None:
        """Train for ``epochs`` over ``train_data`` (a dataset, arrays ``(inputs..., labels)`` or a
        ``DataLoader``), evaluating on ``eval_data`` after the first epoch and every ``eval_freq``
        epochs from there, as Paddle does. ``verbose``: 0 silent, 1 a progress bar per epoch, 2
        a line per epoch. ``save_dir``: the training state is checkpointed there every
        ``save_freq`` epochs and after the last (:meth:`load` reads it; a later ``fit`` with the
        same ``save_dir`` resumes from it). ``callbacks``: :class:`~paddlejax.train.Callback`
        instances for this call. The arguments keep Paddle's order."""
        from paddlejax.data import DataLoader

        trainer = self.trainer
        progress = _verbose("Model.fit", verbose)
        if train_data is None:
            raise ValueError("Model.fit: train_data is required")
        if not isinstance(train_data, DataLoader):
            train_data = DataLoader(train_data, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                                    num_workers=num_workers)
        saved = (trainer.progress, trainer.log_every, trainer.callbacks, trainer.checkpoints)
        trainer.progress, trainer.log_every = progress, max(1, log_freq)
        trainer.callbacks = [*trainer.callbacks, *callbacks]
        if save_dir is not None:
            from paddlejax.train.checkpoint import CheckpointManager

            # a checkpoint at every epoch's end (the Trainer forces one there), none in between
            trainer.checkpoints = CheckpointManager(save_dir, every=len(train_data) * epochs + 1, keep=None)
        try:
            trainer.fit(train_data, eval_data, epochs=epochs, batch_size=batch_size, eval_freq=eval_freq,
                        save_freq=save_freq)
        finally:
            if save_dir is not None:
                trainer.checkpoints.close()
            trainer.progress, trainer.log_every, trainer.callbacks, trainer.checkpoints = saved

    def evaluate(self, eval_data, batch_size: int = 1, log_freq: int = 10, verbose: int = 2, num_workers: int = 0,
                 callbacks: Sequence = ()) -> dict[str, float]:
        """Loss and metrics over ``eval_data`` as a dict (``{"loss": ..., "acc": ...}``);
        ``verbose`` 1 or 2 also prints them. Paddle's other arguments: ``num_workers`` loads the
        batches in worker processes, ``callbacks`` get ``on_eval_end(trainer, results)``, and
        ``log_freq`` is accepted (the results come once, at the end)."""
        loud = _verbose("Model.evaluate", verbose)
        results = self.trainer.evaluate(_loader(eval_data, batch_size, num_workers), batch_size=batch_size)
        for callback in callbacks or ():
            callback.on_eval_end(self.trainer, results)
        if loud:
            print("eval: " + " ".join(f"{k}={v:.4g}" for k, v in results.items()), flush=True)
        return results

    def predict(self, test_data, batch_size: int = 1, num_workers: int = 0, stack_outputs: bool = True,
                verbose: int = 1, callbacks: Sequence = ()) -> list:
        """The network's outputs over ``test_data`` (input arrays, or a dataset whose samples
        may carry labels: only the first ``len(inputs)`` fields are fed): a list with one array
        per output, the batches concatenated; with ``stack_outputs=False`` (Paddle's default)
        one list of per-batch arrays per output instead. ``num_workers`` loads the batches in
        worker processes; ``verbose`` and ``callbacks`` are accepted for Paddle's signature."""
        _verbose("Model.predict", verbose)
        outputs = self.trainer.predict(_loader(test_data, batch_size, num_workers), batch_size=batch_size)
        outputs = [np.asarray(o) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]
        if stack_outputs:
            return outputs
        return [np.split(o, range(batch_size, len(o), batch_size)) for o in outputs]

    def save(self, path: str, training: bool = True) -> None:
        """``training=True``: the whole training state (weights, optimizer state, step, epoch) as
        a checkpoint directory ``path``, which :meth:`load` reads; ``training=False``: the
        inference program and its weights (``path.json`` + ``path.safetensors``, with
        :func:`paddlejax.save`) for :func:`paddlejax.load` and the Predictor."""
        if training:
            self.trainer.save(path)
            return
        from paddlejax.io import save

        save(self.trainer.inference_program(), path)

    def load(self, path: str) -> None:
        """Restore what ``save(path)`` (``training=True``) or ``fit(save_dir=path)`` wrote: the
        weights go into the network too."""
        if not os.path.isdir(path) and os.path.isfile(f"{path}.json"):
            raise ValueError(f"Model.load: {path} is an inference program (save(training=False)); load it with "
                             "pj.load or pj.inference.Predictor, or save with training=True to resume")
        self.trainer.load(path)

    def summary(self, input_size=None, dtype: str = "float32") -> dict[str, int]:
        """Print the per-layer table of :func:`summary` for the model's ``inputs`` (or
        ``input_size``, a shape or a list of shapes, in ``dtype``); returns its totals."""
        if input_size is not None:
            return summary(self.network, input_size=input_size, dtypes=dtype)
        if self._inputs is None:
            raise ValueError("Model.summary: give the model inputs=pj.InputSpec(...) or pass input_size")
        return summary(self.network, *self._inputs)


def _loader(data, batch_size, num_workers):
    """``data`` in a DataLoader with ``num_workers`` workers, when it asks for any."""
    from paddlejax.data import DataLoader

    if not num_workers or isinstance(data, DataLoader):
        return data
    if isinstance(data, np.ndarray) or hasattr(data, "shape"):
        data = (data,)
    return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=num_workers)


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _own_sizes(module) -> tuple[int, int]:
    """(trainable, other) element counts of the variables ``module`` holds itself (not its sub-modules')."""
    from flax import nnx

    trainable = other = 0
    for value in vars(module).values():
        if isinstance(value, nnx.Variable) and not isinstance(value, nnx.RngState):
            size = int(np.size(value.get_value()))
            if isinstance(value, nnx.Param):
                trainable += size
            else:
                other += size
    return trainable, other


def _is_shape(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool)) for d in value)


def _size_specs(input_size, dtypes) -> list[InputSpec]:
    """Paddle's ``input_size`` (a shape or a list of shapes; -1 or None for the batch size) as
    specs in ``dtypes`` (one dtype, or one per shape)."""
    shapes = [input_size] if _is_shape(input_size) else input_size
    if not isinstance(shapes, (list, tuple)) or not shapes or not all(_is_shape(s) for s in shapes):
        raise ValueError(f"summary: input_size expects a shape such as (-1, 4) or a list of shapes, "
                         f"got {input_size!r}")
    dtypes = [dtypes] * len(shapes) if dtypes is None or isinstance(dtypes, str) or not isinstance(
        dtypes, (list, tuple)) else list(dtypes)
    if len(dtypes) != len(shapes):
        raise ValueError(f"summary: dtypes expects one dtype or one per input ({len(shapes)}), got {len(dtypes)}")
    return [InputSpec(tuple(None if d is None or d == -1 else int(d) for d in s), d or "float32")
            for s, d in zip(shapes, dtypes)]


def summary(network, *inputs, input_size=None, dtypes=None, print_fn=print) -> dict[str, int]:
    """Print a table of the layers ``network`` calls on ``inputs`` (specs, arrays or shapes --
    Paddle's ``input_size``, e.g. ``(-1, 4)``, also as the keyword, with ``dtypes``, float32 by
    default), in call order: name and type, output shape (``b``: the batch size) and the number of parameters
    the layer holds itself; then the totals, trainable (``nnx.Param``) and not (batch-norm
    statistics, frozen weights). Nothing is computed: shapes come from ``jax.eval_shape`` in
    eval mode. Returns ``{"total_params", "trainable_params", "non_trainable_params"}``.

    >>> import paddlejax as pj
    >>> net = pj.nn.Sequential(pj.nn.Linear(4, 8), pj.nn.BatchNorm1D(8), pj.nn.Linear(8, 2))
    >>> totals = pj.summary(net, pj.InputSpec((None, 4)))  # doctest: +NORMALIZE_WHITESPACE
    --------------------------------------------------------------
     Layer (type)          Output Shape                  Param #
    ==============================================================
     0 (Linear)            [b, 8]                             40
     1 (BatchNorm1D)       [b, 8]                             32
     2 (Linear)            [b, 2]                             18
    ==============================================================
    Total params: 90
    Trainable params: 74
    Non-trainable params: 16
    --------------------------------------------------------------
    >>> totals
    {'total_params': 90, 'trainable_params': 74, 'non_trainable_params': 16}
    >>> pj.summary(net, (-1, 4), print_fn=lambda table: None) == totals  # a shape, as in Paddle
    True
    """
    from flax import nnx

    from paddlejax.static import set_mode

    if input_size is not None:
        if inputs:
            raise ValueError("summary: pass the inputs or input_size, not both")
        inputs = tuple(_size_specs(input_size, dtypes))
    elif len(inputs) == 1 and isinstance(inputs[0], list) and inputs[0] and all(_is_shape(s) for s in inputs[0]):
        inputs = tuple(_size_specs(inputs[0], dtypes))  # a list of shapes, one per input
    elif any(_is_shape(x) for x in inputs):  # shapes among specs or arrays
        each = list(dtypes) if isinstance(dtypes, (list, tuple)) else [dtypes] * len(inputs)
        if len(each) != len(inputs):
            raise ValueError(f"summary: dtypes expects one dtype or one per input ({len(inputs)}), got {len(each)}")
        inputs = tuple(_size_specs(x, d)[0] if _is_shape(x) else x for x, d in zip(inputs, each))
    if not inputs:
        raise ValueError("summary: give the inputs (pj.InputSpec, arrays, or shapes such as (-1, 4))")

    copy = nnx.merge(*nnx.split(network))
    set_mode(copy, False)
    names = {id(m): ".".join(str(p) for p in path) for path, m in nnx.iter_graph(copy)
             if isinstance(m, nnx.Module) and path}
    rows, counted = [], set()
    classes = {type(m) for _, m in nnx.iter_graph(copy) if isinstance(m, nnx.Module)}

    def recorder(cls, call):
        def recorded(self, *args, **kwargs):
            out = call(self, *args, **kwargs)
            if type(self) is cls and id(self) in names:
                sizes = (0, 0) if id(self) in counted else _own_sizes(self)
                counted.add(id(self))
                shapes = [_dims(o.shape) for o in jax.tree.leaves(out) if hasattr(o, "shape")]
                rows.append((f"{names[id(self)]} ({cls.__name__})", ", ".join(shapes), sum(sizes)))
            return out
        return recorded

    patched = {cls: cls.__dict__.get("__call__") for cls in classes}
    for cls in classes:
        cls.__call__ = recorder(cls, cls.__call__)
    try:
        jax.eval_shape(lambda *xs: copy(*xs), *input_structs(inputs))
    finally:
        for cls, own in patched.items():
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own
    trainable = other = 0
    for _, m in nnx.iter_graph(copy):
        if isinstance(m, nnx.Module):
            t, o = _own_sizes(m)
            trainable, other = trainable + t, other + o
    width = max([40, *(len(r[0]) + len(r[1]) + 16 for r in rows)])
    name_width = max([20, *(len(r[0]) + 2 for r in rows)])
    lines = ["-" * (width + 22), f" {'Layer (type)':<{name_width}}{'Output Shape':<{width - name_width + 10}}"
             f"{'Param #':>10}", "=" * (width + 22)]
    lines += [f" {name:<{name_width}}{shape:<{width - name_width + 10}}{count:>10,}" for name, shape, count in rows]
    lines += ["=" * (width + 22), f"Total params: {trainable + other:,}", f"Trainable params: {trainable:,}",
              f"Non-trainable params: {other:,}", "-" * (width + 22)]
    print_fn("\n".join(lines))
    return {"total_params": trainable + other, "trainable_params": trainable, "non_trainable_params": other}
