"""Cases for the capture sweep: small functions from public JAX APIs (jax.numpy, lax, nn, scipy,
random, linalg, fft), optax, flax nnx layers, transforms and control flow, each with tiny
inputs. ``tests/test_capture_sweep.py`` captures and checks every one."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import optax
from flax import nnx
from jax import lax


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    args: tuple
    tol: float = 1e-6       # forward and gradient tolerance (relative and absolute)
    module: Any = None      # an nnx.Module traced as itself (``fn`` is its pure twin)
    refusal: str | None = None  # the CaptureError text a case that cannot be captured must give


CASES: list[Case] = []


def case(name, fn, *args, **opts):
    CASES.append(Case(name, fn, args, **opts))


def arr(*shape, lo=-1.0, hi=1.0, seed=0, dtype=np.float32):
    return jnp.asarray(np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype))


def ints(*shape, lo=0, hi=5, seed=0, dtype=np.int32):
    return jnp.asarray(np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype))


X = arr(2, 3)
Y = arr(2, 3, seed=1)
V = arr(5, seed=2)
POS = arr(2, 3, lo=0.2, hi=2.0, seed=3)
UNIT = arr(2, 3, lo=-0.9, hi=0.9, seed=4)
SQ = arr(3, 3, seed=5) + 2.0 * jnp.eye(3)
SPD = SQ @ SQ.T + jnp.eye(3)
KEY = jax.random.PRNGKey(7)
IDX = jnp.array([0, 2, 2, 4, 1])
IMG = arr(1, 5, 5, 2, seed=6)

# ---------------------------------------------------------------------------------------
# jax.numpy: elementwise

for _name in ["sin", "cos", "tan", "arctan", "sinh", "cosh", "tanh", "arcsinh", "exp", "expm1", "cbrt",
              "square", "abs", "sign", "floor", "ceil", "round", "trunc", "negative", "deg2rad", "rad2deg",
              "sinc", "i0", "signbit", "isnan", "isfinite", "nan_to_num", "logical_not", "spacing"]:
    case(f"jnp.{_name}", getattr(jnp, _name), X)
for _name in ["log", "log2", "log10", "log1p", "sqrt", "reciprocal", "arccosh"]:
    case(f"jnp.{_name}", getattr(jnp, _name), POS + 1.0)
for _name in ["arcsin", "arccos", "arctanh"]:
    case(f"jnp.{_name}", getattr(jnp, _name), UNIT)
case("jnp.clip", lambda x: jnp.clip(x, -0.5, 0.3), X)
case("jnp.heaviside", lambda x: jnp.heaviside(x, 0.5), X)
case("jnp.frexp", jnp.frexp, POS)
case("jnp.modf", jnp.modf, X * 3)
case("jnp.invert", jnp.invert, ints(4))
case("jnp.bitwise_count", jnp.bitwise_count, ints(4, hi=100))
case("jnp.isclose", lambda x, y: jnp.isclose(x, y, atol=0.5), X, Y)

# binary
for _name in ["add", "subtract", "multiply", "divide", "maximum", "minimum", "fmax", "arctan2", "hypot",
              "logaddexp", "copysign", "nextafter", "greater", "equal", "remainder", "fmod", "floor_divide"]:
    case(f"jnp.{_name}", getattr(jnp, _name), X, Y + 1.5)
case("jnp.power", jnp.power, POS, Y)
case("jnp.float_power", jnp.float_power, POS, Y)
case("jnp.ldexp", jnp.ldexp, X, ints(2, 3))
case("jnp.gcd", jnp.gcd, ints(4, hi=30), ints(4, hi=30, seed=1))
case("jnp.lcm", jnp.lcm, ints(4, lo=1, hi=12), ints(4, lo=1, hi=12, seed=1))
case("jnp.bitwise_and", jnp.bitwise_and, ints(4, hi=64), ints(4, hi=64, seed=1))
case("jnp.left_shift", jnp.left_shift, ints(4, hi=64), ints(4, hi=4, seed=1))
case("jnp.right_shift", jnp.right_shift, ints(4, hi=64), ints(4, hi=4, seed=1))
case("jnp.logical_xor", lambda x, y: jnp.logical_xor(x > 0, y > 0), X, Y)
case("jnp.where", lambda x, y: jnp.where(x > 0, x, y), X, Y)
case("jnp.select", lambda x: jnp.select([x < -0.3, x > 0.3], [x * 2, x ** 2], 0.0), X)
case("jnp.piecewise", lambda x: jnp.piecewise(x, [x < 0, x >= 0], [lambda x: -x, lambda x: x ** 2]), X)
case("jnp.interp", lambda x: jnp.interp(x, jnp.array([-1.0, 0.0, 1.0]), jnp.array([0.0, 2.0, 1.0])), X)
case("jnp.polyval", lambda p, x: jnp.polyval(p, x), V[:3], X)

# reductions
for _name in ["sum", "mean", "var", "std", "prod", "max", "min", "argmax", "argmin", "all", "any", "ptp",
              "median", "nansum", "nanmean", "nanmax", "count_nonzero", "cumsum", "cumprod", "nancumsum"]:
    case(f"jnp.{_name}", functools.partial(getattr(jnp, _name), axis=1), X)
case("jnp.sum_all", jnp.sum, X)
case("jnp.mean_keepdims", lambda x: jnp.mean(x, axis=0, keepdims=True), X)
case("jnp.average", lambda x, w: jnp.average(x, axis=1, weights=w), X, POS)
case("jnp.percentile", lambda x: jnp.percentile(x, 30.0, axis=1), X)
case("jnp.quantile", lambda x: jnp.quantile(x, jnp.array([0.25, 0.75])), V)
case("jnp.diff", lambda x: jnp.diff(x, n=2), V)
case("jnp.ediff1d", jnp.ediff1d, V)
case("jnp.trapezoid", jnp.trapezoid, V)
case("jnp.cumulative_sum", lambda x: jnp.cumulative_sum(x, axis=1, include_initial=True), X)
case("jnp.linalg.vector_norm", lambda x: jnp.linalg.vector_norm(x, ord=3), V)
case("lax.cummax", lambda x: lax.cummax(x, axis=1), X)
case("lax.cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=0), X)

# shapes and indexing
case("jnp.reshape", lambda x: jnp.reshape(x, (3, 2)), X)
case("jnp.transpose", jnp.transpose, X)
case("jnp.swapaxes", lambda x: jnp.swapaxes(x, 0, 2), IMG)
case("jnp.moveaxis", lambda x: jnp.moveaxis(x, -1, 0), IMG)
case("jnp.expand_dims", lambda x: jnp.expand_dims(x, (0, 2)), X)
case("jnp.squeeze", jnp.squeeze, IMG)
case("jnp.flip", lambda x: jnp.flip(x, 1), X)
case("jnp.fliplr", jnp.fliplr, X)
case("jnp.roll", lambda x: jnp.roll(x, 2, axis=1), X)
case("jnp.rot90", jnp.rot90, X)
case("jnp.concatenate", lambda x, y: jnp.concatenate([x, y], axis=1), X, Y)
case("jnp.stack", lambda x, y: jnp.stack([x, y], axis=-1), X, Y)
case("jnp.hstack", lambda x, y: jnp.hstack([x, y]), X, Y)
case("jnp.vstack", lambda x, y: jnp.vstack([x, y]), X, Y)
case("jnp.dstack", lambda x, y: jnp.dstack([x, y]), X, Y)
case("jnp.split", lambda x: jnp.split(x, 3, axis=1), X)
case("jnp.array_split", lambda x: jnp.array_split(x, 2), V)
case("jnp.unstack", jnp.unstack, X)
case("jnp.tile", lambda x: jnp.tile(x, (2, 1)), X)
case("jnp.repeat", lambda x: jnp.repeat(x, 2, axis=0), X)
case("jnp.repeat_counts", lambda x: jnp.repeat(x, jnp.array([1, 0, 2, 1, 1]), total_repeat_length=5), V)
for _mode in ["constant", "reflect", "edge", "wrap", "symmetric", "maximum", "linear_ramp"]:
    case(f"jnp.pad_{_mode}", functools.partial(jnp.pad, pad_width=((1, 0), (2, 1)), mode=_mode), X)
case("jnp.take", lambda x, i: jnp.take(x, i), V, IDX)
case("jnp.take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), X, ints(2, 3, hi=3))
case("jnp.triu", jnp.triu, SQ)
case("jnp.tril", lambda x: jnp.tril(x, -1), SQ)
case("jnp.diag", jnp.diag, V)
case("jnp.diagonal", jnp.diagonal, SQ)
case("jnp.trace", jnp.trace, SQ)
case("jnp.outer", jnp.outer, V, V[::-1])
case("jnp.kron", jnp.kron, X, SQ[:2, :2])
case("jnp.meshgrid", lambda a, b: jnp.meshgrid(a, b), V[:3], V[2:])
case("jnp.broadcast_to", lambda x: jnp.broadcast_to(x, (4, 2, 3)), X)
case("index.stride", lambda x: x[::2, ::-1], X)
case("index.int_array", lambda x, i: x[i], V, IDX)
case("index.bool_where", lambda x: jnp.where(x > 0, size=3, fill_value=-1)[0], V)
case("index.dynamic", lambda x, i: lax.dynamic_slice(x, (i, 0), (1, 3)), X, jnp.int32(1))
case("index.dynamic_update", lambda x, y, i: lax.dynamic_update_slice(x, y[:1], (i, 1)), X, Y[:, :2], jnp.int32(1))
case("index.ellipsis_none", lambda x: x[..., None, 1:], IMG)
case("at.set", lambda x, i: x.at[i].set(9.0), V, IDX)
case("at.add", lambda x, i: x.at[i].add(1.0), V, IDX)
case("at.multiply", lambda x, i: x.at[i].multiply(2.0), V, IDX)
case("at.min", lambda x, i: x.at[i].min(0.0), V, IDX)
case("at.max", lambda x, i: x.at[i].max(0.0), V, IDX)
case("at.get_fill", lambda x: x.at[jnp.array([0, 7])].get(mode="fill", fill_value=-1.0), V)
case("at.add_2d", lambda x: x.at[:, 1].add(5.0), X)
case("at.apply", lambda x, i: x.at[i].apply(jnp.sin), V, IDX,
     refusal=r"capture_sweep_cases\.py:\d+: 'scatter' applies a function to the scattered elements "
             r".*x\.at\[i\]\.set\(f\(x\[i\]\)\)")
case("jnp.sort", lambda x: jnp.sort(x, axis=1), X)
case("jnp.argsort", jnp.argsort, V)
case("jnp.lexsort", lambda a, b: jnp.lexsort((a, b)), ints(5, hi=3), ints(5, hi=3, seed=1))
case("jnp.searchsorted", lambda a, v: jnp.searchsorted(a, v), jnp.sort(V), X)
case("jnp.digitize", lambda x: jnp.digitize(x, jnp.array([-0.5, 0.0, 0.5])), X)
case("jnp.unique", lambda i: jnp.unique(i, size=5, fill_value=-1), IDX)
case("jnp.unique_counts", lambda i: jnp.unique_counts(i, size=5, fill_value=-1), IDX)
case("jnp.nonzero", lambda i: jnp.nonzero(i, size=5), IDX)
case("jnp.argwhere", lambda x: jnp.argwhere(x > 0, size=4), X)
case("jnp.bincount", lambda i: jnp.bincount(i, length=5), IDX)
case("jnp.histogram", lambda x: jnp.histogram(x, bins=4, range=(-1.0, 1.0)), V)
case("jnp.isin", lambda i: jnp.isin(i, jnp.array([2, 4])), IDX)
case("jnp.setdiff1d", lambda a, b: jnp.setdiff1d(a, b, size=4, fill_value=-1), IDX, jnp.array([2, 9]))
case("jnp.union1d", lambda a, b: jnp.union1d(a, b, size=6, fill_value=-1), IDX, jnp.array([2, 9]))
case("jnp.top_k", lambda x: lax.top_k(x, 2), X)
case("jnp.partition", lambda x: jnp.partition(x, 2), V)

# linear algebra and products
case("jnp.matmul", jnp.matmul, X, Y.T)
case("jnp.dot", jnp.dot, V, V[::-1])
case("jnp.vdot", jnp.vdot, X, Y)
case("jnp.inner", jnp.inner, X, Y)
case("jnp.tensordot", lambda a, b: jnp.tensordot(a, b, axes=([1], [1])), X, Y)
case("jnp.einsum", lambda a, b: jnp.einsum("ij,kj->ik", a, b), X, Y)
case("jnp.einsum_trace", lambda a: jnp.einsum("ii->", a), SQ)
case("jnp.cross", jnp.cross, X, Y)
case("jnp.convolve", jnp.convolve, V, V[:3])
case("jnp.correlate", lambda a, b: jnp.correlate(a, b, mode="same"), V, V[:3])
case("jnp.vecdot", jnp.vecdot, X, Y)
case("linalg.inv", jnp.linalg.inv, SQ, tol=1e-5)
case("linalg.solve", jnp.linalg.solve, SQ, V[:3], tol=1e-5)
case("linalg.det", jnp.linalg.det, SQ, tol=1e-5)
case("linalg.slogdet", jnp.linalg.slogdet, SQ, tol=1e-5)
case("linalg.eigh", jnp.linalg.eigh, SPD, tol=1e-4)
case("linalg.eigvalsh", jnp.linalg.eigvalsh, SPD, tol=1e-4)
case("linalg.svd", lambda a: jnp.linalg.svd(a, compute_uv=False), X, tol=1e-5)
case("linalg.svd_uv", lambda a: jnp.linalg.svd(a, full_matrices=False), X, tol=1e-5)
case("linalg.qr", jnp.linalg.qr, SQ, tol=1e-5)
case("linalg.cholesky", jnp.linalg.cholesky, SPD, tol=1e-5)
case("linalg.norm_fro", jnp.linalg.norm, X)
case("linalg.norm_nuc", lambda a: jnp.linalg.norm(a, "nuc"), X, tol=1e-5)
case("linalg.norm_2", lambda a: jnp.linalg.norm(a, 2), X, tol=1e-5)
case("linalg.pinv", jnp.linalg.pinv, X, tol=1e-5)
case("linalg.matrix_power", lambda a: jnp.linalg.matrix_power(a, 3), SQ)
case("linalg.matrix_rank", jnp.linalg.matrix_rank, X)
case("linalg.lstsq", lambda a, b: jnp.linalg.lstsq(a, b)[0], SQ, V[:3], tol=1e-5)
case("linalg.eigvals", jnp.linalg.eigvals, SQ, tol=1e-5)
case("linalg.multi_dot", lambda a, b, c: jnp.linalg.multi_dot([a, b, c]), X, Y.T, SQ[:2])

# fft (complex values)
case("fft.fft", jnp.fft.fft, V, tol=1e-5)
case("fft.ifft", jnp.fft.ifft, V, tol=1e-5)
case("fft.rfft", jnp.fft.rfft, V, tol=1e-5)
case("fft.irfft", lambda x: jnp.fft.irfft(jnp.fft.rfft(x), n=5), V, tol=1e-5)
case("fft.fft2", jnp.fft.fft2, X, tol=1e-5)
case("fft.rfftn", jnp.fft.rfftn, IMG[0, :, :, 0], tol=1e-5)
case("fft.hfft", jnp.fft.hfft, V, tol=1e-5)
case("fft.fftshift", jnp.fft.fftshift, V)
case("fft.fftfreq", lambda x: x * jnp.fft.fftfreq(5), V)
case("complex.ops", lambda x, y: jnp.abs(lax.complex(x, y) * jnp.exp(1j * x)), X, Y, tol=1e-5)
case("complex.angle", lambda x, y: jnp.angle(x + 1j * y), X, Y)

# ---------------------------------------------------------------------------------------
# jax.nn

for _name in ["relu", "sigmoid", "softplus", "soft_sign", "silu", "elu", "selu", "leaky_relu", "hard_tanh",
              "hard_sigmoid", "hard_silu", "log_sigmoid", "log_softmax", "softmax", "standardize",
              "logsumexp", "mish", "squareplus", "sparse_plus", "sparse_sigmoid", "glu"]:
    case(f"nn.{_name}", getattr(jax.nn, _name), arr(2, 4, seed=8) * 3)
case("nn.gelu_tanh", lambda x: jax.nn.gelu(x, approximate=True), X)
case("nn.gelu_exact", lambda x: jax.nn.gelu(x, approximate=False), X)
case("nn.one_hot", lambda i: jax.nn.one_hot(i, 5), IDX)
case("nn.softmax_where", lambda x: jax.nn.softmax(x, where=x > -0.5), X)
case("nn.dot_product_attention", lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
     arr(1, 4, 2, 8), arr(1, 4, 2, 8, seed=1), arr(1, 4, 2, 8, seed=2), tol=1e-5)
case("nn.initializers", lambda x: x + jax.nn.initializers.glorot_uniform()(jax.random.PRNGKey(0), (2, 3)), X)

# jax.scipy
for _name in ["erf", "erfc", "expit", "gammaln", "digamma", "ndtr", "log_ndtr", "i0e", "i1e", "entr"]:
    case(f"scipy.special.{_name}", getattr(jsp.special, _name), X)
case("scipy.special.erfinv", jsp.special.erfinv, UNIT)
case("scipy.special.logit", jsp.special.logit, (UNIT + 1.0) / 2.0 + 0.02)
case("scipy.special.xlogy", jsp.special.xlogy, POS, POS + 0.5)
case("scipy.special.xlog1py", jsp.special.xlog1py, POS, POS)
case("scipy.special.gamma", jsp.special.gamma, POS + 0.5, tol=1e-5)
case("scipy.special.gammainc", jsp.special.gammainc, POS, POS + 0.5, tol=1e-5)
case("scipy.special.logsumexp", lambda x: jsp.special.logsumexp(x, axis=1, b=0.5), X)
case("scipy.special.softmax", lambda x: jsp.special.softmax(x, axis=0), X)
case("scipy.special.polygamma", lambda x: jsp.special.polygamma(1, x), POS + 0.5, tol=1e-5)
case("scipy.stats.norm", lambda x: jsp.stats.norm.logpdf(x, 0.5, 2.0) + jsp.stats.norm.cdf(x), X)
case("scipy.stats.beta", lambda x: jsp.stats.beta.logpdf(x, 2.0, 3.0), (UNIT + 1.0) / 2.0 + 0.02, tol=1e-5)
case("scipy.stats.poisson", lambda k: jsp.stats.poisson.logpmf(k, 2.5), IDX)
case("scipy.stats.multivariate_normal", lambda x: jsp.stats.multivariate_normal.logpdf(x, jnp.zeros(3), SPD),
     X, tol=1e-5)
case("scipy.linalg.expm", jsp.linalg.expm, SQ * 0.3, tol=1e-4)
case("scipy.linalg.solve_triangular", lambda a, b: jsp.linalg.solve_triangular(a, b, lower=True),
     jnp.tril(SQ), V[:3], tol=1e-5)
case("scipy.linalg.cho_solve", lambda a, b: jsp.linalg.cho_solve(jsp.linalg.cho_factor(a), b), SPD, V[:3],
     tol=1e-5)
case("scipy.linalg.lu_solve", lambda a, b: jsp.linalg.lu_solve(jsp.linalg.lu_factor(a), b), SQ, V[:3], tol=1e-5)
case("scipy.linalg.lu", lambda a: jsp.linalg.lu(a)[2], SQ, tol=1e-5)
case("scipy.linalg.sqrtm", jsp.linalg.sqrtm, SPD, tol=1e-4)
case("lax.linalg.tridiagonal_solve", lambda d, b: lax.linalg.tridiagonal_solve(
    jnp.concatenate([jnp.zeros(1), d[1:]]) * 0.1, d + 3, jnp.concatenate([d[:-1], jnp.zeros(1)]) * 0.1, b[:, None]),
     V, V[::-1], tol=1e-5)
case("jnp.roots", lambda p: jnp.sort(jnp.abs(jnp.roots(p, strip_zeros=False))), jnp.array([1.0, -3.0, 2.0]), tol=1e-4)
case("scipy.linalg.block_diag", jsp.linalg.block_diag, X, SQ)
case("scipy.signal.convolve2d", lambda a, b: jsp.signal.convolve2d(a, b, mode="same"), SQ, X[:, :2])
case("scipy.integrate.trapezoid", jsp.integrate.trapezoid, V)
case("scipy.sparse_cg", lambda a, b: jsp.sparse.linalg.cg(lambda x: a @ x, b, maxiter=20)[0], SPD, V[:3],
     tol=1e-5)

# ---------------------------------------------------------------------------------------
# jax.random: raw keys as data

case("random.normal", lambda k: jax.random.normal(k, (3,)), KEY)
case("random.uniform", lambda k, x: x * jax.random.uniform(k, x.shape, minval=-1.0), KEY, X)
case("random.bernoulli", lambda k: jax.random.bernoulli(k, 0.3, (4,)), KEY)
case("random.categorical", lambda k, x: jax.random.categorical(k, x), KEY, X)
case("random.randint", lambda k: jax.random.randint(k, (4,), 0, 10), KEY)
case("random.permutation", lambda k, x: jax.random.permutation(k, x), KEY, V)
case("random.choice", lambda k, x: jax.random.choice(k, x, (3,), replace=False), KEY, V)
case("random.gumbel", lambda k: jax.random.gumbel(k, (3,)), KEY)
case("random.truncated_normal", lambda k: jax.random.truncated_normal(k, -1.0, 1.0, (3,)), KEY)
case("random.split_fold_in", lambda k: jax.random.normal(jax.random.fold_in(jax.random.split(k, 3)[1], 5), (2,)), KEY)
case("random.key_inside", lambda x: x + jax.random.normal(jax.random.key(1), x.shape), X)
case("random.exponential", lambda k: jax.random.exponential(k, (3,)), KEY)
case("random.gamma", lambda k: jax.random.gamma(k, 2.0, (3,)), KEY, tol=1e-5)
case("random.poisson", lambda k: jax.random.poisson(k, 3.0, (3,)), KEY)
case("random.multivariate_normal", lambda k: jax.random.multivariate_normal(k, jnp.zeros(3), SPD), KEY, tol=1e-5)
case("random.orthogonal", lambda k: jax.random.orthogonal(k, 3), KEY, tol=1e-5)
case("random.rademacher", lambda k: jax.random.rademacher(k, (4,)), KEY)
case("random.bits", lambda k: jax.random.bits(k, (3,)), KEY)
case("random.vmap_split", lambda k: jax.vmap(lambda k: jax.random.normal(k, (2,)))(jax.random.split(k, 3)), KEY)
case("random.key_in_scan_carry", lambda k: lax.scan(lambda k, _: (jax.random.split(k)[0], jax.random.normal(k)),
                                                     jax.random.wrap_key_data(k), length=3)[1], KEY)
case("random.key_in_cond", lambda k, p: jax.random.normal(lax.cond(p, lambda k: jax.random.fold_in(k, 1), lambda k: k,
                                                                   jax.random.wrap_key_data(k)), (2,)),
     KEY, jnp.bool_(True))
case("random.ball", lambda k: jax.random.ball(k, 3), KEY, tol=1e-5)
case("random.typed_key_input", lambda k: jax.random.normal(k, (2,)), jax.random.key(0),
     refusal=r"input 'k' is a typed PRNG key array.*jax\.random\.key_data\(key\).*wrap_key_data")

# ---------------------------------------------------------------------------------------
# jax.lax

_DN = ("NHWC", "HWIO", "NHWC")
case("lax.conv", lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DN),
     IMG, arr(3, 3, 2, 4, seed=9), tol=1e-5)
case("lax.conv_dilated", lambda x, w: lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 2)), rhs_dilation=(1, 2),
                                                               dimension_numbers=_DN), IMG, arr(2, 2, 2, 3, seed=9),
     tol=1e-5)
case("lax.conv_grouped", lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=_DN,
                                                               feature_group_count=2), IMG, arr(2, 2, 1, 4, seed=9),
     tol=1e-5)
case("lax.conv_transpose", lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=_DN),
     IMG, arr(3, 3, 2, 2, seed=9), tol=1e-5)
case("lax.reduce_window_max", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
     IMG)
case("lax.reduce_window_sum", lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), IMG)
case("lax.reduce_custom", lambda x: lax.reduce(x, 0.0, lambda a, b: a + b * b, (1,)), X)
case("lax.sort_multi", lambda x, y: lax.sort((x, y), dimension=1, num_keys=1), X, Y)
case("lax.rsqrt", lax.rsqrt, POS)
case("lax.integer_pow", lambda x: lax.integer_pow(x, 3), X)
case("lax.population_count", lax.population_count, ints(4, hi=100))
case("lax.clz", lax.clz, ints(4, lo=1, hi=100))
case("lax.shift_right_logical", lambda a: lax.shift_right_logical(a, jnp.int32(2)), ints(4, hi=100))
case("lax.clamp", lambda x: lax.clamp(-0.2, x, 0.4), X)
case("lax.rem", lax.rem, X, Y + 2.0)
case("lax.erf_inv", lax.erf_inv, UNIT)
case("lax.lgamma", lax.lgamma, POS)
case("lax.betainc", lambda x: lax.betainc(2.0, 3.0, x), (UNIT + 1.0) / 2.0, tol=1e-5)
case("lax.reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), X)
case("lax.to_bfloat16", lambda x: (x.astype(jnp.bfloat16) * 3).astype(jnp.float32), X)
case("lax.to_float16", lambda x: x.astype(jnp.float16) + jnp.float16(1), X)
case("lax.bitcast", lambda x: lax.bitcast_convert_type(x, jnp.int32), X)
case("lax.iota", lambda x: x + lax.broadcasted_iota(jnp.float32, (2, 3), 1), X)
case("lax.pad_negative", lambda x: lax.pad(x, 0.0, ((0, -1, 0), (1, 1, 1))), X)
case("lax.rev", lambda x: lax.rev(x, (0, 1)), X)
case("lax.select_n", lambda i, x, y: lax.select_n(i, x, y), X > 0, X, Y)
case("lax.round_away", lambda x: lax.round(x * 3, lax.RoundingMethod.AWAY_FROM_ZERO), X)
case("lax.round_even", lambda x: lax.round(x * 3, lax.RoundingMethod.TO_NEAREST_EVEN), X)
case("lax.approx_max_k", lambda x: lax.approx_max_k(x, 2), V)
case("lax.nextafter", lax.nextafter, X, Y)
case("lax.expand_dims", lambda x: lax.expand_dims(x, (1,)), X)
case("lax.collapse", lambda x: lax.collapse(x, 1, 3), IMG)
case("lax.dot_general_batch", lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
     arr(2, 3, 4), arr(2, 4, 2, seed=1))
case("lax.dot_precision", lambda a, b: jnp.dot(a, b, precision=lax.Precision.HIGHEST), X, Y.T)
case("lax.dot_preferred", lambda a, b: lax.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                               preferred_element_type=jnp.float32), X, Y.T)
case("lax.psum_vmap", lambda x: jax.vmap(lambda r: r - lax.pmean(r, "i"), axis_name="i")(x), X)
case("lax.stop_gradient", lambda x: x * lax.stop_gradient(x), X)
case("lax.complex_parts", lambda x, y: lax.real(lax.complex(x, y) ** 2) + lax.imag(lax.complex(x, y)), X, Y)

case("lax.axis_index_vmap", lambda x: jax.vmap(lambda r: r * lax.axis_index("i"), axis_name="i")(x), X)
case("lax.all_gather_vmap", lambda x: jax.vmap(lambda r: lax.all_gather(r, "i"), axis_name="i")(x), X)
case("jax.image.resize", lambda x: jax.image.resize(x, (1, 7, 3, 2), "bilinear"), IMG, tol=1e-5)
case("jnp.cov", jnp.cov, X, tol=1e-5)
case("jnp.gradient", jnp.gradient, V)
case("scipy.special.bessel_jn", lambda x: jsp.special.bessel_jn(x, v=2), POS, tol=1e-5)
case("scipy.stats.gaussian_kde", lambda d: jsp.stats.gaussian_kde(d).evaluate(jnp.array([0.0, 0.5])), V, tol=1e-5)
case("linalg.eig_vectors", lambda a: jnp.abs(jnp.linalg.eig(a)[1]), SQ, tol=1e-4)

# ---------------------------------------------------------------------------------------
# control flow

case("cf.cond", lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), X)
case("cf.cond_operands", lambda p, x, y: lax.cond(p, lambda a, b: a * b, lambda a, b: a - b, x, y), jnp.bool_(False),
     X, Y)
case("cf.switch", lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), jnp.int32(2), X)
case("cf.while", lambda x: lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 1.1), (0, x))[1], X)
case("cf.fori_static", lambda x: lax.fori_loop(0, 4, lambda i, c: c * 0.5 + i, x), X)
case("cf.fori_dynamic", lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 0.5 + i, x), jnp.int32(3), X)
case("cf.scan", lambda x: lax.scan(lambda c, a: (c + a, c * a), jnp.zeros(3), x), X)
case("cf.scan_reverse_unroll", lambda x: lax.scan(lambda c, a: (c * a + 1, jnp.sin(c)), 1.0, x, reverse=True,
                                                  unroll=2), V)
case("cf.map", lambda x: lax.map(lambda r: jnp.sum(r ** 2), x), X)
case("cf.associative_scan", lambda x: lax.associative_scan(jnp.add, x), V)
case("cf.nested", lambda x: lax.scan(lambda c, a: (lax.cond(a > 0, lambda: c + a, lambda: c - a), c), 0.0, x), V)
case("cf.while_in_scan", lambda x: lax.scan(
    lambda c, a: (lax.while_loop(lambda v: v < 3.0, lambda v: v + 1.0, a), c), 0.0, x), V)
case("cf.vmap_cond", jax.vmap(lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x)), V)
case("cf.vmap_while", jax.vmap(lambda n, x: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0),
                                                            (0, x))[1]), jnp.array([1, 3, 0, 2]), V[:4])
case("cf.vmap_scan", jax.vmap(lambda x: lax.scan(lambda c, a: (c + a, c), 0.0, x)), X)
case("cf.grad_scan", jax.grad(lambda x: lax.scan(lambda c, a: (c * a + jnp.sin(c), c), 1.0, x)[0]), V)
case("cf.grad_cond", jax.grad(lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x)), jnp.float32(0.3))
case("cf.grad_fori", jax.grad(lambda x: lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * x, x)), jnp.float32(0.7))

# ---------------------------------------------------------------------------------------
# transforms


@jax.custom_jvp
def _clipped_log(x):
    return jnp.log(jnp.maximum(x, 1e-3))


_clipped_log.defjvp(lambda primals, tangents: (_clipped_log(primals[0]), tangents[0] / (primals[0] + 1.0)))


@jax.custom_vjp
def _scaled_grad(x):
    return x


_scaled_grad.defvjp(lambda x: (x, None), lambda _, g: (0.5 * g,))


case("tf.grad", jax.grad(lambda x: jnp.sum(jnp.sin(x) * x)), X)
case("tf.value_and_grad", jax.value_and_grad(lambda x: jnp.sum(jnp.tanh(x) ** 2)), X)
case("tf.grad_has_aux", jax.grad(lambda x: (jnp.sum(x ** 3), x * 2), has_aux=True), X)
case("tf.vmap", jax.vmap(lambda r: r @ r), X)
case("tf.vmap_in_axes", jax.vmap(lambda a, b: a * b, in_axes=(1, None)), X, V[:2])
case("tf.jacfwd", jax.jacfwd(lambda x: jnp.sin(x) * x[::-1]), V)
case("tf.jacrev", jax.jacrev(lambda x: jnp.sin(x) * x[::-1]), V)
case("tf.hessian", jax.hessian(lambda x: jnp.sum(jnp.sin(x) * x ** 2)), V)
case("tf.jvp", lambda x, t: jax.jvp(jnp.tanh, (x,), (t,)), X, Y)
case("tf.vjp", lambda x, g: jax.vjp(jnp.sin, x)[1](g), X, Y)
case("tf.linearize", lambda x, t: jax.linearize(jnp.exp, x)[1](t), X, Y)
case("tf.checkpoint", jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)) * x), X)
case("tf.checkpoint_policy", jax.checkpoint(lambda x: jnp.tanh(x @ x.T),
                                            policy=jax.checkpoint_policies.dots_saveable), X)
case("tf.remat_in_scan", lambda x: lax.scan(jax.checkpoint(lambda c, a: (jnp.sin(c) + a, c)), 0.0, x), V)
case("tf.custom_jvp", lambda x: _clipped_log(x) * 2, POS)
case("tf.custom_vjp", lambda x: _scaled_grad(jnp.sin(x)), X)
case("tf.nested_jit", lambda x: jax.jit(lambda y: jax.jit(jnp.cos)(y) * 2)(x), X)
case("tf.named_call", lambda x: jax.named_call(jnp.sin, name="s")(x), X)
case("tf.named_scope", lambda x: jnp.sum(x), X)
case("tf.vectorize", jnp.vectorize(lambda a, b: a * b + 1.0), X, V[:3])
case("tf.python_scalar_input", lambda x, s, n: x * s + n, X, 2.5, 3)
case("tf.tree_map", lambda t: jax.tree.map(lambda a: a * 2.0, t), {"a": X, "b": (V, [Y])})
case("tf.hessian_vmap", jax.vmap(jax.hessian(lambda x: jnp.sum(x ** 3))), X)
case("tf.grad_of_grad", jax.grad(jax.grad(lambda x: jnp.sin(x) ** 2)), jnp.float32(0.4))
case("tf.custom_jvp_nn", jax.grad(lambda x: jnp.sum(jax.nn.relu(x) + jax.nn.softplus(x))), X)
case("tf.ensure_compile_time_eval", lambda x: x * jnp.sum(jnp.arange(3.0)), X)
case("tf.pure_callback", lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x), X,
     refusal=r"capture_sweep_cases\.py:\d+: primitive 'pure_callback' is not a JAX primitive.*"
             r"no Python code: compute it with jax functions, or call it outside the traced function")
case("tf.debug_print", lambda x: (jax.debug.print("x={x}", x=x), x * 2)[1], X,
     refusal=r"capture_sweep_cases\.py:\d+: primitive 'debug_print' is not a JAX primitive.*"
             r"remove the jax\.debug\.print call")

# ---------------------------------------------------------------------------------------
# optax: losses and optimizer updates

LOGITS = arr(3, 4, seed=10) * 2
LABELS = jax.nn.one_hot(jnp.array([0, 3, 1]), 4)
case("optax.l2_loss", optax.l2_loss, X, Y)
case("optax.squared_error", optax.squared_error, X, Y)
case("optax.huber_loss", lambda a, b: optax.huber_loss(a, b, delta=0.3), X, Y)
case("optax.log_cosh", optax.log_cosh, X, Y)
case("optax.softmax_cross_entropy", optax.softmax_cross_entropy, LOGITS, LABELS)
case("optax.softmax_ce_int", lambda l: optax.softmax_cross_entropy_with_integer_labels(l, jnp.array([0, 3, 1])), LOGITS)
case("optax.sigmoid_bce", optax.sigmoid_binary_cross_entropy, LOGITS, LABELS)
case("optax.hinge", lambda l: optax.hinge_loss(l, jnp.sign(LABELS - 0.5)), LOGITS)
case("optax.cosine_distance", optax.cosine_distance, X, Y)
case("optax.kl_divergence", lambda a, b: optax.kl_divergence(jax.nn.log_softmax(a), jax.nn.softmax(b)), X, Y)
case("optax.smooth_labels", lambda l: optax.smooth_labels(l, 0.1), LABELS)
case("optax.poly_loss", lambda l: optax.losses.poly_loss_cross_entropy(l, LABELS), LOGITS)
case("optax.ema", lambda g: optax.ema(0.9).update(g, optax.ema(0.9).init(g))[0], X)
case("optax.masked", lambda g: optax.masked(optax.sgd(0.1), {"a": True, "b": False}).update(
    g, optax.masked(optax.sgd(0.1), {"a": True, "b": False}).init(g))[0], {"a": X, "b": V})
case("optax.global_norm", lambda t: optax.global_norm(t), {"a": X, "b": V})

_PARAMS = {"w": X, "b": V[:3]}
for _name, _opt in [("sgd", optax.sgd(0.1)), ("momentum", optax.sgd(0.1, momentum=0.9, nesterov=True)),
                    ("adam", optax.adam(1e-2)), ("adamw", optax.adamw(1e-2, weight_decay=0.1)),
                    ("rmsprop", optax.rmsprop(1e-2)), ("adagrad", optax.adagrad(1e-2)),
                    ("lion", optax.lion(1e-3)),
                    ("chain_clip", optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))),
                    ("schedule", optax.adam(optax.cosine_decay_schedule(1e-2, 10)))]:
    _state = _opt.init(_PARAMS)

    def _step(g, s, p, _opt=_opt):
        updates, s = _opt.update(g, s, p)
        return optax.apply_updates(p, updates), s

    case(f"optax.{_name}", _step, jax.tree.map(lambda a: a * 0.3 + 0.1, _PARAMS), _state, _PARAMS, tol=1e-5)

# ---------------------------------------------------------------------------------------
# flax nnx layers (traced as modules; the reference calls the same module through split/merge)


def _module(name, module, *args, **opts):
    graphdef, state = nnx.split(module)

    def pure(*xs):
        return nnx.merge(graphdef, state)(*xs)

    case(name, pure, *args, module=module, **opts)


_rngs = nnx.Rngs(0)
_module("nnx.Linear", nnx.Linear(3, 4, rngs=_rngs), X)
_module("nnx.LinearGeneral", nnx.LinearGeneral((2, 3), 4, axis=(-2, -1), rngs=_rngs), arr(2, 2, 3))
_module("nnx.Einsum", nnx.Einsum("ab,bc->ac", (3, 2), rngs=_rngs), X)
_module("nnx.Conv", nnx.Conv(2, 3, (3, 3), rngs=_rngs), IMG, tol=1e-5)
_module("nnx.Conv_strided", nnx.Conv(2, 3, (2, 2), strides=2, padding="VALID", rngs=_rngs), IMG, tol=1e-5)
_module("nnx.ConvTranspose", nnx.ConvTranspose(2, 3, (3, 3), strides=2, rngs=_rngs), IMG, tol=1e-5)
_module("nnx.BatchNorm_eval", nnx.BatchNorm(3, use_running_average=True, rngs=_rngs), X)
_module("nnx.BatchNorm_train", nnx.BatchNorm(3, use_running_average=False, rngs=_rngs), X)
_module("nnx.LayerNorm", nnx.LayerNorm(3, rngs=_rngs), X)
_module("nnx.RMSNorm", nnx.RMSNorm(3, rngs=_rngs), X)
_module("nnx.GroupNorm", nnx.GroupNorm(2, num_groups=1, rngs=_rngs), IMG)
_module("nnx.Embed", nnx.Embed(6, 3, rngs=_rngs), IDX)
_module("nnx.MultiHeadAttention", nnx.MultiHeadAttention(2, 4, qkv_features=4, decode=False, rngs=_rngs),
        arr(1, 3, 4), tol=1e-5)
_module("nnx.Dropout_eval", nnx.Dropout(0.5, deterministic=True), X)
_module("nnx.Dropout_train", nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1)), X)
_module("nnx.LSTMCell", nnx.LSTMCell(3, 4, rngs=_rngs), (arr(2, 4, seed=1), arr(2, 4, seed=2)), X)
_module("nnx.GRUCell", nnx.GRUCell(3, 4, rngs=_rngs), arr(2, 4, seed=1), X)
_module("nnx.RNN", nnx.RNN(nnx.SimpleCell(3, 4, rngs=_rngs)), arr(1, 4, 3), tol=1e-5)
_module("nnx.Sequential", nnx.Sequential(nnx.Linear(3, 4, rngs=_rngs), jax.nn.relu, nnx.Linear(4, 2, rngs=_rngs)), X)
_module("nnx.PReLU", nnx.PReLU(), X)
case("nnx.scan", lambda x: nnx.scan(lambda c, a: (c + a, c * a), in_axes=(nnx.Carry, 0))(jnp.zeros(3), x), X)
case("nnx.vmap", lambda x: nnx.vmap(jnp.sin)(x), X)
case("nnx.avg_pool", lambda x: nnx.avg_pool(x, (2, 2), strides=(1, 1)), IMG)
case("nnx.max_pool", lambda x: nnx.max_pool(x, (2, 2), strides=(2, 2), padding="SAME"), IMG)
