"""Quantization-aware training (PaddleSlim's ``quant_aware`` and ``convert``).

Train the model with fake-quant ops in its program, so it learns weights that survive int8,
then convert the trained program to int8 kernels. With the Trainer, the ``quant_aware`` pass
runs on the programs it captures, and its activation scales train with the model:

>>> import numpy as np, optax, paddlejax as pj
>>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
>>> y = (x[:, 0] > 0).astype("int32")
>>> trainer = pj.Trainer(pj.nn.Linear(4, 2), optax.adam(0.05), passes="quant_aware", progress=False)
>>> _ = trainer.fit((x, y), epochs=10, batch_size=16)
>>> int8 = pj.slim.convert(trainer.inference_program())
>>> [op.type for op in int8.walk() if op.type != "param"]
['quantize', 'quantized_linear', 'return']
>>> bool((np.asarray(int8(x)).argmax(1) == y).mean() > 0.9)
True
"""
from __future__ import annotations

from paddlejax.ir.core import Program
from paddlejax.passes import run as run_passes
from paddlejax.passes.quant import QuantAware


def quant_aware(program: Program, *, training: bool = False, ops: str = "conv2d:depthwise_conv2d:linear:matmul",
                skip: str = "", weight_bits: int = 8, act_bits: int = 8, channel_wise: bool = True,
                moving_rate: float = 0.9) -> Program:
    """A copy of ``program`` with fake-quant for training: the ``quant_aware`` pass (see
    :class:`paddlejax.passes.QuantAware` for the options). ``training=True`` for a program
    captured with ``to_static(model, train=True)``, whose activation scales then update on
    every call and come back among its updates.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 2)),
    ...                 params={"w": jnp.ones((2, 3))})
    >>> [op.type for op in quant_aware(prog).walk() if op.type != "param"]
    ['abs_max', 'fake_quantize', 'fake_quantize', 'linear', 'return']
    """
    qat = QuantAware(ops=ops, skip=skip, weight_bits=weight_bits, act_bits=act_bits, channel_wise=channel_wise,
                     moving_rate=moving_rate)
    return run_passes(program, [qat], training=training)


def convert(program: Program) -> Program:
    """The int8 program of a fake-quantized one (after ``quant_aware`` training or PTQ
    calibration): ``convert_int8`` then ``dce``, so the float weights are gone and the saved
    file holds int8 ones.

    >>> import jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 2)),
    ...                 params={"w": jnp.ones((2, 3))})
    >>> sorted(convert(quant_aware(prog)).used_params())
    ['w.input_scale', 'w.int8', 'w.quant_scale']
    """
    return run_passes(program, "convert_int8,dce")
