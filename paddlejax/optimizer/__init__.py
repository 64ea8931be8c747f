"""Optimizer companions in Paddle's names: ``pj.optimizer.lr`` holds the learning-rate schedulers
(``paddle.optimizer.lr``) as optax schedules, :func:`lazy_adam` / :func:`lazy_adagrad` the
row-wise optimizers for embedding tables, and :func:`minimize_bfgs` / :func:`minimize_lbfgs` the
quasi-Newton minimisers of ``paddle.incubate.optimizer.functional``; the other optimizers are
optax's.

>>> import optax, paddlejax as pj
>>> tx = optax.adam(learning_rate=pj.optimizer.lr.CosineAnnealingDecay(1e-3, T_max=100))
"""
from paddlejax.optimizer import lr  # noqa: F401
from paddlejax.optimizer.lazy import lazy_adagrad, lazy_adam, lazy_rows  # noqa: F401
from paddlejax.optimizer.quasi_newton import minimize_bfgs, minimize_lbfgs, scale_by_bfgs  # noqa: F401
