"""GANTrainer: one step is a discriminator update and a generator update through the updated
discriminator (checked against the same two SGD steps written out with jax.grad), both models
change, the discriminator loss falls on a toy distribution, state such as batch statistics is
carried and written back, EMA, logs, progress, plots, and errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax.nn as nn
from paddlejax.train.gan import GANTrainer, sample_grid

REAL = (np.array([3.0, -1.0]) + 0.1 * np.random.default_rng(0).normal(size=(64, 2))).astype(np.float32)


class Toy:
    """Non-saturating GAN on 2-D points: the generator maps 2-D noise to points."""

    def generate(self, generator, batch, key):
        return {"fake": generator(jax.random.normal(key, batch[0].shape))}

    def discriminator_loss(self, discriminator, batch, generated):
        real, fake = discriminator(batch[0]), discriminator(generated["fake"])
        d_real = jnp.mean(jax.nn.softplus(-real))
        return d_real + jnp.mean(jax.nn.softplus(fake)), {"d_real": d_real}

    def generator_loss(self, discriminator, batch, generated):
        return jnp.mean(jax.nn.softplus(-discriminator(generated["fake"]))), {}


def players(seed=0):
    nn.seed(seed)
    return nn.Linear(2, 2), nn.Linear(2, 1)


def values(model):
    return {k: np.asarray(v) for k, v in nn.state_dict(model).items()}


def test_one_step_is_a_discriminator_then_a_generator_sgd_step():
    g, d = players()
    g0, d0 = values(g), values(d)
    trainer = GANTrainer(g, d, Toy(), optax.sgd(0.1), optax.sgd(0.2), seed=3, progress=False)
    logs = trainer.train_batch(REAL)

    # the same step by hand: the noise is the second half of the split of the trainer's key
    z = jax.random.normal(jax.random.split(jax.random.key(3))[1], REAL.shape)
    fake = z @ g0["weight"] + g0["bias"]

    def disc(p, x):
        return x @ p["weight"] + p["bias"]

    def d_loss(p):
        return jnp.mean(jax.nn.softplus(-disc(p, REAL))) + jnp.mean(jax.nn.softplus(disc(p, fake)))

    d1 = jax.tree.map(lambda p, g: p - 0.2 * g, d0, jax.grad(d_loss)(d0))

    def g_loss(p):  # through the updated discriminator
        return jnp.mean(jax.nn.softplus(-disc(d1, z @ p["weight"] + p["bias"])))

    g1 = jax.tree.map(lambda p, g: p - 0.1 * g, g0, jax.grad(g_loss)(g0))

    assert trainer.step == 1 and set(logs) == {"d_loss", "g_loss", "d_real"}
    assert logs["d_loss"] == pytest.approx(float(d_loss(d0)), rel=1e-5)
    assert logs["g_loss"] == pytest.approx(float(g_loss(g0)), rel=1e-5)
    for got, want, before in ((values(trainer.discriminator_model()), d1, d0),
                              (values(trainer.generator_model()), g1, g0)):
        for name in want:
            assert not np.allclose(got[name], before[name])  # both players moved
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(values(g)["weight"], g0["weight"])  # the models change only on sync
    trainer.sync_models()
    np.testing.assert_allclose(values(g)["weight"], g1["weight"], rtol=1e-5, atol=1e-6)


def test_the_discriminator_loss_falls_on_a_toy_distribution():
    g, d = players()
    trainer = GANTrainer(g, d, Toy(), optax.adam(1e-3), optax.adam(0.05), progress=False)
    losses = [trainer.train_batch(REAL[i % 4 * 16:(i % 4 + 1) * 16])["d_loss"] for i in range(40)]
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])


class BatchNormGenerator(nn.Layer):
    def __init__(self):
        self.fc = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1D(2)

    def forward(self, z):
        return self.bn(self.fc(z))


def test_fit_carries_batch_statistics_logs_and_writes_the_models_back(capsys):
    nn.seed(0)
    g, d = BatchNormGenerator(), nn.Linear(2, 1)
    g.eval()  # the trainer trains copies in training mode; the originals keep their mode
    trainer = GANTrainer(g, d, Toy(), progress="epoch", log_every=2)
    history = trainer.fit((REAL[:40],), epochs=3, batch_size=16)  # 2 steps an epoch: the last 8 are dropped
    assert trainer.step == 6 and trainer.epoch == 3
    assert history.series("train", "d_loss")[0] == [2, 4, 6]
    assert [s for s, _ in history.records["epoch"]["g_loss"]] == [0, 1, 2]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 3 and lines[0].startswith("epoch 1/3: d_loss=") and " g_loss=" in lines[0]
    assert not g.training
    # batch statistics moved in the steps' forward passes, and were written back
    assert not np.allclose(g.bn.mean[...], 0.0)
    np.testing.assert_array_equal(g.bn.mean[...], trainer.state.g_rest["bn"]["mean"][...])
    assert not trainer.generator_model().training
    trainer.fit((REAL[:40],), epochs=1, batch_size=16)  # a second fit goes on counting
    assert trainer.epoch == 4 and [s for s, _ in history.records["epoch"]["g_loss"]] == [0, 1, 2, 3]


def test_ema_averages_the_generator_with_paddles_warm_up():
    g, d = players()
    g0 = values(g)
    trainer = GANTrainer(g, d, Toy(), optax.sgd(0.5), ema=0.9, progress=False)
    trainer.train_batch(REAL)
    g1 = {k: np.asarray(v) for k, v in nn.state_dict(nnx.merge(trainer._g_def, trainer.state.g_params,
                                                                trainer.state.g_rest)).items()}
    decay = min(0.9, 1 / 10)  # step 0
    for name, value in values(trainer.generator_model()).items():
        np.testing.assert_allclose(value, decay * g0[name] + (1 - decay) * g1[name], rtol=1e-6)


def test_plots(tmp_path):
    g, d = players()
    trainer = GANTrainer(g, d, Toy(), progress=False, log_every=1)
    trainer.fit((REAL,), epochs=1, batch_size=32)
    assert trainer.plot(str(tmp_path / "losses.png")) == str(tmp_path / "losses.png")
    path = sample_grid(np.linspace(-1, 1, 6 * 3 * 4 * 4).reshape(6, 3, 4, 4), str(tmp_path / "grid.png"), nrow=3,
                       row_labels=["a", "b"], title="six")
    import matplotlib.image

    assert matplotlib.image.imread(path).ndim == 3
    with pytest.raises(ValueError, match=r"sample_grid: row_labels expects 2 labels \(one per row\), got 1"):
        sample_grid(np.zeros((6, 1, 4, 4)), str(tmp_path / "bad.png"), nrow=3, row_labels=["a"])
    with pytest.raises(ValueError, match=r"sample_grid: images expects a non-empty \[N, C, H, W\] array"):
        sample_grid(np.zeros((6, 2, 4, 4)), str(tmp_path / "bad.png"))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(generator=lambda z: z), TypeError, "GANTrainer: generator expects an nnx.Module"),
    (dict(objective=object()), TypeError, "objective expects generate, discriminator_loss and generator_loss"),
    (dict(ema=1.0), ValueError, r"GANTrainer: ema expects a decay in \(0, 1\) or None, got 1.0"),
    (dict(progress="bar"), ValueError, "GANTrainer: progress expects True, False or 'epoch'"),
    (dict(log_every=0), ValueError, "GANTrainer: log_every expects an int >= 1"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    g, d = players()
    args = {"generator": g, "discriminator": d, "objective": Toy(), **kwargs}
    players_and_objective = [args.pop(k) for k in ("generator", "discriminator", "objective")]
    with pytest.raises(error, match=match):
        GANTrainer(*players_and_objective, **args)


def test_fit_refuses_a_bad_epoch_count():
    with pytest.raises(ValueError, match="GANTrainer.fit: epochs expects an int >= 1, got 0"):
        GANTrainer(*players(), Toy(), progress=False).fit((REAL,), epochs=0)
