"""Mutated program files are refused with ProgramFormatError or load into programs that run.

The harness (tests/program_fuzz.py) runs in a subprocess: a value that slipped past the loader
used to abort the process inside XLA, which no ``pytest.raises`` can catch.
"""
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("program_fuzz.py")


def fuzz(seed: int, cases: int, timeout: int) -> str:
    proc = subprocess.run([sys.executable, str(HARNESS), "--seed", str(seed), "--cases", str(cases), "--verbose"],
                          capture_output=True, text=True, timeout=timeout)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
    assert proc.returncode == 0, f"the fuzzer failed or crashed (exit {proc.returncode}); last lines:\n{tail}"
    return proc.stdout.splitlines()[-1]


def test_a_few_hundred_mutated_files_are_refused_or_run():
    summary = fuzz(seed=0, cases=300, timeout=600)
    assert "failures=0" in summary and '"ran": ' in summary


@pytest.mark.slow
def test_ten_thousand_mutated_files_are_refused_or_run():
    summary = fuzz(seed=12345, cases=10_000, timeout=1800)
    assert "failures=0" in summary
