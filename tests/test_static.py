"""to_static: a dygraph NNX model as a Program, in inference or training mode."""
import jax.numpy as jnp
import numpy as np
from flax import nnx

import paddlejax as pj


class Net(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.fc = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)

    def __call__(self, x):
        return self.bn(self.fc(x))


def test_eval_program_uses_running_statistics_and_matches_the_model():
    model = Net()
    model.bn.mean.set_value(jnp.full(4, 0.5))
    prog = pj.to_static(model, pj.InputSpec((None, 3)))
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    model.eval()
    np.testing.assert_allclose(prog(x), model(x), rtol=1e-6)
    assert "layers" not in str(prog) and "param @bn.mean" in str(prog)


def test_train_program_returns_state_updates_and_leaves_the_model_alone():
    model = Net()
    prog = pj.to_static(model, pj.InputSpec((None, 3)), train=True)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    out, updates = prog(x)
    assert sorted(updates) == ["bn.mean", "bn.var"]
    h = x @ np.asarray(model.fc.kernel.get_value()) + np.asarray(model.fc.bias.get_value())
    np.testing.assert_allclose(updates["bn.mean"], 0.5 * h.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.mean(0), np.zeros(4), atol=1e-5)  # batch statistics
    assert np.all(np.asarray(model.bn.mean.get_value()) == 0)


def test_train_and_eval_programs_save_and_load(tmp_path):
    model = Net()
    prog = pj.to_static(model, pj.InputSpec((None, 3)), train=True)
    pj.save(prog, str(tmp_path / "net"))
    loaded = pj.load(str(tmp_path / "net"))
    x = np.ones((2, 3), np.float32)
    out, updates = loaded(x)
    ref_out, ref_updates = prog(x)
    np.testing.assert_allclose(out, ref_out)
    np.testing.assert_allclose(updates["bn.var"], ref_updates["bn.var"])
