"""Data parallelism with ZeRO sharding over a mesh, as pieces a training step runs inside
``jax.shard_map``: the batch is split over the data-parallel axes, every device differentiates
its share, gradients are averaged (fused / hierarchical all-reduce, or reduce-scatter), and the
optimizer updates the parameters -- whole, or each device its slice (ZeRO).

ZeRO works on the parameters flattened into one vector and split over the devices bucket by
bucket (:class:`~paddlejax.distributed.zero.FlatLayout`: one bucket per parameter, or with
``fuse_all_reduce`` buckets of ``fuse_grad_size_in_MB``); each device owns a slice:

- stage 1: gradients all-reduced; optimizer state sharded, each device updates its slice of
  the parameters, which are then all-gathered (outside ``shard_map``, by XLA);
- stage 2: gradients reduce-scattered, one ``psum_scatter`` per bucket (each device receives
  only its slice);
- stage 3: parameters also stay sharded at rest and are all-gathered for the forward pass.

Two modes replace the gradient all-reduce (stage 0, on their own): Local SGD
(``strategy.localsgd``) keeps one copy of the parameters and optimizer state per device (a
leading device axis, sharded), updates each from its own gradients and averages the copies
every ``k_steps`` steps; DGC (``strategy.dgc``) sends each gradient's largest entries only,
gathered as (index, value) rows, and keeps the rest per device as residuals.

Gradient merge (``strategy.gradient_merge.k_steps = k``) communicates once per update, as
Paddle's does: below stage 2 every device adds its own gradients into a local buffer and the
all-reduce runs on the ``k``-th micro-step only (inside a ``lax.cond``); at stages 2 and 3 each
micro-step reduce-scatters and only the slice is accumulated, keeping the gradient memory sharded.

Elementwise optax transformations (sgd, momentum, adam, weight decay) are exact on slices;
transformations that look across the whole gradient are not, and ZeRO refuses them (:meth:`init`
probes the optimizer once): clip with :meth:`DataParallel.clip_by_global_norm` (it sums the
squared norm over the slices; the Trainer's ``grad_clip`` uses it) rather than
``optax.clip_by_global_norm``.

>>> import jax, jax.numpy as jnp, optax
>>> from paddlejax.distributed import DataParallel, Strategy
>>> dp = DataParallel(Strategy(sharding={"stage": 2}))
>>> loss = lambda p, batch: jnp.mean((batch[0] @ p["w"] - batch[1]) ** 2)
>>> tx = optax.adam(0.1)
>>> state = dp.init({"w": jnp.zeros((3, 1))}, tx)
>>> state["opt"][0].mu.sharding.spec
P('dp',)
>>> step = dp.train_step(loss, tx)
>>> x = jnp.ones((8, 3)); y = jnp.ones((8, 1))
>>> state, l0 = step(state, (x, y))
>>> state, l1 = step(state, (x, y))
>>> float(l1) < float(l0)
True
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from paddlejax.distributed.collectives import all_reduce_mean, psum
from paddlejax.distributed.mesh import check_batch, dp_axes, dp_size, make_mesh
from paddlejax.distributed.strategy import Strategy
from paddlejax.distributed.zero import FlatLayout


def merge_gradients(tx: optax.GradientTransformation, k_steps: int, avg: bool = True):
    """``tx`` applied once every ``k_steps`` calls to the mean (``avg``) or the sum of the
    gradients in between (Paddle's gradient merge, on ``optax.MultiSteps``), for one device.
    :class:`DataParallel` merges before communicating instead; give it the plain ``tx``.

    >>> import optax
    >>> tx = merge_gradients(optax.sgd(0.1), k_steps=4)
    """
    if k_steps == 1:
        return tx
    inner = tx if avg else optax.chain(optax.scale(k_steps), tx)  # MultiSteps averages
    return optax.MultiSteps(inner, every_k_schedule=k_steps)


def clip_by_norm_of(max_norm: float, squared_norm: Callable) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` with the squared global norm of the updates given by
    ``squared_norm(updates)``: for gradients that are not the whole gradient as they stand (a
    device's slice, copies of one parameter).

    >>> import jax.numpy as jnp
    >>> clip = clip_by_norm_of(1.0, lambda g: 4 * jnp.sum(g["w"] ** 2))  # "w" stands for four copies
    >>> [round(v, 3) for v in clip.update({"w": jnp.array([3.0, 4.0])}, clip.init(None))[0]["w"].tolist()]
    [0.3, 0.4]
    """
    def update(updates, state, params=None):
        norm = jnp.sqrt(squared_norm(updates))
        return jax.tree.map(lambda g: jnp.where(norm < max_norm, g, g / (norm / max_norm)), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _unmerged(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """The optimizer of ``fleet.distributed_optimizer(tx)`` without its own gradient merge
    (:class:`DataParallel` merges before communicating), or ``tx`` itself."""
    return getattr(tx, "inner", tx)


class DataParallel:
    """The data-parallel part of a :class:`Strategy` over a mesh (default: :func:`make_mesh`).

    Use :meth:`train_step` for a complete step of ``loss_fn(params, batch)``, or the pieces
    (:meth:`init`, :meth:`specs`, :meth:`local_params`, :meth:`reduce_gradients`, :meth:`update`,
    :meth:`gather`) to build one, as the Trainer does.
    """

    def __init__(self, strategy: Strategy | None = None, mesh: Mesh | None = None):
        self.strategy = strategy or Strategy()
        self.mesh = mesh if mesh is not None else make_mesh(self.strategy)
        self.axes = dp_axes(self.mesh)
        self.size = dp_size(self.mesh)
        self.stage = self.strategy.sharding.stage
        self.k_steps = self.strategy.gradient_merge.k_steps
        self.localsgd, self.dgc = self.strategy.localsgd, self.strategy.dgc
        self.layout: FlatLayout | None = None  # set by init

    # -- layout ----------------------------------------------------------------------------------
    def sharding(self, spec: P = P()) -> NamedSharding:
        """A ``NamedSharding`` on this mesh."""
        return NamedSharding(self.mesh, spec)

    @property
    def batch_spec(self) -> P:
        return P(self.axes)

    @property
    def params_spec(self) -> P:
        """Where the parameters live: replicated, or (ZeRO-3) the flat vector sharded, or (Local
        SGD) one copy per device."""
        return P(self.axes) if self.stage == 3 or self.localsgd else P()

    def init(self, params: dict, tx: optax.GradientTransformation) -> dict:
        """The state ``{"params", "opt", "merge"}`` for ``params`` placed on the mesh: optimizer
        state (ZeRO >= 1) and parameters (ZeRO-3) as a flat vector sharded over the devices;
        ``merge`` holds the per-device state between steps (:meth:`_merge_buffer`: gradient merge's
        buffer, DGC's momentum and residuals, step counts; empty for plain data parallelism)."""
        s, tx = self.strategy, _unmerged(tx)
        self.layout = FlatLayout(params, self.size, s.fuse_grad_size_in_MB if s.fuse_all_reduce else None)
        if self.localsgd:  # a copy per device, and each copy's optimizer state
            copies = jax.tree.map(lambda p: jnp.broadcast_to(p, (self.size, *jnp.shape(p))), params)
            state = {"params": copies, "opt": jax.vmap(tx.init)(copies)}
        elif self.stage == 0:
            state = {"params": params, "opt": tx.init(params)}
        else:
            self._check_elementwise(tx)
            flat = self.layout.shard(params)
            state = {"params": flat if self.stage == 3 else params, "opt": tx.init(flat)}
        state["merge"] = self._merge_buffer(params)
        # fresh buffers: steps donate the state, which must not free the caller's arrays
        state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
        return jax.device_put(state, jax.tree.map(self.sharding, self.specs(state)))

    def _check_elementwise(self, tx: optax.GradientTransformation) -> None:
        """Raise ``ValueError`` unless ``tx`` updates each device's slice of a vector as it updates
        the whole vector (ZeRO runs it on slices). Probed on a small vector inside ``shard_map``,
        so that a transformation that sums over the devices (:meth:`clip_by_global_norm`) passes:
        the whole vector's update is device 0's, the other devices updating zeros."""
        rng = np.random.default_rng(0)
        n, dtype = self.size, self.layout.dtype
        grads, params = (jnp.asarray(rng.normal(size=4 * n) * scale, dtype) for scale in (1e6, 1.0))
        rows = lambda v: jnp.zeros((n, v.size), dtype).at[0].set(v)  # noqa: E731

        def update(g, p):
            return tx.update(g, tx.init(p), p)[0]

        def error(g, p, g_rows, p_rows):
            sliced = lax.all_gather(update(g, p), self.axes, tiled=True)
            whole = lax.psum(jnp.where(lax.axis_index(self.axes) == 0, update(g_rows[0], p_rows[0]), 0), self.axes)
            return lax.pmax(jnp.max(jnp.abs(sliced - whole) / (jnp.abs(whole) + 1e-30)), self.axes)

        spec = P(self.axes)
        probe = jax.jit(jax.shard_map(error, mesh=self.mesh, in_specs=(spec,) * 4, out_specs=P()))
        if float(probe(grads, params, rows(grads), rows(params))) > 1e-4:
            raise ValueError(f"DataParallel: ZeRO stage {self.stage} runs the optimizer on each device's slice of "
                             "the parameters, and this optimizer does not act element by element (a clip by the "
                             "global norm in the chain would clip each slice by its own norm); clip with "
                             "Trainer(grad_clip=...) or DataParallel.clip_by_global_norm instead")

    def specs(self, state: dict) -> dict:
        """``PartitionSpec``s of :meth:`init`'s state: sliced leaves are those of the sharded
        vector's length."""
        def spec(leaf):
            sliced = self.stage and leaf.ndim == 1 and leaf.shape[0] == self.layout.length
            return P(self.axes) if sliced or self.localsgd else P()

        # everything in the merge state is per device (a leading device axis) but its step count
        merge = {k: P() if k == "count" else jax.tree.map(lambda _: P(self.axes), v)
                 for k, v in state["merge"].items()}
        return {"params": jax.tree.map(lambda _: self.params_spec, state["params"]),
                "opt": jax.tree.map(spec, state["opt"]), "merge": merge}

    def full_params(self, params):
        """The parameters as a dict from :meth:`init`'s layout (outside ``shard_map``); under Local
        SGD the mean of the devices' copies (the copies themselves just after they are averaged)."""
        if self.localsgd:
            return jax.tree.map(lambda p: jnp.mean(p, axis=0).astype(p.dtype), params)
        return self.layout.tree(params) if self.stage == 3 else params

    def gather(self, params):
        """After :meth:`update` (outside ``shard_map``): ZeRO-1/2 slices back into replicated
        parameters (XLA all-gathers them)."""
        if self.stage not in (1, 2):
            return params
        # gather the flat vector whole (one all-gather), then cut it into parameters locally
        flat = jax.lax.with_sharding_constraint(params, self.sharding())
        return jax.lax.with_sharding_constraint(self.layout.tree(flat), self.sharding())

    def update_specs(self, state: dict) -> dict:
        """The ``out_specs`` of :meth:`update`'s parameters and optimizer state."""
        specs = self.specs(state)
        return {**specs, "params": P(self.axes) if self.stage or self.localsgd else specs["params"]}

    def shard_batch(self, batch):
        """``batch`` (a pytree of arrays with a leading batch axis) split over the devices.

        In a run of several processes each process passes only its own rows (as a data loader
        per rank reads them): the global batch is their concatenation in process order, and
        every process must pass the same number of rows."""
        processes = jax.process_count()
        for leaf in jax.tree.leaves(batch):
            check_batch(leaf.shape[0] * processes, self.mesh)
        sharding = self.sharding(self.batch_spec)
        if processes == 1:
            return jax.device_put(batch, sharding)
        return jax.tree.map(lambda rows: jax.make_array_from_process_local_data(sharding, np.asarray(rows)), batch)

    # -- inside shard_map ------------------------------------------------------------------------
    def local_params(self, params):
        """This device's full parameters, typed as varying so that ``jax.grad`` gives its own
        gradients (replicated inputs would be summed over the devices by the transpose)."""
        if self.stage == 3:  # all_gather's result is already varying
            return self.layout.tree(lax.all_gather(params, self.axes, tiled=True))
        if self.localsgd:  # this device's own copy
            return jax.tree.map(lambda p: p[0], params)
        return jax.tree.map(lambda p: lax.pcast(p, self.axes, to="varying"), params)

    def _slice(self, tree):
        """This device's slice of ``tree`` (a whole tree shaped like the parameters)."""
        return self.layout.local(tree, lax.axis_index(self.axes))

    def reduce_gradients(self, grads):
        """The mean of every device's ``grads``: the whole dict (ZeRO 0/1: all-reduce, fused and
        hierarchical as the strategy says), or this device's flat slice (ZeRO 2/3: a
        reduce-scatter per bucket); sent in ``strategy.comm_dtype`` where it names one."""
        s = self.strategy
        wire = jnp.dtype(s.comm_dtype) if s.comm_dtype else None
        sent = grads if wire is None else jax.tree.map(
            lambda g: g.astype(wire) if jnp.issubdtype(g.dtype, jnp.floating) else g, grads)
        if self.stage >= 2:
            return (self.layout.reduce_scatter(sent, self.axes) / self.size).astype(self.layout.dtype)
        mean = all_reduce_mean(sent, self.axes, fuse=s.fuse_all_reduce, bucket_mb=s.fuse_grad_size_in_MB,
                               hierarchical=s.hierarchical_allreduce)
        mean = jax.tree.map(lambda m, g: m.astype(g.dtype), mean, grads)
        return self._slice(mean) if self.stage == 1 else mean

    def all_finite(self, grads) -> jax.Array:
        """Whether every device's ``grads`` (its own, or its slice) are all finite."""
        ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        return lax.pmin(ok.astype(jnp.int32), self.axes).astype(bool)

    def _owned(self, params):
        """The parameters :meth:`update` updates: all of them, or (ZeRO) this device's slice."""
        if self.stage in (1, 2):
            return self._slice(params)
        return params

    def update(self, grads, params, opt, tx: optax.GradientTransformation):
        """Apply ``tx`` to :meth:`reduce_gradients`' result: returns (parameters or this device's
        slice of them, optimizer state)."""
        params = self._owned(params)
        deltas, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, deltas), opt

    def _merge_buffer(self, params) -> dict:
        """The per-device state between steps: for gradient merge, zeros for the merged gradients
        (each device's own, a leading device axis on every leaf, or at stages 2/3 its slice of
        the flat vector) and the micro-step count; for DGC each device's momentum ``u`` and
        residual ``v``, and the step count; for Local SGD the step count; else nothing."""
        per_device = lambda: jax.tree.map(  # noqa: E731
            lambda p: jnp.zeros((self.size, *jnp.shape(p)), jnp.result_type(p)), params)
        if self.dgc:
            return {"u": per_device(), "v": per_device(), "count": jnp.int32(0)}
        if self.localsgd:
            return {"count": jnp.int32(0)}
        if self.k_steps == 1:
            return {}
        grads = jnp.zeros(self.layout.length, self.layout.dtype) if self.stage >= 2 else per_device()
        return {"grads": grads, "count": jnp.int32(0)}

    def apply_gradients(self, grads, params, opt, merge: dict, tx: optax.GradientTransformation):
        """This device's own ``grads`` averaged over the devices and applied by ``tx``, or, under
        gradient merge, added to ``merge`` and applied (mean or sum, as ``gradient_merge.avg``
        says) on every ``k_steps``-th call. Returns (parameters or this device's slice of them,
        optimizer state, merge state)."""
        tx = _unmerged(tx)
        if self.localsgd:
            return self._local_sgd(grads, params, opt, merge, tx)
        if self.dgc:
            mean, merge = self._compressed(grads, merge)
            return (*self.update(mean, params, opt, tx), merge)
        if self.k_steps == 1:
            return (*self.update(self.reduce_gradients(grads), params, opt, tx), merge)
        if self.stage >= 2:
            acc = merge["grads"] + self.reduce_gradients(grads)
        else:
            acc = jax.tree.map(lambda a, g: a + g[None], merge["grads"], grads)
        count = merge["count"] + 1
        scale = 1 / self.k_steps if self.strategy.gradient_merge.avg else 1.0

        def apply(acc):
            mean = acc if self.stage >= 2 else self.reduce_gradients(jax.tree.map(lambda a: a[0], acc))
            new_params, new_opt = self.update(jax.tree.map(lambda g: g * scale, mean), params, opt, tx)
            return new_params, new_opt, jax.tree.map(jnp.zeros_like, acc)

        def hold(acc):
            return self._owned(params), opt, acc

        params, opt, acc = lax.cond(count % self.k_steps == 0, apply, hold, acc)
        return params, opt, {"grads": acc, "count": count}

    def _local_sgd(self, grads, params, opt, merge, tx):
        """Local SGD: this device's copy updated from its own gradients, the copies averaged on
        every ``k_steps``-th step (every step before ``begin_step``)."""
        own = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
        stacked = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
        params, opt = own(params), own(opt)
        deltas, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, deltas)
        count = merge["count"] + 1
        k, begin = self.localsgd.k_steps, self.localsgd.begin_step
        sync = (count <= begin) | ((count - begin) % k == 0)
        average = lambda p: jax.tree.map(  # noqa: E731
            lambda x: lax.pcast(lax.pmean(x, self.axes), self.axes, to="varying"), p)
        params = lax.cond(sync, average, lambda p: p, params)
        return stacked(params), stacked(opt), {"count": count}

    def _compressed(self, grads, merge):
        """DGC: the mean over the devices of each one's largest accumulated entries (momentum
        corrected), exchanged as (index, value) rows, and the per-device momentum and residuals
        with the sent entries cleared; dense (every entry sent) before ``rampup_begin_step``."""
        dgc, n = self.dgc, self.size
        count = merge["count"] + 1
        u = jax.tree.map(lambda a, g: dgc.momentum * a[0] + g, merge["u"], grads)
        v = jax.tree.map(lambda a, b: a[0] + b, merge["v"], u)

        def sparse(v):
            leaves, tree = jax.tree.flatten(v)
            mean, sent = [], []
            for leaf in leaves:
                flat = leaf.reshape(-1)
                k = max(1, math.ceil((1 - dgc.sparsity) * flat.size))
                _, index = lax.top_k(jnp.abs(flat), k)
                # every device's rows, made whole on every device by a sum of rows only one device
                # fills (an all-gather whose result is the same everywhere)
                rows = lambda x: lax.psum(jnp.zeros((n, k), x.dtype).at[lax.axis_index(self.axes)].set(x),  # noqa: E731
                                          self.axes)
                # zeros of no device's (not zeros_like: a device's own would make the sum its own too)
                where, values = rows(index).reshape(-1), rows(flat[index]).reshape(-1)
                summed = jnp.zeros(flat.shape, flat.dtype).at[where].add(values)
                mean.append((summed / n).reshape(leaf.shape))
                sent.append(jnp.zeros(flat.size, bool).at[index].set(True).reshape(leaf.shape))
            return jax.tree.unflatten(tree, mean), jax.tree.unflatten(tree, sent)

        def dense(v):
            everything = lambda x: lax.pcast(jnp.ones(x.shape, bool), self.axes, to="varying")  # noqa: E731
            return jax.tree.map(lambda x: lax.pmean(x, self.axes), v), jax.tree.map(everything, v)

        if dgc.rampup_begin_step:
            mean, sent = lax.cond(count > dgc.rampup_begin_step, sparse, dense, v)
        else:
            mean, sent = sparse(v)
        clear = lambda tree: jax.tree.map(lambda x, s: jnp.where(s, 0, x)[None], tree, sent)  # noqa: E731
        return mean, {"u": clear(u), "v": clear(v), "count": count}

    def clip_by_global_norm(self, max_norm: float) -> optax.GradientTransformation:
        """``optax.clip_by_global_norm`` that is exact when gradients are ZeRO slices (the squared
        norm is summed over the devices)."""
        if not self.stage:
            return optax.clip_by_global_norm(max_norm)
        return clip_by_norm_of(max_norm, lambda updates: lax.psum(
            sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(updates)), self.axes))

    def check_batch_norm(self, program) -> str | None:
        """Which batch norm a training ``program`` uses under this data parallelism: ``"sync"``
        (``SyncBatchNorm``: the whole batch's statistics, as on one device), ``"local"`` (each
        device normalises its own rows, with a warning that says so and how to sync), or None."""
        kinds = {op.type for op in program.walk() if op.type in ("batch_norm", "sync_batch_norm")
                 and op.attrs.get("training")}
        if "batch_norm" in kinds and self.size > 1:
            warnings.warn(f"data parallel over {self.size} devices: batch norm normalises each device's rows on "
                          "their own, so training differs from one device's; for the whole batch's statistics use "
                          "nn.SyncBatchNorm (model = nn.SyncBatchNorm.convert_sync_batchnorm(model))", stacklevel=3)
        return "local" if "batch_norm" in kinds else "sync" if kinds else None

    # -- a whole step ----------------------------------------------------------------------------
    def train_step(self, loss_fn: Callable, tx: optax.GradientTransformation) -> Callable:
        """A jitted ``step(state, batch) -> (state, loss)`` for ``loss_fn(params, batch)`` (the
        mean loss over a batch), ``state`` from :meth:`init` with the same ``tx``. ``loss`` is the
        mean over the global batch; the result equals single-device training on it.
        ``step.lower(state, batch)`` gives the lowered step (``.compile().as_text()``: its HLO)."""
        if self.strategy.recompute:
            loss_fn = jax.checkpoint(loss_fn)

        def per_device(state, batch):
            loss, grads = jax.value_and_grad(loss_fn)(self.local_params(state["params"]), batch)
            params, opt, merge = self.apply_gradients(grads, state["params"], state["opt"], state["merge"], tx)
            return {"params": params, "opt": opt, "merge": merge}, psum(loss, self.axes) / self.size

        def step(state, batch):
            sharded = jax.shard_map(per_device, mesh=self.mesh, in_specs=(self.specs(state), self.batch_spec),
                                    out_specs=(self.update_specs(state), P()))
            new, loss = sharded(state, batch)
            return {**new, "params": self.gather(new["params"])}, loss

        jitted = jax.jit(step, donate_argnums=0)

        def run(state, batch):
            return jitted(state, self.shard_batch(batch))

        run.lower = lambda state, batch: jitted.lower(state, self.shard_batch(batch))  # to read its HLO
        return run
