"""Test setup: several CPU devices (for shard_map tests) before JAX starts its backend."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
