"""The example scripts run end to end at tiny sizes (their real figures come from full runs)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, tmp_path: Path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def bbc_classifier(tmp_path_factory) -> tuple[str, Path]:
    """bbc_finetune.py's output at tiny settings, and the program it saved."""
    tmp_path = tmp_path_factory.mktemp("bbc")
    out = run_example("bbc_finetune.py", "--limit", "48", "--epochs", "1", "--max-length", "16", "--batch-size", "16",
                      "--no-progress", "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    return out, tmp_path / "out" / "bbc_minilm"


def test_bbc_finetune_trains_saves_and_reloads_the_classifier(bbc_classifier):
    out, saved = bbc_classifier
    assert "BBC News: 48 train / 48 test articles, 16 word pieces each" in out, out
    found = re.search(r"held-out accuracy (\d+\.\d+) % \(48 articles\) .* gives (\d+\.\d+) %", out)
    assert found and found.group(1) == found.group(2), out
    assert saved.with_suffix(".json").exists() and saved.with_suffix(".safetensors").exists()


def test_minilm_int8_compares_int8_and_fp32_sentence_embeddings(tmp_path):
    out = run_example("minilm_int8.py", "--limit", "32", "--calib", "32", "--max-length", "32", "--no-progress",
                      tmp_path=tmp_path)
    assert "int8 program: 30 int8 ops (ops linear but \\.linear2\\., algo hist), calibrated on 32 train" in out, out
    found = re.search(r"32 BBC News sentences \(at most 32 word pieces\): cosine of int8 to fp32 embeddings "
                      r"mean (\d\.\d+), min (\d\.\d+)", out)
    assert found and float(found.group(1)) >= 0.99 and float(found.group(2)) >= 0.95, out


def test_minilm_int8_quantizes_the_fine_tuned_classifier(bbc_classifier, tmp_path):
    _, saved = bbc_classifier
    out = run_example("minilm_int8.py", "--classifier", str(saved), "--limit", "48", "--calib", "32",
                      "--no-progress", tmp_path=tmp_path)
    assert "int8 classifier: 32 int8 ops (ops linear but \\.linear2\\., algo hist), calibrated on 32 train" in out, out
    found = re.search(r"held-out accuracy on 48 BBC News articles \(16 word pieces\): fp32 (\d+\.\d+) %, "
                      r"int8 (\d+\.\d+) %, difference ([-+]\d+\.\d+) points", out)
    assert found, out
    fp32, int8, difference = map(float, found.groups())
    assert abs(difference - (int8 - fp32)) < 0.015, out
