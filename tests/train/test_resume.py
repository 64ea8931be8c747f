"""Exact resume: a run killed with SIGKILL and restarted ends bit-identical to an uninterrupted
one, also when the newest checkpoint was damaged and the one before it has to be used."""
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("resume_run.py")
STEPS = list(range(1, 25))  # 1,437 digits / batch 128 → 12 batches, 2 epochs


def run(out, *args, kill_after_step=None):
    log = out.with_suffix(".stderr")  # a file, not a pipe: a full stderr pipe would block the child
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out), *map(str, args)], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        steps = []
        for line in proc.stdout:
            if line.startswith("step "):
                steps.append(int(line.split()[1]))
                if kill_after_step is not None and steps[-1] >= kill_after_step:
                    proc.send_signal(signal.SIGKILL)
                    break
        proc.wait(timeout=300)
    err = log.read_text()
    if kill_after_step is None:
        assert proc.returncode == 0, err[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL
    return steps, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "full.npz"
    steps, _ = run(out)
    assert steps == STEPS
    return np.load(out)


def saved_steps(folder) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def assert_identical(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)


def test_killed_run_resumes_bit_identically(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    run(tmp_path / "killed.npz", ckpt, kill_after_step=14)
    assert not (tmp_path / "killed.npz").exists()
    latest = saved_steps(ckpt)[-1]
    resumed, _ = run(tmp_path / "resumed.npz", ckpt)
    assert resumed == STEPS[latest:]
    assert_identical(uninterrupted, np.load(tmp_path / "resumed.npz"))


def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_one_used(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    run(tmp_path / "killed.npz", ckpt, kill_after_step=14)
    *_, previous, latest = saved_steps(ckpt)
    biggest = max((p for p in (ckpt / str(latest)).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    resumed, err = run(tmp_path / "resumed.npz", ckpt)
    assert f"checkpoint step {latest} in {ckpt} is unusable" in err
    assert resumed == STEPS[previous:]
    assert_identical(uninterrupted, np.load(tmp_path / "resumed.npz"))
