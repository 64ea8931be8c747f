"""Checkpoints of a Trainer's whole training state, and the :class:`Checkpointing` callback that
writes them during ``fit`` and resumes from them.

On disk (through :class:`~paddlejax.train.checkpoint.CheckpointManager`) the state is its leaves
numbered in the order of :meth:`TrainState.as_dict <paddlejax.train.state.TrainState.as_dict>`
(``{"00000": ..., "00001": ...}``), the layout since the first release, so older checkpoints
restore. The state is stored whole, in its step's portable layout
(:meth:`~paddlejax.train.steps.base.StepBuilder.portable`: ZeRO's flat vectors as the parameters'
trees, a pipeline's packed stages by name), so a run saved on N devices or processes resumes on M
(elastic restart), or under another ZeRO stage or pipeline: each array is laid out again as the
resuming step runs it. The meta holds the epoch, the data loader's position, the input specs (so ``load``
needs no data) and every entry's name and shape (so a mismatch is told by name).

>>> import jax.numpy as jnp
>>> from paddlejax.train.state import TrainState
>>> state = TrainState.create({"w": jnp.ones(2)}, {"bn.mean": jnp.zeros(2)}, ())
>>> entries(state)
{'extra/bn.mean': [2], 'loss_scale/scale': [], 'loss_scale/good_steps': [], 'params/w': [2], 'step': []}
>>> sorted(tree(state))
['00000', '00001', '00002', '00003', '00004']
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from paddlejax.train.callbacks import Callback
from paddlejax.train.placement import host_copy
from paddlejax.train.state import TrainState

if TYPE_CHECKING:  # the checkpoint package imports Orbax, which a Trainer without checkpoints never needs
    from paddlejax.train.checkpoint import CheckpointManager


def tree(state: TrainState) -> dict:
    """The tree a checkpoint stores: the state's leaves by number."""
    return {f"{i:05d}": leaf for i, leaf in enumerate(jax.tree.leaves(state.as_dict()))}


def entries(state: TrainState) -> dict[str, list[int]]:
    """The state's entries by name (``opt/0/mu/l1.kernel``), in leaf order, with their shapes."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state.as_dict())
    return {jax.tree_util.keystr(p, simple=True, separator="/"): list(np.shape(v)) for p, v in flat}


def _listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def difference(stored: dict, current: dict) -> str:
    """How two states' :func:`entries` differ, in one line: entries only in one of them, grouped
    over the model's variables (``opt/0/mu/* (4)``), and variables whose shapes differ.

    >>> difference({"params/w": [2], "opt/0/trace/w": [2]}, {"params/w": [3], "opt/0/mu/w": [3]})
    'only in the checkpoint: opt/0/trace/*; only in this run: opt/0/mu/*; other shapes: w (2,) -> (3,)'
    """
    variables = {n.split("/", 1)[1] for n in (*stored, *current) if n.startswith(("params/", "extra/"))}

    def groups(names) -> str:
        counts: dict[str, int] = {}
        for name in names:
            head, _, last = name.rpartition("/")
            key = f"{head}/*" if head and last in variables else name
            counts[key] = counts.get(key, 0) + 1
        return _listed([f"{k} ({n})" if n > 1 else k for k, n in counts.items()])

    parts = []
    if only := [n for n in stored if n not in current]:
        parts.append(f"only in the checkpoint: {groups(only)}")
    if only := [n for n in current if n not in stored]:
        parts.append(f"only in this run: {groups(only)}")
    reshaped = {}
    for name in stored:
        if name in current and stored[name] != current[name]:
            reshaped.setdefault(name.rpartition("/")[2], (stored[name], current[name]))
    if reshaped:
        parts.append("other shapes: " + _listed([f"{n} {tuple(a)} -> {tuple(b)}" for n, (a, b) in reshaped.items()]))
    return "; ".join(parts) or "the same entries in another order"


def save(manager: CheckpointManager, trainer, loader=None, force: bool = True) -> bool:
    """Save ``trainer``'s state as its current step in ``manager``, with the position of
    ``loader`` (the training data, or None); returns whether a checkpoint was written.

    The state is stored whole, in the step's portable layout (the same for any number of devices
    and processes). In a multi-process run every process calls this (the state is gathered) and
    process 0 writes."""
    if not force and trainer.step % manager.every:
        return False
    state = jax.tree.map(host_copy, trainer.step_builder.portable(trainer.state))
    if jax.process_index() != 0:
        return False
    meta = {"epoch": trainer.epoch, "loader": loader.state_dict() if hasattr(loader, "state_dict") else None,
            "inputs": [[list(s.shape), jnp.dtype(s.dtype).name] for s in trainer.specs],
            "state": entries(state), "processes": jax.process_count(), "devices": jax.device_count()}
    return manager.save(trainer.step, tree(state), meta=meta, force=force)


def _host_like(leaf):
    """What a checkpoint's ``leaf`` is read back as: a NumPy array (no memory until read), or,
    for a PRNG key, a key on this process's first device."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=jax.sharding.SingleDeviceSharding(
            jax.local_devices()[0]))
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return np.lib.stride_tricks.as_strided(np.zeros((), leaf.dtype), leaf.shape, (0,) * leaf.ndim)
    return leaf


def restore(manager: CheckpointManager, trainer, step: int | None = None) -> dict | None:
    """Load the newest intact checkpoint of ``manager`` (or ``step``) into ``trainer``'s built
    state and epoch; returns its meta, or None when there is no checkpoint."""
    from paddlejax.train.checkpoint import CheckpointError

    current = trainer.step_builder.portable(trainer.state)
    try:
        restored = manager.restore(like=tree(jax.tree.map(_host_like, current)), step=step)
    except CheckpointError as e:
        stored = e.meta.get("state") if isinstance(e.meta, dict) else None
        if not isinstance(stored, dict):
            raise
        raise CheckpointError(f"Trainer: checkpoint step {e.step} in {manager.directory} does not fit this "
                              f"run's training state ({difference(stored, entries(current))}); "
                              "resume with the model and optimizer it was saved with, or start afresh with "
                              "resume=False or another checkpoint_dir", step=e.step, meta=e.meta) from None
    if restored is None:
        return None
    treedef = jax.tree.structure(current.as_dict())
    portable = TrainState(**jax.tree.unflatten(treedef, [restored.state[k] for k in sorted(restored.state)]))
    trainer.state = trainer.step_builder.from_portable(portable, trainer.state)
    trainer.epoch = restored.meta["epoch"]
    return restored.meta


def load(trainer, path: str, step: int | None = None) -> None:
    """Load the checkpoint of ``step`` (default: the newest intact one) in the directory ``path``
    into ``trainer`` and its model, building its state first, from the input specs the
    checkpoint records, when no batch has built it yet."""
    from paddlejax.capture import InputSpec
    from paddlejax.train.checkpoint import CheckpointError, CheckpointManager

    if not os.path.isdir(path):
        raise FileNotFoundError(f"Trainer.load: no checkpoint directory at {path}")
    with CheckpointManager(path) as manager:
        if trainer.state is None:
            meta = manager.read_meta(step)
            if not isinstance(meta, dict) or "inputs" not in meta:
                raise CheckpointError(f"Trainer.load: {path} holds no checkpoint with input specs (none saved, "
                                      "or one from an older paddlejax); run one batch through the trainer "
                                      "first (train_batch or evaluate), then load")
            trainer.build(*(InputSpec(tuple(shape), dtype) for shape, dtype in meta["inputs"]))
        if restore(manager, trainer, step) is None:
            raise CheckpointError(f"Trainer.load: no checkpoint in {path}")
    trainer.sync_model()


class Checkpointing(Callback):
    """Checkpoints during ``fit`` in ``manager``: every ``manager.every`` steps, after every
    ``save_freq`` epochs and at the end; with ``resume``, ``fit`` first restores the newest
    intact checkpoint (state, epoch and the position of ``loader``, the training data). The
    Trainer installs one for each ``fit`` with a ``checkpoint_dir``.

    >>> import tempfile
    >>> from paddlejax.train.checkpoint import CheckpointManager
    >>> Checkpointing(CheckpointManager(tempfile.mkdtemp()), loader=[]).save_freq
    1
    """

    def __init__(self, manager: CheckpointManager, loader, save_freq: int = 1, resume: bool = True):
        self.manager, self.loader, self.save_freq, self.resume = manager, loader, save_freq, resume
        # the step last saved (or restored), as every process of a run knows it alike: whether to
        # save decides whether to gather the state, which all of them must do together
        self.saved: int | None = None

    def on_train_begin(self, trainer):
        self.saved = self.manager.latest_step()
        if not self.resume or self.saved is None:
            return
        from paddlejax.data import DataLoader

        # the state must exist before it is restored: build it from the first batch's shapes
        peek = DataLoader(self.loader.dataset, batch_size=self.loader.batch_size, device_prefetch=0)
        trainer.build(*next(iter(peek))[:-1])
        meta = restore(self.manager, trainer)
        if meta is not None and meta.get("loader") is not None:
            self.loader.load_state_dict(self._loader_state(meta))

    def _loader_state(self, meta: dict) -> dict:
        """The saved loader position for this run's loader: a run resumed on another number of
        processes feeds each process another share of every batch, so its loader differs in
        size; the position (batches into the epoch) carries over when both give as many batches
        an epoch."""
        state, processes = meta["loader"], meta.get("processes", 1)
        if processes == jax.process_count():
            return state
        theirs = -(-state["num_samples"] // state["batch_size"])
        if theirs != len(self.loader):
            raise ValueError(f"Trainer: the checkpoint was saved by {processes} processes whose data loaders gave "
                             f"{theirs} batches an epoch; this run's gives {len(self.loader)}: give each of the "
                             f"{jax.process_count()} processes its share of every global batch")
        return {**state, "batch_size": self.loader.batch_size, "num_samples": self.loader.num_samples}

    def on_train_batch_end(self, trainer, step):
        if step % self.manager.every == 0:
            save(self.manager, trainer, self.loader, force=False)
            self.saved = step

    def on_epoch_end(self, trainer, epoch, logs):
        finished = trainer.epoch > epoch  # not stopped part-way
        if finished and (epoch + 1) % self.save_freq == 0:
            self._save_unsaved(trainer)

    def on_train_end(self, trainer):
        self._save_unsaved(trainer)  # the last step, whether the run finished or stopped early
        self.manager.wait()

    def _save_unsaved(self, trainer) -> None:
        if self.saved != trainer.step:
            save(self.manager, trainer, self.loader)
            self.saved = trainer.step
