"""The traits of the generic ``lax.*`` ops, declared once (see :mod:`paddlejax.ops.traits`).

A captured program holds plain JAX primitives between registry ops (``lax.add``,
``lax.dot_general``, ``lax.reduce_sum`` ...). What each one means for the passes is declared
here, grouped by kind; a primitive missing from :data:`LAX_TRAITS` is opaque to every pass
(kept by DCE, never fused or cast), and the op-library tests list every primitive that
captured programs use, so a missing declaration fails a test rather than going unnoticed.

>>> LAX_TRAITS["mul"].commutative, LAX_TRAITS["mul"].unit, LAX_TRAITS["div"].unit
(True, 1.0, 1.0)
>>> LAX_TRAITS["reduce_sum"].reduction, LAX_TRAITS["exp"].amp
(True, 'black')
"""
from __future__ import annotations

import numpy as np

from paddlejax.ops.traits import Traits, always

# -- canonical twins in the registry's vocabulary -------------------------------------------------


def _same_numeric(types) -> bool:
    dtypes = {t.dtype for t in types}
    return len(dtypes) == 1 and "bool" not in dtypes


def _inexact(types) -> bool:
    return _same_numeric(types) and np.issubdtype(np.dtype(_numpy_dtype(types[0].dtype)), np.inexact)


def _numpy_dtype(name: str) -> str:
    # bfloat16 and the float8 types are not NumPy's; only their kind matters here
    return "float32" if name.startswith(("bfloat16", "float8")) else name


def _binary(name: str, *, inexact_only: bool = False):
    """``lax.<x>(a, b)`` on equal dtypes is ``elementwise_<x>(a, b)`` (lax shapes are equal,
    so Paddle's broadcasting never applies)."""
    def rule(attrs, types):
        if attrs.get("out_dtype") is not None or not (_inexact if inexact_only else _same_numeric)(types):
            return None
        return name, {}
    return rule


def _activation(name: str):
    def rule(attrs, types):
        return (name, {}) if attrs.get("accuracy") is None else None
    return rule


def _transpose(attrs, types):
    return "transpose", {"perm": tuple(attrs["permutation"])}


def _reshape(attrs, types):
    sizes = attrs["new_sizes"]
    # Paddle's reshape reads 0 as "copy this input dimension": a real 0 has no twin
    if attrs.get("dimensions") is not None or not all(isinstance(d, int) and d > 0 for d in sizes):
        return None
    return "reshape", {"shape": tuple(sizes)}


def _convert(attrs, types):
    return "cast", {"dtype": np.dtype(attrs["new_dtype"]).name}


def _concatenate(attrs, types):
    return "concat", {"axis": attrs["dimension"]}


def _dot_general(attrs, types):
    """A plain matrix product: ``x[..., k] @ y[k, n]`` (or ``y[n, k]`` transposed), or a batched
    one over equal leading axes."""
    if len(types) != 2 or attrs.get("precision") is not None or not _inexact(types):
        return None
    preferred = attrs.get("preferred_element_type")
    if preferred is not None and np.dtype(preferred).name != types[0].dtype:
        return None
    x, y = (len(t.shape) for t in types)
    (contract_x, contract_y), (batch_x, batch_y) = (tuple(map(tuple, d)) for d in attrs["dimension_numbers"])
    if contract_x != (x - 1,) or len(contract_y) != 1:
        return None
    if y == 2 and x >= 1 and not batch_x and not batch_y:
        transpose_y = contract_y == (1,)
    elif (x == y >= 3 and batch_x == batch_y == tuple(range(x - 2))
          and types[0].shape[:-2] == types[1].shape[:-2]):
        transpose_y = contract_y == (y - 1,)
    else:
        return None
    if not transpose_y and contract_y != (y - 2,):
        return None
    return "matmul", {"transpose_x": False, "transpose_y": transpose_y}


# -- identities -----------------------------------------------------------------------------------


def _identity_permutation(attrs) -> bool:
    perm = tuple(attrs["permutation"])
    return perm == tuple(range(len(perm)))


def _no_padding(attrs) -> bool:
    return all(v == 0 for pads in attrs["padding_config"] for v in pads)


def _reduced(attrs):
    return "reduced" if "axes" in attrs else None


def _conv_channels(attrs):
    return "grouped" if attrs.get("feature_group_count", 1) > 1 else "consumed"


# -- the table ------------------------------------------------------------------------------------

_POINTWISE = dict(pointwise=True, channels="identity")
_LINEAR = ()  # a linear op's gradient reads none of its activations

_GRAY_UNARY = ("abs", "neg", "sign", "floor", "ceil", "round", "is_finite", "not", "clz", "population_count",
               "real", "imag", "conj", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
               "acosh", "atanh", "tanh", "logistic", "erf", "erfc", "cbrt", "lgamma", "digamma", "bessel_i0e",
               "bessel_i1e", "copy")
_BLACK_UNARY = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "square", "integer_pow", "erf_inv",
                "reduce_precision")
_COMMUTATIVE = ("add", "add_any", "mul", "max", "min", "and", "or", "xor", "eq", "ne", "mulhi")
_BINARY = ("sub", "rem", "atan2", "nextafter", "lt", "le", "gt", "ge", "lt_to", "le_to", "eq_to", "shift_left",
           "shift_right_arithmetic", "shift_right_logical", "complex", "igamma", "igammac", "igamma_grad_a",
           "polygamma", "zeta")
_BLACK_BINARY = ("div", "pow")
_REDUCTIONS = ("reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_xor", "argmax", "argmin",
               "reduce")
_BLACK_REDUCTIONS = ("reduce_sum", "reduce_prod")
_BLACK_CUMULATIVE = ("cumsum", "cumprod")
_CUMULATIVE = ("cummax", "cummin", "cumlogsumexp")
_WINDOWS = ("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window", "select_and_scatter_add",
            "select_and_gather_add")
_REARRANGING = ("rev", "gather", "dynamic_slice", "dynamic_update_slice", "scatter", "scatter-add", "scatter-sub",
                "scatter-mul", "scatter-min", "scatter-max", "sort", "top_k", "approx_top_k", "split", "tile",
                "stack", "unstack", "iota", "select_and_scatter")
_LINALG = ("cholesky", "eigh", "svd", "qr", "eig", "lu", "lu_pivots_to_permutation", "triangular_solve", "schur",
           "ormqr", "householder_product", "geqrf", "geqp3", "hessenberg", "tridiagonal", "tridiagonal_solve",
           "symmetric_product", "cholesky_update", "fft", "custom_linear_solve")
_RANDOM = ("rng_bit_generator", "threefry2x32", "random_bits", "random_seed", "random_wrap", "random_unwrap",
           "random_fold_in", "random_split", "iota_2x32_shape", "random_gamma")

# What each differentiable op's backward pass reads (checked against ``jax.vjp``).
_SAVED = {
    **dict.fromkeys(("add", "add_any", "sub", "neg", "broadcast_in_dim", "reshape", "transpose", "reduce_sum",
                     "concatenate", "squeeze", "slice", "pad", "convert_element_type", "copy"), _LINEAR),
    **dict.fromkeys(("mul", "dot_general", "log"), ("operands",)),
    "div": ("operands", "new"),
    "exp": ("result",),
    "tanh": ("result", "new"),
    **dict.fromkeys(("logistic", "sqrt", "rsqrt", "integer_pow", "square", "sin", "cos", "erf"), ("new",)),
}

_CANONICAL = {
    "add": _binary("elementwise_add"), "sub": _binary("elementwise_sub"), "mul": _binary("elementwise_mul"),
    "div": _binary("elementwise_div", inexact_only=True), "max": _binary("elementwise_max"),
    "min": _binary("elementwise_min"), "pow": _binary("elementwise_pow", inexact_only=True),
    "tanh": _activation("tanh"), "logistic": _activation("sigmoid"),
    "transpose": _transpose, "reshape": _reshape, "convert_element_type": _convert, "concatenate": _concatenate,
    "dot_general": _dot_general,
}


def _declare() -> dict[str, Traits]:
    table: dict[str, dict] = {}

    def add(names, **traits):
        for name in names:
            table.setdefault(name, {}).update(traits)

    add(_GRAY_UNARY, **_POINTWISE)
    add(_BLACK_UNARY, **_POINTWISE, amp="black")
    add(_COMMUTATIVE, **_POINTWISE, commutative=True)
    add(_BINARY, **_POINTWISE)
    add(_BLACK_BINARY, **_POINTWISE, amp="black")
    add(("select_n", "clamp", "regularized_incomplete_beta"), **_POINTWISE)
    add(("convert_element_type", "bitcast_convert_type"), **_POINTWISE, amp="cast")
    add(("convert_element_type", "copy"), identity_if=always)
    add(("add", "add_any", "sub"), unit=0.0)
    add(("mul", "div"), unit=1.0)
    add(_REDUCTIONS, reduction=True, channels=_reduced)
    add(_BLACK_REDUCTIONS, reduction=True, amp="black", channels=_reduced)
    add(_BLACK_CUMULATIVE, amp="black")
    add(_CUMULATIVE)
    add(_WINDOWS)
    add(("reshape", "squeeze", "broadcast_in_dim"), reshaping=True, channels="reshaped", identity_if=always,
        commutes_with_quantize=True)
    add(("transpose",), identity_if=_identity_permutation, commutes_with_quantize=True)
    add(("concatenate",), channels="concatenated", identity_if=always)
    add(("slice",), identity_if=always)
    add(("pad",), identity_if=_no_padding)
    add(_REARRANGING)
    add(("dot_general",), amp="white", channels="consumed")
    add(("conv_general_dilated",), amp="white", channels=_conv_channels)
    add(_LINALG, amp="black")
    add(_RANDOM)
    add(("rng_uniform",), pure=False)
    # a barrier exists to stop XLA moving work across it; CSE or DCE removing it would too
    add(("optimization_barrier",), pure=False)
    add(("platform_index", "dim_as_value", "stop_gradient", "zeros_like", "empty"))
    # collectives over a mesh axis inside shard_map: values from other devices, elementwise
    add(("psum", "pmax", "pmin", "all_gather", "all_to_all", "ppermute", "axis_index"))
    for name, saved in _SAVED.items():
        add((name,), saved_for_backward=saved)
    for name, rule in _CANONICAL.items():
        add((name,), canonical=rule)
    return {name: Traits(**traits) for name, traits in sorted(table.items())}


LAX_TRAITS: dict[str, Traits] = _declare()
