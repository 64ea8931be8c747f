"""Test setup: several CPU devices (for shard_map tests) before JAX starts its backend, and an
autotune cache of the test run's own (so no user cache is read or written)."""
import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="paddlejax-tests-"), "autotune.json")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
