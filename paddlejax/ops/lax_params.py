"""The parameters of the generic ``lax.*`` ops, declared once: what jax accepts for each.

A program file names lax primitives with their parameters, and jax binds them unchecked: a
parameter of the wrong kind (``precision=true`` on ``dot_general``) passes abstract
evaluation and then aborts the whole process inside XLA's lowering. So every parameter of a
generic op is checked against this declaration when a program is verified (on load, and on
save, so that a file that saves is a file that loads), and an op whose parameters are not
declared here is refused by name rather than run on trust.

Shapes, axes and ranks are left to the primitive's own shape rule, which the verifier runs;
what is declared here is the *kind* of each value (an int, a tuple of dimensions, a lax enum,
a dtype …) and the bounds the shape rules do not check.

>>> import jax.numpy as jnp
>>> check("dot_general", {"dimension_numbers": (((1,), (0,)), ((), ())), "precision": True,
...                       "preferred_element_type": jnp.dtype("float32"), "out_sharding": None})
Traceback (most recent call last):
...
paddlejax.ops.lax_params.ParamError: attribute 'precision' must be None, a lax.Precision or a pair of them, not True
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from jax import lax

from paddlejax.ir.attrs import SymDim


class ParamError(ValueError):
    """A parameter value that the primitive does not accept."""


Kind = Callable[[Any], bool]

_INT_LIMIT = 2 ** 31


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT_LIMIT <= v < _INT_LIMIT


def _described(kind: Kind, text: str) -> Kind:
    kind.text = text
    return kind


def _describe(kind: Kind) -> str:
    return getattr(kind, "text", "a valid value")


INT = _described(_is_int, "an int")
NONNEG = _described(lambda v: _is_int(v) and v >= 0, "an int >= 0")
POSITIVE = _described(lambda v: _is_int(v) and v >= 1, "an int >= 1")
BOOL = _described(lambda v: isinstance(v, bool), "true or false")
NONE = _described(lambda v: v is None, "None")
DTYPE = _described(lambda v: isinstance(v, np.dtype), "a dtype")
DIM = _described(lambda v: (_is_int(v) and v >= 0) or isinstance(v, SymDim), "a dimension (an int >= 0 or a symbol)")
INT_OR_SYM = _described(lambda v: _is_int(v) or isinstance(v, SymDim), "an int or a symbolic dimension")
NUMBER = _described(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                    and (not isinstance(v, int) or _is_int(v)), "a number")


def optional(kind: Kind) -> Kind:
    return _described(lambda v: v is None or kind(v), f"None or {_describe(kind)}")


def tuple_of(kind: Kind, length: int | None = None) -> Kind:
    def ok(v):
        return (isinstance(v, tuple) and not hasattr(v, "_fields") and len(v) <= 64
                and (length is None or len(v) == length) and all(kind(x) for x in v))
    n = f"{length} " if length is not None else ""
    return _described(ok, f"a tuple of {n}({_describe(kind)})")


def enum(cls) -> Kind:
    return _described(lambda v: isinstance(v, cls), f"a lax.{cls.__name__}")


def struct(cls, **fields: Kind) -> Kind:
    def ok(v):
        return isinstance(v, cls) and all(kind(getattr(v, f)) for f, kind in fields.items())
    return _described(ok, f"a lax.{cls.__name__} of valid fields")


def in_range(lo: float, hi: float) -> Kind:
    return _described(lambda v: NUMBER(v) and math.isfinite(v) and lo <= v <= hi, f"a number in [{lo}, {hi}]")


INTS = tuple_of(INT)
NONNEG_INTS = tuple_of(NONNEG)
POSITIVE_INTS = tuple_of(POSITIVE)
SHAPE = tuple_of(DIM)
PADDING = tuple_of(tuple_of(INT_OR_SYM, 2))
PRECISION = _described(
    lambda v: v is None or isinstance(v, lax.Precision) or (
        isinstance(v, tuple) and len(v) == 2 and all(p is None or isinstance(p, lax.Precision) for p in v)),
    "None, a lax.Precision or a pair of them")
ACCURACY = optional(enum(lax.AccuracyMode))
DOT_DIMENSIONS = tuple_of(tuple_of(NONNEG_INTS, 2), 2)

_ACCURACY_OPS = ("exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
                 "sqrt", "rsqrt", "cbrt")
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
               "reduce_xor")
_CUMULATIVE = ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
_WINDOWS = ("reduce_window_sum", "reduce_window_max", "reduce_window_min")
_SCATTERS = ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max")
_INDEX_DIMS = dict(offset_dims=NONNEG_INTS, collapsed_slice_dims=NONNEG_INTS, start_index_map=NONNEG_INTS,
                   operand_batching_dims=NONNEG_INTS, start_indices_batching_dims=NONNEG_INTS)
_SCATTER_DIMS = dict(update_window_dims=NONNEG_INTS, inserted_window_dims=NONNEG_INTS,
                     scatter_dims_to_operand_dims=NONNEG_INTS, operand_batching_dims=NONNEG_INTS,
                     scatter_indices_batching_dims=NONNEG_INTS)
_WINDOW = {"window_dimensions": POSITIVE_INTS, "window_strides": POSITIVE_INTS, "padding": PADDING,
           "base_dilation": POSITIVE_INTS, "window_dilation": POSITIVE_INTS}
_INDEXING = {"indices_are_sorted": BOOL, "unique_indices": BOOL, "mode": enum(lax.GatherScatterMode)}

# Parameters by primitive. A primitive missing here may still appear with no parameters (add,
# sign, erf …): the verifier's shape rule then checks it has none it needs.
PARAMS: dict[str, dict[str, Kind]] = {
    **{p: {"accuracy": ACCURACY} for p in _ACCURACY_OPS},
    **{p: {"axes": NONNEG_INTS, "out_sharding": NONE} for p in _REDUCTIONS},
    **{p: {"axis": NONNEG, "reverse": BOOL} for p in _CUMULATIVE},
    **{p: dict(_WINDOW) for p in _WINDOWS},
    # a scatter's update function follows from its primitive (paddlejax.adapter.bind_lax adds it)
    **{p: {"dimension_numbers": struct(lax.ScatterDimensionNumbers, **_SCATTER_DIMS), **_INDEXING}
       for p in _SCATTERS},
    "mul": {"out_dtype": optional(DTYPE)},
    "argmax": {"axes": NONNEG_INTS, "index_dtype": DTYPE},
    "argmin": {"axes": NONNEG_INTS, "index_dtype": DTYPE},
    "broadcast_in_dim": {"shape": SHAPE, "broadcast_dimensions": NONNEG_INTS, "sharding": NONE},
    "reshape": {"new_sizes": SHAPE, "dimensions": optional(NONNEG_INTS), "sharding": NONE},
    "transpose": {"permutation": NONNEG_INTS},
    "rev": {"dimensions": NONNEG_INTS},
    "squeeze": {"dimensions": NONNEG_INTS},
    "concatenate": {"dimension": NONNEG},
    "split": {"sizes": SHAPE, "axis": NONNEG},
    "slice": {"start_indices": SHAPE, "limit_indices": SHAPE, "strides": optional(POSITIVE_INTS)},
    "dynamic_slice": {"slice_sizes": SHAPE},
    "pad": {"padding_config": tuple_of(tuple_of(INT_OR_SYM, 3))},
    "convert_element_type": {"new_dtype": DTYPE, "weak_type": BOOL, "sharding": NONE},
    "bitcast_convert_type": {"new_dtype": DTYPE},
    "iota": {"dtype": DTYPE, "shape": SHAPE, "dimension": NONNEG, "sharding": NONE},
    "integer_pow": {"y": INT},
    "reduce_precision": {"exponent_bits": _described(lambda v: _is_int(v) and 1 <= v <= 30, "an int in [1, 30]"),
                         "mantissa_bits": _described(lambda v: _is_int(v) and 0 <= v <= 60, "an int in [0, 60]")},
    "round": {"rounding_method": enum(lax.RoundingMethod)},
    "sort": {"dimension": NONNEG, "is_stable": BOOL, "num_keys": POSITIVE},
    "top_k": {"k": NONNEG, "axis": INT, "is_stable": BOOL},
    "tile": {"reps": POSITIVE_INTS},
    "stack": {"axis": NONNEG},
    "unstack": {"axis": NONNEG},
    "platform_index": {"platforms": tuple_of(optional(tuple_of(
        _described(lambda v: isinstance(v, str) and len(v) <= 64, "a platform name"))))},
    "approx_top_k": {"k": POSITIVE, "reduction_dimension": INT, "recall_target": in_range(1e-6, 1.0),
                     "is_max_k": BOOL, "reduction_input_size_override": INT, "aggregate_to_topk": BOOL},
    "dot_general": {"dimension_numbers": DOT_DIMENSIONS, "precision": PRECISION,
                    "preferred_element_type": optional(DTYPE), "out_sharding": NONE},
    "conv_general_dilated": {
        "window_strides": POSITIVE_INTS, "padding": PADDING, "lhs_dilation": POSITIVE_INTS,
        "rhs_dilation": POSITIVE_INTS, "feature_group_count": POSITIVE, "batch_group_count": POSITIVE,
        "dimension_numbers": struct(lax.ConvDimensionNumbers, lhs_spec=NONNEG_INTS, rhs_spec=NONNEG_INTS,
                                    out_spec=NONNEG_INTS),
        "precision": PRECISION, "preferred_element_type": optional(DTYPE), "out_sharding": NONE},
    "gather": {"dimension_numbers": struct(lax.GatherDimensionNumbers, **_INDEX_DIMS), "slice_sizes": SHAPE,
               "fill_value": optional(NUMBER), **_INDEXING},
    "fft": {"fft_type": enum(lax.FftType), "fft_lengths": POSITIVE_INTS},
    "eigh": {"lower": BOOL, "sort_eigenvalues": BOOL, "subset_by_index": NONE, "algorithm": NONE},
    "svd": {"full_matrices": BOOL, "compute_uv": BOOL, "subset_by_index": NONE, "algorithm": NONE},
    "qr": {"pivoting": BOOL, "full_matrices": BOOL, "use_magma": optional(BOOL)},
    "cholesky": {"symmetrize_input": BOOL},
    "eig": {"compute_left_eigenvectors": BOOL, "compute_right_eigenvectors": BOOL, "enable_eigvec_derivs": BOOL,
            "implementation": NONE, "use_magma": optional(BOOL)},
    "schur": {"compute_schur_vectors": BOOL, "sort_eig_vals": BOOL, "select_callable": NONE},
    "ormqr": {"left": BOOL, "transpose": BOOL},
    "lu_pivots_to_permutation": {"permutation_size": NONNEG},
    "iota_2x32_shape": {"shape": SHAPE},
    "triangular_solve": {"left_side": BOOL, "lower": BOOL, "transpose_a": BOOL, "conjugate_a": BOOL,
                         "unit_diagonal": BOOL},
    "rng_bit_generator": {"shape": SHAPE, "dtype": DTYPE, "algorithm": enum(lax.RandomAlgorithm),
                          "out_sharding": NONE},
    "rng_uniform": {"shape": SHAPE},
    **{p: {"axes": NONNEG_INTS, "axis_index_groups": NONE} for p in ("psum", "pmax", "pmin")},
    "random_gamma": {"log_space": BOOL},
    "conj": {"input_dtype": DTYPE},
    "tridiagonal_solve": {"perturb_singular": BOOL},
    "empty": {"shape": SHAPE, "dtype": DTYPE, "out_sharding": NONE},  # jax >= 0.11
    "dim_as_value": {"dim": _described(lambda v: isinstance(v, SymDim), "a symbolic dimension")},
}


def check(primitive: str, params: dict) -> None:
    """Raise :class:`ParamError` unless ``params`` are what ``lax.<primitive>`` accepts.

    >>> check("cumsum", {"axis": 0, "reverse": False})
    >>> check("cumsum", {"axis": 0, "reverse": "no"})
    Traceback (most recent call last):
    ...
    paddlejax.ops.lax_params.ParamError: attribute 'reverse' must be true or false, not 'no'
    """
    declared = PARAMS.get(primitive)
    if declared is None:
        if params:
            raise ParamError(f"parameters of lax.{primitive} are not declared in paddlejax.ops.lax_params, "
                             f"so {sorted(params)} cannot be checked; this paddlejax does not run it from a file")
        return
    for name, value in params.items():
        kind = declared.get(name)
        if kind is None:
            raise ParamError(f"unknown attribute '{name}' (lax.{primitive} takes {', '.join(declared)})")
        if not kind(value):
            raise ParamError(f"attribute '{name}' must be {_describe(kind)}, not {_short(value)}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
