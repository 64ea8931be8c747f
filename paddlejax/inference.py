"""Inference: a :class:`Predictor` runs a program, optimised and compiled once, on any batch size.

The predictor applies the inference pipeline to the program, then compiles it ahead of time for
a few batch sizes ("buckets", by default the powers of two up to ``max_batch_size``). A request
is padded to the next bucket and its outputs sliced back, so no request ever triggers a
compilation; batches above ``max_batch_size`` run in chunks. The pipeline's ``autotune`` pass
picks conv kernels and the data layout at the largest bucket, with the parameters frozen or
not as they will run; its choices are cached, so a second predictor of the program tunes nothing.

>>> import numpy as np, jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda p, x: pj.ops.relu(x @ p["w"]), pj.InputSpec((None, 2)), params={"w": jnp.eye(2)})
>>> predictor = Predictor(prog, Config(max_batch_size=4))
>>> predictor.buckets, predictor.num_compilations
((1, 2, 4), 3)
>>> predictor(np.array([[1.0, -1.0]] * 3, np.float32)).tolist()
[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import numbers
import os

import jax
import numpy as np

from paddlejax.io import load
from paddlejax.ir.core import Program
from paddlejax.lowering import input_dtype
from paddlejax.ops import registry
from paddlejax.passes import run as run_passes
from paddlejax.passes.manager import INFERENCE_PIPELINE, inference_pipeline  # noqa: F401  (INFERENCE_PIPELINE re-exported)

# Above this many bytes of parameters, freezing them into every bucket's executable costs too much memory.
FREEZE_LIMIT_BYTES = 64 << 20
PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass
class Config:
    """How a :class:`Predictor` optimises and compiles its program.

    - ``passes``: a pipeline string; ``None`` runs the ``"inference"`` pipeline (the passes of
      :data:`INFERENCE_PIPELINE` registered now, in that order); ``""`` runs none.
    - ``freeze_params``: embed the parameters in the executables as constants (see
      :meth:`paddlejax.Program.compile`); ``None`` freezes them on CPU when they take less than
      :data:`FREEZE_LIMIT_BYTES`.
    - ``max_batch_size`` and ``batch_buckets``: the batch sizes compiled (default: the powers of
      two up to ``max_batch_size``, and ``max_batch_size`` itself).
    - ``size_buckets``: for programs with symbolic sizes besides the batch (a sequence length),
      the sizes compiled for each (``{"seq": (32, 128)}``); inputs are padded with zeros up to
      the next bucket along those axes and outputs sliced back, which is exact only where the
      program ignores the padding (a masked sequence model). One executable is compiled per
      batch bucket and combination of sizes.
    - ``precision``: ``"fp32"``, or ``"bf16"`` to add the ``amp`` pass after the pipeline (and
      let the autotuner pick reduced-precision conv kernels).
    - ``device``: a JAX platform name (``"cpu"``, ``"gpu"``); ``None`` is JAX's default device.
    - ``progress``: show the autotuner's progress bar when it times many ops (the first
      predictor of a program on a device); ``False`` silences it.

    >>> Config(max_batch_size=6).buckets()
    (1, 2, 4, 6)
    """

    passes: str | None = None
    freeze_params: bool | None = None
    max_batch_size: int = 32
    batch_buckets: tuple[int, ...] | None = None
    size_buckets: dict[str, tuple[int, ...]] | None = None
    precision: str = "fp32"
    device: str | None = None
    progress: bool = True

    def __post_init__(self):
        # NumPy's integers are sizes too; True is not
        def size(n):
            return int(n) if isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_)) else n

        self.max_batch_size = size(self.max_batch_size)
        if not isinstance(self.max_batch_size, int) or isinstance(self.max_batch_size, bool) or self.max_batch_size < 1:
            raise ValueError(f"Config: max_batch_size must be a positive int, got {self.max_batch_size!r}")
        if self.batch_buckets is not None and not isinstance(self.batch_buckets, (str, bytes)):
            self.batch_buckets = tuple(size(b) for b in self.batch_buckets)
        if self.precision not in PRECISIONS:
            raise ValueError(f"Config: precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.batch_buckets is not None:
            bad = [b for b in self.batch_buckets
                   if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= self.max_batch_size]
            if bad or not self.batch_buckets:
                raise ValueError(f"Config: batch_buckets must be sizes in 1..max_batch_size={self.max_batch_size}, "
                                 f"got {self.batch_buckets!r}")

        if self.size_buckets is not None:
            if not isinstance(self.size_buckets, dict):
                raise ValueError(f"Config: size_buckets must be a dict {{size name: sizes}}, got {self.size_buckets!r}")
            checked = {}
            for name, sizes in self.size_buckets.items():
                sizes = (sizes,) if not isinstance(sizes, (tuple, list)) else sizes
                sizes = tuple(size(s) for s in sizes)
                if (not isinstance(name, str) or not sizes
                        or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes)):
                    raise ValueError(f"Config: size_buckets['{name}'] must be positive ints, got {sizes!r}")
                checked[name] = tuple(sorted(set(sizes)))
            self.size_buckets = checked

    def buckets(self) -> tuple[int, ...]:
        """The batch sizes compiled, ascending; the largest is ``max_batch_size``."""
        if self.batch_buckets is not None:
            return tuple(sorted({*self.batch_buckets, self.max_batch_size}))
        powers = [1 << i for i in range(self.max_batch_size.bit_length()) if 1 << i < self.max_batch_size]
        return (*powers, self.max_batch_size)

    def pipeline(self, sizes: str = "", frozen: bool = False) -> str:
        """The pipeline string the predictor runs; the inference pipeline tunes its kernels for
        ``sizes`` (e.g. ``"b=32"``) with parameters ``frozen`` or not, as they will run.

        >>> Config(passes="dce", precision="bf16").pipeline()
        'dce,amp{dtype=bfloat16}'
        """
        text = self.passes
        if text is None:
            tune = {"sizes": sizes, "frozen": frozen, "reduced_precision": self.precision == "bf16"}
            tune = {k: v for k, v in tune.items() if v} | ({} if self.progress else {"progress": False})
            text = inference_pipeline(autotune=tune)
        return ",".join(p for p in (text, "amp{dtype=bfloat16}" if self.precision == "bf16" else "") if p)


class Predictor:
    """A program (or the path of a saved one) optimised and compiled for batched inference.

    ``run(*inputs)`` (or calling the predictor) takes inputs structured like the program's,
    whose leading dimension is the batch; it returns the outputs as NumPy arrays. Inputs take
    the program's dtypes, or their 64-bit twins (NumPy's float64 for float32, ...), which are
    cast, as :meth:`Program.__call__` does (:func:`paddlejax.lowering.input_dtype`). Inputs are
    padded with zero rows on the host up to the bucket size and the padding's outputs dropped,
    which is exact for programs that treat batch rows independently (inference programs do,
    batch norm in eval mode included). A program with batch-coupled ops (batch norm in
    training mode: its statistics come from the whole batch) is refused, since padding and
    chunking would change its outputs; trace the model in eval mode.

    ``num_compilations`` counts the executables built; it does not grow after construction.

    >>> import numpy as np, jax.numpy as jnp, paddlejax as pj
    >>> prog = pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3)))
    >>> Predictor(prog, Config(max_batch_size=2))(np.ones((5, 3), np.float32)).shape
    (5, 3)
    """

    def __init__(self, path_or_program: Program | str | os.PathLike, config: Config | None = None):
        self.config = config or Config()
        if not isinstance(path_or_program, (Program, str, os.PathLike)):
            raise TypeError(f"Predictor: expected a Program or the path of a saved one, "
                            f"got {type(path_or_program).__name__}")
        source = path_or_program if isinstance(path_or_program, Program) else load(path_or_program)
        self.device = jax.devices(self.config.device)[0] if self.config.device else jax.devices()[0]
        self.size_buckets = dict(self.config.size_buckets or {})
        symbols = {d for v in source.inputs for d in v.type.shape[1:] if isinstance(d, str)}
        unknown = sorted(set(self.size_buckets) - symbols)
        if unknown:
            raise ValueError(f"Predictor: size_buckets names {unknown}, which no input of {source.name} has; "
                             f"its symbolic sizes besides the batch: {sorted(symbols) or 'none'}")
        self.batch_dim = batch_dim(source, tuple(self.size_buckets))
        _refuse_batch_coupled(source)
        self.freeze_params = self.config.freeze_params
        if self.freeze_params is None:
            self.freeze_params = self.device.platform == "cpu" and _param_bytes(source) < FREEZE_LIMIT_BYTES
        self.buckets = self.config.buckets()
        # kernels and layout are tuned for the largest buckets, where the time goes
        largest = {self.batch_dim: self.buckets[-1], **{n: b[-1] for n, b in self.size_buckets.items()}}
        with jax.default_device(self.device):
            self.program = run_passes(source, self.config.pipeline(":".join(f"{n}={v}" for n, v in largest.items()),
                                                                   self.freeze_params))
        self.program.params = jax.device_put(self.program.params, self.device)
        self.num_compilations = 0
        # inputs of the program's dtypes that fill a bucket take a short path (no padding, no
        # casts, no slicing), so that a call costs what the executable does
        self._exact = None if self.size_buckets else [(jax.numpy.dtype(v.type.dtype), tuple(v.type.shape[1:]))
                                                      for v in self.program.inputs]
        self._executables = {key: self._compile(dict(zip((self.batch_dim, *self.size_buckets), key)))
                             for key in itertools.product(self.buckets, *self.size_buckets.values())}
        self._executables_batches = frozenset(self.buckets)
        self._refuse_mixed_rows(largest)

    def _refuse_mixed_rows(self, largest: dict[str, int]) -> None:
        """A clear error if the outputs of some rows change when another row does: ops that no
        trait marks batch-coupled may still mix rows (a mean, softmax, sort or reversal over the
        batch axis), and padding and chunking would then change the outputs. Checked on the
        largest bucket with random rows, against the same rows with the first one zeroed."""
        if largest[self.batch_dim] < 2:
            return
        rng = np.random.default_rng(0)
        rows = []
        for v in self.program.inputs:
            shape, dtype = tuple(largest.get(d, d) for d in v.type.shape), np.dtype(v.type.dtype)
            if dtype == np.bool_:
                rows.append(rng.random(shape) < 0.5)
            elif np.issubdtype(dtype, np.integer):
                rows.append(rng.integers(0, 2, shape).astype(dtype))
            else:
                rows.append(rng.standard_normal(shape).astype(dtype))
        zeroed = [np.concatenate([np.zeros_like(x[:1]), x[1:]]) for x in rows]
        run = self._executables[tuple(largest.values())]
        tree = self.program.in_tree
        for a, b in zip(*(jax.tree_util.tree_leaves(run(*jax.tree_util.tree_unflatten(tree, xs)))
                          for xs in (rows, zeroed))):
            a, b = np.asarray(a, np.float64)[1:], np.asarray(b, np.float64)[1:]
            if not np.allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(a), initial=0))),
                               equal_nan=True):
                raise ValueError(f"Predictor: {self.program.name} mixes the rows of its batch (an output row changes "
                                 f"when another input row does: a mean, softmax, sort or reversal over the batch "
                                 f"axis), so padding to a bucket and running in chunks would change its outputs; "
                                 f"run it with Program.__call__ on the whole batch")

    def _compile(self, sizes: dict[str, int]):
        specs = [jax.ShapeDtypeStruct(tuple(sizes.get(d, d) for d in v.type.shape), v.type.dtype)
                 for v in self.program.inputs]
        with jax.default_device(self.device):
            executable = self.program.compile(*jax.tree_util.tree_unflatten(self.program.in_tree, specs),
                                              freeze_params=self.freeze_params)
        self.num_compilations += 1
        return executable

    def run(self, *inputs):
        """The program's outputs on ``inputs`` (any batch size), as NumPy arrays."""
        leaves, tree = jax.tree_util.tree_flatten(tuple(inputs))
        if tree != self.program.in_tree:
            raise TypeError(f"Predictor: {self.program.name} expects inputs structured as "
                            f"{self.program.in_tree}, got {tree}")
        if self._fills_a_bucket(leaves):
            executable = self._executables[(leaves[0].shape[0],)]
            outputs = [np.asarray(o) for o in jax.tree_util.tree_leaves(executable.func(*executable.bound, *leaves))]
            return jax.tree_util.tree_unflatten(self.program.out_tree, [o if o.flags.writeable else o.copy()
                                                                        for o in outputs])
        leaves = [self._check(v, x) for v, x in zip(self.program.inputs, leaves)]
        sizes = {x.shape[0] for x in leaves}
        if len(sizes) > 1:
            shown = ", ".join(f"'{v.name}': {x.shape[0]}" for v, x in zip(self.program.inputs, leaves))
            raise ValueError(f"Predictor: inputs disagree on the batch size ({shown})")
        (n,) = sizes
        step = self.config.max_batch_size
        chunks = [self._run_padded([x[i:i + step] for x in leaves]) for i in range(0, max(n, 1), step)]
        if len(chunks) == 1:  # a view of XLA's read-only buffer would surprise a caller that writes into it
            outputs = [o if o.flags.writeable else o.copy() for o in chunks[0]]
        else:
            outputs = [np.concatenate(parts) for parts in zip(*chunks)]
        return jax.tree_util.tree_unflatten(self.program.out_tree, outputs)

    __call__ = run

    def _fills_a_bucket(self, leaves: list) -> bool:
        """Whether ``leaves`` are NumPy arrays of the program's dtypes and shapes whose batch is
        a bucket's size."""
        if self._exact is None or not leaves or type(leaves[0]) is not np.ndarray:
            return False
        n = leaves[0].shape[0] if leaves[0].ndim else None
        return n in self._executables_batches and all(
            type(x) is np.ndarray and x.dtype == dtype and x.shape[1:] == shape and x.shape[0] == n
            for x, (dtype, shape) in zip(leaves, self._exact))

    def _run_padded(self, leaves: list[np.ndarray]) -> list[np.ndarray]:
        n = leaves[0].shape[0]
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        actual = {self.batch_dim: n}
        for v, x in zip(self.program.inputs, leaves):
            for d, got in zip(v.type.shape, x.shape):
                if d in self.size_buckets and actual.setdefault(d, got) != got:
                    raise ValueError(f"Predictor: inputs disagree on size '{d}' ({actual[d]} and {got} "
                                     f"in '{v.name}')")
        padded_to = {self.batch_dim: bucket}
        for name, sizes in self.size_buckets.items():
            if actual[name] > sizes[-1]:
                raise ValueError(f"Predictor: size '{name}' is {actual[name]}, over the largest compiled "
                                 f"bucket {sizes[-1]} of {sizes}")
            padded_to[name] = sizes[bisect.bisect_left(sizes, actual[name])]
        padded = [x if all(padded_to.get(d, s) == s for d, s in zip(v.type.shape, x.shape)) else
                  np.pad(x, [(0, padded_to.get(d, s) - s) for d, s in zip(v.type.shape, x.shape)])
                  for v, x in zip(self.program.inputs, leaves)]  # a batch that fills its bucket is not copied
        outputs = jax.tree_util.tree_leaves(self._executables[tuple(padded_to.values())](
            *jax.tree_util.tree_unflatten(self.program.in_tree, padded)))
        return [np.asarray(o)[tuple(slice(actual[d]) if d in actual else slice(None) for d in v.type.shape)]
                for v, o in zip(self.program.outputs, outputs)]

    def _check(self, value, x) -> np.ndarray:
        x = np.asarray(x)
        want = value.type
        dtype = input_dtype(want.dtype, x.dtype.name)
        if (dtype is None or x.ndim != len(want.shape)
                or any(isinstance(w, int) and w != g for w, g in zip(want.shape[1:], x.shape[1:]))):
            raise ValueError(f"Predictor: input '{value.name}' expects {want} (batch dimension "
                             f"'{self.batch_dim}' first), got {x.dtype.name}{list(x.shape)}")
        bad = [f"'{d}' of {x.shape[i]}" for i, d in enumerate(want.shape)
               if d in self.size_buckets and not 1 <= x.shape[i] <= self.size_buckets[d][-1]]
        if bad:
            raise ValueError(f"Predictor: input '{value.name}' has size {', '.join(bad)}, outside the compiled "
                             f"buckets {self.size_buckets}")
        return x.astype(dtype, copy=False)

    def __repr__(self) -> str:
        sizes = "".join(f", {n} buckets {b}" for n, b in self.size_buckets.items())
        return (f"<Predictor {self.program.name}: buckets {self.buckets}{sizes}, "
                f"{'frozen' if self.freeze_params else 'argument'} parameters on {self.device.platform}>")


def batch_dim(program: Program, others: tuple[str, ...] = ()) -> str:
    """The symbolic size that leads every input and output; a clear error when there is none,
    or when another symbolic size is not one of ``others`` (sizes given buckets).

    >>> import paddlejax as pj
    >>> batch_dim(pj.trace(lambda x: x * 2.0, pj.InputSpec((None, 3))))
    'b'
    """
    first = program.inputs[0].type.shape[:1] if program.inputs else ()
    batch = first[0] if first and isinstance(first[0], str) else None
    for kind, values in (("input", program.inputs), ("output", program.outputs)):
        for i, v in enumerate(values):
            label = f"{kind} {i} ('{v.name}': {v.type})" if v.name else f"{kind} {i} ({v.type})"
            if batch is None or v.type.shape[:1] != (batch,):
                raise ValueError(f"Predictor: {label} does not lead with a symbolic "
                                 f"batch dimension shared by all inputs and outputs; trace the program with "
                                 f"pj.InputSpec((None, ...))")
            unbucketed = [d for d in v.type.shape[1:] if isinstance(d, str) and d not in others]
            if unbucketed:
                raise ValueError(f"Predictor: {label} has symbolic sizes {unbucketed} besides the batch; only the "
                                 f"batch dimension may vary, or give the others buckets with "
                                 f"Config(size_buckets={{'{unbucketed[0]}': (...)}})")
    return batch


def _refuse_batch_coupled(program: Program) -> None:
    """A clear error if an op of ``program`` mixes the rows of its batch (the op library's
    ``batch_coupled``), where the Predictor's padding and chunking would change the outputs."""
    coupled = [op for op in program.walk()
               if (opdef := registry.lookup(op.type)) is not None and opdef.couples_batch(op.attrs)]
    if coupled:
        kinds = ", ".join(dict.fromkeys(op.type for op in coupled))
        raise ValueError(f"Predictor: {program.name} has {len(coupled)} batch-coupled op(s) ({kinds}) whose outputs "
                         f"for a row depend on the other rows (batch norm in training mode normalises with the "
                         f"batch's statistics), so padding to a bucket and running in chunks would change them; "
                         f"trace the model in eval mode: model.eval() before pj.trace, or pj.to_static(model, ...)")


def _param_bytes(program: Program) -> int:
    return sum(np.size(p) * np.dtype(p.dtype).itemsize for p in program.used_params().values())
