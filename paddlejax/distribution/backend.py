"""The library that computes the densities, samplers, entropies and KL divergences behind
:mod:`paddlejax.distribution`: TensorFlow Probability's JAX substrate (the ``prob`` extra).

paddlejax keeps Paddle's names, signatures and conventions on top of it and derives no density
itself. It is imported through :func:`paddlejax._extras.require`, so a missing install says
which extra to add.

>>> float(tfd.Normal(0.0, 1.0).cdf(0.0))
0.5
"""
import warnings

from paddlejax._extras import require

with warnings.catch_warnings():
    # its JAX backend registers an array type through an alias that JAX has deprecated
    warnings.filterwarnings("ignore", message="jax.core.pytype_aval_mappings", category=DeprecationWarning)
    tfp = require("tensorflow_probability.substrates.jax", extra="prob", feature="pj.distribution")

tfd = tfp.distributions
tfb = tfp.bijectors
