"""Every notebook in notebooks/ executes without a cell error."""
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow  # a notebook runs for 20-110 s

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory):
    """A folder holding a ``python3`` kernelspec that runs this very interpreter.

    Put first on ``JUPYTER_PATH``, it wins over any other ``python3`` kernel (a user-level
    one may point at a different Python without paddlejax).
    """
    from ipykernel.kernelspec import make_ipkernel_cmd, write_kernel_spec

    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "python3", overrides={"argv": make_ipkernel_cmd(executable=sys.executable)})
    return root


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_path, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors


def test_notebooks_found():
    assert NOTEBOOKS, "no notebooks in notebooks/"
