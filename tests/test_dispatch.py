"""CPU calls run on the calling thread when asked (PADDLEJAX_CPU_DISPATCH=sync), and the
inference commands ask for it; switching after JAX has run is refused by name."""
import os
import subprocess
import sys

import jax
import pytest

from paddlejax import dispatch

# a call that computes for tens of milliseconds: handed over, it is not done when the call returns
READY = """
import jax, jax.numpy as jnp
{before}
from paddlejax.dispatch import cpu_dispatch
f = jax.jit(lambda x: jax.lax.fori_loop(0, 10, lambda i, y: jnp.tanh(y @ x), x))
x = jnp.ones((512, 512)) / 512
f(x).block_until_ready()
ready = []
for _ in range(3):
    y = f(x)
    ready.append(y.is_ready())
    y.block_until_ready()
print(cpu_dispatch(), all(ready), not any(ready))
"""


def python(code: str, mode: str | None, before: str = "import paddlejax") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != dispatch.ENV}
    env |= {"JAX_PLATFORMS": "cpu"} | ({dispatch.ENV: mode} if mode is not None else {})
    return subprocess.run([sys.executable, "-c", code.format(before=before)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_sync_runs_the_call_on_the_caller_so_its_result_is_ready_when_the_call_returns():
    out = python(READY, "sync")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sync", "True", "False"]


def test_without_the_variable_jax_keeps_asynchronous_dispatch():
    out = python(READY, None)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["async", "False", "True"]


def test_a_mode_asked_for_after_jax_ran_warns_and_changes_nothing():
    out = python(READY, "sync", before="jax.numpy.ones(2).block_until_ready()\nimport paddlejax")
    assert out.returncode == 0, out.stderr
    assert "cannot switch CPU dispatch to 'sync'" in out.stderr and "PADDLEJAX_CPU_DISPATCH=sync" in out.stderr
    assert out.stdout.split() == ["async", "False", "True"]


def test_an_unknown_mode_in_the_environment_is_refused_at_import():
    out = python("import paddlejax", "fast")
    assert out.returncode != 0
    assert "PADDLEJAX_CPU_DISPATCH must be one of ('sync', 'async'), got 'fast'" in out.stderr


def test_set_cpu_dispatch_after_jax_ran_names_the_way_to_choose_in_time():
    jax.numpy.ones(1).block_until_ready()
    other = "sync" if dispatch.cpu_dispatch() == "async" else "async"
    with pytest.raises(RuntimeError, match=f"before the first JAX computation.*{dispatch.ENV}={other}"):
        dispatch.set_cpu_dispatch(other)
    dispatch.set_cpu_dispatch(dispatch.cpu_dispatch())  # the mode in force: nothing to do
    with pytest.raises(ValueError, match="one of"):
        dispatch.set_cpu_dispatch("threads")


CLI = """
import sys
from paddlejax.cli.main import main
from paddlejax.dispatch import cpu_dispatch
code = main(sys.argv[1:])
print(code, cpu_dispatch())
"""


@pytest.mark.parametrize("mode, expected", [(None, "sync"), ("async", "async")])
def test_paddlejax_run_calls_on_the_caller_unless_the_environment_says_otherwise(tmp_path, mode, expected):
    import jax.numpy as jnp
    import numpy as np

    import paddlejax as pj

    pj.save(pj.trace(lambda x: pj.ops.relu(x), jnp.ones((2, 3))), tmp_path / "m")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    env = {k: v for k, v in os.environ.items() if k != dispatch.ENV} | {"JAX_PLATFORMS": "cpu"}
    env |= {dispatch.ENV: mode} if mode else {}
    out = subprocess.run([sys.executable, "-c", CLI, "run", str(tmp_path / "m"), "--input", str(tmp_path / "x.npy")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["0", expected]
