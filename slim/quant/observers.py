"""Observers: PaddleSlim's calibration algorithms, turning sample tensors into quantization scales.

An observer sees a tensor batch by batch (``observe``) and then gives its ``scale()`` in Paddle's
convention: the float value that maps to the largest integer (127 for int8), so that a value is
quantized as ``clip(round(x / scale * 127), -127, 127)``. Scales are float32 arrays of shape ``()``
per tensor, or ``(C,)`` per channel along ``axis``.

=========================== ===================================================================
algo                        scale
=========================== ===================================================================
``abs_max``                 max |x| over all batches (per tensor, or per channel with ``axis``)
``channel_wise_abs_max``    max |x| per channel along ``axis`` (default 0: the output channels
                            of OIHW conv weights; pass ``axis=1`` for ``[in, out]`` linear weights)
``moving_average_abs_max``  moving average of each batch's max |x| with ``rate`` (default 0.9)
``min_max``                 max(|min|, |max|); ``range()`` gives (min, max) for asymmetric use
``avg``                     mean over batches of each batch's max |x|
``hist``                    the ``percentile`` (default 0.99999) of the histogram of |x|
``KL``                      TensorRT's entropy calibration: the clip minimising KL(P || Q)
``mse``                     the clip minimising the mean squared quantization error
=========================== ===================================================================

``hist``, ``KL`` and ``mse`` accumulate one histogram of |x| with ``bins`` (default 2048) bins over
[0, max |x|], in a single pass over the data. When a batch exceeds the range seen so far, the
counts gathered so far are re-binned onto the wider range, spread uniformly within their old bins
(PaddleSlim re-bins the same way, through 64 sub-bins per bin), so the final histogram spans
exactly the overall max |x| and differs from one histogram of all the data by less than a bin.

>>> import numpy as np
>>> obs = make_observer("abs_max")
>>> obs.observe(np.array([0.5, -2.0], np.float32))
>>> obs.observe(np.array([1.5], np.float32))
>>> obs.scale()
array(2., dtype=float32)
>>> weights = make_observer("channel_wise_abs_max", axis=0)
>>> weights.observe(np.array([[1.0, -3.0], [0.5, 0.25]]))
>>> weights.scale()
array([3. , 0.5], dtype=float32)
"""
from __future__ import annotations

import inspect
from typing import ClassVar

import numpy as np

from paddlejax.ops.quant import qmax


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return int(value)


def _check_bits(bits) -> int:
    return _check_int("bits", bits, 2, 16)


def _check_axis(axis, allow_none: bool):
    if axis is None and allow_none:
        return None
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int{' or None' if allow_none else ''}, got {axis!r}")
    return int(axis)


def _as_array(x, what: str = "x", dtype=np.float32) -> np.ndarray:
    """``x`` (numpy or jax, any real dtype) as a float numpy array, or a clear error."""
    a = np.asarray(x)
    if a.dtype == np.bool_ or np.iscomplexobj(a):
        raise TypeError(f"{what} must hold real numbers, got dtype {a.dtype}")
    try:
        return np.asarray(a, dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must hold real numbers, got dtype {a.dtype}") from None


def _normalize_axis(axis: int, a: np.ndarray) -> int:
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"channel axis {axis} is out of range for x of rank {a.ndim} (shape {a.shape})")
    return axis % a.ndim


def _abs_max(a: np.ndarray, axis: int | None) -> np.ndarray:
    """max |a| over everything (``axis=None``) or over all axes but ``axis``."""
    if axis is None:
        return np.max(np.abs(a))
    axis = _normalize_axis(axis, a)
    return np.max(np.abs(a), axis=tuple(d for d in range(a.ndim) if d != axis))


def quant_error(x, scale, bits: int = 8, axis: int | None = None) -> float:
    """Mean squared error of quantizing ``x`` to symmetric ``bits``-bit integers and back.

    ``scale`` follows Paddle's convention (the value that maps to ``2**(bits-1) - 1``): shape ``()``,
    or ``(C,)`` per channel along ``axis``. Values beyond the scale are clipped; rounding is half to
    even, as ``jnp.round``. A zero scale quantizes everything to zero.

    >>> import numpy as np
    >>> quant_error(np.array([0.5, 1.0, 3.0]), 1.0)  # 3.0 clips to 1.0: error about 4 / 3
    1.33333...
    >>> quant_error(np.array([[1.0, 8.0], [-1.0, 0.0]]), np.array([1.0, 8.0]), axis=1)
    0.0
    """
    bits = _check_bits(bits)
    a = _as_array(x, dtype=np.float64)
    s = _as_array(scale, "scale", dtype=np.float64)
    if axis is None:
        if s.ndim:
            raise ValueError(f"a per-channel scale (shape {s.shape}) needs the channel axis")
    else:
        axis = _normalize_axis(_check_axis(axis, allow_none=False), a)
        if s.shape != (a.shape[axis],):
            raise ValueError(f"scale must have shape ({a.shape[axis]},) for axis {axis} of x with shape "
                             f"{a.shape}, got {s.shape}")
        s = s.reshape([-1 if d == axis else 1 for d in range(a.ndim)])
    if np.any(s < 0):
        raise ValueError("scale must be >= 0")
    top = qmax(bits)
    step = s / top
    # A zero step (all-zero calibration data) quantizes to zero instead of dividing by zero.
    q = np.clip(np.round(a / np.where(step > 0, step, 1.0)), -top, top)
    return float(np.mean((a - np.where(step > 0, q * step, 0.0)) ** 2))


class Observer:
    """Base of the observers: ``observe`` validates each batch, subclasses accumulate statistics.

    Subclasses set ``name`` and implement ``_update(a)`` (``a``: a finite, non-empty float32 array)
    and ``_threshold()`` (the scale as a float or a per-channel array).

    >>> import numpy as np
    >>> obs = make_observer("min_max")
    >>> obs.observe(np.array([-1.0, 3.0]))
    >>> obs.scale(), obs.range(), obs.batches
    (array(3., dtype=float32), (-1.0, 3.0), 1)
    """

    name: ClassVar[str] = ""

    def __init__(self):
        self.batches = 0

    def observe(self, x) -> None:
        """Accumulate the statistics of one batch ``x`` (numpy or jax array, any shape)."""
        a = _as_array(x)
        if a.size == 0:
            raise ValueError(f"x is empty (shape {a.shape}): the {self.name} observer needs values")
        bad = a.size - int(np.count_nonzero(np.isfinite(a)))
        if bad:
            raise ValueError(f"x has {bad} non-finite value(s) (NaN or inf) out of {a.size}: "
                             f"calibration data for the {self.name} observer must be finite")
        self._update(a)
        self.batches += 1

    def scale(self) -> np.ndarray:
        """The abs-max threshold mapping to the largest integer: float32, shape () or (C,)."""
        self._require_data("scale()")
        return np.asarray(self._threshold(), np.float32)

    def range(self) -> tuple[float, float]:
        """(min, max) of the data, for asymmetric quantization; only ``min_max`` keeps it."""
        raise TypeError(f"the {self.name} observer is symmetric and keeps no (min, max) range; "
                        "use the min_max observer for asymmetric activations")

    def _require_data(self, method: str) -> None:
        if not self.batches:
            raise RuntimeError(f"the {self.name} observer has observed no data: call observe(x) "
                               f"on calibration batches before {method}")

    def _update(self, a: np.ndarray) -> None:
        raise NotImplementedError

    def _threshold(self):
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}, {self.batches} batch(es)>"


class AbsMaxObserver(Observer):
    """max |x| over all batches, per tensor (``axis=None``) or per channel along ``axis``.

    >>> import numpy as np
    >>> obs = AbsMaxObserver(axis=1)
    >>> obs.observe(np.array([[1.0, -4.0], [-2.0, 0.5]]))
    >>> obs.scale()
    array([2., 4.], dtype=float32)
    """

    name = "abs_max"

    def __init__(self, axis: int | None = None):
        super().__init__()
        self.axis = _check_axis(axis, allow_none=True)
        self._max = None

    def _update(self, a):
        m = _abs_max(a, self.axis)
        if self._max is None:
            self._max = m
        elif m.shape != self._max.shape:
            raise ValueError(f"x has {m.shape[0]} channels along axis {self.axis}, earlier batches had "
                             f"{self._max.shape[0]}")
        else:
            self._max = np.maximum(self._max, m)

    def _threshold(self):
        return self._max


class ChannelWiseAbsMaxObserver(AbsMaxObserver):
    """max |x| per output channel of a weight: ``axis=0`` for OIHW conv, ``axis=1`` for [in, out].

    >>> import numpy as np
    >>> obs = ChannelWiseAbsMaxObserver()
    >>> obs.observe(np.array([[[[1.0, -3.0]]], [[[0.5, 0.25]]]]))  # 2 output channels
    >>> obs.scale()
    array([3. , 0.5], dtype=float32)
    """

    name = "channel_wise_abs_max"

    def __init__(self, axis: int = 0):
        super().__init__(_check_axis(axis, allow_none=False))


class MovingAverageAbsMaxObserver(Observer):
    """Moving average of each batch's max |x| (Paddle's QAT activation scale).

    With ``m_n`` the n-th batch's max |x|: ``accum_n = rate * accum_{n-1} + m_n``,
    ``state_n = rate * state_{n-1} + 1`` and the scale is ``accum_n / state_n`` (both start at 0,
    so the first scale is ``m_1``; Paddle's QAT graphs start them at 1, a prior pulling early
    scales towards 1.0).

    >>> import numpy as np
    >>> obs = MovingAverageAbsMaxObserver(rate=0.5)
    >>> obs.observe(np.array([2.0])); obs.observe(np.array([-4.0]))
    >>> obs.scale()  # (0.5 * 2 + 4) / (0.5 * 1 + 1)
    array(3.3333333, dtype=float32)
    """

    name = "moving_average_abs_max"

    def __init__(self, rate: float = 0.9):
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.rate = float(rate)
        self._accum = self._state = 0.0

    def _update(self, a):
        self._accum = self.rate * self._accum + float(np.max(np.abs(a)))
        self._state = self.rate * self._state + 1.0

    def _threshold(self):
        return self._accum / self._state


class MinMaxObserver(Observer):
    """Overall min and max; the symmetric scale is max(|min|, |max|).

    >>> import numpy as np
    >>> obs = MinMaxObserver()
    >>> obs.observe(np.array([0.5, 2.0])); obs.observe(np.array([-1.0]))
    >>> obs.range(), obs.scale()
    ((-1.0, 2.0), array(2., dtype=float32))
    """

    name = "min_max"

    def __init__(self):
        super().__init__()
        self._min, self._max = np.inf, -np.inf

    def _update(self, a):
        self._min = min(self._min, float(a.min()))
        self._max = max(self._max, float(a.max()))

    def _threshold(self):
        return max(abs(self._min), abs(self._max))

    def range(self) -> tuple[float, float]:
        """(min, max) over all batches."""
        self._require_data("range()")
        return self._min, self._max


class AvgObserver(Observer):
    """Mean over batches of each batch's max |x|.

    (PaddleSlim's ``avg`` first averages the max |x| of each sample within a batch; here a batch
    counts as one sample, so the result does not depend on how a batch is laid out.)

    >>> import numpy as np
    >>> obs = AvgObserver()
    >>> obs.observe(np.array([1.0, -2.0])); obs.observe(np.array([4.0]))
    >>> obs.scale()
    array(3., dtype=float32)
    """

    name = "avg"

    def __init__(self):
        super().__init__()
        self._sum = 0.0

    def _update(self, a):
        self._sum += float(np.max(np.abs(a)))

    def _threshold(self):
        return self._sum / self.batches


def _rebin(hist: np.ndarray, old_max: float, new_max: float) -> np.ndarray:
    """Counts over [0, old_max] moved onto as many bins over [0, new_max >= old_max].

    Counts are taken as uniform within their old bins: the new counts are differences of the old
    cumulative counts interpolated linearly at the new edges.
    """
    if old_max == 0.0:  # everything seen so far was exactly 0
        out = np.zeros_like(hist)
        out[0] = hist.sum()
        return out
    n = hist.size
    cumulative = np.concatenate([[0.0], np.cumsum(hist)])
    return np.diff(np.interp(np.linspace(0.0, new_max, n + 1), np.linspace(0.0, old_max, n + 1), cumulative))


class HistogramObserver(Observer):
    """Accumulates a histogram of |x| with ``bins`` bins over [0, max |x|] (see the module doc).

    Subclasses turn it into a threshold; an all-zero input gives a zero scale.

    >>> import numpy as np
    >>> obs = HistObserver(bins=4, percentile=1.0)
    >>> obs.observe(np.array([0.1, 1.0])); obs.observe(np.array([-2.0, 0.0]))
    >>> obs.histogram()  # [0.1, 1.0] re-binned from [0, 1] to [0, 2]; then 0.0 and 2.0
    (array([2., 1., 0., 1.]), 2.0)
    """

    name = "histogram"

    def __init__(self, bins: int = 2048):
        super().__init__()
        self.bins = _check_int("bins", bins, 2)
        self._hist = np.zeros(self.bins)
        self._max = 0.0

    def _update(self, a):
        a = np.abs(a).ravel()
        m = float(a.max())
        if m > self._max:
            self._hist = _rebin(self._hist, self._max, m)
            self._max = m
        if self._max == 0.0:
            self._hist[0] += a.size
        else:
            self._hist += np.histogram(a, bins=self.bins, range=(0.0, self._max))[0]

    def histogram(self) -> tuple[np.ndarray, float]:
        """(counts per bin, max |x|): bin ``i`` covers ``[i, i + 1] * max / bins``."""
        return self._hist.copy(), self._max

    def _threshold(self):
        return 0.0 if self._max == 0.0 else self._search(self._hist, self._max / self.bins)

    def _search(self, hist: np.ndarray, width: float) -> float:
        raise NotImplementedError


class HistObserver(HistogramObserver):
    """The ``percentile`` of |x| from the histogram: the centre of the bin where it is reached.

    >>> import numpy as np
    >>> obs = HistObserver(percentile=0.999)
    >>> obs.observe(np.linspace(-1.0, 1.0, 100_001))
    >>> round(float(obs.scale()), 3)
    0.999
    """

    name = "hist"

    def __init__(self, percentile: float = 0.99999, bins: int = 2048):
        super().__init__(bins)
        if not 0.0 < percentile <= 1.0:
            raise ValueError(f"percentile must be in (0, 1], got {percentile}")
        self.percentile = float(percentile)

    def _search(self, hist, width):
        cumulative = np.cumsum(hist)
        index = min(int(np.searchsorted(cumulative, self.percentile * cumulative[-1])), hist.size - 1)
        return (index + 0.5) * width


class _ClipSearchObserver(HistogramObserver):
    """A histogram searched for the best clip, from ``2**(bits-1)`` bins (128 for int8) up.

    Below that many bins a quantization step is narrower than a bin, and the histogram can no
    longer tell the candidates apart.
    """

    def __init__(self, bits: int = 8, bins: int = 2048):
        self.bits = _check_bits(bits)
        self.levels = 2 ** (self.bits - 1)
        super().__init__(_check_int("bins", bins, self.levels))


def _kl_divergence(hist: np.ndarray, stop: int, levels: int) -> float:
    """KL(P || Q) of TensorRT's calibration for clipping the histogram after ``stop`` bins.

    P: the first ``stop`` bins, the clipped tail added to the last one. Q: the same bins (tail
    left out) merged into ``levels`` groups (the last one takes the remainder), each group's count
    spread evenly over the bins where P is non-zero. Where Q is zero but P is not (a tail landing
    on an empty group), Q gets a ten-thousandth of a count, as MXNet's smoothing does.
    """
    p = hist[:stop].copy()
    p[-1] += hist[stop:].sum()
    nonzero = p > 0
    group = stop // levels
    starts = np.arange(levels) * group
    sums = np.add.reduceat(hist[:stop], starts)
    counts = np.add.reduceat(nonzero.astype(np.int64), starts)
    spread = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    q = np.where(nonzero, spread[np.minimum(np.arange(stop) // group, levels - 1)], 0.0)
    if not q.any():
        return np.inf
    q = np.where(nonzero & (q == 0), 1e-4, q)
    p, q = p[nonzero] / p.sum(), q[nonzero] / q.sum()
    return float(np.sum(p * np.log(p / q)))


class KLObserver(_ClipSearchObserver):
    """TensorRT-style entropy calibration: the clip whose quantized histogram loses least information.

    Clip points from ``start`` times the max (PaddleSlim's 0.5 by default: never clip below
    max/2) to all ``bins`` are tried, and never fewer than ``2**(bits-1)`` bins (128 for int8);
    ``start=0`` tries them all, as TensorRT does. The one with the smallest KL divergence (see
    ``_kl_divergence``) wins, and the threshold is the right edge of its last kept bin
    (PaddleSlim reports the bin's centre, half a bin lower).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=100_000)
    >>> obs = KLObserver()
    >>> obs.observe(x)
    >>> 2.0 < float(obs.scale()) < float(np.abs(x).max())
    True
    """

    name = "KL"

    def __init__(self, bits: int = 8, bins: int = 2048, start: float = 0.5):
        super().__init__(bits, bins)
        if not 0 <= start <= 1:
            raise ValueError(f"KL: start must be a fraction of the max in [0, 1], got {start}")
        self.start = start

    def _search(self, hist, width):
        stops = range(max(self.levels, int(self.start * hist.size)), hist.size + 1)
        divergences = [_kl_divergence(hist, stop, self.levels) for stop in stops]
        return stops[int(np.argmin(divergences))] * width


class MSEObserver(_ClipSearchObserver):
    """The clip minimising the mean squared quantization error, estimated on the histogram.

    Each bin counts as its centre; candidate thresholds are the bin edges from ``2**(bits-1)``
    bins up. PaddleSlim instead searches 0.3..1.0 x max of each batch on the raw values and keeps
    the best across batches; the histogram lets the search see all batches at once.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=1_000_000)
    >>> x[:3] = 40.0  # rare outliers: clipping them costs less than a coarse step for the rest
    >>> obs = MSEObserver()
    >>> obs.observe(x)
    >>> float(obs.scale()) < 20.0, quant_error(x, obs.scale()) < quant_error(x, 40.0)
    (True, True)
    """

    name = "mse"

    def _search(self, hist, width):
        centres = (np.arange(hist.size) + 0.5) * width
        thresholds = np.arange(self.levels, hist.size + 1) * width
        errors = np.concatenate([self._errors(centres, hist, chunk) for chunk in np.array_split(
            thresholds, max(1, thresholds.size // 256))])
        return float(thresholds[int(np.argmin(errors))])

    def _errors(self, centres, counts, thresholds):
        """Histogram estimate of the summed squared error, one value per threshold."""
        top = qmax(self.bits)
        step = thresholds[:, None] / top
        dequantized = np.clip(np.round(centres / step), 0, top) * step
        return ((centres - dequantized) ** 2) @ counts


OBSERVERS: dict[str, type[Observer]] = {cls.name: cls for cls in (
    AbsMaxObserver, ChannelWiseAbsMaxObserver, MovingAverageAbsMaxObserver, MinMaxObserver, AvgObserver,
    HistObserver, KLObserver, MSEObserver)}


def make_observer(algo: str, **options) -> Observer:
    """A fresh observer for PaddleSlim's ``algo`` name (case-insensitive), with its options.

    >>> make_observer("hist", percentile=0.99999, bins=2048)
    <HistObserver 'hist', 0 batch(es)>
    >>> make_observer("kl").name
    'KL'
    >>> make_observer("max")
    Traceback (most recent call last):
    ...
    ValueError: unknown observer algo 'max'; known: abs_max, channel_wise_abs_max, ...
    """
    by_lower = {name.lower(): cls for name, cls in OBSERVERS.items()}
    cls = by_lower.get(algo.lower()) if isinstance(algo, str) else None
    if cls is None:
        raise ValueError(f"unknown observer algo {algo!r}; known: {', '.join(OBSERVERS)}")
    accepted = list(inspect.signature(cls).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"the {cls.name} observer has no option {', '.join(map(repr, unknown))}; "
                        f"its options: {', '.join(accepted) or 'none'}")
    return cls(**options)
