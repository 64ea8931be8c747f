"""The GAN zoo: output shapes and structure of DCGAN (conditional, spectral norm), Pix2Pix
(U-Net, PatchGAN) and CycleGAN (ResNet) networks, capture and saved programs, the adversarial
losses against numpy, the objectives (CycleGAN's cycle and identity terms by hand), and short
trainings: one DCGAN step moves both players, Pix2Pix lowers its L1 on a tiny batch."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
import paddlejax.nn as nn
from paddlejax.models.gan import (CycleGANGenerator, DCGANDiscriminator, DCGANGenerator, PatchGANDiscriminator,
                                  Pix2PixGenerator, ResnetBlock)
from paddlejax.models.gan_objectives import CycleGANObjective, DCGANObjective, Pix2PixObjective, gan_loss
from paddlejax.train.gan import GANTrainer

rng = np.random.default_rng(0)
IMAGES = rng.uniform(-1, 1, size=(4, 1, 16, 16)).astype(np.float32)
LABELS = np.array([0, 3, 9, 3], np.int32)


def tiny_dcgan(**kwargs):
    nn.seed(0)
    return (DCGANGenerator(latent_dim=8, num_classes=10, image_size=16, base_channels=4),
            DCGANDiscriminator(num_classes=10, image_size=16, base_channels=4, **kwargs))


@pytest.mark.parametrize("factory, inputs, want", [
    (lambda: DCGANGenerator(latent_dim=8, image_size=8, base_channels=4), (np.zeros((2, 8), np.float32),),
     (2, 1, 8, 8)),
    (lambda: DCGANGenerator(latent_dim=8, num_classes=10, image_size=32, channels=3, base_channels=4,
                            embed_dim=5), (np.zeros((2, 8), np.float32), np.array([1, 2])), (2, 3, 32, 32)),
    (lambda: DCGANDiscriminator(image_size=32, channels=3, base_channels=4), (np.zeros((2, 3, 32, 32), np.float32),),
     (2,)),
    (lambda: DCGANDiscriminator(num_classes=10, image_size=16, base_channels=4, spectral_norm=False,
                                condition="concat"), (IMAGES, LABELS), (4,)),
    (lambda: Pix2PixGenerator(2, 3, num_downs=5, base_channels=4), (np.zeros((1, 2, 32, 64), np.float32),),
     (1, 3, 32, 64)),
    (lambda: PatchGANDiscriminator(2, base_channels=4, n_layers=3), (np.zeros((1, 2, 32, 32), np.float32),),
     (1, 1, 2, 2)),
    (lambda: CycleGANGenerator(3, 1, base_channels=4, n_blocks=1, n_downsampling=3),
     (np.zeros((1, 3, 16, 24), np.float32),), (1, 1, 16, 24)),
])
def test_output_shapes(factory, inputs, want):
    assert nnx.eval_shape(lambda *a: factory()(*a), *inputs).shape == want


def test_dcgan_layer_stacks():
    g = nnx.eval_shape(lambda: DCGANGenerator(latent_dim=100, num_classes=10, image_size=64))
    convs = [layer.weight.shape for layer in g.net if isinstance(layer, nn.Conv2DTranspose)]
    assert convs == [(110, 512, 4, 4), (512, 256, 4, 4), (256, 128, 4, 4), (128, 64, 4, 4), (64, 1, 4, 4)]
    assert g.embedding.weight.shape == (10, 10)
    with_sn = nnx.eval_shape(lambda: DCGANDiscriminator(num_classes=10, image_size=16, base_channels=4))
    names = set(nn.state_dict(with_sn))
    assert {"head.layer.weight", "head.spectral_norm.weight_u", "embedding.layer.weight",
            "features.0.spectral_norm.weight_v"} <= names
    assert not any(isinstance(layer, nn.BatchNorm2D) for layer in with_sn.features)
    plain = nnx.eval_shape(lambda: DCGANDiscriminator(image_size=16, base_channels=4, spectral_norm=False))
    assert [type(layer).__name__ for layer in plain.features] == ["Conv2D", "LeakyReLU", "Conv2D", "BatchNorm2D",
                                                                  "LeakyReLU"]
    assert plain.embedding is None and plain.head.weight.shape == (8 * 16, 1)


def test_pix2pix_and_cyclegan_follow_paddlegan():
    unet = nnx.eval_shape(lambda: Pix2PixGenerator(3, 3, num_downs=8))
    # dropout after the three middle decoder levels that keep 512 channels (num_downs - 5)
    assert [any(isinstance(m, nn.Dropout) for m in up) for up in unet.ups] == [False] * 4 + [True] * 3 + [False]
    assert [down[1].weight.shape[0] for down in list(unet.downs)[1:]] == [128, 256, 512, 512, 512, 512, 512]
    assert unet.ups[1][1].weight.shape == (256, 64, 4, 4)  # the skip doubles the decoder's input
    patch = nnx.eval_shape(lambda: PatchGANDiscriminator(6))
    assert [c.weight.shape[:2] for c in patch.net if isinstance(c, nn.Conv2D)] == [
        (64, 6), (128, 64), (256, 128), (512, 256), (1, 512)]
    resnet = nnx.eval_shape(lambda: CycleGANGenerator(3, 3, n_blocks=9))
    assert sum(isinstance(layer, ResnetBlock) for layer in resnet.net) == 9
    norms = [layer for layer in resnet.net if isinstance(layer, nn.InstanceNorm2D)]
    assert len(norms) == 5 and all(n.scale is None for n in norms)
    assert resnet.net[0].weight.shape == (64, 3, 7, 7) and resnet.net[0].bias is not None


def test_conditional_generator_depends_on_the_label_and_samples_from_the_key():
    g, _ = tiny_dcgan()
    g.eval()
    z = rng.normal(size=(2, 8)).astype(np.float32)
    assert not np.allclose(g(z, np.array([1, 1])), g(z, np.array([1, 2])))
    a, b = g.sample(jax.random.key(0), LABELS), g.sample(jax.random.key(0), LABELS)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, g(jax.random.normal(jax.random.key(0), (4, 8)), LABELS), rtol=1e-6)
    assert float(jnp.abs(a).max()) <= 1.0


def test_projection_adds_the_label_embedding_times_the_features():
    _, d = tiny_dcgan(spectral_norm=False)
    d.eval()
    h = np.asarray(d.features(IMAGES)).reshape(4, -1)
    want = h @ np.asarray(d.head.weight[...])[:, 0] + np.asarray(d.head.bias[...])[0]
    want += np.sum(np.asarray(d.embedding.weight[...])[LABELS] * h, axis=1)
    np.testing.assert_allclose(d(IMAGES, LABELS), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, build, inputs", [
    ("dcgan-g", lambda: tiny_dcgan()[0], (np.zeros((3, 8), np.float32) + 0.5, LABELS[:3])),
    ("dcgan-d", lambda: tiny_dcgan()[1], (IMAGES, LABELS)),
    ("pix2pix", lambda: Pix2PixGenerator(1, 1, num_downs=4, base_channels=4), (IMAGES,)),
    ("patchgan", lambda: PatchGANDiscriminator(2, base_channels=4, n_layers=2), (np.concatenate([IMAGES] * 2, 1),)),
    ("cyclegan", lambda: CycleGANGenerator(1, 1, base_channels=4, n_blocks=2), (IMAGES,)),
])
def test_traces_saves_and_loads_with_equal_outputs(name, build, inputs, tmp_path):
    model = build()
    model(*inputs)  # a training-mode call: batch statistics and spectral-norm vectors move off their start
    model.eval()
    want = np.asarray(nnx.jit(lambda m, *a: m(*a))(model, *inputs))
    program = pj.trace(model, *inputs)
    np.testing.assert_allclose(program(*inputs), want, rtol=1e-5, atol=1e-5)
    pj.save(program, tmp_path / name)
    np.testing.assert_allclose(pj.load(tmp_path / name)(*inputs), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: DCGANGenerator(image_size=24), r"DCGANGenerator: argument 'image_size' expects a power of 2 >= 8"),
    (lambda: DCGANDiscriminator(condition="add"), r"DCGANDiscriminator: argument 'condition' expects one of"),
    (lambda: Pix2PixGenerator(norm="layer"), r"Pix2PixGenerator: argument 'norm' expects one of"),
    (lambda: tiny_dcgan()[0](np.zeros((2, 8), np.float32)),
     r"DCGANGenerator: input 'labels' is required \(a conditional model, num_classes=10\)"),
    (lambda: tiny_dcgan()[0](np.zeros((2, 7), np.float32), LABELS[:2]),
     r"DCGANGenerator: input 'z' expects shape \[N, 8\], got \(2, 7\)"),
    (lambda: tiny_dcgan()[1](IMAGES, LABELS.astype(np.float32)),
     r"DCGANDiscriminator: input 'labels' expects 4 integer class ids"),
    (lambda: tiny_dcgan()[1](IMAGES[:, :, :8, :8], LABELS),
     r"DCGANDiscriminator: input 'x' expects 16x16 images, got \(4, 1, 8, 8\)"),
    (lambda: DCGANGenerator(latent_dim=4, image_size=8)(np.zeros((1, 4), np.float32), LABELS[:1]),
     r"DCGANGenerator: labels given to an unconditional model"),
    (lambda: Pix2PixGenerator(1, 1, num_downs=5, base_channels=4)(IMAGES),
     r"Pix2PixGenerator: input 'x' expects height and width multiples of 32 \(num_downs=5\)"),
    (lambda: PatchGANDiscriminator(1, base_channels=4)(IMAGES),
     r"PatchGANDiscriminator: input 'x' expects images of at least 24x24 with n_layers=3"),
    (lambda: CycleGANGenerator(1, 1, base_channels=4, n_blocks=1)(IMAGES[:, :, :, :14]),
     r"CycleGANGenerator: input 'x' expects height and width multiples of 4"),
    (lambda: CycleGANGenerator(3, 1, base_channels=4, n_blocks=1)(IMAGES),
     r"CycleGANGenerator: input 'x' expects shape \[N, 3, H, W\]"),
    (lambda: gan_loss(jnp.zeros(2), False, "hinge"), r"gan_loss: the hinge loss of a generator scores its images"),
    (lambda: gan_loss(jnp.zeros(2), True, "wgan"), r"gan_loss: argument 'mode' expects one of"),
    (lambda: Pix2PixObjective(l1_weight=-1), r"Pix2PixObjective: argument 'l1_weight' expects a number >= 0"),
    (lambda: Pix2PixObjective().generate(None, (IMAGES,), None),
     r"Pix2PixObjective: batches expect \(inputs, targets\), got 1 arrays"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("mode", ["vanilla", "lsgan", "hinge"])
def test_gan_losses_match_numpy(mode):
    x = rng.normal(size=(3, 1, 2, 2)).astype(np.float32)
    xs = x.astype(np.float64)
    softplus = lambda v: np.log1p(np.exp(v))  # noqa: E731  (-log sigmoid(-v))
    # (discriminator on real images with label 0.9, on fakes, generator on fakes)
    want = {"vanilla": (np.mean(0.9 * softplus(-xs) + 0.1 * softplus(xs)), np.mean(softplus(xs)),
                        np.mean(softplus(-xs))),
            "lsgan": (np.mean((xs - 0.9) ** 2), np.mean(xs ** 2), np.mean((xs - 1) ** 2)),
            "hinge": (np.mean(np.maximum(0, 1 - xs)), np.mean(np.maximum(0, 1 + xs)), -np.mean(xs))}[mode]
    got = (gan_loss(x, True, mode, for_discriminator=True, real_label=1.0 if mode == "hinge" else 0.9),
           gan_loss(x, False, mode, for_discriminator=True), gan_loss(x, True, mode))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_cyclegan_losses_by_hand():
    # linear "generators" (1x1 convolutions) and "judges", so every term is a numpy one-liner
    def conv(scale, shift):
        layer = nn.Conv2D(1, 1, 1)
        layer.weight.set_value(jnp.full((1, 1, 1, 1), scale))
        layer.bias.set_value(jnp.full((1,), shift))
        return layer

    generators, judges = nn.LayerList([conv(2.0, 0.5), conv(0.25, -0.1)]), nn.LayerList([conv(1.0, 0.0),
                                                                                          conv(-0.5, 0.2)])
    a, b = IMAGES[:2], IMAGES[2:]
    objective = CycleGANObjective(cycle_weight=10.0, identity_weight=0.5, mode="lsgan")
    generated = objective.generate(generators, (a, b), None)
    g_loss, logs = objective.generator_loss(judges, (a, b), generated)
    d_loss, d_logs = objective.discriminator_loss(judges, (a, b), generated)

    ab, ba = (lambda x: 2 * x + 0.5), (lambda x: 0.25 * x - 0.1)
    judge_a, judge_b = (lambda x: x), (lambda x: -0.5 * x + 0.2)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cycle = np.mean(np.abs(ba(ab(a64)) - a64)) + np.mean(np.abs(ab(ba(b64)) - b64))
    identity = np.mean(np.abs(ab(b64) - b64)) + np.mean(np.abs(ba(a64) - a64))
    adv = np.mean((judge_b(ab(a64)) - 1) ** 2) + np.mean((judge_a(ba(b64)) - 1) ** 2)
    d_a = 0.5 * (np.mean((judge_a(a64) - 1) ** 2) + np.mean(judge_a(ba(b64)) ** 2))
    d_b = 0.5 * (np.mean((judge_b(b64) - 1) ** 2) + np.mean(judge_b(ab(a64)) ** 2))
    np.testing.assert_allclose([logs["cycle"], logs["identity"], logs["g_adv"], g_loss],
                               [cycle, identity, adv, adv + 10 * cycle + 5 * identity], rtol=1e-5)
    np.testing.assert_allclose([d_logs["d_a"], d_logs["d_b"], d_loss], [d_a, d_b, d_a + d_b], rtol=1e-5)
    without = CycleGANObjective(identity_weight=0.0)
    assert "idt_a" not in without.generate(generators, (a, b), None)
    assert float(without.generator_loss(judges, (a, b), without.generate(generators, (a, b), None))[1]["identity"]) == 0


def test_one_dcgan_step_moves_both_players_and_their_state():
    g, d = tiny_dcgan()
    g0, d0 = nn.state_dict(g), nn.state_dict(d)
    trainer = GANTrainer(g, d, DCGANObjective("hinge"), progress=False)
    logs = trainer.train_batch(IMAGES, LABELS)
    assert set(logs) == {"d_loss", "g_loss", "d_real", "d_fake"}
    assert logs["d_loss"] == pytest.approx(logs["d_real"] + logs["d_fake"])
    g1, d1 = nn.state_dict(trainer.generator_model()), nn.state_dict(trainer.discriminator_model())
    for before, after in ((g0, g1), (d0, d1)):
        moved = {name for name in before if not np.allclose(before[name], after[name])}
        # every weight and batch statistic, and every power-iteration vector longer than one; biases
        # may have a zero gradient at the start (a hinge loss with all logits inside the margin)
        assert {name for name in before if not name.endswith("bias") and before[name].size > 1} <= moved
    assert {"features.0.spectral_norm.weight_u", "embedding.spectral_norm.weight_v", "net.1.mean"} <= {
        name for name in {**g0, **d0} if not np.allclose({**g0, **d0}[name], {**g1, **d1}[name])}


def test_unconditional_dcgan_trains_on_images_alone():
    nn.seed(0)
    g = DCGANGenerator(latent_dim=4, image_size=8, base_channels=4)
    d = DCGANDiscriminator(image_size=8, base_channels=4)
    trainer = GANTrainer(g, d, DCGANObjective("vanilla", real_label=0.9, conditional=False), progress=False)
    logs = trainer.train_batch(IMAGES[:, :, ::2, ::2])
    assert np.isfinite(list(logs.values())).all()


def test_a_few_pix2pix_steps_lower_the_l1_on_a_tiny_batch():
    from paddlejax.data.digit_domains import edge_map

    nn.seed(0)
    targets = np.tanh(3 * IMAGES)
    inputs = edge_map(targets)
    trainer = GANTrainer(Pix2PixGenerator(1, 1, num_downs=4, base_channels=4),
                         PatchGANDiscriminator(2, base_channels=4, n_layers=2), Pix2PixObjective(),
                         optax.adam(2e-3, b1=0.5), optax.adam(2e-3, b1=0.5), progress=False)
    l1 = [trainer.train_batch(inputs, targets)["l1"] for _ in range(25)]
    assert np.mean(l1[-3:]) < 0.85 * np.mean(l1[:3])
