"""What the GANs of :mod:`paddlejax.models.gan` optimise: PaddleGAN's adversarial losses
(:func:`gan_loss`: the non-saturating ``"vanilla"`` loss, least squares ``"lsgan"``, ``"hinge"``)
and one objective per model, which :class:`paddlejax.train.gan.GANTrainer` steps (a
discriminator update, then a generator update through the updated discriminator):

- :class:`DCGANObjective`: noise (and the batch's labels) to images, judged against real ones;
- :class:`Pix2PixObjective`: an input image to its target, judged as a pair by a PatchGAN,
  plus ``l1_weight`` times the L1 distance to the target;
- :class:`CycleGANObjective`: two generators between unpaired domains A and B, each output
  judged by its domain's discriminator, plus cycle consistency (A -> B -> A gives A back) and
  identity (a B image given to the A -> B generator stays itself) L1 terms.

>>> import jax.numpy as jnp
>>> float(gan_loss(jnp.array([0.0]), True))    # log 2: the discriminator cannot tell
0.6931471824645996
>>> float(gan_loss(jnp.array([2.0, -0.5]), False, "hinge", for_discriminator=True))  # mean(relu(1 + x))
1.75
"""
from __future__ import annotations

import jax.numpy as jnp

from paddlejax import nn, ops
from paddlejax.nn.args import arg_error, choice, is_number

MODES = ("vanilla", "lsgan", "hinge")


def _number(owner: str, name: str, value, minimum: float = 0.0) -> float:
    if not is_number(value) or value < minimum:
        raise arg_error(owner, name, f"a number >= {minimum}", value)
    return float(value)


def gan_loss(logits, target_is_real: bool, mode: str = "vanilla", *, for_discriminator: bool = False,
             real_label: float = 1.0):
    """PaddleGAN's ``GANLoss``: how far the discriminator's ``logits`` are from calling their
    images real (``target_is_real``) or fake, averaged.

    - ``"vanilla"``: binary cross entropy with the logits toward ``real_label`` (1; 0.9 is
      one-sided label smoothing) or 0. A generator scored with ``target_is_real=True`` gets the
      non-saturating loss ``-log D(G(z))`` of Goodfellow et al.
    - ``"lsgan"``: the squared distance to those targets (Mao et al. 2017).
    - ``"hinge"``: for the discriminator ``relu(1 - logits)`` (real) or ``relu(1 + logits)``
      (fake); for the generator ``-logits`` (Lim & Ye 2017, as SNGAN and BigGAN train).

    >>> import jax.numpy as jnp
    >>> float(gan_loss(jnp.array([1.5]), True, "lsgan", real_label=0.9))
    0.36000001430511475
    """
    mode = choice("gan_loss", "mode", mode, MODES)
    if mode == "hinge":
        if not for_discriminator:
            if not target_is_real:
                raise ValueError("gan_loss: the hinge loss of a generator scores its images as real "
                                 "(target_is_real=True)")
            return -jnp.mean(logits)
        return jnp.mean(nn.functional.relu(1 - logits if target_is_real else 1 + logits))
    target = jnp.full(logits.shape, real_label if target_is_real else 0.0, logits.dtype)
    if mode == "lsgan":
        return nn.functional.mse_loss(logits, target)
    return nn.functional.binary_cross_entropy_with_logits(logits, target)


def _batch(owner: str, batch, names: tuple[str, ...]):
    if not isinstance(batch, (tuple, list)) or len(batch) != len(names):
        raise ValueError(f"{owner}: batches expect ({', '.join(names)}), got "
                         f"{len(batch) if isinstance(batch, (tuple, list)) else type(batch).__name__} arrays")
    return batch


class DCGANObjective:
    """DCGAN on ``(images, labels)`` batches (``conditional=False``: ``(images,)`` batches, or
    labels ignored): the generator (a :class:`~paddlejax.models.gan.DCGANGenerator`) draws one
    image per real image from fresh noise, for the real image's label; the discriminator scores
    real images as real and generated ones as fake (with ``real_label`` < 1, one-sided label
    smoothing of the vanilla and least-squares losses), the generator its images as real.
    Logs ``d_real`` and ``d_fake``, the discriminator's two terms.

    >>> DCGANObjective("hinge").mode
    'hinge'
    """

    def __init__(self, mode: str = "hinge", real_label: float = 1.0, conditional: bool = True):
        self.mode = choice("DCGANObjective", "mode", mode, MODES)
        self.real_label = _number("DCGANObjective", "real_label", real_label)
        self.conditional = conditional

    def _labels(self, batch):
        if self.conditional:
            return _batch("DCGANObjective", batch, ("images", "labels"))
        return batch[0], None

    def generate(self, generator, batch, key):
        """``{"fake": ...}``: one image per real image, from fresh noise, for its label."""
        images, labels = self._labels(batch)
        return {"fake": generator.sample(key, labels, num=images.shape[0])}

    def discriminator_loss(self, discriminator, batch, generated):
        """The real images scored as real plus the generated ones as fake."""
        images, labels = self._labels(batch)
        real = gan_loss(discriminator(images, labels), True, self.mode, for_discriminator=True,
                        real_label=self.real_label)
        fake = gan_loss(discriminator(generated["fake"], labels), False, self.mode, for_discriminator=True)
        return real + fake, {"d_real": real, "d_fake": fake}

    def generator_loss(self, discriminator, batch, generated):
        """The generated images scored as real."""
        _, labels = self._labels(batch)
        return gan_loss(discriminator(generated["fake"], labels), True, self.mode), {}


class Pix2PixObjective:
    """Pix2Pix on ``(inputs, targets)`` batches: the generator (a U-Net) maps inputs to
    outputs; the discriminator (a PatchGAN on input and image concatenated on channels) scores
    ``(input, target)`` as real and ``(input, output)`` as fake, its loss halved as in
    PaddleGAN; the generator's loss is its adversarial term plus ``l1_weight`` (100 in the
    paper) times the mean absolute difference to the target. Logs ``g_adv`` and ``l1``.

    >>> Pix2PixObjective(l1_weight=10).l1_weight
    10.0
    """

    def __init__(self, l1_weight: float = 100.0, mode: str = "vanilla"):
        self.l1_weight = _number("Pix2PixObjective", "l1_weight", l1_weight)
        self.mode = choice("Pix2PixObjective", "mode", mode, MODES)

    def generate(self, generator, batch, key):
        """``{"fake": generator(inputs)}``."""
        inputs, _ = _batch("Pix2PixObjective", batch, ("inputs", "targets"))
        return {"fake": generator(inputs)}

    def discriminator_loss(self, discriminator, batch, generated):
        """Half the sum of (input, target) scored as real and (input, output) as fake."""
        inputs, targets = batch
        real = gan_loss(discriminator(ops.concat(inputs, targets, axis=1)), True, self.mode, for_discriminator=True)
        fake = gan_loss(discriminator(ops.concat(inputs, generated["fake"], axis=1)), False, self.mode,
                        for_discriminator=True)
        return 0.5 * (real + fake), {"d_real": real, "d_fake": fake}

    def generator_loss(self, discriminator, batch, generated):
        """(input, output) scored as real, plus ``l1_weight`` times the L1 distance to the target."""
        inputs, targets = batch
        adv = gan_loss(discriminator(ops.concat(inputs, generated["fake"], axis=1)), True, self.mode)
        l1 = nn.functional.l1_loss(generated["fake"], targets)
        return adv + self.l1_weight * l1, {"g_adv": adv, "l1": l1}


class CycleGANObjective:
    """CycleGAN on ``(a, b)`` batches of two unpaired domains. The generator is a pair of
    generators ``nn.LayerList([a_to_b, b_to_a])``, the discriminator a pair
    ``nn.LayerList([judge_a, judge_b])`` (each judges images of its domain). Per batch:
    ``fake_b = a_to_b(a)``, ``fake_a = b_to_a(b)``, the reconstructions ``rec_a =
    b_to_a(fake_b)`` and ``rec_b = a_to_b(fake_a)``, and the identity mappings ``idt_b =
    a_to_b(b)``, ``idt_a = b_to_a(a)``.

    - discriminator loss: for each domain, half the sum of its real images scored as real and
      the generated ones as fake;
    - generator loss: ``fake_b`` and ``fake_a`` scored as real by their domain's judge, plus
      ``cycle_weight * cycle`` with ``cycle = mean|rec_a - a| + mean|rec_b - b|``, plus
      ``cycle_weight * identity_weight * identity`` with ``identity = mean|idt_b - b| +
      mean|idt_a - a|`` (PaddleGAN's weights: lambda 10, identity 0.5; no identity term, and
      no identity images, at ``identity_weight=0``).

    Logs ``d_a``, ``d_b``, ``g_adv``, ``cycle`` and ``identity`` (unweighted). Generated images
    are not replayed from a pool of earlier ones.

    >>> CycleGANObjective().mode
    'lsgan'
    """

    def __init__(self, cycle_weight: float = 10.0, identity_weight: float = 0.5, mode: str = "lsgan"):
        self.cycle_weight = _number("CycleGANObjective", "cycle_weight", cycle_weight)
        self.identity_weight = _number("CycleGANObjective", "identity_weight", identity_weight)
        self.mode = choice("CycleGANObjective", "mode", mode, MODES)

    def generate(self, generator, batch, key):
        """Both translations, their reconstructions and (with an identity term) the identity mappings."""
        a, b = _batch("CycleGANObjective", batch, ("a", "b"))
        a_to_b, b_to_a = generator
        fake_b, fake_a = a_to_b(a), b_to_a(b)
        out = {"fake_b": fake_b, "fake_a": fake_a, "rec_a": b_to_a(fake_b), "rec_b": a_to_b(fake_a)}
        if self.identity_weight:
            out.update(idt_b=a_to_b(b), idt_a=b_to_a(a))
        return out

    def discriminator_loss(self, discriminator, batch, generated):
        """Each domain's judge: half the sum of its real images as real and the translated ones as fake."""
        a, b = batch
        judge_a, judge_b = discriminator
        terms = {}
        for name, judge, real, fake in (("d_a", judge_a, a, generated["fake_a"]),
                                        ("d_b", judge_b, b, generated["fake_b"])):
            terms[name] = 0.5 * (gan_loss(judge(real), True, self.mode, for_discriminator=True)
                                 + gan_loss(judge(fake), False, self.mode, for_discriminator=True))
        return terms["d_a"] + terms["d_b"], terms

    def generator_loss(self, discriminator, batch, generated):
        """Both translations scored as real by their domain's judge, plus the weighted cycle and identity terms."""
        a, b = batch
        judge_a, judge_b = discriminator
        adv = gan_loss(judge_b(generated["fake_b"]), True, self.mode) + gan_loss(judge_a(generated["fake_a"]), True,
                                                                                 self.mode)
        l1 = nn.functional.l1_loss
        cycle = l1(generated["rec_a"], a) + l1(generated["rec_b"], b)
        identity = l1(generated["idt_b"], b) + l1(generated["idt_a"], a) if self.identity_weight else jnp.float32(0)
        loss = adv + self.cycle_weight * (cycle + self.identity_weight * identity)
        return loss, {"g_adv": adv, "cycle": cycle, "identity": identity}
