"""The :class:`CheckpointManager`: saves, keeps and restores a run's checkpoints on Orbax.

>>> import tempfile, numpy as np
>>> with CheckpointManager(tempfile.mkdtemp(), keep=1) as mgr:
...     _ = mgr.save(1, {"w": np.ones(2)}), mgr.save(2, {"w": np.zeros(2)})
...     mgr.wait(); mgr.all_steps()
[2]
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from paddlejax.train.checkpoint.errors import CheckpointError, Corrupt, CorruptCheckpointWarning, Restored
from paddlejax.train.checkpoint.lock import acquire_writer_lock, release_writer_lock
from paddlejax.train.checkpoint.manifest import (MANIFEST_FORMAT, MANIFEST_VERSION, HostKeys, as_like,
                                                 check_structure, describe, host_local, like_leaves, manifest_crc32,
                                                 parse_manifest, target, verify)

_ITEMS = ("state", "manifest")


class _QuietOrbax(logging.Filter):
    """Drops Orbax's INFO chatter (a dozen lines per save) from absl's logger; warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


logging.getLogger("absl").addFilter(_QuietOrbax())


def _step_arg(method: str, step) -> int | None:
    """``step`` as given to ``restore``/``read_meta``: None or a non-negative int (NumPy's too)."""
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"CheckpointManager.{method}: 'step' expects a non-negative int or None, got {step!r}")
    return int(step)


def _reason(error: Exception) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class CheckpointManager:
    """Saves and restores a training run's checkpoints in ``directory``.

    ``save`` writes a checkpoint when ``step % every == 0`` (or ``force=True``) and returns
    whether it did; with ``async_save`` the arrays are copied to host memory and written in the
    background (``wait()`` blocks until they are durable). The ``keep`` newest checkpoints are
    kept (``None`` keeps all). A step that is already saved is never overwritten.
    ``restore(like)`` returns the newest checkpoint that reads back intact as a
    :class:`Restored`, or None when there is none yet; a damaged one is reported with a
    :class:`CorruptCheckpointWarning` naming its step and the reason, and skipped. One process
    writes into a directory: from its first ``save`` until ``close`` (or its end, killed too),
    another process's ``save`` there raises :class:`CheckpointError`; any may restore.

    >>> import tempfile, numpy as np
    >>> mgr = CheckpointManager(tempfile.mkdtemp(), every=2, keep=2)
    >>> [mgr.save(s, {"x": np.full(2, s)}) for s in range(7)]
    [True, False, True, False, True, False, True]
    >>> mgr.wait(); mgr.all_steps()
    [4, 6]
    >>> mgr.close()
    """

    def __init__(self, directory, every: int = 1, keep: int | None = 3, async_save: bool = True):
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"CheckpointManager: 'directory' expects a path, "
                            f"got {type(directory).__name__}")
        for name, value in (("every", every), ("keep", keep)):
            if value is None and name == "keep":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"CheckpointManager: '{name}' expects a positive int, got {value!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.every = int(every)
        self.keep = None if keep is None else int(keep)
        islands = {}
        if jax.process_count() > 1:
            # Each process its own manager, with no barriers between them: the state reaches the
            # writer whole (the Trainer gathers it), one process writes, any may read.
            me = jax.process_index()
            os.makedirs(self.directory, exist_ok=True)
            islands = dict(create=False, multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=me, active_processes={me}))
        options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, save_interval_steps=1,
                                               enable_async_checkpointing=bool(async_save),
                                               **({"create": True} | islands))
        self._mgr = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
        self._bad: set[int] = set()
        self._locked = False  # whether this manager holds the directory's writer lock

    def save(self, step: int, state, meta: dict | None = None, force: bool = False) -> bool:
        """Saves ``state`` (a pytree of arrays) and ``meta`` (a JSON-able dict) as ``step``.

        Returns False without writing when ``step`` is not a multiple of ``every`` (unless
        ``force``) or is already saved. With ``async_save`` it returns while the data is written.

        >>> import tempfile, jax.numpy as jnp
        >>> mgr = CheckpointManager(tempfile.mkdtemp(), every=100)
        >>> mgr.save(5, {"w": jnp.ones(2)}), mgr.save(5, {"w": jnp.ones(2)}, force=True)
        (False, True)
        >>> mgr.close()
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"CheckpointManager.save: 'step' expects a non-negative int, got {step!r}")
        step = int(step)
        if not force and step % self.every:
            return False
        if meta is not None and not isinstance(meta, dict):
            raise TypeError("CheckpointManager.save: 'meta' expects a dict or None, "
                            f"got {type(meta).__name__}")
        try:
            # as it reads back from JSON (string keys, lists): the manifest's checksum covers that
            meta = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as e:
            raise TypeError(f"CheckpointManager.save: 'meta' expects a JSON-serialisable dict ({e})") \
                from None
        if not self._locked:
            self._locked = acquire_writer_lock(self.directory)
        self._drop_abandoned(step)
        if step in self._mgr.all_steps():
            return False
        if jax.process_count() > 1:  # Orbax takes only host arrays from one process of several
            state = jax.tree.map(host_local, state)
        manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "step": step, "meta": meta,
                    "leaves": describe(state)}
        manifest["crc32"] = manifest_crc32(manifest)
        state = jax.tree.map(lambda leaf: leaf.data if isinstance(leaf, HostKeys) else leaf, state)
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  manifest=ocp.args.JsonSave(manifest))
        # Orbax's own policy also refuses steps below its latest; ``every`` is decided above.
        return bool(self._mgr.save(step, args=args, force=True))

    def _drop_abandoned(self, step: int) -> None:
        """Deletes damaged checkpoints at or after ``step``: training has moved on without them,
        and left in place they would shadow the new ones as "latest" or block this step."""
        abandoned = sorted(s for s in self._bad if s >= step)
        if abandoned:
            self.wait()
        for bad in abandoned:
            if bad in self._mgr.all_steps():
                self._mgr.delete(bad)
            self._bad.discard(bad)

    def restore(self, like=None, step: int | None = None) -> Restored | None:
        """The newest intact checkpoint (or exactly ``step``), or None when none is saved.

        ``like`` is a pytree with the target structure (arrays or ``jax.ShapeDtypeStruct``):
        leaves come back with its types, dtypes and shardings, in its containers. Without it the
        stored tree comes back as Orbax reads it (dicts and lists). Damaged checkpoints are
        skipped with a :class:`CorruptCheckpointWarning`; :class:`CheckpointError` when none is
        usable or when ``like`` does not fit the stored structure.

        >>> import tempfile, jax, jax.numpy as jnp, numpy as np
        >>> mgr = CheckpointManager(tempfile.mkdtemp())
        >>> mgr.restore() is None
        True
        >>> mgr.save(1, {"w": np.arange(4, dtype=np.float32), "n": 7}, meta={"epoch": 2})
        True
        >>> r = mgr.restore(like={"w": jax.ShapeDtypeStruct((4,), jnp.bfloat16), "n": 0})
        >>> r.step, r.state["w"].dtype, r.state["n"], r.meta["epoch"]
        (1, dtype(bfloat16), 7, 2)
        >>> mgr.close()
        """
        step = _step_arg("restore", step)
        self.wait()
        self._mgr.reload()
        saved = sorted(self._mgr.all_steps(), reverse=True)
        if step is not None:
            if step not in saved:
                raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; saved steps: "
                                      f"{sorted(saved)}")
            try:
                return self._restore_step(step, like)
            except Corrupt as e:
                raise CheckpointError(f"checkpoint step {step} in {self.directory} is unusable: {e}") \
                    from None
        tried = []
        for candidate in saved:
            try:
                return self._restore_step(candidate, like)
            except Corrupt as e:
                self._bad.add(candidate)
                tried.append(f"step {candidate}: {e}")
                warnings.warn(f"checkpoint step {candidate} in {self.directory} is unusable ({e}); "
                              "trying the previous one", CorruptCheckpointWarning, stacklevel=2)
        if not tried:
            return None
        raise CheckpointError(f"no usable checkpoint in {self.directory}; tried " + "; ".join(tried))

    def read_meta(self, step: int | None = None):
        """The ``meta`` saved with ``step`` (default: the newest checkpoint whose manifest reads
        back intact), without reading the arrays; None when no checkpoint is saved.

        >>> import tempfile, numpy as np
        >>> with CheckpointManager(tempfile.mkdtemp()) as mgr:
        ...     _ = mgr.save(4, {"w": np.zeros(2)}, meta={"epoch": 1})
        ...     mgr.read_meta()
        {'epoch': 1}
        """
        step = _step_arg("read_meta", step)
        self.wait()
        self._mgr.reload()
        saved = sorted(self._mgr.all_steps(), reverse=True)
        if step is not None and step not in saved:
            raise CheckpointError(f"no checkpoint of step {step} in {self.directory}; saved steps: {sorted(saved)}")
        tried = []
        for candidate in [step] if step is not None else saved:
            try:
                return self._manifest(candidate)[1]
            except Corrupt as e:
                tried.append(f"step {candidate}: {e}")
        if not tried:
            return None
        raise CheckpointError(f"no readable checkpoint manifest in {self.directory}; tried " + "; ".join(tried))

    def _manifest(self, step: int) -> tuple[list[dict], Any]:
        # Damaged files surface as many exception types (JSON, tensorstore's ValueErrors, missing
        # files...), so any failure to read counts as damage; the reason goes into the report.
        try:
            doc = self._mgr.restore(step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))
        except Exception as e:
            raise Corrupt(f"manifest unreadable: {_reason(e)}") from None
        leaves, meta = parse_manifest(doc["manifest"])
        saved_as = doc["manifest"].get("step")  # None in checkpoints written before manifests named it
        if saved_as is not None and saved_as != step:
            raise Corrupt(f"it holds the checkpoint of step {saved_as!r} (a copied or renamed step directory)")
        return leaves, meta

    def _restore_step(self, step: int, like) -> Restored:
        entries, meta = self._manifest(step)
        read_into = None
        if like is not None:
            wanted, treedef = like_leaves(like)
            check_structure(step, entries, wanted, meta)
            by_path = {tuple(e["path"]): e for e in entries}
            read_into = treedef.unflatten([target(by_path[p], leaf) for p, leaf in wanted])
        try:
            tree = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(read_into)))
        except Exception as e:
            raise Corrupt(f"arrays unreadable: {_reason(e)}") from None
        values = verify(entries, tree["state"])
        if like is None:
            return Restored(step, tree["state"], meta)
        return Restored(step, treedef.unflatten([as_like(values[p], leaf) for p, leaf in wanted]), meta)

    def latest_step(self) -> int | None:
        """The newest saved step (not checked for damage), or None.

        >>> import tempfile; CheckpointManager(tempfile.mkdtemp()).latest_step() is None
        True
        """
        return self._mgr.latest_step()

    def all_steps(self) -> list[int]:
        """The saved steps, oldest first.

        >>> import tempfile; CheckpointManager(tempfile.mkdtemp()).all_steps()
        []
        """
        return sorted(self._mgr.all_steps())

    def wait(self) -> None:
        """Blocks until every started save is on disk; re-raises a background write's error.

        >>> import tempfile; CheckpointManager(tempfile.mkdtemp()).wait()
        """
        self._mgr.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources.

        >>> import tempfile; CheckpointManager(tempfile.mkdtemp()).close()
        """
        try:
            self._mgr.close()
        finally:
            if self._locked:
                self._locked = False
                release_writer_lock(self.directory)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.directory!r}, every={self.every}, keep={self.keep}, "
                f"steps={self.all_steps()})")
