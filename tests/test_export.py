"""jax.export artifacts run in a fresh process with nothing but JAX."""
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj


def net(p, x):
    return pj.ops.softmax(pj.ops.linear(pj.ops.relu(x), p["w"], p["b"]))


PARAMS = {"w": jnp.arange(12.0).reshape(4, 3) / 10, "b": jnp.ones(3)}


def test_artifact_runs_in_a_fresh_process_for_any_batch(tmp_path):
    prog = pj.trace(net, pj.InputSpec((None, 4)), params=PARAMS)
    pj.export(prog, tmp_path / "m.stablehlo")
    x = np.linspace(-1, 1, 5 * 4, dtype=np.float32).reshape(5, 4)
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import sys, numpy as np, jax
        exp = jax.export.deserialize(open({str(tmp_path / 'm.stablehlo')!r}, 'rb').read())
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.save({str(tmp_path / 'y5.npy')!r}, np.asarray(exp.call(x)))
        np.save({str(tmp_path / 'y2.npy')!r}, np.asarray(exp.call(x[:2])))
        assert not any(m.startswith('paddlejax') for m in sys.modules), 'paddlejax was imported'
        print(exp.in_avals)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "float32[b,4]" in out.stdout
    want = np.asarray(net(PARAMS, x))
    np.testing.assert_allclose(np.load(tmp_path / "y5.npy"), want, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "y2.npy"), want[:2], atol=1e-6)


def test_static_program_with_batch_dependent_shapes_gets_advice():
    prog = pj.trace(lambda x: x.reshape(x.shape[0] * 2, -1), jnp.ones((4, 6)))
    with pytest.raises(ValueError, match=r"Trace with pj.InputSpec\(\(None, ...\)\)"):
        pj.export(prog)
    exp = pj.export(prog, batch=None)
    assert exp.in_avals[0].shape == (4, 6)


def test_static_program_exports_with_symbolic_batch_when_possible():
    prog = pj.trace(lambda x: pj.ops.relu(x) * 2.0, jnp.ones((4, 6)))
    exp = pj.export(prog)
    assert str(exp.in_avals[0].shape) == "(b, 6)"
    np.testing.assert_allclose(exp.call(-jnp.ones((3, 6))), jnp.zeros((3, 6)))
