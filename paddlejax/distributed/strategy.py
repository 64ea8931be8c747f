"""``Strategy``: how a training step is spread over devices (Paddle's ``DistributedStrategy``).

The fields mirror Paddle's where they mean something on XLA. Nested options are small frozen
dataclasses; a plain dict is accepted in their place. Every field is checked on construction and
a bad value raises ``ValueError`` naming it.

>>> from paddlejax.distributed import Strategy
>>> s = Strategy(fuse_all_reduce=True, fuse_grad_size_in_MB=16, sharding={"stage": 2},
...              gradient_merge={"k_steps": 4})
>>> s.sharding.stage, s.gradient_merge.k_steps, s.gradient_merge.avg
(2, 4, True)
>>> Strategy(amp="int4")
Traceback (most recent call last):
...
ValueError: Strategy.amp: expected one of None, 'bf16', 'fp16', got 'int4'
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

AMP = (None, "bf16", "fp16")
COMM_DTYPES = (None, "bfloat16", "float16")
SCHEDULES = ("gpipe", "1f1b")


def _int(owner: str, name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name}: expected an int >= {minimum}, got {value!r}")


def _optional_int(owner: str, name: str, value, minimum: int = 1) -> None:
    if value is not None:
        _int(owner, name, value, minimum)


def _bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name}: expected True or False, got {value!r}")


@dataclass(frozen=True)
class GradientMerge:
    """Accumulate gradients over ``k_steps`` micro-steps and update once; ``avg`` averages them
    (otherwise they are summed, as Paddle's ``gradient_merge_configs["avg"] = False``).

    >>> GradientMerge(k_steps=4)
    GradientMerge(k_steps=4, avg=True)
    """

    k_steps: int = 1
    avg: bool = True

    def __post_init__(self):
        _int("GradientMerge", "k_steps", self.k_steps, 1)
        _bool("GradientMerge", "avg", self.avg)


@dataclass(frozen=True)
class Sharding:
    """ZeRO: ``stage`` 1 shards the optimizer state over the data-parallel devices, 2 also the
    gradients (reduce-scatter instead of all-reduce), 3 also the parameters at rest. ``degree``
    is the number of devices sharded over; it must be the data-parallel size (the default).

    >>> Sharding(stage=3)
    Sharding(stage=3, degree=None)
    """

    stage: int = 0
    degree: int | None = None

    def __post_init__(self):
        if self.stage not in (0, 1, 2, 3) or isinstance(self.stage, bool):
            raise ValueError(f"Sharding.stage: expected 0, 1, 2 or 3, got {self.stage!r}")
        _optional_int("Sharding", "degree", self.degree)


@dataclass(frozen=True)
class LocalSGD:
    """Local SGD: every device updates its own copy of the parameters from its own gradients, and
    the copies are averaged every ``k_steps`` steps (every step before ``begin_step``), so
    gradients are never all-reduced (Paddle's ``localsgd_configs``).

    >>> LocalSGD(k_steps=4)
    LocalSGD(k_steps=4, begin_step=0)
    """

    k_steps: int = 1
    begin_step: int = 0

    def __post_init__(self):
        _int("LocalSGD", "k_steps", self.k_steps, 1)
        _int("LocalSGD", "begin_step", self.begin_step, 0)


@dataclass(frozen=True)
class DGC:
    """Deep gradient compression: each device sends only the ``1 - sparsity`` largest entries of
    every gradient (by magnitude) and keeps the rest as a residual added to its next gradients,
    with momentum correction (``momentum`` applied before sparsifying, the momentum of a sent entry
    cleared) as Paddle's ``DGCMomentumOptimizer``; dense, all-reduced steps before
    ``rampup_begin_step``. The optimizer given to the Trainer must then be plain ``optax.sgd(lr)``:
    the momentum is DGC's.

    >>> DGC(sparsity=0.99).momentum
    0.9
    """

    sparsity: float = 0.999
    momentum: float = 0.9
    rampup_begin_step: int = 0

    def __post_init__(self):
        for name in ("sparsity", "momentum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"DGC.{name}: expected a number in [0, 1), got {value!r}")
        _int("DGC", "rampup_begin_step", self.rampup_begin_step, 0)


@dataclass(frozen=True)
class Pipeline:
    """Pipeline parallelism: ``stages`` consecutive parts of the model on ``stages`` device
    groups, each batch split into ``micro_batches``, run by the ``schedule`` "gpipe" or "1f1b".

    >>> Pipeline(stages=4, micro_batches=8, schedule="1f1b").schedule
    '1f1b'
    """

    stages: int = 1
    micro_batches: int = 1
    schedule: str = "gpipe"

    def __post_init__(self):
        _int("Pipeline", "stages", self.stages, 1)
        _int("Pipeline", "micro_batches", self.micro_batches, 1)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Pipeline.schedule: expected one of {', '.join(map(repr, SCHEDULES))}, "
                             f"got {self.schedule!r}")


def _nested(owner: str, name: str, value, cls):
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{owner}.{name}: unknown option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        return cls(**value)
    raise ValueError(f"{owner}.{name}: expected a {cls.__name__} or a dict, got {type(value).__name__}")


@dataclass(frozen=True)
class Strategy:
    """How to distribute training. Defaults give plain data parallelism over every device.

    Args:
        amp: mixed precision, ``"bf16"`` or ``"fp16"`` (with dynamic loss scaling), or None.
        recompute: rematerialise the forward pass in the backward pass: the ``remat`` pass cuts
            the training program into the ``jax.checkpoint`` segments that keep the least
            (pipeline stages recompute their whole forward pass).
        recompute_offload: with ``recompute``, keep the recompute segments' inputs in host memory
            (the ``pinned_host`` memory kind) from the forward pass to the backward pass (Paddle's
            recompute ``enable_offload``): device memory then holds one segment's activations
            at a time; each kept activation crosses to the host and back once. Where the
            backend has no ``pinned_host`` memory the Trainer says so.
        gradient_merge: :class:`GradientMerge` (k_steps, avg).
        fuse_all_reduce: pack gradients into buckets of at most ``fuse_grad_size_in_MB``
            megabytes and all-reduce each bucket with one collective (Paddle's default 32 MB);
            under ZeRO-2/3 the buckets are reduce-scattered. Unfused: one collective per
            parameter.
        hierarchical_allreduce: all-reduce within groups of ``dp_size / inter_nranks``
            neighbouring devices (a node), then across the ``hierarchical_allreduce_inter_nranks``
            groups.
        sharding: :class:`Sharding` (ZeRO stage 0-3, degree).
        pipeline: :class:`Pipeline` (stages, micro_batches, schedule).
        dp_degree: data-parallel size; None takes every device left over by ``pp_degree`` and
            ``tensor_parallel_degree``.
        pp_degree: pipeline size; None takes ``pipeline.stages``.
        localsgd: :class:`LocalSGD` (k_steps, begin_step), or None: synchronous gradients.
        dgc: :class:`DGC` (sparsity, momentum, rampup_begin_step), or None: dense gradients.
        expert_parallel_degree: the size of the ``"ep"`` mesh axis that mixture-of-experts layers
            (:mod:`paddlejax.distributed.moe`) split their experts over; the batch is split over
            it too (``dp_degree`` then counts the groups of ``"ep"`` devices).
        offload_optimizer: keep the optimizer state in host memory (the ``pinned_host`` memory
            kind) between steps; each step brings it to the device, updates it and sends it
            back, so device memory holds it only while the update runs (Paddle's sharding
            offload). Where the backend has no ``pinned_host`` memory the Trainer says so.
        comm_dtype: the type gradients travel in between data-parallel devices (``"bfloat16"`` or
            ``"float16"``: half the bytes of float32, Paddle 2.3's BF16 communication; the sum is
            rounded to that type, then cast back); None sends them as they are.
        tensor_parallel_degree: the size of the ``"mp"`` mesh axis that tensor-parallel layers
            (:mod:`paddlejax.distributed.tensor_parallel`) split their weights over; neighbouring
            devices, as Megatron places them. XLA's partitioner places every collective of such a
            step, so ZeRO and hierarchical all-reduce (hand-placed collectives) do not combine with it;
            with ``pp_degree`` the program's runs of identical layers are pipelined too (3-D,
            :mod:`paddlejax.distributed.layer_pipeline`, GPipe).
        shard_embeddings: split the tables of
            :class:`~paddlejax.distributed.sparse_embedding.SparseEmbedding` layers by rows over the
            data-parallel devices (lookups exchange ids and rows by all-to-all), the step
            partitioned by XLA as under tensor parallelism; off, such tables are replicated and
            plain data parallelism refuses them.
        logical_axis_rules: Flax's logical axis rules, ``(("embed", None), ("mlp", "mp"), ...)``:
            the mesh axes the logical names of a Flax model's ``nnx.with_partitioning`` metadata
            stand for (as ``nnx.logical_axis_rules`` gives them), read when the Trainer captures
            the model; mesh axes: ``"dp"``, ``"ep"``, ``"mp"``, or None for whole.

    >>> s = Strategy(hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2)
    >>> s.replace(dp_degree=8).dp_degree
    8
    """

    amp: str | None = None
    recompute: bool = False
    recompute_offload: bool = False
    gradient_merge: GradientMerge = field(default_factory=GradientMerge)
    fuse_all_reduce: bool = False
    fuse_grad_size_in_MB: float = 32.0
    hierarchical_allreduce: bool = False
    hierarchical_allreduce_inter_nranks: int = 1
    sharding: Sharding = field(default_factory=Sharding)
    pipeline: Pipeline = field(default_factory=Pipeline)
    dp_degree: int | None = None
    pp_degree: int | None = None
    tensor_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    shard_embeddings: bool = False
    logical_axis_rules: tuple = ()
    comm_dtype: str | None = None
    offload_optimizer: bool = False
    localsgd: LocalSGD | None = None
    dgc: DGC | None = None

    def __post_init__(self):
        if self.amp not in AMP:
            raise ValueError(f"Strategy.amp: expected one of None, 'bf16', 'fp16', got {self.amp!r}")
        for name in ("recompute", "recompute_offload", "fuse_all_reduce", "hierarchical_allreduce", "offload_optimizer",
                     "shard_embeddings"):
            _bool("Strategy", name, getattr(self, name))
        if self.recompute_offload and not self.recompute:
            raise ValueError("Strategy.recompute_offload: offloads the activations recompute keeps; "
                             "set recompute=True too")
        size = self.fuse_grad_size_in_MB
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
            raise ValueError(f"Strategy.fuse_grad_size_in_MB: expected a number > 0, got {size!r}")
        _int("Strategy", "hierarchical_allreduce_inter_nranks", self.hierarchical_allreduce_inter_nranks, 1)
        if self.hierarchical_allreduce_inter_nranks > 1 and not self.hierarchical_allreduce:
            raise ValueError(f"Strategy.hierarchical_allreduce_inter_nranks: {self.hierarchical_allreduce_inter_nranks} "
                             "has no effect without hierarchical_allreduce=True; set that too, or leave it at 1")
        self._check_axis_rules()
        _optional_int("Strategy", "dp_degree", self.dp_degree)
        _optional_int("Strategy", "pp_degree", self.pp_degree)
        _int("Strategy", "tensor_parallel_degree", self.tensor_parallel_degree, 1)
        _int("Strategy", "expert_parallel_degree", self.expert_parallel_degree, 1)
        for name, cls in (("gradient_merge", GradientMerge), ("sharding", Sharding), ("pipeline", Pipeline),
                          ("localsgd", LocalSGD), ("dgc", DGC)):
            if getattr(self, name) is not None or name not in ("localsgd", "dgc"):
                object.__setattr__(self, name, _nested("Strategy", name, getattr(self, name), cls))
        self._check_gradient_modes()
        if self.pp_degree is not None and self.pipeline.stages > 1 and self.pp_degree != self.pipeline.stages:
            raise ValueError(f"Strategy.pp_degree: {self.pp_degree} differs from pipeline.stages "
                             f"{self.pipeline.stages}")
        if self.recompute_offload and self.pp_size > 1:
            raise ValueError("Strategy.recompute_offload: pipeline stages recompute their whole forward pass from "
                             "stage inputs kept on the device; recompute_offload applies without a pipeline")
        if self.comm_dtype not in COMM_DTYPES:
            raise ValueError(f"Strategy.comm_dtype: expected one of {', '.join(map(repr, COMM_DTYPES))}, "
                             f"got {self.comm_dtype!r}")
        if self.comm_dtype is not None and (self.partitioned or self.pp_size > 1):
            raise ValueError(f"Strategy.comm_dtype: {self.comm_dtype!r} applies to data-parallel gradients; "
                             "sharded and pipeline steps communicate in the gradients' own type")
        for name in ("tensor_parallel_degree", "expert_parallel_degree", "shard_embeddings"):
            value = getattr(self, name)
            on = value if isinstance(value, bool) else value > 1
            # tensor parallelism combines with a pipeline of layer runs (GPipe, partitioned by XLA too)
            staged = self.pp_size > 1 and (name != "tensor_parallel_degree" or self.pipeline.schedule != "gpipe")
            if on and (self.sharding.stage or self.hierarchical_allreduce or staged):
                what = (f"sharding.stage={self.sharding.stage}" if self.sharding.stage else
                        "hierarchical_allreduce" if self.hierarchical_allreduce else
                        f"the {self.pipeline.schedule} pipeline schedule (a pipeline with tensor parallelism runs "
                        "gpipe)" if name == "tensor_parallel_degree" else "pipeline parallelism")
                raise ValueError(f"Strategy.{name}: {value} does not combine with {what}: XLA's partitioner places "
                                 "the collectives of a sharded step")

    def _check_axis_rules(self) -> None:
        rules = self.logical_axis_rules
        ok = isinstance(rules, (tuple, list)) and all(
            isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str)
            and (r[1] is None or isinstance(r[1], str) or (isinstance(r[1], (tuple, list))
                                                             and all(isinstance(a, str) for a in r[1])))
            for r in rules)
        if not ok:
            raise ValueError(f"Strategy.logical_axis_rules: expected pairs (logical name, mesh axis or None), "
                             f"got {rules!r}")
        object.__setattr__(self, "logical_axis_rules", tuple((r[0], tuple(r[1]) if isinstance(r[1], list) else r[1])
                                                             for r in rules))

    def _check_gradient_modes(self) -> None:
        """Local SGD and DGC replace the gradient all-reduce of plain data parallelism, so they
        combine with nothing else that changes it."""
        modes = [n for n in ("localsgd", "dgc") if getattr(self, n) is not None]
        if not modes:
            return
        clashes = [what for what, on in (("the other of localsgd and dgc", len(modes) > 1),
                                         (f"sharding.stage={self.sharding.stage}", self.sharding.stage > 0),
                                         ("gradient_merge", self.gradient_merge.k_steps > 1),
                                         ("comm_dtype", self.comm_dtype is not None),
                                         ("tensor, expert or pipeline parallelism or sharded embeddings",
                                          self.partitioned or self.pp_size > 1)) if on]
        if clashes:
            raise ValueError(f"Strategy.{modes[0]}: replaces the gradient all-reduce, so it does not combine with "
                             f"{', '.join(clashes)}")

    @property
    def partitioned(self) -> bool:
        """Whether XLA's partitioner places this step's collectives (tensor or expert parallelism,
        sharded embeddings) rather than data parallelism's hand-placed ones."""
        return self.tensor_parallel_degree > 1 or self.expert_parallel_degree > 1 or self.shard_embeddings

    @property
    def pp_size(self) -> int:
        """The pipeline size: ``pp_degree``, else ``pipeline.stages``."""
        return self.pp_degree if self.pp_degree is not None else self.pipeline.stages

    def replace(self, **changes) -> Strategy:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def as_strategy(value, owner: str) -> Strategy:
    """``value`` as a :class:`Strategy`: itself, or a dict of its fields; anything else is
    refused in the name of ``owner`` (the class or function that took it as ``strategy``).

    >>> as_strategy({"sharding": {"stage": 1}}, "Trainer").sharding.stage
    1
    >>> as_strategy(1, "Trainer")
    Traceback (most recent call last):
    ...
    ValueError: Trainer.strategy: expected a Strategy or a dict, got int
    """
    return _nested(owner, "strategy", value, Strategy)
