"""Auto-compression from a program and unlabelled samples: sample files read safely, candidates
built and measured, the least-drift candidate that meets the speed target chosen."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import analysis
from paddlejax.slim.auto_compress import Candidate, auto_compress, choose, load_samples
from paddlejax.slim.pruning import prune


def two_inputs():
    return pj.trace(lambda a, b: a * 2.0 + b.sum(), pj.InputSpec((None, 3), name="a"),
                    pj.InputSpec((None, 2), "int32", name="b"))


def test_samples_come_from_arrays_dicts_npz_npy_and_directories(tmp_path):
    prog = two_inputs()
    a, b = np.ones((4, 3), np.float32), np.zeros((4, 2), np.int64)
    np.savez(tmp_path / "named.npz", b=b, a=a)
    np.savez(tmp_path / "ordered.npz", a, b)
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "a.npy", a)
    np.save(tmp_path / "dir" / "b.npy", b)
    for source in ([a, b], {"a": a, "b": b}, tmp_path / "named.npz", str(tmp_path / "ordered.npz"), tmp_path / "dir"):
        got = load_samples(source, prog)
        assert [(x.shape, x.dtype) for x in got] == [((4, 3), np.float32), ((4, 2), np.int32)]


@pytest.mark.parametrize("source, message", [
    (lambda d: [np.ones((4, 3), np.float32)], "1 sample arrays for 2 inputs"),
    (lambda d: {"a": np.ones((4, 3), np.float32)}, "the program's inputs are \\['a', 'b'\\]"),
    (lambda d: [np.ones((4, 5), np.float32), np.zeros((4, 2), np.int32)], "shape \\(4, 5\\)"),
    (lambda d: [np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)], "are float32, the program takes int32"),
    (lambda d: [np.ones((4, 3), np.float32), np.zeros((5, 2), np.int32)], "one common number"),
    (lambda d: d / "x.txt", "directory of .npy files, an .npz or an .npy"),
])
def test_samples_that_do_not_fit_the_program_are_refused_by_name(tmp_path, source, message):
    with pytest.raises(ValueError, match=message):
        load_samples(source(tmp_path), two_inputs())


def test_hostile_sample_files_are_refused_without_unpickling(tmp_path):
    prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3), name="x"))
    np.save(tmp_path / "objects.npy", np.array([{"boom": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        load_samples(tmp_path / "objects.npy", prog)
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="not a .npz archive"):
        load_samples(tmp_path / "broken.npz", prog)
    forged = tmp_path / "forged.npy"  # a header that claims 10^12 rows over a few bytes of data
    np.save(forged, np.zeros((2, 3), np.float32))
    forged.write_bytes(forged.read_bytes().replace(b"(2, 3), }  ", b"(9999999, 3), }"))
    with pytest.raises(ValueError, match="declares"):
        load_samples(forged, prog)


def test_the_least_drift_among_fast_enough_candidates_wins_top1_changes_first():
    cs = [Candidate("original", None, speedup=1.0), Candidate("small-error", None, speedup=2.0, error=0.01, flips=0.05),
          Candidate("no-flips", None, speedup=1.8, error=0.2, flips=0.0), Candidate("slow", None, speedup=1.1)]
    assert choose(cs, 1.5).name == "no-flips"
    assert choose(cs, 1.9).name == "small-error"
    assert choose(cs, 2.5).name == "original"



def drift(program, reference, x):
    got, ref = np.asarray(program(x), np.float64), np.asarray(reference(x), np.float64)
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


def test_candidates_are_measured_and_distillation_pulls_the_pruned_program_back(untrained_digits, tmp_path):
    prog = untrained_digits
    x = pj.data.Digits("train").arrays()[0][:160]
    result = auto_compress(prog, [x], target_speedup=0.01, strategies=("ptq", "prune_distill"), prune_flops=0.5,
                           epochs=4, learning_rate=3e-3, batch_size=16, repeats=2, progress=False)
    by_name = {c.name: c for c in result.candidates}
    assert list(by_name) == ["original", "ptq", "prune_distill"]
    assert by_name["original"].speedup == 1.0 and by_name["original"].error == 0.0
    assert all(c.latency_ms > 0 and c.speedup > 0 for c in result.candidates)
    assert by_name["ptq"].error < 0.05 and any(op.type.startswith("quantized") or "int8" in op.type
                                               for op in by_name["ptq"].program.walk())
    held = x[128:]  # the held-out fifth, which training never saw
    pruned = by_name["prune_distill"].program
    assert pruned.params["features.0.weight"].shape[0] < prog.params["features.0.weight"].shape[0]
    assert drift(pruned, prog, held) < 0.7 * drift(prune(prog, flops=0.5), prog, held)
    assert result.met and result.chosen == choose(result.candidates, 0.01).name
    assert "<- chosen" in result.table() and "target: 0.01x speed-up, met" in result.table()
    result.plot(tmp_path / "act.png")
    assert (tmp_path / "act.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_qat_with_distillation_converts_to_int8_and_keeps_close(untrained_digits):
    prog = untrained_digits
    x = pj.data.Digits("train").arrays()[0][:96]
    result = auto_compress(prog, [x], target_speedup=100.0, strategies=("qat_distill",), epochs=1,
                           learning_rate=1e-4, batch_size=16, repeats=2, progress=False)
    qat = result.candidates[1]
    assert not result.met and result.chosen == "original" and result.program is prog
    assert not any(op.type == "fake_quantize" for op in qat.program.walk())  # converted
    assert qat.error < 0.1


def test_pruning_takes_the_flops_the_target_asks_unless_told(untrained_digits):
    prog = untrained_digits
    x = pj.data.Digits("train").arrays()[0][:40]
    result = auto_compress(prog, [x], target_speedup=2.0, strategies=("prune_distill",), epochs=0, batch_size=8,
                           repeats=1, progress=False)
    removed = 1 - analysis.flops(result.candidates[1].program, {"b": 1}) / analysis.flops(prog, {"b": 1})
    assert 0.5 <= removed < 0.6  # 1 - 1/2 of the FLOPs
    with pytest.raises(ValueError, match="prune_flops is the fraction"):
        auto_compress(prog, [x], strategies=("prune_distill",), prune_flops=1.0)


def test_unknown_strategies_and_holdouts_are_refused():
    prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
    with pytest.raises(ValueError, match="unknown strategies"):
        auto_compress(prog, [np.ones((4, 3), np.float32)], strategies=())
    with pytest.raises(ValueError, match="holdout"):
        auto_compress(prog, [np.ones((4, 3), np.float32)], holdout=1.0)
