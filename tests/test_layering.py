"""The architecture's rules, checked on the source: layers point down, one JAX adapter."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL = ["paddlejax/ops", "paddlejax/ir", "paddlejax/capture.py", "paddlejax/lowering.py",
          "paddlejax/io.py", "paddlejax/stablehlo.py", "paddlejax/adapter.py", "paddlejax/analysis.py",
          "paddlejax/nancheck.py", "paddlejax/autodiff.py", "paddlejax/execution.py", "paddlejax/table.py",
          "paddlejax/files.py", "paddlejax/arrays.py", "paddlejax/convert", "paddlejax/host_memory.py",
          "paddlejax/dispatch.py", "paddlejax/sparse"]
RUNTIME = ["paddlejax/nn", "paddlejax/train", "paddlejax/data", "paddlejax/geometric", "paddlejax/static.py",
           "paddlejax/distributed", "paddlejax/inference.py", "paddlejax/hapi.py", "paddlejax/optimizer",
           "paddlejax/streaming.py", "paddlejax/distribution", "paddlejax/boxes.py"]
# The package face (lazy sub-packages, optional extras) and the command line, on top of all.
TOP = ["paddlejax/__init__.py", "paddlejax/_extras.py", "paddlejax/cli"]


def imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def files(*parts):
    for part in parts:
        p = ROOT / part
        yield from (p.rglob("*.py") if p.is_dir() else [p])


def test_every_module_of_the_package_has_its_layer():
    placed = {ROOT / p for p in KERNEL + RUNTIME + TOP}
    unplaced = sorted(p.name for p in (ROOT / "paddlejax").iterdir()
                      if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p not in placed)
    assert unplaced == [], "add these to a layer here and in CONTRIBUTING.md"


def test_contributing_names_every_layer_folder():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for folder in ("paddlejax/ops", "paddlejax/ir", "passes/", "models/", "slim/", "hub/", "paddlejax/cli/",
                   "paddlejax/nn", "paddlejax/train", "paddlejax/distributed", "paddlejax/adapter.py"):
        assert f"`{folder}" in text, folder


def test_only_the_adapter_touches_jax_internals():
    users = sorted(str(f.relative_to(ROOT)) for f in files("paddlejax", "passes", "models", "slim", "hub")
                   if any(n.startswith(("jax.extend", "jax.interpreters")) for n in imports(f)))
    assert users == ["paddlejax/adapter.py"]


def test_kernel_does_not_import_upper_layers():
    upper = ("paddlejax.passes", "paddlejax.models", "paddlejax.slim", "paddlejax.hub", "paddlejax.cli")
    bad = {str(f.relative_to(ROOT)): sorted(n for n in imports(f) if n.startswith(upper))
           for f in files(*KERNEL)}
    assert {k: v for k, v in bad.items() if v} == {}


def test_runtime_does_not_import_models_slim_hub_or_the_cli():
    upper = ("paddlejax.models", "paddlejax.slim", "paddlejax.hub", "paddlejax.cli")
    bad = {str(f.relative_to(ROOT)): sorted(n for n in imports(f) if n.startswith(upper))
           for f in files(*RUNTIME)}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_ir_imports_neither_lowering_nor_execution_when_loaded():
    # Program is data: running it belongs to paddlejax.execution, which ``prog(x)`` reaches only
    # when called (a function-level import), never when the IR is imported.
    lowering = ("paddlejax.lowering", "paddlejax.execution", "paddlejax.passes", "paddlejax.capture")
    bad = {}
    for f in files("paddlejax/ir"):
        top = [n for n in ast.parse(f.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
        if any(n.startswith(lowering) for n in names):
            bad[str(f.relative_to(ROOT))] = sorted(n for n in names if n.startswith(lowering))
    assert bad == {}


def test_passes_import_only_the_kernel():
    allowed = ("paddlejax.ir", "paddlejax.ops", "paddlejax.lowering", "paddlejax.capture", "paddlejax.analysis",
               "paddlejax.passes", "paddlejax.table")
    bad = {str(f.relative_to(ROOT)): sorted(n for n in imports(f) if n.startswith("paddlejax")
                                            and not n.startswith(allowed)) for f in files("passes")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_import_is_lazy_about_sub_packages():
    code = ("import sys, paddlejax as pj; assert 'paddlejax.passes' not in sys.modules; "
            "pj.passes; assert 'paddlejax.passes' in sys.modules; import paddlejax.models, paddlejax.hub")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_models_do_not_import_slim_hub_or_the_cli():
    upper = ("paddlejax.slim", "paddlejax.hub", "paddlejax.cli")
    bad = {str(f.relative_to(ROOT)): sorted(n for n in imports(f) if n.startswith(upper)) for f in files("models")}
    assert {k: v for k, v in bad.items() if v} == {}
