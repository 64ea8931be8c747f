"""Adversarial training: :class:`GANTrainer` trains a generator and a discriminator with an
optimizer each, alternating their updates batch by batch as PaddleGAN's models do, on Flax NNX
and Optax; :func:`sample_grid` draws generated images.

What the two players optimise is an *objective* (:class:`GANObjective`), so one trainer serves
DCGAN, Pix2Pix and CycleGAN alike (the model zoo's objectives are in
``paddlejax.models.gan_objectives``). A step is one ``jax.jit`` call:

1. the generator makes everything the losses need from the batch (``generate``), once, keeping
   its backward function (``jax.vjp``);
2. the discriminator takes a step on the real batch against those images (they are constants
   to it);
3. the generator loss is computed through the *updated* discriminator, and its gradient with
   respect to the generated images is pulled back through the generator's forward pass of (1).

So each step runs the generator forward once, as PyTorch's DCGAN reuses its ``fake`` batch for
both updates, and one compiled call does both updates (one dispatch per step; the order of the
two updates is the data dependence between them). Batch-norm statistics and spectral-norm
vectors are carried from step to step like the parameters.

>>> import numpy as np, optax, paddlejax as pj
>>> from flax import nnx
>>> class Toy:   # real samples near 3; the generator shifts noise, the discriminator is logistic
...     def generate(self, generator, batch, key):
...         return {"fake": generator(jax.random.normal(key, batch[0].shape))}
...     def discriminator_loss(self, discriminator, batch, generated):
...         real, fake = discriminator(batch[0]), discriminator(generated["fake"])
...         return jnp.mean(jax.nn.softplus(-real) + jax.nn.softplus(fake)), {}
...     def generator_loss(self, discriminator, batch, generated):
...         return jnp.mean(jax.nn.softplus(-discriminator(generated["fake"]))), {}
>>> data = (3 + 0.1 * np.random.default_rng(0).normal(size=(256, 1))).astype("float32")
>>> trainer = GANTrainer(nnx.Linear(1, 1, rngs=nnx.Rngs(0)), nnx.Linear(1, 1, rngs=nnx.Rngs(1)), Toy(),
...                      optax.adam(0.05), optax.adam(0.05), progress=False)
>>> history = trainer.fit((data,), epochs=15, batch_size=64)
>>> trainer.step, abs(float(trainer.generator_model()(jnp.zeros((1, 1)))[0, 0]) - 3) < 0.5
(60, True)
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from paddlejax._extras import new_figure
from paddlejax.static import set_mode
from paddlejax.train.callbacks import Callback
from paddlejax.train.history import History
from paddlejax.train.progress import ProgressBar
from paddlejax.train.state import moving_average


class GANObjective(Protocol):
    """What a :class:`GANTrainer` optimises. ``batch`` is a tuple of arrays (a loader's batch);
    ``generated`` a dict of float arrays; the losses return ``(scalar loss, {name: scalar})``,
    the dict logged alongside ``d_loss`` and ``g_loss``. All three are traced under ``jax.jit``.

    The generator loss sees the generator only through ``generated``: whatever it needs from
    the generator (fakes, reconstructions, identity mappings) ``generate`` makes.
    """

    def generate(self, generator, batch: tuple, key: jax.Array) -> dict[str, jax.Array]: ...

    def discriminator_loss(self, discriminator, batch: tuple, generated: dict) -> tuple[jax.Array, dict]: ...

    def generator_loss(self, discriminator, batch: tuple, generated: dict) -> tuple[jax.Array, dict]: ...


@struct.dataclass
class GANState:
    """The two players' parameters (``g_params``, ``d_params``: ``nnx.Param``), their other
    variables (``g_rest``, ``d_rest``: batch-norm statistics, spectral-norm vectors, dropout
    keys), optimizer states, the generator's EMA (``None`` without one), the random key and the
    step count. ``jax.jit`` takes and returns it whole.

    >>> [name for name in GANState.__dataclass_fields__][:4]
    ['g_params', 'g_rest', 'd_params', 'd_rest']
    """

    g_params: Any
    g_rest: Any
    d_params: Any
    d_rest: Any
    g_opt: Any
    d_opt: Any
    g_ema: Any
    key: jax.Array
    step: jax.Array


class GANTrainer:
    """Train ``generator`` and ``discriminator`` (NNX modules, e.g. ``paddlejax.nn`` layers) on
    ``objective`` (a :class:`GANObjective`), each with its own optax optimizer (default: Adam,
    learning rate 2e-4, ``b1=0.5``: DCGAN's and PaddleGAN's setting).

    Args:
        ema: decay of an exponential moving average of the generator's parameters (with Paddle's
            warm-up, as the Trainer's ``ema``); :meth:`generator_model` then holds the average,
            which usually samples better than the last step's weights.
        seed: seeds the key the objective draws noise from (``generate``'s ``key``).
        progress: True shows a progress bar per epoch and a line per epoch with the epoch's
            mean losses (``epoch 3/20: d_loss=1.2 g_loss=0.9 ... (4.1 s)``); ``"epoch"`` the
            lines only; False nothing. ``log_every``: steps between entries in :attr:`history`.
        callbacks: :class:`~paddlejax.train.Callback` s; hooks get this trainer.

    The models train in training mode on copies; ``fit`` writes the trained variables back into
    ``generator`` and ``discriminator`` at its end (:meth:`sync_models`). :attr:`history` holds
    the logged losses (phase ``"train"`` by step, ``"epoch"`` means by epoch); :meth:`plot`
    draws them; :attr:`step` and :attr:`epoch` count the steps and epochs of every ``fit``.
    """

    def __init__(self, generator, discriminator, objective: GANObjective,
                 g_optimizer: optax.GradientTransformation | None = None,
                 d_optimizer: optax.GradientTransformation | None = None, *, ema: float | None = None,
                 seed: int = 0, progress: bool | str = True, log_every: int = 10, callbacks: Sequence[Callback] = ()):
        for name, model in (("generator", generator), ("discriminator", discriminator)):
            if not isinstance(model, nnx.Module):
                raise TypeError(f"GANTrainer: {name} expects an nnx.Module (a paddlejax.nn layer), got "
                                f"{type(model).__name__}")
        missing = [m for m in ("generate", "discriminator_loss", "generator_loss")
                   if not callable(getattr(objective, m, None))]
        if missing:
            raise TypeError(f"GANTrainer: objective expects generate, discriminator_loss and generator_loss methods; "
                            f"{type(objective).__name__} lacks {', '.join(missing)}")
        if ema is not None and not (isinstance(ema, float) and 0 < ema < 1):
            raise ValueError(f"GANTrainer: ema expects a decay in (0, 1) or None, got {ema!r}")
        if progress not in (True, False, "epoch"):
            raise ValueError(f"GANTrainer: progress expects True, False or 'epoch', got {progress!r}")
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"GANTrainer: log_every expects an int >= 1, got {log_every!r}")
        self.generator, self.discriminator, self.objective = generator, discriminator, objective
        default = optax.adam(2e-4, b1=0.5, b2=0.999)
        self.g_tx, self.d_tx = g_optimizer or default, d_optimizer or default
        self.ema_decay = ema
        self.progress, self.log_every, self.callbacks = progress, log_every, list(callbacks)
        self.history = History()
        self.epoch = 0
        self.stop_training = False
        self._g_def, g_params, g_rest = _split(generator)
        self._d_def, d_params, d_rest = _split(discriminator)
        state = GANState(g_params=g_params, g_rest=g_rest, d_params=d_params, d_rest=d_rest,
                         g_opt=self.g_tx.init(g_params), d_opt=self.d_tx.init(d_params),
                         g_ema=g_params if ema else None, key=jax.random.key(seed), step=jnp.int32(0))
        # fresh buffers: the step donates its state, which must not free the models' own arrays
        self.state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
        self._step = jax.jit(self._train_step, donate_argnums=0)

    # -- the step ---------------------------------------------------------------------------------
    def _train_step(self, state: GANState, batch: tuple):
        key, noise = jax.random.split(state.key)

        # copy=True: variables made inside each differentiated function, where the forward
        # pass may update them (nnx refuses updates to variables of an outer trace)
        def generate(g_params):
            g = nnx.merge(self._g_def, g_params, state.g_rest, copy=True)
            return self.objective.generate(g, batch, noise), nnx.state(g, nnx.Not(nnx.Param))

        generated, pullback, g_rest = jax.vjp(generate, state.g_params, has_aux=True)

        def d_loss(d_params, d_rest):
            d = nnx.merge(self._d_def, d_params, d_rest, copy=True)
            loss, logs = self.objective.discriminator_loss(d, batch, generated)
            return loss, (logs, nnx.state(d, nnx.Not(nnx.Param)))

        (d_value, (d_logs, d_rest)), d_grads = jax.value_and_grad(d_loss, has_aux=True)(state.d_params, state.d_rest)
        d_updates, d_opt = self.d_tx.update(d_grads, state.d_opt, state.d_params)
        d_params = optax.apply_updates(state.d_params, d_updates)

        def g_loss(generated, d_rest):
            d = nnx.merge(self._d_def, d_params, d_rest, copy=True)
            loss, logs = self.objective.generator_loss(d, batch, generated)
            return loss, (logs, nnx.state(d, nnx.Not(nnx.Param)))

        (g_value, (g_logs, d_rest)), to_generated = jax.value_and_grad(g_loss, has_aux=True)(generated, d_rest)
        (g_grads,) = pullback(to_generated)
        g_updates, g_opt = self.g_tx.update(g_grads, state.g_opt, state.g_params)
        g_params = optax.apply_updates(state.g_params, g_updates)
        g_ema = moving_average(state.g_ema, g_params, self.ema_decay, state.step) if self.ema_decay else None
        new = GANState(g_params=g_params, g_rest=g_rest, d_params=d_params, d_rest=d_rest, g_opt=g_opt, d_opt=d_opt,
                       g_ema=g_ema, key=key, step=state.step + 1)
        return new, {"d_loss": d_value, "g_loss": g_value, **d_logs, **g_logs}

    # -- public API -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps trained so far."""
        return int(self.state.step)

    def train_batch(self, *batch) -> dict[str, float]:
        """One discriminator step and one generator step on ``batch`` (its arrays, as the
        objective takes them); returns the step's logs."""
        self.state, logs = self._step(self.state, tuple(batch))
        return {k: float(v) for k, v in logs.items()}

    def fit(self, data, epochs: int = 1, batch_size: int = 64, shuffle: bool = True, seed: int = 0) -> History:
        """Train ``epochs`` more epochs over ``data`` (a :class:`~paddlejax.data.DataLoader`, or
        arrays / a dataset, batched with ``batch_size``, ``shuffle`` and ``seed``, dropping a last
        smaller batch so that every step has one shape); a callback setting ``stop_training``
        ends it after the current step. Returns :attr:`history`."""
        from paddlejax.data import DataLoader

        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"GANTrainer.fit: epochs expects an int >= 1, got {epochs!r}")
        loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size, shuffle=shuffle,
                                                                       seed=seed, drop_last=True)
        hooks = [ProgressBar(loader, epochs, bar=self.progress is True)] if self.progress else []
        hooks += self.callbacks

        def call(name, *args):
            for hook in hooks:
                getattr(hook, name)(self, *args)

        # a host-side count: reading the state's would wait for every step to finish
        self.stop_training, first, step = False, self.epoch, self.step
        call("on_train_begin")
        try:
            for epoch in range(epochs):  # hooks count this call's epochs; the history all of them
                if self.stop_training:
                    break
                call("on_epoch_begin", epoch)
                sums, count, tic = None, 0, time.perf_counter()
                for batch in loader:
                    self.state, logs = self._step(self.state, tuple(batch))
                    sums = logs if sums is None else jax.tree.map(jnp.add, sums, logs)
                    count, step = count + 1, step + 1
                    if step % self.log_every == 0:
                        logged = {k: float(v) for k, v in logs.items()}
                        self.history.log("train", step, logged)
                        call("on_step_end", step, logged)
                    call("on_train_batch_end", step)
                    if self.stop_training:
                        break
                means = {k: float(v) / count for k, v in sums.items()} if sums else {}
                self.history.log("epoch", first + epoch, means)
                call("on_epoch_end", epoch, {**means, "time": time.perf_counter() - tic})
                self.epoch += 1
        finally:
            self.sync_models()
        call("on_train_end")
        return self.history

    def generator_model(self):
        """A copy of the generator holding the trained weights (the EMA with ``ema``), in eval mode."""
        params = self.state.g_ema if self.ema_decay else self.state.g_params
        return _merged(self._g_def, params, self.state.g_rest)

    def discriminator_model(self):
        """A copy of the discriminator holding the trained weights, in eval mode."""
        return _merged(self._d_def, self.state.d_params, self.state.d_rest)

    def sync_models(self) -> None:
        """Write the trained variables into ``generator`` and ``discriminator`` (the
        generator's last-step weights, not the EMA: :meth:`generator_model` has those)."""
        nnx.update(self.generator, *jax.device_get((self.state.g_params, self.state.g_rest)))
        nnx.update(self.discriminator, *jax.device_get((self.state.d_params, self.state.d_rest)))

    def plot(self, path: str = "gan_losses.png") -> str:
        """The logged losses over the steps as a PNG (:meth:`History.plot`); returns the path."""
        return self.history.plot(path)


def _split(model):
    """``(graphdef, params, other variables)`` of a training-mode copy of ``model``."""
    copy = nnx.clone(model)
    set_mode(copy, True)
    return nnx.split(copy, nnx.Param, ...)


def _merged(graphdef, params, rest):
    model = nnx.merge(graphdef, *jax.device_get((params, rest)))
    set_mode(model, False)
    return model


def sample_grid(images, path: str, nrow: int | None = None, row_labels: Sequence[str] | None = None,
                value_range: tuple[float, float] = (-1.0, 1.0), title: str | None = None) -> str:
    """Save ``images`` (``[N, C, H, W]``, C 1 or 3, values in ``value_range``) as one PNG grid
    at ``path``, ``nrow`` images per row (default: a square grid), with ``row_labels`` written
    left of the rows; returns the path.

    >>> import os, tempfile, numpy as np
    >>> path = sample_grid(np.zeros((6, 1, 8, 8)), os.path.join(tempfile.mkdtemp(), "grid.png"), nrow=3,
    ...                    row_labels=["a", "b"])
    >>> os.path.getsize(path) > 0
    True
    """
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or images.shape[1] not in (1, 3) or len(images) == 0:
        raise ValueError(f"sample_grid: images expects a non-empty [N, C, H, W] array with C 1 or 3, got shape "
                         f"{images.shape}")
    n, c, h, w = images.shape
    nrow = nrow or math.ceil(math.sqrt(n))
    if isinstance(nrow, bool) or not isinstance(nrow, int) or nrow < 1:
        raise ValueError(f"sample_grid: nrow expects an int >= 1, got {nrow!r}")
    rows = math.ceil(n / nrow)
    if row_labels is not None and len(row_labels) != rows:
        raise ValueError(f"sample_grid: row_labels expects {rows} labels (one per row), got {len(row_labels)}")
    low, high = value_range
    scaled = np.clip((images - low) / (high - low), 0, 1).transpose(0, 2, 3, 1)
    grid = np.ones((rows * (h + 1) + 1, nrow * (w + 1) + 1, c), np.float32)  # a white line between images
    for i, image in enumerate(scaled):
        r, col = divmod(i, nrow)
        grid[1 + r * (h + 1):(r + 1) * (h + 1), 1 + col * (w + 1):(col + 1) * (w + 1)] = image
    fig = new_figure("sample_grid", figsize=(max(2.0, 0.45 * nrow * w / 8), max(2.0, 0.45 * rows * h / 8)))
    ax = fig.subplots()
    ax.imshow(grid[..., 0] if c == 1 else grid, cmap="gray" if c == 1 else None, vmin=0, vmax=1,
              interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([(r + 0.5) * (h + 1) for r in range(rows)] if row_labels is not None else [])
    if row_labels is not None:
        ax.set_yticklabels(list(row_labels))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
