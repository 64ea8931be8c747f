"""The example scripts run end to end at tiny sizes (their real figures come from full runs)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # conftest's fake devices
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_bbc_finetune_trains_saves_and_reloads_the_classifier(tmp_path):
    out = run_example("bbc_finetune.py", "--limit", "48", "--epochs", "1", "--max-length", "16", "--batch-size", "16",
                      "--no-progress", "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert "BBC News: 48 train / 48 test articles, 16 word pieces each" in out, out
    found = re.search(r"held-out accuracy (\d+\.\d+) % \(48 articles\) .* gives (\d+\.\d+) %", out)
    assert found and found.group(1) == found.group(2), out
    assert (tmp_path / "out" / "bbc_minilm.json").exists() and (tmp_path / "out" / "bbc_minilm.safetensors").exists()
