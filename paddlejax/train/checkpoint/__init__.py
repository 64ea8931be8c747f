"""Training checkpoints on Orbax: asynchronous, atomic, checksummed, with fallback on corruption.

A :class:`CheckpointManager` saves a pytree of arrays (jax or numpy, any dtype, PRNG keys,
Python scalars) plus a JSON-able ``meta`` dict every ``every`` steps, keeps the last ``keep``,
and restores the newest checkpoint that reads back intact. Orbax writes each checkpoint into a
temporary directory and renames it when complete, so a process killed mid-write leaves the
earlier checkpoints usable. Each checkpoint also carries a manifest with its step (a step
directory copied over another is not taken for it), a CRC-32 per leaf and one over the manifest
itself (so ``meta``, e.g. the epoch and the data loader's position, is covered too); a
checkpoint that fails to read or to verify is reported with a warning and skipped.

The package's modules: :mod:`~paddlejax.train.checkpoint.manager` (the manager),
:mod:`~paddlejax.train.checkpoint.manifest` (manifest and integrity checks),
:mod:`~paddlejax.train.checkpoint.lock` (one writer process per directory) and
:mod:`~paddlejax.train.checkpoint.errors`.

>>> import tempfile, numpy as np
>>> with CheckpointManager(tempfile.mkdtemp(), every=10, keep=2) as mgr:
...     mgr.save(10, {"w": np.arange(3.0)}, meta={"epoch": 1})
...     mgr.wait()
...     restored = mgr.restore()
True
>>> restored.step, restored.state["w"].tolist(), restored.meta
(10, [0.0, 1.0, 2.0], {'epoch': 1})
"""
from paddlejax.train.checkpoint.errors import CheckpointError, CorruptCheckpointWarning, Restored  # noqa: F401
from paddlejax.train.checkpoint.manager import CheckpointManager  # noqa: F401
from paddlejax.train.checkpoint.manifest import MANIFEST_FORMAT, MANIFEST_VERSION  # noqa: F401
