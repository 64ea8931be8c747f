"""An embedding table in host memory, trained by pull and push: the host tier of a parameter
server, for tables (or their cold rows) that device memory cannot hold.

:class:`HostEmbeddingTable` keeps its rows and their optimizer state in ``pinned_host`` memory
(JAX memory kinds). A training step :meth:`~HostEmbeddingTable.pull` s the rows a batch looks up
(each distinct id once) onto the device, differentiates the loss with respect to those rows, and
:meth:`~HostEmbeddingTable.push` es their gradients back: the row-wise optimizer (Adagrad, lazy
Adam or SGD, as the parameter server's sparse tables run them) updates them where they live,
computed on the host (``compute_on("device_host")``). The device holds only the batch's rows;
rows no batch pulled never move, and keep their optimizer state.

Beside :class:`~paddlejax.distributed.sparse_embedding.SparseEmbedding` (the device tier, split
over the devices and trained by the Trainer), the host tier takes the long tail: hash the
frequent ids into a device table and the rest into this one.

The SSD tier, on paper: below the host tier, rows unused for a while would be written to files in
blocks of neighbouring ids (an LRU over blocks, as Paddle's SSD sparse table keeps them) and read
back into host memory by :meth:`pull` before it gathers; the pull and push protocol, which
already names every row a step touches, stays as it is.

>>> import jax, jax.numpy as jnp, numpy as np
>>> table = HostEmbeddingTable(1000, 4, optimizer="sgd", learning_rate=1.0)
>>> pulled = table.pull(jnp.array([[7, 7, 3]]))
>>> pulled.rows.shape, pulled.lookup().shape        # 2 distinct ids: 2 rows on the device
((3, 4), (1, 3, 4))
>>> grads = jax.grad(lambda rows: pulled.lookup(rows).sum())(pulled.rows)
>>> before = table.read([7])
>>> table.push(pulled, grads)
>>> np.round(table.read([7]) - before, 4).tolist()   # looked up twice: gradient 2 a column
[[-2.0, -2.0, -2.0, -2.0]]
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compute_on import compute_on

from paddlejax.train.placement import require_pinned_host

OPTIMIZERS = ("adagrad", "adam", "sgd")


@dataclasses.dataclass(frozen=True)
class Pulled:
    """The rows one :meth:`HostEmbeddingTable.pull` brought to the device: ``ids`` the distinct
    ids (padded with an id past the table), ``rows`` their rows, ``index`` where each looked-up id
    is among them (the ids' shape)."""

    ids: jax.Array
    rows: jax.Array
    index: jax.Array

    def lookup(self, rows: jax.Array | None = None) -> jax.Array:
        """The looked-up ids' rows, ``[*ids.shape, dim]``, from ``rows`` (default: as pulled;
        pass the rows being differentiated)."""
        return jnp.take(self.rows if rows is None else rows, self.index, axis=0)


def _on_host(x):
    return jax.device_put(x, jax.memory.Space.Host)


class HostEmbeddingTable:
    """``num_embeddings`` rows of ``embedding_dim`` in host memory, with a row-wise optimizer
    (``"adagrad"``: Paddle's defaults ``epsilon=1e-6``, ``initial_accumulator_value=0.0``;
    ``"adam"``: lazy, ``beta1``, ``beta2``, ``epsilon``; ``"sgd"``). Rows start normal with
    standard deviation ``init_std`` (seeded by ``seed``).

    >>> HostEmbeddingTable(10, 2, optimizer="rmsprop")
    Traceback (most recent call last):
    ...
    ValueError: HostEmbeddingTable: optimizer expects one of 'adagrad', 'adam', 'sgd', got 'rmsprop'
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, optimizer: str = "adagrad",
                 learning_rate: float = 0.01, epsilon: float | None = None, initial_accumulator_value: float = 0.0,
                 beta1: float = 0.9, beta2: float = 0.999, init_std: float = 0.01, seed: int = 0, device=None):
        for name, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"HostEmbeddingTable: {name} expects an int >= 1, got {value!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"HostEmbeddingTable: optimizer expects one of {', '.join(map(repr, OPTIMIZERS))}, "
                             f"got {optimizer!r}")
        self.device = device or jax.devices()[0]
        require_pinned_host("HostEmbeddingTable", self.device)
        self.num_embeddings, self.embedding_dim, self.optimizer = num_embeddings, embedding_dim, optimizer
        self.options = dict(learning_rate=float(learning_rate), beta1=float(beta1), beta2=float(beta2),
                            epsilon=float(epsilon if epsilon is not None else 1e-6 if optimizer == "adagrad"
                                          else 1e-8))
        self.host = jax.sharding.SingleDeviceSharding(self.device, memory_kind="pinned_host")
        shape = (num_embeddings, embedding_dim)
        self.rows = jax.device_put(init_std * jax.random.normal(jax.random.key(seed), shape), self.host)
        fill = {"adagrad": {"moment": initial_accumulator_value}, "adam": {"mu": 0.0, "nu": 0.0}, "sgd": {}}
        self.state = {k: jax.device_put(jnp.full(shape, v, jnp.float32), self.host) for k, v in fill[optimizer].items()}
        self.count = 0  # pushes so far (Adam's bias correction counts steps, as Paddle's lazy Adam does)
        self._push = jax.jit(functools.partial(_push, optimizer=optimizer, **self.options),
                             out_shardings=(self.host, {k: self.host for k in self.state}), donate_argnums=(0, 1))

    def pull(self, ids) -> Pulled:
        """The rows of ``ids`` (any shape of int ids in ``[0, num_embeddings)``) on the device,
        each distinct id once."""
        ids = jnp.asarray(ids)
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"HostEmbeddingTable.pull: ids expects an int array, got {ids.dtype}")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise ValueError(f"HostEmbeddingTable.pull: ids must lie in [0, {self.num_embeddings}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        unique, index = jnp.unique(ids.reshape(-1), size=max(ids.size, 1), fill_value=self.num_embeddings,
                                   return_inverse=True)
        return Pulled(unique, _pull(self.rows, unique), index.reshape(ids.shape))

    def push(self, pulled: Pulled, grads) -> None:
        """Apply the optimizer to the pulled rows with their gradients ``grads`` (shaped like
        ``pulled.rows``), in host memory."""
        if np.shape(grads) != pulled.rows.shape:
            raise ValueError(f"HostEmbeddingTable.push: grads expects the pulled rows' shape {pulled.rows.shape}, "
                             f"got {np.shape(grads)}")
        self.count += 1
        self.rows, self.state = self._push(self.rows, self.state, pulled.ids, jnp.asarray(grads, jnp.float32),
                                           jnp.float32(self.count))

    def read(self, ids) -> np.ndarray:
        """The current rows of ``ids`` as a NumPy array (for checks and export)."""
        return np.asarray(_pull(self.rows, jnp.asarray(ids)))


@jax.jit
def _pull(rows, ids):
    with compute_on("device_host"):
        picked = rows[_on_host(ids)]
    return jax.device_put(picked, jax.memory.Space.Device)


def _push(rows, state, ids, grads, count, *, optimizer, learning_rate, beta1, beta2, epsilon):
    ids, grads, count = _on_host(ids), _on_host(grads), _on_host(count)
    with compute_on("device_host"):
        # ids past the table are the padding of a pull: their updates are dropped
        put = lambda table, values: table.at[ids].set(values, mode="drop")  # noqa: E731
        if optimizer == "adagrad":
            moment = state["moment"][ids] + grads * grads
            step = grads / (jnp.sqrt(moment) + epsilon)
            state = {"moment": put(state["moment"], moment)}
        elif optimizer == "adam":
            mu = beta1 * state["mu"][ids] + (1 - beta1) * grads
            nu = beta2 * state["nu"][ids] + (1 - beta2) * grads * grads
            step = (mu / (1 - beta1 ** count)) / (jnp.sqrt(nu / (1 - beta2 ** count)) + epsilon)
            state = {"mu": put(state["mu"], mu), "nu": put(state["nu"], nu)}
        else:
            step = grads
        rows = put(rows, rows[ids] - learning_rate * step)
    return rows, state
