"""The distribution tests run in float64 (distributions built inside a test take float64
parameters from Python numbers) and share a moment check."""
import jax
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def _assert_moments(samples, mean, variance):
    """Sample mean and variance (over axis 0) within 5 standard errors of ``mean``, ``variance``."""
    samples = np.asarray(samples, np.float64)
    n = samples.shape[0]
    centred = samples - samples.mean(0)
    m2, m4 = (centred ** 2).mean(0), (centred ** 4).mean(0)
    np.testing.assert_array_less(np.abs(samples.mean(0) - mean), 5 * np.sqrt(variance / n) + 1e-12)
    np.testing.assert_array_less(np.abs(m2 - variance), 5 * np.sqrt((m4 - m2 ** 2) / n) + 1e-12)


@pytest.fixture
def assert_moments():
    return _assert_moments
