"""``paddlejax launch``: N processes joined by jax.distributed train like one process with all
the devices; a failing rank or a Ctrl-C stops every rank; bad arguments are refused clearly."""
import os
import pathlib
import runpy
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from paddlejax.cli.main import main
from paddlejax.distributed.env import init_from_env

HERE = pathlib.Path(__file__).parent
DP_SCRIPT, WORKER, CRASH = HERE / "dp_script.py", HERE / "worker_script.py", HERE / "crash_script.py"


def launch_command(*args) -> list[str]:
    return [sys.executable, "-m", "paddlejax.cli.main", "launch", *map(str, args)]


def run_launch(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(launch_command(*args), cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def pids(directory: pathlib.Path, ranks) -> list[int]:
    return [int((directory / f"pid{r}").read_text()) for r in ranks]


def launched_and_reference(tmp_path, parallel):
    """Process 0's results from ``dp_script.py`` launched as 2 processes x 4 devices, and the
    same training in this process on its 8 devices."""
    result = run_launch("--nproc", 2, "--devices-per-proc", 4, "--log-dir", tmp_path / "log",
                        DP_SCRIPT, tmp_path / "out.npz", *(["--pipeline"] if parallel == "pipeline" else []),
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    reference = runpy.run_path(str(DP_SCRIPT))["train"](parallel)
    launched = np.load(tmp_path / "out.npz")
    assert set(launched) == set(reference)
    for name in set(reference) - {"predictions"}:
        want = reference[name]
        assert np.abs(launched[name] - want).max() <= 1e-5 * np.abs(want).max(), name
    return result, launched, reference


def test_two_processes_of_four_devices_train_like_one_process_of_eight(tmp_path):
    result, launched, reference = launched_and_reference(tmp_path, "data")
    assert "[rank0] process 0 of 2: 4 local devices, 8 in the mesh; GPU ids if any: [0, 1, 2, 3]" in result.stdout
    assert ("process 1 of 2: 4 local devices, 8 in the mesh; GPU ids if any: [4, 5, 6, 7]"
            in (tmp_path / "log" / "rank1.log").read_text())
    assert "[rank1]" not in result.stdout  # only rank 0 is echoed
    assert {"0.weight", "0.bias", "2.weight", "2.bias", "eval_loss"} < set(reference)
    assert np.abs(reference["2.bias"]).max() > 0.1  # it did train (biases start at zero)
    # evaluation covered both processes' rows; rank 0 predicted its own half of the batch
    assert launched["predictions"].shape == (16, 2) and reference["predictions"].shape == (32, 2)
    np.testing.assert_allclose(launched["predictions"], reference["predictions"][:16], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_pipeline_whose_stages_span_two_processes_trains_like_one_process(tmp_path):
    _, launched, reference = launched_and_reference(tmp_path, "pipeline")
    assert np.abs(reference["6.bias"]).max() > 0.05  # it did train (biases start at zero)
    np.testing.assert_allclose(launched["predictions"], reference["predictions"], rtol=1e-5, atol=1e-6)


def test_a_failing_rank_stops_the_others_and_its_error_and_exit_code_are_shown(tmp_path):
    # rank 0 ignores SIGTERM: it is killed once the grace period is over
    result = run_launch("--nproc", 2, "--log-dir", tmp_path / "log", "--grace-period", 0.5,
                        WORKER, tmp_path, "--fail-rank", 1, "--wait", "--ignore-sigterm", cwd=tmp_path)
    assert result.returncode == 3
    assert "[rank0] rank 0 of 2, local rank 0, coordinator 127.0.0.1:" in result.stdout
    assert "paddlejax launch: rank 1 exited with code 3; stopping the others (1 running)" in result.stderr
    assert f"--- last 2 lines of {tmp_path / 'log' / 'rank1.log'} (rank 1, exited with code 3) ---" in result.stderr
    assert result.stderr.rstrip().endswith("rank 1: shard 1 is missing")
    assert all(gone(pid) for pid in pids(tmp_path, [0, 1]))


def test_an_exception_in_a_joined_rank_is_reported_not_the_ranks_waiting_for_it(tmp_path):
    # without init_from_env's exit-at-once, rank 1 would wait in JAX's shutdown for rank 0, which
    # waits in the collective for rank 1, until a timeout blamed rank 0
    result = run_launch("--nproc", 2, "--log-dir", tmp_path / "log", "--grace-period", 0.5, CRASH, cwd=tmp_path)
    assert result.returncode == 1
    assert "paddlejax launch: rank 1 exited with code 1; stopping the others (1 running)" in result.stderr
    assert result.stderr.rstrip().endswith("RuntimeError: rank 1 cannot read its shard")
    assert "sum" not in result.stdout


def test_ranks_on_the_second_node_count_from_node_rank_times_nproc(tmp_path):
    result = run_launch("--nproc", 2, "--nnodes", 2, "--node-rank", 1, "--master", "127.0.0.1:6170",
                        "--log-dir", tmp_path / "log", WORKER, tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "[rank2] rank 2 of 4, local rank 0, coordinator 127.0.0.1:6170" in result.stdout
    assert "rank 3 of 4, local rank 1, coordinator 127.0.0.1:6170" in (tmp_path / "log" / "rank3.log").read_text()


def test_ctrl_c_stops_every_rank(tmp_path):
    launcher = subprocess.Popen(launch_command("--nproc", 2, "--log-dir", tmp_path / "log", WORKER, tmp_path, "--wait"),
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"pid{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGINT
    assert "paddlejax launch: SIGINT received; stopping 2 ranks (send it again to kill them at once)" in err
    assert all(gone(pid) for pid in pids(tmp_path, [0, 1]))


@pytest.mark.parametrize("devices", [{}, {"PADDLEJAX_DEVICES_PER_PROC": "4"}])
def test_joining_after_jax_started_says_what_to_do(devices):
    jax.devices()  # the backend is running
    environ = {"PADDLEJAX_COORDINATOR": "127.0.0.1:6170", "PADDLEJAX_NUM_PROCESSES": "2",
               "PADDLEJAX_PROCESS_ID": "1", **devices}
    with pytest.raises(RuntimeError, match=r"must run before JAX starts its backend, but devices are already "
                                           r"initialised .* at the top of the script"):
        init_from_env(environ)


@pytest.mark.parametrize("args, message", [
    (["--nproc", "0"], "nproc must be at least 1 (processes on this node), got 0"),
    (["--devices-per-proc", "0"], "devices_per_proc must be at least 1 (CPU devices per process), got 0"),
    (["--master", "localhost"], "master must be ADDR:PORT with a port in 1..65535 (e.g. 10.0.0.1:6170), "
                                "got 'localhost'"),
    (["--nnodes", "2"], "master ADDR:PORT (an address of node 0 that every node reaches) is required with nnodes=2"),
    (["--nnodes", "2", "--node-rank", "2", "--master", "10.0.0.1:6170"], "node_rank must be in 0..1 (nnodes=2), got 2"),
])
def test_bad_arguments_are_refused_before_anything_starts(args, message, tmp_path, capsys):
    assert main(["launch", *args, "--log-dir", str(tmp_path / "log"), str(WORKER), str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"paddlejax launch: error: {message}\n"
    assert not (tmp_path / "log").exists()


def test_a_missing_script_is_named(tmp_path, capsys):
    assert main(["launch", "--log-dir", str(tmp_path / "log"), str(tmp_path / "train.py")]) == 2
    assert f"script '{tmp_path / 'train.py'}' is not a file" in capsys.readouterr().err


FLAKY = """import os, sys
restart = int(os.environ["PADDLEJAX_RESTART_COUNT"])
print("rank", os.environ["PADDLEJAX_PROCESS_ID"], "start", restart, "coordinator", os.environ["PADDLEJAX_COORDINATOR"])
if os.environ["PADDLEJAX_PROCESS_ID"] == "1" and restart < int(sys.argv[1]):
    sys.exit(5)
"""


@pytest.mark.parametrize("failures, code", [(2, 0), (4, 5)])
def test_an_elastic_run_restarts_every_rank_after_a_failure_up_to_the_limit(failures, code, tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    result = run_launch("--elastic", "--max-restarts", 3, "--nproc", 2, "--log-dir", tmp_path / "log", script,
                        failures, cwd=tmp_path)
    assert result.returncode == code, result.stderr
    starts = min(failures, 3) + 1
    # rank 0's echoed lines: "[rank0] rank 0 start K coordinator ADDR"
    assert [line.split()[4] for line in result.stdout.splitlines()] == [str(i) for i in range(starts)]
    assert result.stderr.count("rank 1 exited with code 5") == min(failures, 4)
    assert f"restarting all 2 ranks (restart {starts - 1} of 3)" in result.stderr
    assert f"(restart {starts} of 3)" not in result.stderr
    coordinators = {line.split()[-1] for line in result.stdout.splitlines()}
    assert len(coordinators) == starts  # a fresh coordinator each time
    log = (tmp_path / "log" / "rank1.log").read_text()
    assert log.count("--- paddlejax launch: restart") == starts - 1 and log.count("rank 1 start") == starts


def test_without_elastic_a_failure_is_final(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    result = run_launch("--nproc", 2, "--log-dir", tmp_path / "log", script, 1, cwd=tmp_path)
    assert result.returncode == 5 and "restarting" not in result.stderr
