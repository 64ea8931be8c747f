"""Optimizer companions in Paddle's names: ``pj.optimizer.lr`` holds the learning-rate schedulers
(``paddle.optimizer.lr``) as optax schedules; the optimizers themselves are optax's.

>>> import optax, paddlejax as pj
>>> tx = optax.adam(learning_rate=pj.optimizer.lr.CosineAnnealingDecay(1e-3, T_max=100))
"""
from paddlejax.optimizer import lr  # noqa: F401
