"""Saved programs: round trips, and one clear error type for every kind of bad file."""
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paddlejax as pj
from paddlejax.io import ProgramFormatError


def model(p, x):
    h = pj.ops.conv2d(x, p["conv.weight"], p["conv.bias"], padding=1, data_format="NHWC")
    h = pj.ops.relu(h).astype(jnp.bfloat16).astype(jnp.float32)
    c, _ = jax.lax.scan(lambda c, row: (c + row.sum(), None), 0.0, h.reshape(h.shape[0], -1))
    return {"logits": pj.ops.linear(h.mean(axis=(1, 2)), p["fc.weight"]), "total": c}


PARAMS = {"conv.weight": jnp.ones((4, 2, 3, 3)) * 0.1, "conv.bias": jnp.arange(4.0),
          "fc.weight": jnp.ones((4, 3), jnp.bfloat16)}


@pytest.fixture
def saved(tmp_path):
    prog = pj.trace(model, pj.InputSpec((None, 5, 5, 2)), params=PARAMS)
    path = tmp_path / "model"
    pj.save(prog, path)
    return prog, path


def test_round_trip_gives_identical_ir_and_outputs(saved):
    prog, path = saved
    loaded = pj.load(path)
    assert str(loaded) == str(prog)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 5, 2))
    for a, b in zip(jax.tree_util.tree_leaves(loaded(x)), jax.tree_util.tree_leaves(prog(x))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert loaded.params["fc.weight"].dtype == jnp.bfloat16


def test_files_are_json_and_safetensors(saved):
    _, path = saved
    doc = json.loads(path.with_suffix(".json").read_text())
    # a dense save keeps the version older readers load
    assert doc["format"] == "paddlejax.program" and doc["format_version"] == pj.io.DENSE_FORMAT_VERSION
    tensor_file = path.with_suffix(".safetensors").read_bytes()  # the program names its tensor file
    assert doc["tensors"] == {"bytes": len(tensor_file), "sha256": hashlib.sha256(tensor_file).hexdigest()}
    assert doc["producer"]["paddlejax"] == pj.__version__ and doc["producer"]["jax"] == jax.__version__
    from safetensors import safe_open

    with safe_open(str(path.with_suffix(".safetensors")), "numpy") as f:
        assert sorted(f.keys()) == ["params/conv.bias", "params/conv.weight", "params/fc.weight"]


def edit(path, change):
    doc = json.loads(path.with_suffix(".json").read_text())
    change(doc)
    path.with_suffix(".json").write_text(json.dumps(doc))


def first_op(doc, kind):
    return next(op for op in doc["body"]["ops"] if op["type"] == kind)


def test_unknown_op_type(saved):
    _, path = saved
    edit(path, lambda d: first_op(d, "relu").update(type="relu_ext"))
    with pytest.raises(ProgramFormatError, match=r"\(relu_ext\): unknown op type 'relu_ext'"):
        pj.load(path)


def test_parameter_shape_disagrees_with_program(saved):
    _, path = saved
    edit(path, lambda d: d["params"]["conv.bias"].update(shape=[5]))
    with pytest.raises(ProgramFormatError, match=r"param 'conv.bias' is f32\[4\] in the tensor file but f32\[5\]"):
        pj.load(path)


def test_missing_parameter(saved):
    prog, path = saved
    from safetensors.numpy import save_file

    save_file({f"params/{k}": np.asarray(v, np.float32) for k, v in PARAMS.items() if k != "conv.bias"},
              str(path.with_suffix(".safetensors")))
    with pytest.raises(ProgramFormatError, match="param 'conv.bias' is missing from the tensor file"):
        pj.load(path)


def test_newer_format_version_is_refused_by_name(saved):
    _, path = saved
    edit(path, lambda d: d.update(format_version=99))
    with pytest.raises(ProgramFormatError, match="format_version 99 is newer than this paddlejax reads"):
        pj.load(path)


def test_the_current_format_version_loads_and_the_next_one_is_refused(saved):
    prog, path = saved
    current = pj.io.FORMAT_VERSION
    edit(path, lambda d: d.update(format_version=current))
    assert str(pj.load(path)) == str(prog)
    edit(path, lambda d: d.update(format_version=current + 1))
    with pytest.raises(ProgramFormatError, match=f"format_version {current + 1} is newer than this paddlejax reads "
                                                 rf"\({current}\)"):
        pj.load(path)


def test_older_version_is_migrated(saved, monkeypatch):
    prog, path = saved
    edit(path, lambda d: (d.update(format_version=0), d.update(title=d.pop("name"))))

    def v0_to_v1(doc):
        doc["name"] = doc.pop("title")
        return doc

    monkeypatch.setitem(pj.io.MIGRATIONS, 0, v0_to_v1)
    assert str(pj.load(path)) == str(prog)


def test_json_nesting_bomb(saved):
    _, path = saved
    path.with_suffix(".json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ProgramFormatError, match="nested too deeply"):
        pj.load(path)


def test_deeply_nested_blocks(saved):
    _, path = saved
    block = {"name": "b", "args": [], "ops": []}
    for _ in range(100):
        block = {"name": "b", "args": [], "ops": [{"type": "cond", "operands": [], "blocks": [block]}]}
    edit(path, lambda d: d.update(body=block))
    with pytest.raises(ProgramFormatError, match="nested too deeply"):
        pj.load(path)


def test_attribute_cannot_name_arbitrary_classes(saved):
    _, path = saved
    edit(path, lambda d: first_op(d, "conv2d")["attrs"].update(
        stride={"struct": "os.system", "fields": {"command": "echo hacked"}}))
    with pytest.raises(ProgramFormatError, match="unknown structure os.system"):
        pj.load(path)


def test_missing_files(tmp_path):
    with pytest.raises(ProgramFormatError, match="cannot read"):
        pj.load(tmp_path / "nothing")


# --- property-based corruption -------------------------------------------------------------

@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    prog = pj.trace(lambda p, x: pj.ops.relu(x @ p["w"]).sum(axis=-1), jnp.ones((2, 3)),
                    params={"w": jnp.ones((3, 4))})
    path = tmp_path_factory.mktemp("fuzz") / "m"
    pj.save(prog, path)
    return path.with_suffix(".json").read_bytes(), path.with_suffix(".safetensors").read_bytes()


def mutate(data: bytes, draw) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "splice"]))
    if not data:
        return data
    i = draw(st.integers(0, len(data) - 1))
    if kind == "truncate":
        return data[:i]
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    if kind == "delete":
        return data[:i] + data[i + draw(st.integers(1, 16)):]
    j = draw(st.integers(0, len(data) - 1))
    return data[:i] + data[j:j + 32] + data[i:]


_JSON_TOKENS = [b'"shape": [3, 4]', b'"shape": [-1]', b'"dtype": "float32"', b'"dtype": "object"',
                b'"type": "lax.add"', b'"type": "while"', b'"operands": []', b'"operands": ["w"]',
                b'{"tuple": [1]}', b'{"dim": "__import__(1)"}', b'"x"', b"null", b"1e999", b"[]", b"{}"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_files_raise_program_format_error(small_files, tmp_path, data):
    json_bytes, st_bytes = small_files
    target = data.draw(st.sampled_from(["json", "tensors", "json-token"]))
    if target == "json":
        json_bytes = mutate(json_bytes, data.draw)
    elif target == "tensors":
        st_bytes = mutate(st_bytes, data.draw)
    else:
        tokens = [t for t in _JSON_TOKENS]
        i = data.draw(st.integers(0, len(json_bytes)))
        json_bytes = json_bytes[:i] + data.draw(st.sampled_from(tokens)) + json_bytes[i:]
    path = tmp_path / f"m{abs(hash((json_bytes, st_bytes))) % 10**9}"
    path.with_suffix(".json").write_bytes(json_bytes)
    path.with_suffix(".safetensors").write_bytes(st_bytes)
    try:
        prog = pj.load(path)
    except ProgramFormatError as e:
        assert str(e)  # says what is wrong
        return
    prog.verify()  # a mutation that kept the file valid must give a valid program


def test_scalar_parameters_keep_their_shape(tmp_path):
    prog = pj.trace(lambda p, x: x * p["s"], jnp.ones(2), params={"s": jnp.float32(3.0)})
    pj.save(prog, tmp_path / "m")
    loaded = pj.load(tmp_path / "m")
    assert loaded.params["s"].shape == () and loaded(jnp.ones(2)).tolist() == [3.0, 3.0]


# --- attributes are checked when a program is loaded, not when it runs --------------------

def _op(doc, kind):
    """The first op of ``kind`` anywhere in the document (sub-blocks included)."""
    def walk(block):
        for op in block["ops"]:
            yield op
            for b in op.get("blocks", []):
                yield from walk(b)
    return next(op for op in walk(doc["body"]) if op["type"] == kind)


@pytest.mark.parametrize("value", [True, False, 3.0, {"float": "nan"}, {"float": "inf"}, "HIGHEST",
                                   {"tuple": [True, True]}, {"list": []}])
def test_dot_general_precision_of_the_wrong_kind_is_refused(tmp_path, value):
    # these once passed the loader and aborted the process inside XLA ("LLVM ERROR: Invalid value")
    path = tmp_path / "m"
    pj.save(pj.trace(lambda x: x @ x.T, jnp.ones((2, 3))), path)
    edit(path, lambda d: _op(d, "lax.dot_general")["attrs"].update(precision=value))
    with pytest.raises(ProgramFormatError, match=r"lax.dot_general.*attribute 'precision' must be None, "
                                                 r"a lax.Precision or a pair of them"):
        pj.load(path)


def test_attributes_a_primitive_does_not_take_are_refused(tmp_path):
    path = tmp_path / "m"
    pj.save(pj.trace(lambda x: x @ x.T, jnp.ones((2, 3))), path)
    edit(path, lambda d: _op(d, "lax.dot_general")["attrs"].update(fast=True))
    with pytest.raises(ProgramFormatError, match="unknown attribute 'fast'"):
        pj.load(path)


@pytest.mark.parametrize("kind, attr, value, message", [
    ("conv2d", "kernel", "bogus", "kernel 'bogus' is not a variant of conv2d"),
    ("scan", "unroll", {"float": "nan"}, "scan unroll must be"),
    ("scan", "unroll", {"float": "inf"}, "scan unroll must be"),
    ("scan", "unroll", "twice", "scan unroll must be"),
    ("scan", "length", -2, "scan length must be a dimension"),
    ("lax.exp", "accuracy", True, "attribute 'accuracy' must be None or a lax.AccuracyMode"),
    ("lax.exp", "accuracy", 65, "attribute 'accuracy' must be None or a lax.AccuracyMode"),
    ("main return", "donate", "abc", "donate must list distinct input positions below 1"),
    ("main return", "donate", 3, "donate must list distinct input positions below 1"),
    ("main return", "donate", {"tuple": [0, 0]}, "donate must list distinct input positions below 1"),
    ("conv2d", "remat_segment", -1, "remat_segment must be an int >= 0"),
    ("return", "donate", {"tuple": [0]}, "only the main block's return carries a donate annotation"),
])
def test_attributes_that_would_fail_at_run_time_are_refused_at_load(tmp_path, kind, attr, value, message):
    def fn(p, x):
        h = pj.ops.conv2d(x, p["conv.weight"], p["conv.bias"], padding=1, data_format="NHWC")
        c, _ = jax.lax.scan(lambda c, row: (c + jnp.exp(row).sum(), None), 0.0, h.reshape(h.shape[0], -1))
        return c

    path = tmp_path / "m"
    pj.save(pj.trace(fn, jnp.ones((2, 5, 5, 2)), params=PARAMS), path)
    pj.load(path)  # the unedited file loads
    target = (lambda d: d["body"]["ops"][-1]) if kind == "main return" else (lambda d: _op(d, kind))
    edit(path, lambda d: target(d).setdefault("attrs", {}).update({attr: value}))
    with pytest.raises(ProgramFormatError, match=message):
        pj.load(path)


def test_saving_refuses_a_program_that_would_not_load(tmp_path):
    prog = pj.trace(lambda x: x @ x.T, jnp.ones((2, 3)))
    dot = next(op for op in prog.body.ops if op.type == "lax.dot_general")
    dot.attrs["precision"] = True
    with pytest.raises(ValueError, match="cannot save an invalid program.*'precision' must be"):
        pj.save(prog, tmp_path / "m")
    assert not list(tmp_path.iterdir())


# --- the program file and its tensor file are one unit -------------------------------------

def test_a_tensor_file_from_another_save_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    pj.save(pj.trace(model, jnp.ones((1, 5, 5, 2)), params=PARAMS), a)
    pj.save(pj.trace(model, jnp.ones((1, 5, 5, 2)), params=jax.tree.map(lambda v: v * 2, PARAMS)), b)
    a.with_suffix(".safetensors").write_bytes(b.with_suffix(".safetensors").read_bytes())
    with pytest.raises(ProgramFormatError, match="a.safetensors does not belong to this program file"):
        pj.load(a)


def test_a_save_that_fails_part_way_leaves_the_old_pair(saved, monkeypatch):
    import errno

    prog, path = saved
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    real = pj.files._write_synced
    calls = []

    def disk_full_on_the_second_file(target, data):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(target, data)

    monkeypatch.setattr(pj.files, "_write_synced", disk_full_on_the_second_file)
    bigger = pj.trace(model, jnp.ones((1, 5, 5, 2)), params=jax.tree.map(lambda v: v * 2, PARAMS))
    with pytest.raises(OSError, match="No space left"):
        pj.save(bigger, path)
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before  # no temp files either
    assert str(pj.load(path)) == str(prog)


def _save_many(path, scale, n):
    import paddlejax as pj  # in a worker process
    params = {k: v * scale for k, v in PARAMS.items()}
    prog = pj.trace(model, jnp.ones((1, 5, 5, 2)), params=params)
    for _ in range(n):
        pj.save(prog, path)


@pytest.mark.slow
def test_concurrent_saves_to_one_path_end_with_one_consistent_pair(tmp_path):
    import multiprocessing

    path = tmp_path / "m"
    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        workers = [ctx.Process(target=_save_many, args=(path, scale, 15)) for scale in (1.0, 2.0)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
            assert w.exitcode == 0
        loaded = pj.load(path)  # refused if the files came from different saves
        assert float(loaded.params["conv.bias"][1]) in (1.0, 2.0)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.safetensors"]


def test_saved_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        pj.save(pj.trace(lambda x: x + 1, jnp.ones(2)), tmp_path / "m")
    finally:
        os.umask(old)
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {oct(0o644)}


def test_a_killed_save_leaves_nothing_once_the_next_save_runs(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    leftover = tmp_path / f".m.safetensors.{dead}.1a2b3c4d.tmp"
    leftover.write_bytes(b"\0" * 4096)  # what a save killed mid-write leaves
    pj.save(pj.trace(lambda x: x + 1, jnp.ones(2)), tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.safetensors"]


def test_a_directory_is_not_a_save_path(tmp_path):
    with pytest.raises(ValueError, match="names a directory"):
        pj.save(pj.trace(lambda x: x + 1, jnp.ones(2)), str(tmp_path / "adir") + "/")


def test_version_1_files_without_a_tensor_binding_still_load(saved):
    prog, path = saved
    edit(path, lambda d: (d.pop("tensors"), d.update(format_version=1)))
    assert str(pj.load(path)) == str(prog)


# --- loading is bounded in memory and reads only regular files -----------------------------

def test_a_document_that_would_take_much_more_memory_than_its_size_is_refused(saved):
    import tracemalloc

    _, path = saved
    doc = json.loads(path.with_suffix(".json").read_text())
    text = json.dumps(doc)[:-1] + ', "x": [' + ",".join(["{}"] * 2_000_000) + "]}"
    path.with_suffix(".json").write_text(text)  # 6 MB that once cost ~25x its size in memory
    tracemalloc.start()
    with pytest.raises(ProgramFormatError, match="would take about .* MiB to parse"):
        pj.load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * len(text)


def test_producer_must_be_a_small_object_of_strings(saved):
    _, path = saved
    edit(path, lambda d: d.update(producer=[{}, {}]))
    with pytest.raises(ProgramFormatError, match="producer: expected a small object"):
        pj.load(path)


def test_devices_and_fifos_are_refused_without_reading_them(saved):
    import os

    _, path = saved
    json_path = path.with_suffix(".json")
    json_path.unlink()
    json_path.symlink_to("/dev/zero")
    with pytest.raises(ProgramFormatError, match="is not a regular file"):
        pj.load(path)
    json_path.unlink()
    os.mkfifo(json_path)  # opening a FIFO for reading would wait for a writer forever
    with pytest.raises(ProgramFormatError, match="is not a regular file"):
        pj.load(path)


def test_running_out_of_memory_is_a_format_error(saved, monkeypatch):
    _, path = saved

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(pj.io.json, "loads", exhausted)
    with pytest.raises(ProgramFormatError, match="out of memory"):
        pj.load(path)


@pytest.mark.parametrize("text, message", [
    ('{"format": "paddlejax.program", "format": "x"}', "duplicate key 'format'"),
    ('{"format": NaN}', "bare NaN in JSON"),
    ('{"format": -Infinity}', "bare -Infinity in JSON"),
])
def test_json_is_parsed_strictly(saved, text, message):
    _, path = saved
    path.with_suffix(".json").write_text(text)
    with pytest.raises(ProgramFormatError, match=message):
        pj.load(path)


def test_a_scan_without_its_unroll_is_refused(saved):
    _, path = saved
    edit(path, lambda d: _op(d, "scan")["attrs"].pop("unroll"))  # once loaded, then failed to run
    with pytest.raises(ProgramFormatError, match="scan unroll must be true, false or an int >= 1, not None"):
        pj.load(path)


def test_a_symbolic_size_must_name_an_input_symbol(tmp_path):
    prog = pj.trace(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: v * 2, x), pj.InputSpec((None, 2)))
    pj.save(prog, tmp_path / "m")
    edit(tmp_path / "m", lambda d: _op(d, "scan")["attrs"].update(length={"dim": "unknown"}))
    with pytest.raises(ProgramFormatError, match="unknown dimension symbol 'unknown'"):
        pj.load(tmp_path / "m")


def test_complex_values_and_complex64_tensors_round_trip(tmp_path):
    c = np.array([1 + 2j, 3j], np.complex64)
    prog = pj.trace(lambda a: (jnp.linalg.eigvals(a).real.sum() * c).real, 2 * jnp.eye(2))
    pj.save(prog, tmp_path / "m")
    np.testing.assert_allclose(pj.load(tmp_path / "m")(2 * jnp.eye(2)), [4.0, 0.0])


def test_named_tuples_of_local_classes_save_and_load(tmp_path):
    import collections

    Pair = collections.namedtuple("Pair", ["low", "high"])
    prog = pj.trace(lambda x: Pair(jnp.min(x), jnp.max(x)), jnp.arange(3.0))
    pj.save(prog, tmp_path / "m")
    out = pj.load(tmp_path / "m")(jnp.arange(3.0))
    assert type(out).__name__ == "Pair" and (float(out.low), float(out.high)) == (0.0, 2.0)


def test_a_loaded_program_takes_named_tuple_inputs_its_stand_in_matches(tmp_path):
    import collections

    Pair = collections.namedtuple("Pair", ["low", "high"])
    prog = pj.trace(lambda p: p.high - p.low, Pair(jnp.zeros(2), jnp.ones(2)))
    pj.save(prog, tmp_path / "m")
    loaded, x = pj.load(tmp_path / "m"), Pair(jnp.zeros(2), jnp.full(2, 3.0))
    np.testing.assert_array_equal(loaded(x), [3.0, 3.0])
    np.testing.assert_array_equal(loaded.compile(x)(x), [3.0, 3.0])
    with pytest.raises(TypeError, match="expects inputs structured as"):
        loaded.compile(x)((jnp.zeros(2), jnp.ones(2)))


@pytest.mark.parametrize("node", [
    {"namedtuple": {"class": "os:system()", "fields": {"a": "*"}}},
    {"namedtuple": {"class": "m:<locals>", "fields": {"a": "*"}}},
    {"namedtuple": {"class": "m:T", "fields": {"__class__": "*"}}},
    {"namedtuple": {"class": "m:T", "fields": ["*"]}},
    {"namedtuple": {"class": "m:T"}},
])
def test_malformed_named_tuples_are_refused(saved, node):
    _, path = saved
    edit(path, lambda d: d.update(output_tree=node))
    with pytest.raises(ProgramFormatError, match="output_tree"):
        pj.load(path)


def test_a_named_tuple_never_resolves_to_what_is_not_a_named_tuple_class(saved):
    _, path = saved
    edit(path, lambda d: d.update(output_tree={"namedtuple": {"class": "os:system", "fields": {"a": "*", "b": "*"}}}))
    out = pj.load(path)(jnp.ones((2, 5, 5, 2)))
    assert type(out).__name__ == "system" and type(out).__module__ != "os" and out._fields == ("a", "b")
