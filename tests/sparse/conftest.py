"""Random sparse tensors with their dense numpy twin, duplicates included."""
import numpy as np
import pytest


def make_coo(shape, nnz, seed=0, dense_dims=0, duplicates=True, dtype=np.float32, index_dtype=np.int32):
    """Paddle-layout ``indices`` [sparse_dim, nnz], ``values`` [nnz, *dense] and the dense array they
    sum to (duplicate positions add, as np.add.at adds them)."""
    rng = np.random.default_rng(seed)
    sparse_shape = shape[:len(shape) - dense_dims]
    flat = rng.choice(int(np.prod(sparse_shape)), size=nnz, replace=duplicates)
    if duplicates and nnz > 1:
        flat[-1] = flat[0]  # at least one duplicate
    indices = np.stack(np.unravel_index(flat, sparse_shape)).astype(index_dtype).reshape(len(sparse_shape), nnz)
    values = rng.uniform(-1.0, 1.0, size=(nnz, *shape[len(sparse_shape):])).astype(dtype)
    dense = np.zeros(shape, values.dtype)
    np.add.at(dense, tuple(indices), values)
    return indices, values, dense


@pytest.fixture
def coo():
    return make_coo
