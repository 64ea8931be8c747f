"""Sparse tensors in saved programs: ``pj.save(..., sparse=True)`` stores a tensor with many zeros
as its kept values and a bitmask, ``pj.load`` gives the dense array back bit for bit, and every
inconsistency between the declared encoding and the stored parts is one clear error."""
import hashlib
import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paddlejax as pj
from paddlejax.io import ProgramFormatError


def sparse_weight(shape, density, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=shape).astype(dtype)
    return np.where(rng.random(shape) < density, w, np.zeros((), dtype))


def model(p, x):
    return pj.ops.linear(x, p["fc.w"], p["fc.b"]) + p["table"].astype(jnp.float32).sum()


@pytest.fixture
def prog():
    """A 75 %-sparse float32 weight, a dense bias, a bfloat16 table with zeros, -0.0 and a NaN."""
    table = sparse_weight((64, 64), 0.1).astype(jnp.bfloat16)
    table[0, :3] = [-0.0, np.nan, 0.0]
    return pj.trace(model, pj.InputSpec((None, 128)),
                    params={"fc.w": sparse_weight((128, 64), 0.25), "fc.b": np.arange(64, dtype=np.float32),
                            "table": table})


@pytest.fixture
def saved(prog, tmp_path):
    pj.save(prog, tmp_path / "m", sparse=True)
    return tmp_path / "m"


def test_round_trip_is_bit_exact(prog, saved):
    loaded = pj.load(saved)
    for name, value in prog.params.items():
        want = np.asarray(value)
        assert loaded.params[name].dtype == want.dtype and loaded.params[name].shape == want.shape
        assert loaded.params[name].tobytes() == want.tobytes(), name  # -0.0 and NaN included
    assert str(loaded) == str(prog)


def test_only_tensors_that_get_smaller_are_encoded_and_the_file_says_so(saved):
    doc = json.loads(saved.with_suffix(".json").read_text())
    assert doc["format_version"] == 4 == pj.io.FORMAT_VERSION
    assert {k: v.get("encoding") for k, v in doc["params"].items()} == {"fc.w": "bitmask", "fc.b": None,
                                                                         "table": "bitmask"}
    tensors = pj.io.read_tensors(saved.with_suffix(".safetensors"))
    shapes = {k: v.shape for k, v in tensors.items()}
    kept = int(np.count_nonzero(tensors["params/fc.w"]))
    assert shapes == {"params/fc.w": (kept,), "bitmask/params/fc.w": (128 * 64 // 8,), "params/fc.b": (64,),
                      "params/table": (shapes["params/table"][0],), "bitmask/params/table": (64 * 64 // 8,)}


def test_a_75_percent_sparse_float32_file_is_less_than_030_of_the_dense_one(tmp_path):
    prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 256)),
                    params={"w": sparse_weight((256, 256), 0.25)})
    pj.save(prog, tmp_path / "dense")
    pj.save(prog, tmp_path / "sparse", sparse=True)
    sizes = [(tmp_path / f"{n}.safetensors").stat().st_size for n in ("dense", "sparse")]
    assert sizes[1] / sizes[0] < 0.30  # 0.25 of the values and one bit in 32 for the mask
    np.testing.assert_array_equal(pj.load(tmp_path / "sparse").params["w"], prog.params["w"])


def test_a_dense_save_is_what_it_always_was(prog, tmp_path):
    pj.save(prog, tmp_path / "a")
    pj.save(prog, tmp_path / "b", sparse=False)
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["format_version"] == pj.io.DENSE_FORMAT_VERSION == 3  # older readers still load it
    assert all("encoding" not in v for v in doc["params"].values())
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


# -- hostile and broken files -----------------------------------------------------------------------

def rewrite(path, change):
    """Apply ``change(doc, tensors)`` to a saved pair, then bind the JSON to the new tensor file
    (so that only the change itself is under test)."""
    doc = json.loads(path.with_suffix(".json").read_text())
    tensors = dict(pj.io.read_tensors(path.with_suffix(".safetensors")))
    change(doc, tensors)
    data = safetensors.numpy.save(tensors)
    path.with_suffix(".safetensors").write_bytes(data)
    doc["tensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.with_suffix(".json").write_text(json.dumps(doc))


def drop_value(doc, t):
    t["params/fc.w"] = t["params/fc.w"][:-1]


def flip_mask_bit(doc, t):
    mask = t["bitmask/params/fc.w"].copy()
    mask[0] ^= 0x80
    t["bitmask/params/fc.w"] = mask


def set_padding_bit(doc, t):
    doc["params"]["fc.w"]["shape"] = [127, 63]  # 8,001 elements: the mask's last 7 bits are padding
    mask = t["bitmask/params/fc.w"][:1001].copy()
    mask[-1] |= 1
    t["bitmask/params/fc.w"] = mask


@pytest.mark.parametrize("change, message", [
    (drop_value, r"m.safetensors: param 'fc.w': its bitmask keeps (\d+) values but the tensor file holds (?!\1)\d+"),
    (flip_mask_bit, r"param 'fc.w': its bitmask keeps \d+ values but the tensor file holds \d+"),
    (lambda d, t: t.update({"bitmask/params/fc.w": t["bitmask/params/fc.w"][:-1]}),
     r"param 'fc.w': its bitmask is u8\[1023\] in the tensor file; a f32\[128,64\] needs u8\[1024\]"),
    (lambda d, t: t.update({"bitmask/params/fc.w": t["bitmask/params/fc.w"].astype(np.int16)}),
     r"param 'fc.w': its bitmask is i16\[1024\] in the tensor file; a f32\[128,64\] needs u8\[1024\]"),
    (set_padding_bit, "param 'fc.w': its bitmask sets bits past the tensor's 8001 elements"),
    (lambda d, t: t.pop("bitmask/params/fc.w"),
     "param 'fc.w' is declared bitmask-encoded but 'bitmask/params/fc.w' is missing from the tensor file"),
    (lambda d, t: t.update({"params/fc.w": t["params/fc.w"].astype(np.float16)}),
     r"param 'fc.w': its values are f16\[\d+\] in the tensor file; expected a vector of float32"),
    (lambda d, t: d["params"]["fc.w"].update(encoding="zstd"),
     r"params.fc.w: unknown encoding 'zstd'; this paddlejax reads 'bitmask'"),
    (lambda d, t: d["params"]["fc.w"].update(encoding=["bitmask"]), r"params.fc.w: unknown encoding"),
    (lambda d, t: d["params"]["fc.w"].pop("encoding"), r"param 'fc.w' is f32\[\d+\] in the tensor file but "
                                                       r"f32\[128,64\] in the program"),
    (lambda d, t: d["params"]["fc.b"].update(encoding="bitmask"),
     "param 'fc.b' is declared bitmask-encoded but 'bitmask/params/fc.b' is missing"),
    (lambda d, t: t.update({"bitmask/params/fc.b": np.zeros(8, np.uint8)}),
     r"unexpected tensors \['bitmask/params/fc.b'\]"),
    (lambda d, t: d["params"]["fc.w"].update(shape=["b", 64]), r"param 'fc.w' is encoded, which needs a static shape"),
])
def test_inconsistent_parts_are_refused_naming_the_tensor(saved, change, message):
    rewrite(saved, change)
    with pytest.raises(ProgramFormatError, match=message):
        pj.load(saved)


def test_a_small_file_cannot_claim_a_huge_dense_tensor(saved, monkeypatch):
    monkeypatch.setattr(pj.io, "MAX_DECODED_BYTES", 40_000)  # fc.w alone is 32 KiB dense, the table 8 KiB more
    with pytest.raises(ProgramFormatError, match="param 'table' would expand the file's encoded tensors past"):
        pj.load(saved)


def test_a_truncated_sparse_tensor_file_is_refused(saved):
    data = saved.with_suffix(".safetensors").read_bytes()
    saved.with_suffix(".safetensors").write_bytes(data[:-100])
    with pytest.raises(ProgramFormatError, match="m.safetensors: not a valid safetensors file"):
        pj.load(saved)


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory):
    prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 64)), params={"w": sparse_weight((64, 64), 0.2)})
    path = tmp_path_factory.mktemp("sparse") / "m"
    pj.save(prog, path, sparse=True)
    return path.with_suffix(".json").read_bytes(), path.with_suffix(".safetensors").read_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_sparse_files_raise_program_format_error(sparse_files, tmp_path, data):
    json_bytes, st_bytes = sparse_files
    target = data.draw(st.sampled_from(["json", "tensors"]))
    blob = json_bytes if target == "json" else st_bytes
    i = data.draw(st.integers(0, len(blob) - 1))
    flipped = blob[:i] + bytes([blob[i] ^ data.draw(st.integers(1, 255))]) + blob[i + 1:]
    blob = data.draw(st.sampled_from([blob[:i], flipped]))
    json_bytes, st_bytes = (blob, st_bytes) if target == "json" else (json_bytes, blob)
    path = tmp_path / f"m{abs(hash((json_bytes, st_bytes))) % 10**9}"
    path.with_suffix(".json").write_bytes(json_bytes)
    path.with_suffix(".safetensors").write_bytes(st_bytes)
    try:
        prog = pj.load(path)
    except ProgramFormatError as e:
        assert str(e)
        return
    prog.verify()
