"""Saved programs: round trips, and one clear error type for every kind of bad file."""
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
    assert doc["format"] == "paddlejax.program" and doc["format_version"] == 1
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
