"""Batches from arrays or map-style datasets, shuffled per epoch, prefetched onto devices.

The input pipeline is built on Grain (``grain.MapDataset``): the JAX team's well-kept,
deterministic, checkpointable input library. Read through its random-access datasets, batch ``b``
of an epoch is a pure function of (seed, epoch, b), so resuming at any batch is exact, and its
thread pool reads batches ahead without us writing one.

>>> import numpy as np
>>> x = np.arange(10, dtype=np.float32).reshape(5, 2)
>>> loader = DataLoader((x, np.arange(5)), batch_size=2)
>>> len(loader)
3
>>> [labels.tolist() for _, labels in loader]
[[0, 1], [2, 3], [4]]
"""
from __future__ import annotations

import math
import os
import queue
import sys
import threading
from typing import Any, Callable, Iterator

import grain
import jax
import numpy as np

_ITEM, _DONE, _ERROR = "item", "done", "error"


def default_collate(samples: list) -> Any:
    """Stacks a list of samples leaf by leaf into numpy arrays of the samples' structure.

    >>> batch = default_collate([{"x": np.zeros(2), "y": 1}, {"x": np.ones(2), "y": 2}])
    >>> batch["x"].shape, batch["y"].tolist()
    ((2, 2), [1, 2])
    """
    return jax.tree.map(lambda *leaves: np.stack(leaves), *samples)


class _Arrays:
    """Arrays with a shared first (sample) dimension, read a whole batch at a time.

    ``arrays`` is one array, or a tuple/list/dict of arrays; a sample and a batch have that
    structure. ``take(indices)`` gathers a batch with one fancy index per array instead of
    stacking samples one by one.
    """

    def __init__(self, arrays):
        leaves = jax.tree.leaves(arrays)
        if not leaves:
            raise ValueError("DataLoader: dataset expects at least one array, got an empty structure")
        self.arrays = jax.tree.map(np.asarray, arrays)
        lengths = [np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree.leaves(self.arrays)]
        if None in lengths:
            raise ValueError("DataLoader: every dataset array needs a first (sample) dimension, "
                             f"got shapes {[np.shape(leaf) for leaf in leaves]}")
        if len(set(lengths)) > 1:
            raise ValueError("DataLoader: dataset arrays must have equal first dimensions, "
                             f"got lengths {lengths}")
        self._length = lengths[0]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        return jax.tree.map(lambda a: a[index], self.arrays)

    def take(self, indices: np.ndarray):
        """The batch of samples at ``indices`` (an integer array)."""
        return jax.tree.map(lambda a: a[indices], self.arrays)


def _is_array_structure(dataset) -> bool:
    """True for one array, a dict (of arrays) or a tuple/list of arrays (the loader's fast path)."""
    if isinstance(dataset, (np.ndarray, jax.Array, dict)):
        return True
    return (isinstance(dataset, (tuple, list)) and len(dataset) > 0
            and all(isinstance(a, (np.ndarray, jax.Array)) for a in dataset))


def _as_source(dataset):
    if _is_array_structure(dataset):
        return _Arrays(dataset)
    if callable(getattr(dataset, "arrays", None)):
        return _Arrays(dataset.arrays())
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError("DataLoader: dataset expects arrays (an array, or a tuple/list/dict of arrays) "
                        "or a map-style dataset with __len__ and __getitem__, "
                        f"got {type(dataset).__name__}")
    return dataset


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DataLoader: {name} expects an int >= {minimum}, got {value!r}")
    return int(value)


def _to_device(batch, sharding):
    """Puts the numeric leaves of ``batch`` on device; strings and objects stay on the host."""
    def put(leaf):
        if isinstance(leaf, jax.Array) or (isinstance(leaf, np.ndarray) and leaf.dtype.kind in "biufc"):
            return jax.device_put(leaf, sharding)
        return leaf
    return jax.tree.map(put, batch)


def _produce(items: Iterator, transform: Callable, out: queue.Queue, stop: threading.Event):
    """Background loop of :class:`_DevicePrefetch`: every put is preceded by a stop check, so a
    drained queue always has room for the one put that may still be in flight."""
    try:
        for item in items:
            value = transform(item)
            if stop.is_set():
                return
            out.put((_ITEM, value))
            if stop.is_set():
                return
        out.put((_DONE, None))
    except Exception as error:  # handed to the consumer, which re-raises it unchanged
        if not stop.is_set():
            out.put((_ERROR, error))


class _DevicePrefetch:
    """Iterates ``transform(item) for item in items`` on a daemon thread, ``size`` items ahead."""

    def __init__(self, items: Iterator, transform: Callable, size: int):
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_produce, args=(items, transform, self._queue, self._stop),
                                        name="paddlejax-device-prefetch", daemon=True)
        # Kept on the instance: close() may run at interpreter exit, after module globals are gone.
        self._finalizing = sys.is_finalizing
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self):
        """Stops the thread; returns once the batch it may be working on is done."""
        self._stop.set()
        while not self._queue.empty():  # only this side takes items, so the get cannot block
            self._queue.get_nowait()
        # While the interpreter shuts down, daemon threads are frozen and would never be joined.
        if not self._finalizing():
            self._thread.join()


class DataLoader:
    """Batches of a dataset, shuffled per epoch from ``(seed, epoch)``, put on device ahead of use.

    ``dataset`` is either arrays — one numpy array, or a tuple/list/dict of arrays with equal first
    dimensions (a list of arrays is read as fields, not as samples), or an object whose
    ``arrays()`` method returns such a structure matching its samples — or a map-style dataset
    (``__len__`` and ``__getitem__(i)`` returning an array, tuple or dict sample). Arrays are
    batched with one gather per batch; map-style samples are read one by one and combined with
    ``collate`` (default: stack leaf by leaf).

    Each ``iter(loader)`` runs the rest of the current epoch; running it to the end moves to the
    next epoch, whose order is reshuffled. Abandoning an iteration keeps the position, so the next
    one (or a loader restored from :meth:`state_dict`) continues with the next unseen batch: so
    ``next(iter(loader))`` uses up a batch, and :meth:`set_epoch` rewinds.

    Args:
      batch_size: samples per batch.
      shuffle: reshuffle every epoch; the order depends only on ``(seed, epoch)``.
      seed: non-negative int.
      drop_last: drop the last batch when it is smaller than ``batch_size``.
      num_workers: threads reading batches in parallel, or ``"auto"``: the first iteration
        times reading the epoch's first batches with 0, 1, 2, 4, ... threads (up to twice the
        CPUs, at most 16), keeps the fewest within 5 % of the fastest rate and reads twice as many
        batches ahead (Paddle 2.3's DataLoader autotune); :attr:`autotune` holds the rates and
        the choice, which the ``paddlejax.data`` logger reports.
      prefetch: batches the worker threads read ahead (no effect with ``num_workers=0``).
      device_prefetch: batches a background thread keeps transferred to device
        (``jax.device_put``); 0 transfers in the consumer's thread.
      sharding: a ``jax.sharding.Sharding`` for the batches (default: the default device); one
        that splits the batch dimension needs ``drop_last=True`` unless every batch divides.
        Numeric leaves go to device; strings and other objects stay numpy/Python on the host.
      collate: ``collate(list_of_samples) -> batch`` for map-style datasets; giving one for
        arrays makes them read sample by sample too.

    >>> import numpy as np
    >>> loader = DataLoader({"x": np.zeros((6, 3)), "y": np.arange(6)}, batch_size=4,
    ...                     shuffle=True, seed=1)
    >>> epoch0 = [b["y"].tolist() for b in loader]
    >>> epoch1 = [b["y"].tolist() for b in loader]
    >>> [len(b) for b in epoch0], sorted(sum(epoch0, [])), epoch0 != epoch1
    ([4, 2], [0, 1, 2, 3, 4, 5], True)
    >>> loader.state_dict()["epoch"]
    2
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, num_workers: int | str = 0, prefetch: int = 2,
                 device_prefetch: int = 2, sharding: jax.sharding.Sharding | None = None,
                 collate: Callable[[list], Any] | None = None):
        self.dataset = dataset
        self._source = _as_source(dataset)
        self.batch_size = _check_count("batch_size", batch_size, 1)
        self.seed = _check_count("seed", seed, 0)
        self.autotune: dict | None = None  # with num_workers="auto", once measured
        self._tune = num_workers == "auto"
        self.num_workers = 0 if self._tune else _check_count("num_workers", num_workers, 0)
        self.prefetch = _check_count("prefetch", prefetch, 0)
        self.device_prefetch = _check_count("device_prefetch", device_prefetch, 0)
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(f"DataLoader: sharding expects a jax.sharding.Sharding or None, got {sharding!r}")
        if collate is not None and not callable(collate):
            raise TypeError(f"DataLoader: collate expects a callable or None, got {collate!r}")
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.sharding, self.collate = sharding, collate
        self.num_samples = len(self._source)
        if self.num_samples == 0:
            raise ValueError(f"DataLoader: dataset is empty ({type(dataset).__name__} of length 0)")
        if len(self) == 0:
            raise ValueError(f"DataLoader: drop_last=True with batch_size={self.batch_size} larger than "
                             f"the {self.num_samples} samples gives no batches")
        self._epoch, self._position = 0, 0

    def __len__(self) -> int:
        """Batches per epoch."""
        rounding = math.floor if self.drop_last else math.ceil
        return rounding(self.num_samples / self.batch_size)

    def _read(self, indices: np.ndarray):
        if self.collate is None and isinstance(self._source, _Arrays):
            return self._source.take(indices)
        samples = [self._source[int(i)] for i in indices]
        return (self.collate or default_collate)(samples)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        # One numpy permutation per epoch rather than Grain's per-index shuffle, which costs
        # ~20 us per sample (30 ms per epoch of digits, seconds for larger sets). Seeding with
        # the pair keeps streams apart: seed 0's second epoch is not seed 1's first.
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def _host_batches(self, epoch: int, start: int, stop: int | None = None, workers: int | None = None,
                      prefetch: int | None = None) -> grain.DatasetIterator:
        order, size = self._epoch_order(epoch), self.batch_size
        batches = grain.MapDataset.range(start, len(self) if stop is None else stop).map(
            lambda b: self._read(order[b * size:(b + 1) * size]))
        options = grain.ReadOptions(num_threads=self.num_workers if workers is None else workers,
                                    prefetch_buffer_size=self.prefetch if prefetch is None else prefetch)
        return iter(batches.to_iter_dataset(options))

    def _autotune(self, seconds: float = 1.0) -> None:
        """Pick ``num_workers`` and ``prefetch`` by timing reads (see ``num_workers``); each
        candidate reads at most ``seconds`` worth of the first batches of this epoch's order."""
        import logging
        import time

        most = min(16, 2 * (os.cpu_count() or 1))
        rates = {}
        for workers in [0] + [2 ** k for k in range(int(math.log2(most)) + 1)]:
            batches = self._host_batches(self._epoch, 0, min(len(self), max(4, 2 * workers)), workers,
                                         max(1, 2 * workers))
            start, count = time.perf_counter(), 0
            try:
                for _ in batches:
                    count += 1
                    if time.perf_counter() - start > seconds:
                        break
            finally:
                batches.close()
            rates[workers] = count / (time.perf_counter() - start)
        best = max(rates.values())
        self.num_workers = min(w for w, rate in rates.items() if rate >= 0.95 * best)
        self.prefetch = max(self.prefetch, 2 * self.num_workers)
        self._tune = False
        self.autotune = {"num_workers": self.num_workers, "prefetch": self.prefetch, "batches_per_s": rates}
        logging.getLogger("paddlejax.data").info(
            "DataLoader autotune: num_workers=%d, prefetch=%d (batches/s by workers: %s)", self.num_workers,
            self.prefetch, ", ".join(f"{w}: {r:.0f}" for w, r in rates.items()))

    def _put(self, batch):
        return _to_device(batch, self.sharding)

    def __iter__(self):
        if self._tune:
            self._autotune()
        host = self._host_batches(self._epoch, self._position)
        ahead = _DevicePrefetch(host, self._put, self.device_prefetch) if self.device_prefetch else None
        batches = ahead if ahead is not None else map(self._put, host)
        try:
            for batch in batches:
                self._position += 1
                yield batch
        finally:
            if ahead is not None:
                ahead.close()
            host.close()
        self._epoch, self._position = self._epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its first batch at the next iteration (as PyTorch's sampler).

        >>> import numpy as np
        >>> loader = DataLoader(np.arange(4), batch_size=2, shuffle=True)
        >>> first = [b.tolist() for b in loader]
        >>> loader.set_epoch(0)
        >>> [b.tolist() for b in loader] == first
        True
        """
        self._epoch, self._position = _check_count("epoch", epoch, 0), 0

    def state_dict(self) -> dict:
        """Where the loader is: a small JSON-able dict for :meth:`load_state_dict`.

        ``position`` counts the batches of ``epoch`` already handed out; ``batch_size`` and
        ``num_samples`` are recorded to refuse a state from a differently configured loader.

        >>> import numpy as np
        >>> loader = DataLoader(np.arange(5), batch_size=2, seed=3)
        >>> batches = iter(loader); _ = next(batches)
        >>> loader.state_dict()
        {'epoch': 0, 'position': 1, 'seed': 3, 'batch_size': 2, 'num_samples': 5}
        """
        return {"epoch": self._epoch, "position": self._position, "seed": self.seed,
                "batch_size": self.batch_size, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        """Continues exactly where the loader that saved ``state`` stopped (its seed included).

        >>> import numpy as np
        >>> loader = DataLoader(np.arange(6), batch_size=2, shuffle=True, seed=7)
        >>> batches = iter(loader); _ = next(batches); state = loader.state_dict()
        >>> rest = [b.tolist() for b in batches]
        >>> fresh = DataLoader(np.arange(6), batch_size=2, shuffle=True)
        >>> fresh.load_state_dict(state)
        >>> [b.tolist() for b in fresh] == rest
        True
        """
        if not isinstance(state, dict):
            raise TypeError(f"DataLoader.load_state_dict: state expects a dict, got {type(state).__name__}")
        missing = {"epoch", "position", "seed", "batch_size", "num_samples"} - set(state)
        if missing:
            raise ValueError(f"DataLoader.load_state_dict: state lacks {sorted(missing)}, "
                             f"got keys {sorted(state)}")
        for key in ("batch_size", "num_samples"):
            if state[key] != getattr(self, key):
                raise ValueError(f"DataLoader.load_state_dict: state was saved with {key}={state[key]!r}, "
                                 f"this loader has {key}={getattr(self, key)!r}")
        position = _check_count("position", state["position"], 0)
        if position > len(self):
            raise ValueError(f"DataLoader.load_state_dict: position expects at most {len(self)} "
                             f"(batches per epoch), got {position}")
        self._epoch = _check_count("epoch", state["epoch"], 0)
        self.seed = _check_count("seed", state["seed"], 0)
        self._position = position
