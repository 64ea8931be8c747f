"""Unstructured and N:M sparsity of a program's weights: PaddleSlim's unstructured pruning and
Paddle's automatic sparsity (ASP, ``paddle.incubate.asp``), on programs.

The weights are the parameters that ops read through the input their traits name as ``weight``
(conv2d, depthwise_conv2d, linear, matmul, and the plain ``x @ w`` products that read as matmul),
less an ``exclude`` list (Paddle's ``set_excluded_layers``) and those under ``min_size`` elements.
A mask is a boolean array of the weight's shape, True where the weight is kept.

- ``ratio=0.75``: unstructured magnitude masks, the 75 % smallest ``|w|`` zeroed in each weight
  (``scope="tensor"``) or across all of them (``scope="global"``, PaddleSlim's default);
- ``n=2, m=4`` (the default): N:M masks, at most ``n`` of every ``m`` consecutive weights along
  the input-channel (reduction) axis kept, as ASP's ``mask_1d`` does (``mask_2d_greedy`` keeps
  ``n`` per row and per column of every ``m x m`` block, so the transposed weight is N:M too).
  The axis is the one the traits declare (``weight_in_axis``), or the other axis of a 2-D weight
  whose output axis they declare; a weight without one, or whose axis is shorter than ``m``, stays
  dense, as in ASP.

:func:`prune_program` (ASP's ``prune_model``) returns the pruned copy and its masks;
:func:`decorate` (ASP's ``decorate(optimizer)``) keeps the zeros through fine-tuning under
``pj.Trainer``; ``pj.save(program, path, sparse=True)`` stores the zeros compactly (a bitmask
and the kept values); :func:`sparsity` reports each weight's density.

>>> import numpy as np, paddlejax as pj
>>> w = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
>>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["fc.w"]), pj.InputSpec((None, 64)), params={"fc.w": w})
>>> sparse, masks = prune_program(prog)  # 2:4 along the 64 input features
>>> sparsity(sparse), check_sparsity(sparse.params["fc.w"], n=2, m=4, axis=0)
({'fc.w': 0.5}, True)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from paddlejax.ir.core import Program
from paddlejax.ops import registry
from paddlejax.ops.traits import traits_of
from paddlejax.passes.query import param_name

MIN_SIZE = 1024
MASK_ALGOS = ("mask_1d", "mask_2d_greedy")
SCOPES = ("tensor", "global")


# -- which parameters are weights -----------------------------------------------------------------

def _weight_reads(program: Program):
    """``(parameter name, input-channel axis or None)`` for every read of a parameter as an op's
    weight, the op's kind taken in the registry's vocabulary (a ``lax.dot_general`` reads as matmul)."""
    for op in program.walk():
        kind, attrs = op.canonical
        opdef, traits = registry.lookup(kind), traits_of(kind)
        if opdef is None or traits.weight is None:
            continue
        index = [i.name for i in opdef.inputs].index(traits.weight)
        name = param_name(op.operands[index]) if index < len(op.operands) else None
        if name is None:
            continue
        rank = len(op.operands[index].type.shape)
        if traits.weight_in_axis is not None:
            axis = traits.weight_in_axis(attrs, rank)
        else:  # a 2-D weight reduces over the axis that does not make the outputs
            out = traits.weight_out_axis(attrs, rank) if traits.weight_out_axis is not None else None
            axis = None if rank != 2 or out is None else 1 - out % 2
        yield name, axis


def prunable_weights(program: Program, *, exclude=(), min_size: int = MIN_SIZE) -> dict[str, int | None]:
    """``{parameter name: input-channel axis}`` of the weights that masks cover (the axis None
    where the traits do not tell it, or where two ops read the weight along different axes).

    >>> import numpy as np, paddlejax as pj
    >>> p = {"conv": np.ones((8, 4, 3, 3), np.float32), "fc": np.ones((8, 2), np.float32)}
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.conv2d(x, p["conv"]).mean((2, 3)), p["fc"]),
    ...                 pj.InputSpec((None, 4, 5, 5)), params=p)
    >>> prunable_weights(prog, min_size=0), prunable_weights(prog, min_size=100)
    ({'conv': 1, 'fc': 0}, {'conv': 1})
    """
    axes: dict[str, int | None] = {}
    for name, axis in _weight_reads(program):
        axes[name] = axis if axes.get(name, axis) == axis else None
    unknown = sorted(set(exclude) - set(axes))
    if unknown:
        raise ValueError(f"sparsity: exclude names {unknown}, which no op reads as a weight; weights: {sorted(axes)}")
    return {name: axis for name, axis in axes.items()
            if name not in exclude and np.size(program.params[name]) >= min_size}


# -- masks of arrays ----------------------------------------------------------------------------------

def magnitude_mask(array, ratio: float) -> np.ndarray:
    """The mask that zeroes the ``ratio`` of ``array``'s elements of smallest magnitude (ties
    go by position, so the count is exact).

    >>> magnitude_mask(np.array([0.5, -2.0, 0.1, 3.0]), 0.5).tolist()
    [False, True, False, True]
    """
    _check_ratio(ratio)
    flat = np.abs(np.asarray(array, np.float64)).reshape(-1)
    keep = np.ones(flat.size, bool)
    keep[np.argsort(flat, kind="stable")[:round(ratio * flat.size)]] = False
    return keep.reshape(np.shape(array))


def _check_ratio(ratio) -> None:
    if not (isinstance(ratio, (int, float)) and 0 <= ratio < 1):
        raise ValueError(f"sparsity: ratio is the fraction of weights to zero, in [0, 1); got {ratio!r}")


def _check_nm(n, m) -> None:
    if not (isinstance(n, int) and isinstance(m, int) and 0 < n < m):
        raise ValueError(f"sparsity: N:M keeps n of every m weights, 0 < n < m; got n={n!r}, m={m!r}")


def _matrix(array, axis: int, m: int, rows_multiple: int) -> tuple[np.ndarray, tuple]:
    """``|array|`` as a ``[rest, axis]`` matrix padded with -1 (never preferred to a real weight)
    to a multiple of ``m`` columns and of ``rows_multiple`` rows, and the moved shape."""
    moved = np.moveaxis(np.abs(np.asarray(array, np.float64)), axis, -1)
    matrix = moved.reshape(-1, moved.shape[-1])
    pad = ((0, -matrix.shape[0] % rows_multiple), (0, -matrix.shape[1] % m))
    return np.pad(matrix, pad, constant_values=-1.0), moved.shape


def _unmatrix(mask: np.ndarray, moved_shape: tuple, axis: int) -> np.ndarray:
    rows, cols = int(np.prod(moved_shape[:-1])), moved_shape[-1]
    return np.moveaxis(mask[:rows, :cols].reshape(moved_shape), -1, axis)


def nm_mask(array, n: int = 2, m: int = 4, axis: int = -1, mask_algo: str = "mask_1d") -> np.ndarray:
    """The N:M mask of ``array`` along ``axis``: ``mask_1d`` keeps the ``n`` largest ``|w|`` of
    every ``m`` consecutive elements; ``mask_2d_greedy`` views the array as a matrix with
    ``axis`` as its columns and, in every ``m x m`` block, keeps the largest elements whose row
    and column still hold fewer than ``n`` (Paddle's greedy 2-D mask). A last, shorter group
    keeps at most ``n``.

    >>> nm_mask(np.array([[0.1, -3.0, 2.0, 0.5, 1.0, 0.0, 0.0, -1.5]])).astype(int).tolist()
    [[0, 1, 1, 0, 1, 0, 0, 1]]
    """
    _check_nm(n, m)
    if mask_algo not in MASK_ALGOS:
        raise ValueError(f"sparsity: mask_algo must be one of {', '.join(MASK_ALGOS)}, got {mask_algo!r}")
    matrix, moved = _matrix(array, axis, m, m if mask_algo == "mask_2d_greedy" else 1)
    if mask_algo == "mask_1d":
        groups = matrix.reshape(matrix.shape[0], -1, m)
        keep = np.zeros(groups.shape, bool)
        np.put_along_axis(keep, np.argsort(-groups, axis=-1, kind="stable")[..., :n], True, axis=-1)
        return _unmatrix(keep.reshape(matrix.shape), moved, axis)
    rows, cols = matrix.shape[0] // m, matrix.shape[1] // m
    blocks = matrix.reshape(rows, m, cols, m).transpose(0, 2, 1, 3).reshape(-1, m * m)
    order = np.argsort(-blocks, axis=1, kind="stable")
    keep = np.zeros(blocks.shape, bool)
    in_row, in_col = np.zeros((len(blocks), m), int), np.zeros((len(blocks), m), int)
    every = np.arange(len(blocks))
    for step in range(m * m):  # each block's elements, largest first, all blocks at once
        idx = order[:, step]
        r, c = idx // m, idx % m
        ok = (in_row[every, r] < n) & (in_col[every, c] < n)
        keep[every, idx] = ok
        in_row[every, r] += ok
        in_col[every, c] += ok
    keep = keep.reshape(rows, cols, m, m).transpose(0, 2, 1, 3).reshape(matrix.shape)
    return _unmatrix(keep, moved, axis)


def check_sparsity(array, n: int = 2, m: int = 4, axis: int = -1, mask_algo: str = "mask_1d") -> bool:
    """Whether ``array`` is N:M sparse along ``axis`` (Paddle's ``asp.check_sparsity``): at most
    ``n`` nonzeros in every ``m`` consecutive elements (``mask_1d``), or in every row and column of
    every ``m x m`` block of the matrix whose columns are ``axis`` (``mask_2d_greedy``).

    >>> check_sparsity(np.array([[1.0, 0.0, 2.0, 0.0]])), check_sparsity(np.array([[1.0, 1.0, 2.0, 0.0]]))
    (True, False)
    """
    _check_nm(n, m)
    if mask_algo not in MASK_ALGOS:
        raise ValueError(f"sparsity: mask_algo must be one of {', '.join(MASK_ALGOS)}, got {mask_algo!r}")
    nonzero = np.asarray(array) != 0
    if mask_algo == "mask_1d":
        matrix, _ = _matrix(nonzero, axis, m, 1)
        return bool(((matrix > 0).reshape(matrix.shape[0], -1, m).sum(-1) <= n).all())
    matrix, _ = _matrix(nonzero, axis, m, m)
    blocks = (matrix > 0).reshape(matrix.shape[0] // m, m, matrix.shape[1] // m, m)
    return bool((blocks.sum(3) <= n).all() and (blocks.sum(1) <= n).all())


# -- masks of programs --------------------------------------------------------------------------------

def create_masks(program: Program, ratio: float | None = None, *, n: int | None = None, m: int | None = None,
                 mask_algo: str = "mask_1d", scope: str = "tensor", exclude=(),
                 min_size: int = MIN_SIZE) -> dict[str, np.ndarray]:
    """``{weight name: mask}`` for ``program``'s weights: magnitude masks at ``ratio``, or N:M
    masks (2:4 when neither is given); the weights N:M leaves dense have no mask.

    >>> import numpy as np, paddlejax as pj
    >>> p = {"a": np.arange(1.0, 9.0).reshape(4, 2), "b": np.full((2, 2), 100.0)}
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.linear(x, p["a"]), p["b"]), pj.InputSpec((None, 4)),
    ...                 params=p)
    >>> {k: int(v.sum()) for k, v in create_masks(prog, 0.5, min_size=0).items()}
    {'a': 4, 'b': 2}
    >>> {k: int(v.sum()) for k, v in create_masks(prog, 0.5, scope="global", min_size=0).items()}
    {'a': 2, 'b': 4}
    """
    if scope not in SCOPES:
        raise ValueError(f"sparsity: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    weights = prunable_weights(program, exclude=exclude, min_size=min_size)
    arrays = {name: np.asarray(program.params[name]) for name in weights}
    if ratio is not None:
        if n is not None or m is not None:
            raise ValueError("sparsity: give ratio (unstructured) or n and m (N:M), not both")
        if scope == "tensor":
            return {name: magnitude_mask(w, ratio) for name, w in arrays.items()}
        if not arrays:
            return {}
        everything = magnitude_mask(np.concatenate([w.reshape(-1) for w in arrays.values()]), ratio)
        ends = np.cumsum([w.size for w in arrays.values()])[:-1]
        return {name: part.reshape(w.shape) for (name, w), part in zip(arrays.items(), np.split(everything, ends))}
    n, m = 2 if n is None else n, 4 if m is None else m
    _check_nm(n, m)
    return {name: nm_mask(w, n, m, weights[name], mask_algo) for name, w in arrays.items()
            if weights[name] is not None and w.shape[weights[name]] >= m}


def apply_masks(program: Program, masks: dict) -> Program:
    """A copy of ``program`` whose masked weights are zero where their masks are False.

    >>> import numpy as np, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": np.ones((2, 2), np.float32)})
    >>> apply_masks(prog, {"w": np.eye(2, dtype=bool)}).params["w"].tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    params = dict(program.params)
    for name, mask in masks.items():
        if name not in params:
            raise ValueError(f"sparsity: mask '{name}' names no parameter of {program.name}")
        weight = np.asarray(params[name])
        mask = np.asarray(mask)
        if mask.shape != weight.shape or mask.dtype != bool:
            raise ValueError(f"sparsity: mask '{name}' is {mask.dtype}{list(mask.shape)}; the weight needs "
                             f"bool{list(weight.shape)}")
        params[name] = np.where(mask, weight, np.zeros((), weight.dtype))
    out = program.clone()
    out.params = params
    return out


def prune_program(program: Program, ratio: float | None = None, *, n: int | None = None, m: int | None = None,
                  mask_algo: str = "mask_1d", scope: str = "tensor", exclude=(),
                  min_size: int = MIN_SIZE) -> tuple[Program, dict[str, np.ndarray]]:
    """``(pruned copy, masks)``: Paddle's ``asp.prune_model``, with :func:`create_masks`'s
    arguments (``ratio`` for unstructured magnitude masks, else ``n``:``m``, 2:4 by default).

    >>> import numpy as np, paddlejax as pj
    >>> w = np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32)
    >>> prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 32)), params={"w": w})
    >>> pruned, masks = prune_program(prog, 0.75)
    >>> sparsity(pruned), float(masks["w"].mean())
    ({'w': 0.25}, 0.25)
    """
    masks = create_masks(program, ratio, n=n, m=m, mask_algo=mask_algo, scope=scope, exclude=exclude,
                         min_size=min_size)
    return apply_masks(program, masks), masks


def sparsity(program: Program) -> dict[str, float]:
    """``{weight name: density}`` (the fraction of nonzero elements) of every weight ops read.

    >>> import numpy as np, paddlejax as pj
    >>> prog = pj.trace(lambda p, x: x @ p["w"], pj.InputSpec((None, 2)), params={"w": np.eye(2, dtype=np.float32)})
    >>> sparsity(prog)
    {'w': 0.5}
    """
    return {name: float(np.count_nonzero(np.asarray(program.params[name])) / np.size(program.params[name]))
            for name in prunable_weights(program, min_size=0)}


# -- keeping the zeros through training -------------------------------------------------------------

class MaskedState(NamedTuple):
    """The state of :func:`decorate`: the wrapped optimizer's, and one mask (or None) per leaf of
    the parameter tree."""

    inner: object
    masks: tuple


def _path_names(tree) -> tuple[list[str], list]:
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in leaves], [v for _, v in leaves]


def _places(leaf_name: str, name: str):
    """``(prefix, suffix)`` for every place ``name`` fills whole dotted parts of ``leaf_name``."""
    start = leaf_name.find(name)
    while start >= 0:
        end = start + len(name)
        if (start == 0 or leaf_name[start - 1] == ".") and (end == len(leaf_name) or leaf_name[end] == "."):
            yield leaf_name[:start], leaf_name[end:]
        start = leaf_name.find(name, start + 1)


def leaf_masks(params, masks: dict) -> tuple:
    """One mask (or None) per leaf of the parameter tree ``params``, matched by name: a mask
    named ``N`` belongs to the leaf whose path is ``N`` between a prefix and a suffix common to all
    masks (the Trainer names a ``ProgramLayer``'s parameters ``params.N``; ``nnx.Optimizer`` sees
    ``params.N.value``). A mask that names no leaf, masks that fit several places, or a mask of
    the wrong shape is an error.

    >>> import numpy as np
    >>> params = {"params.fc.w": np.ones((2, 2)), "params.fc.b": np.ones(2)}
    >>> [None if m is None else m.shape for m in leaf_masks(params, {"fc.w": np.eye(2, dtype=bool)})]
    [None, (2, 2)]
    """
    names, leaves = _path_names(params)
    if not masks:
        return (None,) * len(leaves)
    found: dict[tuple[str, str], dict[str, int]] = {}
    for i, leaf_name in enumerate(names):
        for name in masks:
            for place in _places(leaf_name, name):
                found.setdefault(place, {})[name] = i
    complete = sorted(place for place, hits in found.items() if len(hits) == len(masks))
    if len(complete) > 1 and ("", "") in complete:  # masks named by their full paths
        complete = [("", "")]
    if len(complete) > 1:
        raise ValueError("decorate: the masks fit the parameters at several places "
                         f"({', '.join(p + '*' + s for p, s in complete)}); name them by their full paths")
    if not complete:
        best = max(found.values(), key=len, default={})
        missing = sorted(set(masks) - set(best))
        raise ValueError(f"decorate: masks {missing[:5]} name no parameter of the optimized tree "
                         f"(its parameters: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})")
    out: list = [None] * len(leaves)
    for name, i in found[complete[0]].items():
        mask = np.asarray(masks[name], bool)
        if mask.shape != np.shape(leaves[i]):
            raise ValueError(f"decorate: mask '{name}' has shape {mask.shape} but parameter '{names[i]}' has "
                             f"{tuple(np.shape(leaves[i]))}")
        out[i] = mask
    return tuple(out)


def decorate(tx, masks: dict):
    """``tx`` (an optax transformation) whose updates keep the masked weights at zero: Paddle's
    ``asp.decorate(optimizer)``. A masked position's update is ``-w`` (zero for a weight already
    zero), so after every step the weight is exactly zero there, whatever ``tx`` adds (momentum,
    Adam's moments, decoupled weight decay, the Trainer's ``weight_decay``). Masks are matched to
    the parameter tree by name (:func:`leaf_masks`) when the optimizer state is made.

    >>> import jax.numpy as jnp, numpy as np, optax
    >>> tx = decorate(optax.adam(0.1), {"w": np.array([True, False])})
    >>> params = {"w": jnp.array([1.0, 0.0])}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.array([1.0, 1.0])}, state, params)
    >>> [round(v, 4) for v in optax.apply_updates(params, updates)["w"].tolist()]
    [0.9, 0.0]
    """
    import jax
    import jax.numpy as jnp
    import optax

    masks = dict(masks)

    def init(params):
        return MaskedState(tx.init(params), tuple(None if m is None else jnp.asarray(m)
                                                  for m in leaf_masks(params, masks)))

    def update(updates, state, params=None):
        updates, inner = tx.update(updates, state.inner, params)
        flat, treedef = jax.tree_util.tree_flatten(updates)
        weights = treedef.flatten_up_to(params) if params is not None else [None] * len(flat)
        out = [u if mask is None else jnp.where(mask, u, jnp.zeros_like(u) if w is None else -w).astype(u.dtype)
               for u, w, mask in zip(flat, weights, state.masks)]
        return jax.tree_util.tree_unflatten(treedef, out), MaskedState(inner, state.masks)

    return optax.GradientTransformation(init, update)
