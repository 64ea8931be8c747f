"""The manifest a checkpoint carries beside its arrays, and the checks on reading it back: the
step, every leaf's path, kind, shape, dtype and CRC-32, and a CRC-32 of the manifest itself.

>>> import numpy as np
>>> [(e["path"], e["kind"], e["shape"]) for e in describe({"w": np.zeros(3)})]
[(['w'], 'numpy', [3])]
"""
from __future__ import annotations

import json
import zlib
from typing import Any

import jax
import numpy as np

from paddlejax.adapter import wrap_key_data
from paddlejax.train.checkpoint.errors import CheckpointError, Corrupt

MANIFEST_FORMAT = "paddlejax.checkpoint"
MANIFEST_VERSION = 2  # 2: the manifest carries a CRC-32 of itself; 1 (readable) did not
_SCALARS = (bool, int, float)
KINDS = ("jax", "numpy", "scalar", "key_data")  # key_data: keys' raw bits, written by one of several processes


# Integrity: one CRC-32 per leaf, computed on the host bytes at save time and stored in the
# checkpoint's JSON manifest (written in the same atomic Orbax commit as the arrays), then
# recomputed on the arrays Orbax hands back. Per leaf rather than per file because it does not
# depend on Orbax's on-disk layout (OCDBT, zarr chunks, zstd, small values inlined into the
# OCDBT manifest), it checks exactly what the caller receives (a flipped byte inside an
# incompressible zstd block decodes without any error), and it needs no second, non-atomic
# write after Orbax has committed the files. zlib's CRC-32 runs at several GB/s, well above disk
# speed, and catches every burst error of up to 32 bits; it guards against accidents, not
# against someone forging a checkpoint.
def crc32(value) -> int:
    if isinstance(value, HostKeys):
        value = value.data
    elif jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    data = np.ascontiguousarray(np.asarray(value))
    return zlib.crc32(data.reshape(-1).view(np.uint8))


def manifest_crc32(doc: dict) -> int:
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


class HostKeys:
    """PRNG keys as a process of a multi-process run hands them to Orbax (which takes only host
    arrays there): the raw bits of ``jax.random.key_data`` with the keys' shape and type."""

    def __init__(self, keys: jax.Array):
        self.data, self.shape, self.dtype = np.asarray(jax.random.key_data(keys)), keys.shape, keys.dtype


def host_local(leaf):
    """``leaf`` as Orbax stores it from one process of several: a NumPy array (keys as
    :class:`HostKeys`); other leaves as they are."""
    if not isinstance(leaf, jax.Array):
        return leaf
    return HostKeys(leaf) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else np.asarray(leaf)


def _kind(leaf) -> str | None:
    """How Orbax stores ``leaf`` (and so how to ask for it back); None if it cannot."""
    if isinstance(leaf, HostKeys):
        return "key_data"
    if isinstance(leaf, jax.Array):
        return "jax"
    if isinstance(leaf, (np.ndarray, np.generic)):
        return "numpy"
    return "scalar" if isinstance(leaf, _SCALARS) else None


def describe(state) -> list[dict]:
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
        entries.append({"path": list(path), "kind": kind, "shape": list(leaf.shape if kind == "key_data" else
                                                                        np.shape(leaf)),
                        "dtype": str(leaf.dtype if kind in ("jax", "key_data") else np.asarray(leaf).dtype)})
    # Arrays spread over several hosts have no single host copy to sum (None: not checked);
    # Orbax's own reads still fail loudly on missing or truncated files for those.
    sources = [None if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable else leaf
               for _, leaf in flat]
    # One batched transfer for all device arrays; on CPU it is a no-copy view.
    for entry, value in zip(entries, jax.device_get(sources)):
        entry["crc32"] = None if value is None else crc32(value)
    return entries


def parse_manifest(doc) -> tuple[list[dict], Any]:
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise Corrupt("the manifest is not a paddlejax checkpoint manifest")
    version = doc.get("version")
    if version not in (1, MANIFEST_VERSION):
        raise Corrupt(f"manifest version {version!r} is not one this paddlejax reads (1 to {MANIFEST_VERSION})")
    if version > 1 and doc.get("crc32") != manifest_crc32(doc):
        raise Corrupt("checksum mismatch in the manifest (its meta or leaf list was changed)")
    leaves = doc.get("leaves")
    fields = {"path", "kind", "shape", "dtype", "crc32"}
    if not isinstance(leaves, list) or not all(isinstance(e, dict) and fields <= e.keys() for e in leaves):
        raise Corrupt("the manifest's leaf list is malformed")
    for i, entry in enumerate(leaves):
        problem = _entry_problem(entry)
        if problem:
            raise Corrupt(f"the manifest's leaf {i} is malformed ({problem})")
    return leaves, doc.get("meta")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry_problem(entry: dict) -> str | None:
    """What is wrong with the field types of one manifest leaf entry, or None."""
    path, shape, dtype, crc = entry["path"], entry["shape"], entry["dtype"], entry["crc32"]
    if not isinstance(path, list) or not all(isinstance(k, str) for k in path):
        return f"path {path!r} is not a list of strings"
    if entry["kind"] not in KINDS:
        return f"kind {entry['kind']!r} is not one of {', '.join(KINDS)}"
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


def target(entry, like_leaf):
    """What Orbax should read ``entry`` into: the stored dtype and kind, ``like``'s placement."""
    dtype, shape = _stored_dtype(entry), tuple(entry["shape"])
    if entry["kind"] == "scalar":
        return np.zeros((), dtype).item()
    if entry["kind"] == "key_data":
        return np.empty(jax.eval_shape(jax.random.key_data, like_leaf).shape, np.uint32)
    if dtype is None:
        # A typed PRNG key: only the like tree knows which implementation to rebuild.
        return jax.ShapeDtypeStruct(shape, like_leaf.dtype, sharding=getattr(like_leaf, "sharding", None))
    # 64-bit values cannot live in jax arrays unless jax_enable_x64 is on; read them on the host,
    # as those asked for on the host
    if entry["kind"] == "numpy" or jax.dtypes.canonicalize_dtype(dtype) != dtype or isinstance(like_leaf, np.ndarray):
        return np.empty(shape, dtype)
    sharding = getattr(like_leaf, "sharding", None) or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def as_like(value, like_leaf):
    """``value`` converted to the type, dtype and placement of ``like_leaf``."""
    if isinstance(like_leaf, (np.ndarray, np.generic)):  # before the scalars: np.float64 is a float
        host = np.asarray(value).astype(like_leaf.dtype, copy=False)
        return host[()] if isinstance(like_leaf, np.generic) else host
    if isinstance(like_leaf, _SCALARS):
        return type(like_leaf)(np.asarray(value).item())
    if jax.dtypes.issubdtype(like_leaf.dtype, jax.dtypes.prng_key) and not jax.dtypes.issubdtype(
            getattr(value, "dtype", None), jax.dtypes.prng_key):  # raw bits, stored by one of several processes
        value = wrap_key_data(jax.numpy.asarray(value), like_leaf)
    if isinstance(value, jax.Array):
        if not jax.dtypes.issubdtype(like_leaf.dtype, jax.dtypes.prng_key):
            value = value.astype(like_leaf.dtype)
    else:
        # A 64-bit value read on the host: cast there, before jax would narrow it with a warning.
        value = np.asarray(value).astype(like_leaf.dtype, copy=False)
    sharding = like_leaf.sharding
    return jax.device_put(value, sharding) if sharding is not None else jax.numpy.asarray(value)


def like_leaves(like):
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    for keys, leaf in flat:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic, *_SCALARS)):
            raise TypeError(f"CheckpointManager.restore: 'like' leaf {_show(_path(keys))} expects an array, "
                            f"a jax.ShapeDtypeStruct or a Python scalar, got {type(leaf).__name__}")
    return [(_path(keys), leaf) for keys, leaf in flat], treedef


def check_structure(step, entries, like_leaves, meta):
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


def verify(entries, tree) -> dict[tuple[str, ...], Any]:
    """The restored leaves by path, after checking them against the manifest."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    got = {_path(keys): leaf for keys, leaf in flat}
    if set(got) != {tuple(e["path"]) for e in entries}:
        raise Corrupt("the stored arrays do not match the manifest's leaf list")
    for entry in entries:
        path = tuple(entry["path"])
        value = got[path]
        shape = np.shape(value)[:len(entry["shape"])] if entry["kind"] == "key_data" else np.shape(value)
        if shape != tuple(entry["shape"]):
            raise Corrupt(f"leaf {_show(path)} has shape {np.shape(value)}, "
                           f"expected {tuple(entry['shape'])}")
        if entry["crc32"] is not None and crc32(value) != entry["crc32"]:
            raise Corrupt(f"checksum mismatch in leaf {_show(path)}")
    return got
