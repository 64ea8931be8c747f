"""donate: which inputs' buffers the outputs may take, and Program.compile(donate=True) using them."""
import jax
import jax.numpy as jnp
import numpy as np

import paddlejax as pj


def sgd_step(p, w, g):
    """An update program: the new weights have the old ones' type, the loss does not."""
    return w - p["lr"] * g, jnp.sum(g * g)


def program():
    return pj.trace(sgd_step, pj.InputSpec((8, 4)), pj.InputSpec((8, 4)), params={"lr": jnp.float32(0.1)})


def test_each_output_takes_one_dead_input_of_its_type():
    donated = pj.passes.run(program(), "donate")
    assert str(donated).splitlines()[-2] == "  return %2, %4 {donate=(0,)}"
    assert donated.body.terminator.attrs["donate"] == (0,)


def test_nothing_to_donate_leaves_the_program_unchanged():
    for prog in (pj.trace(lambda x: x.sum(axis=0), pj.InputSpec((3, 4))),  # no output of an input's type
                 pj.trace(lambda x: (x, x * 2.0), pj.InputSpec((3,)))):   # x is returned: not dead
        result = pj.passes.get_pass("donate").apply(out := prog.clone(), pj.passes.PassContext())
        assert not result.changed and result.stats == {"donated": 0} and str(out) == str(prog)


def test_compiled_program_writes_into_the_donated_input():
    prog = pj.passes.run(program(), "donate")
    w, g = jnp.ones((8, 4)), jnp.full((8, 4), 2.0)
    for frozen in (False, True):
        f = prog.compile(w, g, donate=True, freeze_params=frozen)
        assert f.func.memory_analysis().alias_size_in_bytes == w.nbytes
        w_in, g_in = jnp.array(w), jnp.array(g)
        new, loss = f(w_in, g_in)
        assert w_in.is_deleted() and not g_in.is_deleted()
        np.testing.assert_allclose(new, w - 0.2, rtol=1e-6)
        assert float(loss) == 128.0


def test_without_donate_the_inputs_stay_usable():
    prog = pj.passes.run(program(), "donate")
    w = jnp.ones((8, 4))
    f = prog.compile(w, w)
    assert f.func.memory_analysis().alias_size_in_bytes == 0
    f(w, w)
    assert not w.is_deleted() and float(w.sum()) == 32.0


def test_donation_survives_save_and_load(tmp_path):
    prog = pj.passes.run(program(), "donate")
    pj.save(prog, tmp_path / "step")
    loaded = pj.load(tmp_path / "step")
    assert str(loaded) == str(prog) and loaded.body.terminator.attrs["donate"] == (0,)


def test_compiled_call_checks_the_input_structure():
    f = program().compile()
    try:
        f((jnp.ones((8, 4)), jnp.ones((8, 4))))
    except TypeError as e:
        assert "expects inputs structured as" in str(e)
    else:
        raise AssertionError("a wrongly structured input was accepted")
    assert jax.tree.leaves(f(jnp.ones((8, 4)), jnp.ones((8, 4))))[1].shape == ()
