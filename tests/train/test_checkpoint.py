"""Checkpoints: bit-exact round trips, every/keep, async writes, and recovery from damage."""
import glob
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from paddlejax.train.checkpoint import CheckpointError, CheckpointManager, CorruptCheckpointWarning
from paddlejax.train.checkpoint.manifest import manifest_crc32

ROOT = pathlib.Path(__file__).resolve().parents[2]

# After a failed read of a damaged checkpoint, Orbax closes its event loop while tensorstore
# still completes the other reads; their callbacks then report "Event loop is closed" as
# unraisable exceptions, sometimes during a later test. Harmless, and not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def mixed_state(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "params": {"w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32),
                   "b": jnp.asarray(rng.standard_normal(4), jnp.bfloat16)},
        "rng": jax.random.PRNGKey(seed),                      # uint32 key data
        "typed_key": jax.random.key(seed),                    # a typed PRNG key array
        "host": (rng.integers(-2**40, 2**40, 5), rng.integers(0, 255, (2, 2), dtype=np.uint8),
                 np.array([True, False])),
        "half": np.float16(rng.standard_normal()),
        "step": 7 + seed,
        "lr": 0.25,
    }


def host_bytes(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x).tobytes()


def assert_same_tree(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert type(g) is type(w)
        assert getattr(g, "dtype", None) == getattr(w, "dtype", None)
        assert np.shape(g) == np.shape(w)
        assert host_bytes(g) == host_bytes(w)


def test_round_trip_with_like_is_bit_exact_for_mixed_dtypes(tmp_path):
    state = mixed_state()
    with CheckpointManager(tmp_path, every=1) as mgr:
        assert mgr.save(3, state, meta={"loader": {"epoch": 1, "position": 96}, "config": {"lr": 0.25}})
        restored = mgr.restore(like=mixed_state(seed=1))
    assert restored.step == 3
    assert restored.meta == {"loader": {"epoch": 1, "position": 96}, "config": {"lr": 0.25}}
    assert_same_tree(restored.state, state)


def test_restore_without_like_gives_the_raw_tree(tmp_path):
    state = mixed_state()
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state)
        raw = mgr.restore().state
    assert isinstance(raw["host"], list)  # Orbax stores tuples as sequences
    assert host_bytes(raw["host"][0]) == host_bytes(state["host"][0])  # int64 kept, even without x64
    assert raw["step"] == 7 and raw["lr"] == 0.25
    for key in ("rng", "typed_key"):
        assert host_bytes(raw[key]) == host_bytes(state[key])
    np.testing.assert_array_equal(np.asarray(raw["params"]["b"]), np.asarray(state["params"]["b"]))


def test_like_gives_types_dtypes_and_containers(tmp_path):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, {"model": nnx.state(model), "pair": (np.arange(3.0), 5)})
        abstract = nnx.eval_shape(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(9)))
        like = {"model": nnx.state(abstract),
                "pair": (jax.ShapeDtypeStruct((3,), jnp.bfloat16), 0)}
        state = mgr.restore(like).state
    assert isinstance(state["model"], nnx.State)
    np.testing.assert_array_equal(state["model"]["kernel"][...], model.kernel[...])
    assert isinstance(state["pair"], tuple)
    assert isinstance(state["pair"][0], jax.Array) and state["pair"][0].dtype == jnp.bfloat16
    assert state["pair"][0].tolist() == [0.0, 1.0, 2.0] and state["pair"][1] == 5


def test_every_and_keep(tmp_path):
    with CheckpointManager(tmp_path, every=3, keep=2) as mgr:
        saved = [mgr.save(s, {"x": np.full(2, s)}) for s in range(11)]
        assert saved == [s % 3 == 0 for s in range(11)]
        assert mgr.save(10, {"x": np.full(2, 10)}, force=True)
        assert not mgr.save(10, {"x": np.zeros(2)}, force=True)  # never overwritten
        mgr.wait()
        assert mgr.all_steps() == [9, 10] and mgr.latest_step() == 10
        assert mgr.restore().state["x"].tolist() == [10, 10]
        assert mgr.restore(step=9).state["x"].tolist() == [9, 9]


def test_async_save_snapshots_the_state_and_is_durable_after_wait(tmp_path):
    big = np.zeros(1 << 18, np.float32)
    with CheckpointManager(tmp_path, async_save=True) as mgr:
        assert mgr.save(1, {"x": big})
        big[:] = 1.0  # the caller may reuse its buffers as soon as save returns
        mgr.wait()
        assert {"manifest", "state"} <= set(os.listdir(tmp_path / "1"))
        assert not glob.glob(str(tmp_path / "*tmp*"))
        assert mgr.restore().state["x"].sum() == 0.0


def test_sync_save_is_on_disk_when_it_returns(tmp_path):
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(2, {"x": np.ones(3)})
        assert (tmp_path / "2" / "state").is_dir()


def test_restore_on_an_empty_directory_gives_none(tmp_path):
    with CheckpointManager(tmp_path / "new") as mgr:
        assert mgr.restore() is None and mgr.latest_step() is None and mgr.all_steps() == []


# Damage is done to Orbax's files the way a full disk, a crash or bit rot would.
def largest_data_file(step_dir):
    return max(glob.glob(f"{step_dir}/state/**/d/*", recursive=True), key=os.path.getsize)


def flip_a_byte(step_dir):
    path = largest_data_file(step_dir)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))


def truncate(step_dir):
    path = largest_data_file(step_dir)
    os.truncate(path, os.path.getsize(path) // 2)


def delete(step_dir):
    os.remove(largest_data_file(step_dir))


def garble(step_dir):
    path = largest_data_file(step_dir)
    pathlib.Path(path).write_bytes(np.random.default_rng(0).bytes(os.path.getsize(path)))


def garble_manifest(step_dir):
    (step_dir / "manifest" / "metadata").write_text("{not json")


def garble_tree_metadata(step_dir):
    (step_dir / "state" / "_METADATA").write_text("\x00\x01")


def random_state(step):
    # Incompressible values, so that a flipped byte lands in stored data, not in zstd framing.
    return {"w": np.random.default_rng(step).standard_normal(4096).astype(np.float32), "step": step}


@pytest.mark.parametrize("damage, reason", [
    (flip_a_byte, "checksum mismatch in leaf w"),  # Orbax itself reads this back without error
    (truncate, "arrays unreadable"),
    (delete, "arrays unreadable"),
    (garble, "arrays unreadable"),
    (garble_manifest, "manifest unreadable"),
    (garble_tree_metadata, "arrays unreadable"),
])
def test_damaged_latest_warns_and_falls_back(tmp_path, damage, reason):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1))
        mgr.save(2, random_state(2))
        mgr.wait()
        damage(tmp_path / "2")
        with pytest.warns(CorruptCheckpointWarning, match=f"step 2 .*{reason}"):
            restored = mgr.restore(like=random_state(0))
    assert restored.step == 1
    np.testing.assert_array_equal(restored.state["w"], random_state(1)["w"])


def test_all_damaged_raises_listing_what_was_tried(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1))
        mgr.save(2, random_state(2))
        mgr.wait()
        flip_a_byte(tmp_path / "1")
        truncate(tmp_path / "2")
        with pytest.warns(CorruptCheckpointWarning), \
                pytest.raises(CheckpointError, match=r"tried step 2: arrays unreadable.*; step 1: checksum"):
            mgr.restore()
        with pytest.raises(CheckpointError, match="step 1 .* is unusable: checksum mismatch"):
            mgr.restore(step=1)


def test_saving_again_replaces_a_damaged_step(tmp_path):
    with CheckpointManager(tmp_path, keep=3) as mgr:
        mgr.save(1, random_state(1))
        mgr.save(2, random_state(2))
        mgr.wait()
        flip_a_byte(tmp_path / "2")
        with pytest.warns(CorruptCheckpointWarning):
            assert mgr.restore().step == 1
        assert mgr.save(2, random_state(22))  # training resumed from step 1 reaches step 2 again
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            restored = mgr.restore()
    assert restored.step == 2 and restored.state["step"] == 22


def edit_manifest_meta(step_dir, **changes):
    """Change ``meta`` in a saved manifest, keeping the JSON well formed (as a hand edit would)."""
    path = step_dir / "manifest" / "metadata"
    doc = json.loads(path.read_text())
    doc["meta"].update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("changes", [{"epoch": 2}, {"loader": {"epoch": 1, "position": 0}}])
def test_an_edited_meta_fails_the_manifest_checksum(tmp_path, changes):
    meta = {"epoch": 1, "loader": {"epoch": 1, "position": 96}}
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1), meta={**meta, "epoch": 0})
        mgr.save(2, random_state(2), meta=meta)
        mgr.wait()
        edit_manifest_meta(tmp_path / "2", **changes)
        with pytest.warns(CorruptCheckpointWarning, match=r"step 2 .*checksum mismatch in the manifest"):
            restored = mgr.restore()
    assert restored.step == 1 and restored.meta["epoch"] == 0


def test_a_version_1_manifest_reads_without_its_checksum_and_a_newer_version_is_refused(tmp_path):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1), meta={"epoch": 1})
        mgr.wait()
        path = tmp_path / "1" / "manifest" / "metadata"
        doc = json.loads(path.read_text())
        del doc["crc32"]
        path.write_text(json.dumps({**doc, "version": 1}))  # as paddlejax wrote it before manifests had one
        assert mgr.restore().meta == {"epoch": 1}
        path.write_text(json.dumps({**doc, "version": 3}))
        with pytest.raises(CheckpointError, match="manifest version 3 is not one this paddlejax reads"):
            mgr.restore(step=1)


@pytest.mark.parametrize("field, value, reason", [
    ("path", None, "path None is not a list of strings"),
    ("path", [3], "path \\[3\\] is not a list of strings"),
    ("shape", 5, "shape 5 is not a list of sizes"),
    ("shape", [-1], "shape \\[-1\\] is not a list of sizes"),
    ("dtype", None, "dtype None is not a string"),
    ("dtype", "float33", "dtype 'float33' is not a dtype"),
    ("dtype", "object", "dtype 'object' is not an array dtype"),
    ("kind", "pickle", "kind 'pickle' is not one of jax, numpy, scalar, key_data"),
    ("crc32", "0", "crc32 '0' is not a CRC-32"),
])
@pytest.mark.parametrize("like", [False, True])
def test_a_manifest_with_malformed_leaf_fields_is_skipped(tmp_path, field, value, reason, like):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1))
        mgr.save(2, random_state(2))
        mgr.wait()
        path = tmp_path / "2" / "manifest" / "metadata"
        doc = json.loads(path.read_text())
        doc["leaves"][0][field] = value
        doc["crc32"] = manifest_crc32(doc)  # a consistent manifest, only its entries are wrong
        path.write_text(json.dumps(doc))
        with pytest.warns(CorruptCheckpointWarning, match=f"step 2 .*leaf 0 is malformed \\({reason}\\)"):
            restored = mgr.restore(like=random_state(0) if like else None)
        assert restored.step == 1 and int(restored.state["step"]) == 1
        with pytest.raises(CheckpointError, match="leaf 0 is malformed"):
            mgr.restore(step=2)


def test_a_step_directory_copied_over_a_later_step_is_not_taken_for_it(tmp_path):
    import shutil

    with CheckpointManager(tmp_path, keep=None) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, random_state(step))
        mgr.wait()
        shutil.rmtree(tmp_path / "3")
        shutil.copytree(tmp_path / "1", tmp_path / "3")  # consistent files, but step 1's
        with pytest.warns(CorruptCheckpointWarning, match=r"step 3 .*holds the checkpoint of step 1"):
            restored = mgr.restore()
    assert restored.step == 2 and restored.state["step"] == 2


def test_meta_comes_back_as_json_reads_it_and_the_checksum_holds(tmp_path):
    meta = {"epoch": 3, "lr": 0.1, "ids": (1, 2), 7: "seven", "nested": {"neg": -0.0, "big": 2**60}}
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1), meta=meta)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            restored = mgr.restore()
    assert restored.meta == {"epoch": 3, "lr": 0.1, "ids": [1, 2], "7": "seven",
                             "nested": {"neg": -0.0, "big": 2**60}}


@pytest.mark.parametrize("like, message", [
    ({"w": np.zeros(4096, np.float32)}, "in the checkpoint but not in like: step"),
    ({"w": np.zeros(4096, np.float32), "step": 0, "extra": np.zeros(1)},
     "in like but not in the checkpoint: extra"),
    ({"w": np.zeros((64, 64), np.float32), "step": 0}, r"shape of w: checkpoint \(4096,\), like \(64, 64\)"),
    ({"w": {"kernel": np.zeros(4096)}, "step": 0}, "in like but not in the checkpoint: w/kernel"),
])
def test_like_with_another_structure_is_a_clear_error(tmp_path, like, message):
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, random_state(1))
        with pytest.raises(CheckpointError, match=f"structure of checkpoint step 1: .*{message}"):
            mgr.restore(like=like)


KILLED_WRITER = """
import sys
import numpy as np
from paddlejax.train.checkpoint import CheckpointManager

mgr = CheckpointManager(sys.argv[1], every=1, keep=2)
for step in range(1, 10_000):
    print(step, flush=True)
    mgr.save(step, {"a": np.full(1 << 20, step, np.float32), "b": np.full((256, 1024), -step, np.int32)},
             meta={"step": step})
"""


def test_a_writer_killed_mid_save_leaves_a_restorable_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:
            if int(line) == 4:  # three 5 MB saves under way or done, the fourth starting
                break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL

    def expected(step):
        return {"a": np.full(1 << 20, step, np.float32), "b": np.full((256, 1024), -step, np.int32)}

    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptCheckpointWarning)
        with CheckpointManager(tmp_path, every=1, keep=2) as mgr:
            restored = mgr.restore(like=expected(0))
            assert restored is not None and restored.meta == {"step": restored.step}
            assert_same_tree(restored.state, expected(restored.step))
            for step in range(restored.step + 1, 6):  # the run goes on over the interrupted steps
                assert mgr.save(step, expected(step), meta={"step": step})
            assert mgr.restore().step == 5


HOLDING_WRITER = """
import sys, time
import numpy as np
from paddlejax.train.checkpoint import CheckpointManager

mgr = CheckpointManager(sys.argv[1], every=1, keep=2)
mgr.save(1, {"a": np.full(4, 1.0, np.float32)}, meta={"who": "child"})
mgr.wait()
print("saved", flush=True)
time.sleep(600)
"""


def test_a_second_process_writing_into_the_directory_is_refused_until_the_first_is_gone(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen([sys.executable, "-c", HOLDING_WRITER, str(tmp_path)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "saved"
        with CheckpointManager(tmp_path, every=1, keep=2) as mgr:
            with pytest.raises(CheckpointError, match=f"is being written by process {child.pid} .*own directory"):
                mgr.save(2, {"a": np.full(4, 2.0, np.float32)})
            restored = mgr.restore()  # reading while another process writes is fine
            assert restored.step == 1 and restored.meta == {"who": "child"}
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    with CheckpointManager(tmp_path, every=1, keep=2) as mgr, \
            CheckpointManager(tmp_path, every=1, keep=2) as other:  # one process may hold several
        assert mgr.save(2, {"a": np.full(4, 2.0, np.float32)}, meta={"who": "parent"})
        assert other.save(3, {"a": np.full(4, 3.0, np.float32)}, meta={"who": "parent"})
        other.wait()
        restored = mgr.restore(like={"a": np.zeros(4, np.float32)})
    assert restored.step == 3 and restored.state["a"].tolist() == [3.0] * 4


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="'every' expects a positive int, got 0"):
        CheckpointManager(tmp_path, every=0)
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(TypeError, match="'meta' expects a JSON-serialisable dict"):
            mgr.save(1, {"x": np.ones(2)}, meta={"when": object()})
        with pytest.raises(TypeError, match="leaf name expects an array or a Python bool/int/float, got str"):
            mgr.save(1, {"x": np.ones(2), "name": "run-1"})
        with pytest.raises(ValueError, match="'step' expects a non-negative int, got -1"):
            mgr.save(-1, {"x": np.ones(2)})
        with pytest.raises(CheckpointError, match=r"no checkpoint of step 4 .*saved steps: \[\]"):
            mgr.restore(step=4)
        mgr.save(2, {"x": np.ones(2)}, meta={"epoch": 1})
        for step in (True, 2.0, "2", -1):  # not taken for step 1 or 2, nor blamed on the checkpoint
            with pytest.raises(ValueError, match=f"restore: 'step' expects a non-negative int or None, got {step!r}"):
                mgr.restore(step=step)
            with pytest.raises(ValueError, match=f"read_meta: 'step' expects a non-negative int or None"):
                mgr.read_meta(step)
        restored = mgr.restore(step=np.int64(2))
        assert type(restored.step) is int and restored.step == 2 and mgr.read_meta(np.int32(2)) == {"epoch": 1}


def test_orbax_info_logging_is_silenced_but_warnings_pass(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, {"x": np.ones(2)})
        mgr.restore()
    assert not [r for r in caplog.records if "orbax" in r.pathname]
    orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "x.py")
    warning = logging.LogRecord("absl", logging.WARNING, orbax_file, 1, "a warning", None, None)
    assert logging.getLogger("absl").filter(warning)


def test_a_process_that_never_closes_its_manager_exits_without_an_unclosed_file_warning(tmp_path):
    import subprocess
    import sys

    code = ("import jax.numpy as jnp\nfrom paddlejax.train.checkpoint import CheckpointManager\n"
            f"m = CheckpointManager({str(tmp_path)!r})\nm.save(1, {{'a': jnp.ones(2)}})\nm.wait()\n")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ResourceWarning" not in done.stderr


def test_keys_written_by_one_of_several_processes_travel_as_their_raw_bits():
    """In a multi-process run the manager hands Orbax host arrays only: PRNG keys go as their
    key_data, and come back as keys of the type the restoring run asks for."""
    from paddlejax.train.checkpoint.manifest import HostKeys, as_like, describe, host_local, target, verify

    keys = jax.random.split(jax.random.key(3), 4)
    state = jax.tree.map(host_local, {"k": keys, "w": jnp.arange(3.0)})
    assert isinstance(state["k"], HostKeys) and isinstance(state["w"], np.ndarray)
    entries = describe(state)
    assert [(e["path"], e["kind"], e["shape"], e["dtype"]) for e in entries] == [
        (["k"], "key_data", [4], "key<fry>"), (["w"], "numpy", [3], "float32")]
    stored = {"k": state["k"].data, "w": state["w"]}  # what Orbax writes and reads back
    verify(entries, stored)  # the checksum of the raw bits
    like = jax.ShapeDtypeStruct((4,), keys.dtype)
    assert target(entries[0], like).shape == (4, 2)
    back = as_like(stored["k"], like)
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(keys))
