"""Training checkpoints on Orbax: asynchronous, atomic, checksummed, with fallback on corruption.

A :class:`CheckpointManager` saves a pytree of arrays (jax or numpy, any dtype, PRNG keys,
Python scalars) plus a JSON-able ``meta`` dict every ``every`` steps, keeps the last ``keep``,
and restores the newest checkpoint that reads back intact. Orbax writes each checkpoint into a
temporary directory and renames it when complete, so a process killed mid-write leaves the
earlier checkpoints usable. Each checkpoint also carries a manifest with its step (a step
directory copied over another is not taken for it), a CRC-32 per leaf and one over the manifest itself (so ``meta``, e.g. the epoch and the data loader's position, is
covered too); a checkpoint that fails to read or to verify is reported with a warning and
skipped.

>>> import tempfile, numpy as np
>>> with CheckpointManager(tempfile.mkdtemp(), every=10, keep=2) as mgr:
...     mgr.save(10, {"w": np.arange(3.0)}, meta={"epoch": 1})
...     mgr.wait()
...     restored = mgr.restore()
True
>>> restored.step, restored.state["w"].tolist(), restored.meta
(10, [0.0, 1.0, 2.0], {'epoch': 1})
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import warnings
import zlib
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

try:
    import fcntl
except ImportError:  # not on Windows: there, two writers are not detected
    fcntl = None

MANIFEST_FORMAT = "paddlejax.checkpoint"
MANIFEST_VERSION = 2  # 2: the manifest carries a CRC-32 of itself; 1 (readable) did not
_ITEMS = ("state", "manifest")
_SCALARS = (bool, int, float)


class _QuietOrbax(logging.Filter):
    """Drops Orbax's INFO chatter (a dozen lines per save) from absl's logger; warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


logging.getLogger("absl").addFilter(_QuietOrbax())


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a ``like`` tree that does not fit the stored one; for the
    latter, ``step`` and ``meta`` are those of the checkpoint that did not fit (else None).

    >>> e = CheckpointError("no usable checkpoint")
    >>> isinstance(e, RuntimeError), e.step, e.meta
    (True, None, None)
    """

    def __init__(self, message: str, step: int | None = None, meta: Any = None):
        super().__init__(message)
        self.step, self.meta = step, meta


# One writer process per directory: two runs saving into one directory would replace and delete
# each other's checkpoints, and Orbax's temporary directories of a step collide. The lock is an
# advisory flock on a file in the directory, held by the process from its first save until its
# managers there close; the kernel drops it when the process dies, so a killed run can resume.
_LOCK_NAME = ".paddlejax-writer.lock"
_WRITER_LOCKS: dict[str, list] = {}  # directory -> [open lock file, managers of this process holding it]


@atexit.register
def _close_writer_locks() -> None:
    """Closes the lock files a Trainer's never-closed manager holds (no unclosed-file warning at exit)."""
    for held in _WRITER_LOCKS.values():
        held[0].close()


def _acquire_writer_lock(directory: str) -> bool:
    """Marks ``directory`` as written by this process; False where nothing is locked (no flock,
    or a multi-process run, whose processes all save into one directory by design)."""
    if fcntl is None or jax.process_count() > 1:
        return False
    held = _WRITER_LOCKS.get(directory)
    if held is not None:
        held[1] += 1
        return True
    f = open(os.path.join(directory, _LOCK_NAME), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise CheckpointError(f"CheckpointManager.save: {directory} is being written by {holder}; two runs "
                              "saving into one directory would replace and delete each other's checkpoints, "
                              "so give each run its own directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"process {os.getpid()} on {socket.gethostname()}")
    f.flush()
    _WRITER_LOCKS[directory] = [f, 1]
    return True


def _release_writer_lock(directory: str) -> None:
    held = _WRITER_LOCKS.get(directory)
    if held is not None:
        held[1] -= 1
        if held[1] == 0:
            del _WRITER_LOCKS[directory]
            held[0].close()  # closing the file drops the flock


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint failed to read or verify and was skipped in favour of an earlier one.

    >>> issubclass(CorruptCheckpointWarning, UserWarning)
    True
    """


class Restored(NamedTuple):
    """A restored checkpoint: its step, the state tree and the ``meta`` dict saved with it.

    >>> Restored(step=3, state={}, meta=None).step
    3
    """

    step: int
    state: Any
    meta: Any


class _Corrupt(Exception):
    """A checkpoint that cannot be read back as it was written; the message says why."""


# Integrity: one CRC-32 per leaf, computed on the host bytes at save time and stored in the
# checkpoint's JSON manifest (written in the same atomic Orbax commit as the arrays), then
# recomputed on the arrays Orbax hands back. Per leaf rather than per file because it does not
# depend on Orbax's on-disk layout (OCDBT, zarr chunks, zstd, small values inlined into the
# OCDBT manifest), it checks exactly what the caller receives (a flipped byte inside an
# incompressible zstd block decodes without any error), and it needs no second, non-atomic
# write after Orbax has committed the files. zlib's CRC-32 runs at several GB/s, well above disk
# speed, and catches every burst error of up to 32 bits; it guards against accidents, not
# against someone forging a checkpoint.
def _crc32(value) -> int:
    if jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    data = np.ascontiguousarray(np.asarray(value))
    return zlib.crc32(data.reshape(-1).view(np.uint8))


def _manifest_crc32(doc: dict) -> int:
    """CRC-32 of a manifest less its own ``crc32`` field, over canonical JSON text (sorted keys,
    no spaces), so that it does not depend on how the file lays the JSON out."""
    body = {k: v for k, v in doc.items() if k != "crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _key_name(key) -> str:
    for field in ("key", "idx", "name"):
        if hasattr(key, field):
            return str(getattr(key, field))
    return str(key)


def _path(keys) -> tuple[str, ...]:
    """A leaf's path as strings, the way Orbax names it (tuple indices and dict keys alike)."""
    return tuple(_key_name(k) for k in keys)


def _show(path) -> str:
    return "/".join(path) or "<root>"


def _kind(leaf) -> str | None:
    """How Orbax stores ``leaf`` (and so how to ask for it back); None if it cannot."""
    if isinstance(leaf, jax.Array):
        return "jax"
    if isinstance(leaf, (np.ndarray, np.generic)):
        return "numpy"
    return "scalar" if isinstance(leaf, _SCALARS) else None


def _describe(state) -> list[dict]:
    """The manifest entries of ``state``: path, kind, shape, dtype and CRC-32 of every leaf."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    if not flat:
        raise ValueError("CheckpointManager.save: 'state' expects a pytree with at least one array, "
                         f"got {type(state).__name__} with no leaves")
    entries, seen = [], set()
    for keys, leaf in flat:
        path, kind = _path(keys), _kind(leaf)
        if kind is None:
            raise TypeError(f"CheckpointManager.save: 'state' leaf {_show(path)} expects an array or a "
                            f"Python bool/int/float, got {type(leaf).__name__}")
        if path in seen:
            raise ValueError(f"CheckpointManager.save: two leaves of 'state' share the path {_show(path)}")
        seen.add(path)
        entries.append({"path": list(path), "kind": kind, "shape": list(np.shape(leaf)),
                        "dtype": str(leaf.dtype if kind == "jax" else np.asarray(leaf).dtype)})
    # Arrays spread over several hosts have no single host copy to sum (None: not checked);
    # Orbax's own reads still fail loudly on missing or truncated files for those.
    sources = [None if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable else leaf
               for _, leaf in flat]
    # One batched transfer for all device arrays; on CPU it is a no-copy view.
    for entry, value in zip(entries, jax.device_get(sources)):
        entry["crc32"] = None if value is None else _crc32(value)
    return entries


def _parse_manifest(doc) -> tuple[list[dict], Any]:
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise _Corrupt("the manifest is not a paddlejax checkpoint manifest")
    version = doc.get("version")
    if version not in (1, MANIFEST_VERSION):
        raise _Corrupt(f"manifest version {version!r} is not one this paddlejax reads (1 to {MANIFEST_VERSION})")
    if version > 1 and doc.get("crc32") != _manifest_crc32(doc):
        raise _Corrupt("checksum mismatch in the manifest (its meta or leaf list was changed)")
    leaves = doc.get("leaves")
    fields = {"path", "kind", "shape", "dtype", "crc32"}
    if not isinstance(leaves, list) or not all(isinstance(e, dict) and fields <= e.keys() for e in leaves):
        raise _Corrupt("the manifest's leaf list is malformed")
    for i, entry in enumerate(leaves):
        problem = _entry_problem(entry)
        if problem:
            raise _Corrupt(f"the manifest's leaf {i} is malformed ({problem})")
    return leaves, doc.get("meta")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry_problem(entry: dict) -> str | None:
    """What is wrong with the field types of one manifest leaf entry, or None."""
    path, shape, dtype, crc = entry["path"], entry["shape"], entry["dtype"], entry["crc32"]
    if not isinstance(path, list) or not all(isinstance(k, str) for k in path):
        return f"path {path!r} is not a list of strings"
    if entry["kind"] not in ("jax", "numpy", "scalar"):
        return f"kind {entry['kind']!r} is not jax, numpy or scalar"
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        return f"shape {shape!r} is not a list of sizes"
    if not isinstance(dtype, str):
        return f"dtype {dtype!r} is not a string"
    if not dtype.startswith("key<"):
        try:
            np_dtype = np.dtype(dtype)
        except (TypeError, ValueError, SyntaxError):
            return f"dtype {dtype!r} is not a dtype"
        if np_dtype.hasobject or np_dtype.type is np.void:  # ml_dtypes (bfloat16, ...) are kind V too
            return f"dtype {dtype!r} is not an array dtype"
    if crc is not None and not (_is_int(crc) and 0 <= crc < 2 ** 32):
        return f"crc32 {crc!r} is not a CRC-32"
    return None


def _stored_dtype(entry):
    return None if entry["dtype"].startswith("key<") else np.dtype(entry["dtype"])


def _target(entry, like_leaf):
    """What Orbax should read ``entry`` into: the stored dtype and kind, ``like``'s placement."""
    dtype, shape = _stored_dtype(entry), tuple(entry["shape"])
    if entry["kind"] == "scalar":
        return np.zeros((), dtype).item()
    if dtype is None:
        # A typed PRNG key: only the like tree knows which implementation to rebuild.
        return jax.ShapeDtypeStruct(shape, like_leaf.dtype, sharding=getattr(like_leaf, "sharding", None))
    # 64-bit values cannot live in jax arrays unless jax_enable_x64 is on; read them on the host.
    if entry["kind"] == "numpy" or jax.dtypes.canonicalize_dtype(dtype) != dtype:
        return np.empty(shape, dtype)
    sharding = getattr(like_leaf, "sharding", None) or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _as_like(value, like_leaf):
    """``value`` converted to the type, dtype and placement of ``like_leaf``."""
    if isinstance(like_leaf, (np.ndarray, np.generic)):  # before the scalars: np.float64 is a float
        host = np.asarray(value).astype(like_leaf.dtype, copy=False)
        return host[()] if isinstance(like_leaf, np.generic) else host
    if isinstance(like_leaf, _SCALARS):
        return type(like_leaf)(np.asarray(value).item())
    if isinstance(value, jax.Array):
        if not jax.dtypes.issubdtype(like_leaf.dtype, jax.dtypes.prng_key):
            value = value.astype(like_leaf.dtype)
    else:
        # A 64-bit value read on the host: cast there, before jax would narrow it with a warning.
        value = np.asarray(value).astype(like_leaf.dtype, copy=False)
    sharding = like_leaf.sharding
    return jax.device_put(value, sharding) if sharding is not None else jax.numpy.asarray(value)


def _like_leaves(like):
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    for keys, leaf in flat:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic, *_SCALARS)):
            raise TypeError(f"CheckpointManager.restore: 'like' leaf {_show(_path(keys))} expects an array, "
                            f"a jax.ShapeDtypeStruct or a Python scalar, got {type(leaf).__name__}")
    return [(_path(keys), leaf) for keys, leaf in flat], treedef


def _check_structure(step, entries, like_leaves, meta):
    stored = {tuple(e["path"]): e for e in entries}
    wanted = dict(like_leaves)
    problems = []
    missing = [p for p in wanted if p not in stored]
    extra = [p for p in stored if p not in wanted]
    if missing:
        problems.append("in like but not in the checkpoint: " + ", ".join(map(_show, missing)))
    if extra:
        problems.append("in the checkpoint but not in like: " + ", ".join(map(_show, extra)))
    for path, leaf in wanted.items():
        if path in stored and tuple(stored[path]["shape"]) != np.shape(leaf):
            problems.append(f"shape of {_show(path)}: checkpoint {tuple(stored[path]['shape'])}, "
                            f"like {np.shape(leaf)}")
        elif path in stored and (stored[path]["dtype"].startswith("key<")
                                 != jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)):
            problems.append(f"dtype of {_show(path)}: checkpoint {stored[path]['dtype']}, "
                            f"like {getattr(leaf, 'dtype', type(leaf).__name__)}")
    if problems:
        raise CheckpointError(f"'like' does not match the structure of checkpoint step {step}: "
                              + "; ".join(problems), step=step, meta=meta)


def _verify(entries, tree) -> dict[tuple[str, ...], Any]:
    """The restored leaves by path, after checking them against the manifest."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    got = {_path(keys): leaf for keys, leaf in flat}
    if set(got) != {tuple(e["path"]) for e in entries}:
        raise _Corrupt("the stored arrays do not match the manifest's leaf list")
    for entry in entries:
        path = tuple(entry["path"])
        value = got[path]
        if np.shape(value) != tuple(entry["shape"]):
            raise _Corrupt(f"leaf {_show(path)} has shape {np.shape(value)}, "
                           f"expected {tuple(entry['shape'])}")
        if entry["crc32"] is not None and _crc32(value) != entry["crc32"]:
            raise _Corrupt(f"checksum mismatch in leaf {_show(path)}")
    return got


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
        options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, save_interval_steps=1,
                                               enable_async_checkpointing=bool(async_save), create=True)
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
            self._locked = _acquire_writer_lock(self.directory)
        self._drop_abandoned(step)
        if step in self._mgr.all_steps():
            return False
        manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "step": step, "meta": meta,
                    "leaves": _describe(state)}
        manifest["crc32"] = _manifest_crc32(manifest)
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
            except _Corrupt as e:
                raise CheckpointError(f"checkpoint step {step} in {self.directory} is unusable: {e}") \
                    from None
        tried = []
        for candidate in saved:
            try:
                return self._restore_step(candidate, like)
            except _Corrupt as e:
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
            except _Corrupt as e:
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
            raise _Corrupt(f"manifest unreadable: {_reason(e)}") from None
        leaves, meta = _parse_manifest(doc["manifest"])
        saved_as = doc["manifest"].get("step")  # None in checkpoints written before manifests named it
        if saved_as is not None and saved_as != step:
            raise _Corrupt(f"it holds the checkpoint of step {saved_as!r} (a copied or renamed step directory)")
        return leaves, meta

    def _restore_step(self, step: int, like) -> Restored:
        entries, meta = self._manifest(step)
        target = None
        if like is not None:
            like_leaves, treedef = _like_leaves(like)
            _check_structure(step, entries, like_leaves, meta)
            by_path = {tuple(e["path"]): e for e in entries}
            target = treedef.unflatten([_target(by_path[p], leaf) for p, leaf in like_leaves])
        try:
            tree = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
        except Exception as e:
            raise _Corrupt(f"arrays unreadable: {_reason(e)}") from None
        values = _verify(entries, tree["state"])
        if like is None:
            return Restored(step, tree["state"], meta)
        return Restored(step, treedef.unflatten([_as_like(values[p], leaf) for p, leaf in like_leaves]), meta)

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
                _release_writer_lock(self.directory)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.directory!r}, every={self.every}, keep={self.keep}, "
                f"steps={self.all_steps()})")
