"""Calibration statistics: streaming |x| histograms (and per-channel maxima for weights).

Pure numpy, no IR knowledge. The ``calibrate`` pass feeds every tensor that will be quantized to
an observer (``update`` once per sample), then asks for a symmetric threshold ``T`` with
:func:`qir.passes.calibrate.thresholds.compute_threshold`; the node's scale is ``T / qmax`` (qmax = 127
for int8, 32767 for int16). Memory is bounded: an observer holds a fixed number of integer bins
and a few scalars, never a tensor.

Observers
---------
:class:`AbsHistogram`
    Histogram of ``|x|`` over ``[0, range)`` with ``num_bins`` equal bins (a power of two, default
    2048), plus ``count`` (finite values), ``nan_count``, ``inf_count``, ``zero_count``,
    ``abs_max`` and signed ``min`` / ``max``. NaN and ±Inf are counted and otherwise ignored.
:class:`AbsMaxObserver`
    The same scalars without bins: all the ``max`` method needs, at the cost of two reductions.

Range rule (why streaming equals one-shot, exactly)
---------------------------------------------------
The range is always a power of two, ``range = 2**e`` with ``e`` the smallest integer such that
``abs_max < 2**e`` (``math.frexp``), but never below ``2**MIN_RANGE_EXP``. Bin ``k`` holds
``k*w <= |x| < (k+1)*w`` with ``w = range / num_bins``. When a batch's ``|x|`` max reaches the
range, ``e`` grows to fit it and the bins are merged pairwise (``new[j] = old[2j] + old[2j+1]``)
once per doubling, which is exactly the histogram the larger range would have produced: both
``range`` and ``num_bins`` are powers of two, so ``|x| * num_bins / range`` is computed without
rounding and ``floor(y / 2) == floor(floor(y) / 2)``. Hence the bins depend only on the data, not
on how it was split into batches or in which order it arrived, ``merge`` is exact, and the number
of bins never changes. The price: the data max lies in the upper half of the range, so between
``num_bins/2`` and ``num_bins`` bins are in use (raise ``num_bins`` for finer resolution).

Weights use :func:`channel_abs_max` (per-channel max ``|w|``); all-zero channels get
``ZERO_DATA_THRESHOLD`` (1e-8) and an :class:`ObserverWarning`, NaN/Inf raise
:class:`ObserverError` (a ``ValueError``).
"""
from __future__ import annotations

import math
import threading
import warnings
from typing import Any, Mapping

import numpy as np

from qir.errors import QirError
from qir.json_dump import JsonValue

__all__ = [
    "AbsHistogram", "AbsMaxObserver", "ObserverError", "ObserverWarning",
    "ZERO_DATA_THRESHOLD", "MIN_RANGE_EXP", "channel_abs_max",
]

#: Threshold returned for data that is exactly zero everywhere. Small enough to be "nothing",
#: large enough that ``scale = T / 32767`` (3e-13) and ``1 / scale`` stay normal, finite float32
#: (a threshold of ``np.finfo(np.float32).tiny`` would give a denormal or zero scale).
ZERO_DATA_THRESHOLD = 1e-8
#: The histogram range never goes below ``2**MIN_RANGE_EXP`` (~7.9e-31): values smaller than that
#: all share the lowest bins. Keeps ``num_bins / range`` a normal float32.
MIN_RANGE_EXP = -100
_MAX_BINS = 1 << 20
_CHUNK = 1 << 16          # elements per histogram chunk: buffers stay cache-sized
_FORMAT = "qir.abs_histogram"


class ObserverError(QirError, ValueError):
    """Calibration statistics cannot give a threshold (no finite data, bad method or option)."""


class ObserverWarning(UserWarning):
    """A threshold came from a guard (e.g. all-zero data) rather than from the data."""


# --------------------------------------------------------------------------- observers

class AbsMaxObserver:
    """Running ``count``/``nan_count``/``inf_count``/``zero_count``/``abs_max``/``min``/``max``.

    ``update`` costs two reductions over the tensor (``max`` and ``min``, which also detect
    NaN/Inf) plus a zero count; NaN/Inf take a slower path that drops them.
    """

    kind = "absmax"

    def __init__(self) -> None:
        self.count = 0          # finite values seen
        self.nan_count = 0
        self.inf_count = 0
        self.zero_count = 0     # finite values exactly 0 (either sign)
        self.abs_max = 0.0      # max |x| over finite values
        self.min: float | None = None   # signed min / max over finite values
        self.max: float | None = None

    # -- update
    @staticmethod
    def _as_float(x: Any) -> np.ndarray:
        arr = np.asarray(x)
        kind = arr.dtype.kind
        if kind == "f":
            if arr.dtype.itemsize < 4:
                arr = arr.astype(np.float32)
            elif arr.dtype.itemsize > 8:
                arr = arr.astype(np.float64)
        elif kind in "biu":
            arr = arr.astype(np.float64)
        else:
            raise TypeError(f"observers take real numeric arrays, got dtype {arr.dtype}")
        return arr

    def _scan(self, x: Any) -> tuple[np.ndarray, float] | None:
        """Count non-finite values and update the scalars; return (finite values, batch abs max)."""
        arr = self._as_float(x)
        if arr.size == 0:
            return None
        mx, mn = arr.max(), arr.min()          # NaN propagates; ±Inf shows up here too
        if not (math.isfinite(mx) and math.isfinite(mn)):
            finite = np.isfinite(arr)
            n_fin = int(np.count_nonzero(finite))
            n_nan = int(np.count_nonzero(np.isnan(arr)))
            self.nan_count += n_nan
            self.inf_count += arr.size - n_fin - n_nan
            if n_fin == 0:
                return None
            arr = arr[finite]
            mx, mn = arr.max(), arr.min()
        mx, mn = float(mx), float(mn)
        self.count += arr.size
        self.min = mn if self.min is None else min(self.min, mn)
        self.max = mx if self.max is None else max(self.max, mx)
        amax = max(mx, -mn, 0.0)
        self.abs_max = max(self.abs_max, amax)
        return arr, amax

    def update(self, x: Any) -> "AbsMaxObserver":
        """Observe one tensor (any shape; NaN/Inf counted and ignored). Returns self."""
        got = self._scan(x)
        if got is not None:
            arr, amax = got
            self.zero_count += arr.size if amax == 0 else int(np.count_nonzero(arr == 0))
        return self

    def update_range(self, lo: float, hi: float) -> "AbsMaxObserver":
        """Observe a tensor known only by its ``lo`` = min and ``hi`` = max (as float32): what
        ``update([lo, hi])`` records (two values), without building arrays. Returns self."""
        lo, hi = float(np.float32(lo)), float(np.float32(hi))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return self.update(np.array([lo, hi], np.float32))
        self.count += 2
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self.abs_max = max(self.abs_max, hi, -lo, 0.0)
        self.zero_count += (lo == 0) + (hi == 0)
        return self

    # -- combine / save
    def _merge_scalars(self, other: "AbsMaxObserver") -> None:
        self.count += other.count
        self.nan_count += other.nan_count
        self.inf_count += other.inf_count
        self.zero_count += other.zero_count
        self.abs_max = max(self.abs_max, other.abs_max)
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)
            self.max = other.max if self.max is None else max(self.max, other.max)

    def merge(self, other: "AbsMaxObserver") -> "AbsMaxObserver":
        """Add ``other``'s statistics into self (as if self had seen its data too). Returns self."""
        if not isinstance(other, AbsMaxObserver):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        self._merge_scalars(other)
        return self

    @property
    def total(self) -> int:
        """Every value seen, finite or not."""
        return self.count + self.nan_count + self.inf_count

    @property
    def all_zero(self) -> bool:
        """True when finite data was seen and all of it is exactly zero."""
        return self.count > 0 and self.abs_max == 0.0

    def _scalars_dict(self) -> dict:
        return {"count": self.count, "nan_count": self.nan_count, "inf_count": self.inf_count,
                "zero_count": self.zero_count, "abs_max": self.abs_max, "min": self.min,
                "max": self.max}

    def _load_scalars(self, d: Mapping[str, Any]) -> None:
        for key in ("count", "nan_count", "inf_count", "zero_count"):
            setattr(self, key, int(d.get(key, 0)))
        self.abs_max = float(d.get("abs_max", 0.0))
        self.min = None if d.get("min") is None else float(d["min"])
        self.max = None if d.get("max") is None else float(d["max"])

    def to_dict(self) -> dict[str, JsonValue]:
        """The statistics as a JSON document (plain ints, floats and None)."""
        return {"format": _FORMAT, "version": 1, "kind": self.kind, **self._scalars_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> "AbsMaxObserver":
        """Inverse of :meth:`to_dict`; an ``AbsHistogram`` dict loads as its own class."""
        _check_format(d)
        if d.get("kind") == AbsHistogram.kind and cls is not AbsHistogram:
            return AbsHistogram.from_dict(d)
        if d.get("kind") != cls.kind:
            raise ObserverError(f"observer dict is of kind {d.get('kind')!r}, expected {cls.kind!r}")
        obs = cls()
        obs._load_scalars(d)
        return obs

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(count={self.count}, abs_max={self.abs_max:.6g}, "
                f"nan={self.nan_count}, inf={self.inf_count}, zeros={self.zero_count})")


def _check_format(d: Mapping[str, Any]) -> None:
    if not isinstance(d, Mapping) or d.get("format") != _FORMAT:
        raise ObserverError(f"not an observer dict (expected format {_FORMAT!r})")
    if d.get("version") != 1:
        raise ObserverError(f"unsupported observer dict version {d.get('version')!r} (this qir reads 1)")


_tls = threading.local()


def _buffers(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread scratch buffers (float of ``dtype``, int32, bool), reused across updates."""
    key = np.dtype(dtype).str
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    if key not in bufs:
        bufs[key] = (np.empty(_CHUNK, dtype=dtype), np.empty(_CHUNK, dtype=np.int32),
                     np.empty(_CHUNK, dtype=bool))
    return bufs[key]


def _spread_offsets(n_bins: int) -> np.ndarray:
    """``[0, n_bins, 0, n_bins, ...]`` (int32, one chunk long), cached per thread."""
    cache = getattr(_tls, "spread", None)
    if cache is None:
        cache = _tls.spread = {}
    if n_bins not in cache:
        off = np.zeros(_CHUNK, dtype=np.int32)
        off[1::2] = n_bins
        cache[n_bins] = off
    return cache[n_bins]


def _halve(hist: np.ndarray, times: int) -> np.ndarray:
    """The histogram over a range ``2**times`` larger: merge adjacent bins pairwise ``times`` times."""
    n = hist.size
    out = hist.copy()
    for _ in range(min(times, n.bit_length())):   # after log2(n)+1 halvings all is in bin 0
        half = out.reshape(-1, 2).sum(axis=1)
        out[: n // 2] = half
        out[n // 2:] = 0
    return out


class AbsHistogram(AbsMaxObserver):
    """Streaming histogram of ``|x|`` with a fixed number of bins (see the module doc for the
    power-of-two range rule). ``hist[k]`` counts finite values with ``k*w <= |x| < (k+1)*w``.

    >>> h = AbsHistogram(num_bins=2048)
    >>> for x in batches: h.update(x)
    >>> compute_threshold(h, "kl", qmax=127)
    """

    kind = "abs_histogram"

    def __init__(self, num_bins: int = 2048) -> None:
        super().__init__()
        if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
            raise ObserverError(f"num_bins must be an int, got {num_bins!r}")
        num_bins = int(num_bins)
        if num_bins < 16 or num_bins > _MAX_BINS or num_bins & (num_bins - 1):
            raise ObserverError(f"num_bins must be a power of two between 16 and {_MAX_BINS}, got "
                                f"{num_bins} (the exact range-doubling rule needs a power of two)")
        self.num_bins = num_bins
        self.hist = np.zeros(num_bins, dtype=np.int64)
        self.range_exp: int | None = None    # range = 2**range_exp; None until nonzero data
        self._hot = False                    # speed hint only (see _accumulate)

    @property
    def range(self) -> float:
        """Upper end of the histogram (exclusive); 0.0 before any nonzero data."""
        return 0.0 if self.range_exp is None else math.ldexp(1.0, self.range_exp)

    @property
    def bin_width(self) -> float:
        return self.range / self.num_bins

    @property
    def edges(self) -> np.ndarray:
        """The ``num_bins + 1`` bin edges (float64)."""
        return np.arange(self.num_bins + 1, dtype=np.float64) * self.bin_width

    @property
    def used_bins(self) -> int:
        """Index of the last non-empty bin + 1 (0 when empty)."""
        nz = np.flatnonzero(self.hist)
        return int(nz[-1]) + 1 if nz.size else 0

    def _grow(self, new_exp: int) -> None:
        if self.range_exp is None:
            self.range_exp = new_exp
        elif new_exp > self.range_exp:
            self.hist = _halve(self.hist, new_exp - self.range_exp)
            self.range_exp = new_exp

    def update_range(self, lo: float, hi: float) -> "AbsHistogram":
        """``update([lo, hi])``: the two values go into the bins too."""
        return self.update(np.array([lo, hi], np.float32))

    def update(self, x: Any) -> "AbsHistogram":
        """Observe one tensor (any shape; NaN/Inf counted and ignored). Returns self.

        One chunked pass: ``|x|`` → ``* num_bins/range`` → truncate to int32 → ``np.bincount``,
        in float32 for float32/float16 input (exact, the scale factor is a power of two).
        """
        got = self._scan(x)
        if got is None:
            return self
        arr, amax = got
        if amax == 0.0:                      # all zero: bin 0 whatever the range
            self.hist[0] += arr.size
            self.zero_count += arr.size
            return self
        self._grow(max(math.frexp(amax)[1], MIN_RANGE_EXP))
        self._accumulate(arr)
        return self

    def _accumulate(self, arr: np.ndarray) -> None:
        n_bins = self.num_bins
        flat = arr.reshape(-1)
        fbuf, ibuf, bbuf = _buffers(flat.dtype)
        factor = flat.dtype.type(math.ldexp(float(n_bins), -self.range_exp))   # exact power of 2
        if not 0.0 < factor < np.inf:        # float32 data after float64 data beyond its range
            flat = flat.astype(np.float64)
            fbuf, ibuf, bbuf = _buffers(flat.dtype)
            factor = math.ldexp(float(n_bins), -self.range_exp)
        hist = self.hist
        zeros = 0
        hot = self._hot
        for start in range(0, flat.size, _CHUNK):
            seg = flat[start:start + _CHUNK]
            n = seg.size
            f = fbuf[:n]
            idx = ibuf[:n]
            np.abs(seg, out=f)
            np.multiply(f, factor, out=f)          # < num_bins because |x| < range
            np.copyto(idx, f, casting="unsafe")    # truncation == floor for |x| >= 0; int32
                                                   # converts much faster than intp
            if hot:
                # One bin takes a large share (e.g. the zeros after a ReLU): bincount then
                # stalls on a single counter. Alternate elements go to two copies of the bins,
                # which breaks the dependency chain (~15% faster on ReLU data), then fold.
                np.add(idx, _spread_offsets(n_bins)[:n], out=idx)
                counts = np.bincount(idx, minlength=2 * n_bins)
                counts = counts[:n_bins] + counts[n_bins:]
            else:
                counts = np.bincount(idx, minlength=n_bins)
            if counts[0]:                          # exact zeros can only be in bin 0
                zeros += int(np.count_nonzero(np.equal(seg, 0, out=bbuf[:n])))
            hot = int(counts.max()) * 4 > n
            hist += counts
        self.zero_count += zeros
        self._hot = hot                  # a tensor's next sample is likely alike

    def merge(self, other: "AbsHistogram") -> "AbsHistogram":
        """Add ``other`` into self; equal to updating self with ``other``'s data. Returns self."""
        if not isinstance(other, AbsHistogram):
            raise TypeError(f"cannot merge {type(other).__name__} into AbsHistogram "
                            "(it has no bins)")
        if other.num_bins != self.num_bins:
            raise ObserverError(f"cannot merge histograms with {self.num_bins} and "
                                f"{other.num_bins} bins")
        theirs = other.hist
        if other.range_exp is not None:
            self._grow(other.range_exp)
            if other.range_exp < self.range_exp:
                theirs = _halve(theirs, self.range_exp - other.range_exp)
        self.hist = self.hist + theirs
        self._merge_scalars(other)
        return self

    def to_dict(self) -> dict[str, JsonValue]:
        """JSON-able: scalars, ``range_exp`` and the bins up to the last non-empty one."""
        d = super().to_dict()
        d.update(num_bins=self.num_bins, range_exp=self.range_exp, range=self.range,
                 hist=self.hist[: self.used_bins].tolist())
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, JsonValue]) -> "AbsHistogram":
        _check_format(d)
        if d.get("kind") != cls.kind:
            raise ObserverError(f"observer dict is of kind {d.get('kind')!r}, expected {cls.kind!r}")
        if "num_bins" not in d:
            raise ObserverError("observer dict has no 'num_bins'")
        h = cls(int(d["num_bins"]))
        h._load_scalars(d)
        h.range_exp = None if d.get("range_exp") is None else int(d["range_exp"])
        bins = np.asarray(d.get("hist", []), dtype=np.int64)
        if bins.ndim != 1 or bins.size > h.num_bins or (bins < 0).any():
            raise ObserverError("observer dict has a malformed 'hist'")
        h.hist[: bins.size] = bins
        if int(h.hist.sum()) != h.count:
            raise ObserverError(f"observer dict is inconsistent: bins sum to {int(h.hist.sum())} "
                                f"but count is {h.count}")
        if h.abs_max > 0 and not (h.range_exp is not None and h.abs_max < h.range):
            raise ObserverError(f"observer dict is inconsistent: abs_max {h.abs_max!r} is not "
                                f"below the range 2**{h.range_exp}")
        return h

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", bins={self.num_bins}, range={self.range:.6g})"


# --------------------------------------------------------------------------- weights

def channel_abs_max(w: Any, axis: int, *, guard: bool = True) -> np.ndarray:
    """Per-channel ``max |w|`` along ``axis`` (e.g. 0 for Conv weights), as a float32 vector.

    Raises :class:`ObserverError` when a channel holds NaN/Inf (naming the channels). With
    ``guard`` (the default, for use as thresholds) all-zero channels get ``ZERO_DATA_THRESHOLD``
    and an :class:`ObserverWarning`; ``guard=False`` returns the raw maxima, zeros included.
    """
    arr = AbsMaxObserver._as_float(w)
    if arr.ndim == 0:
        raise ObserverError("channel_abs_max needs an array with at least one axis, got a scalar")
    if not -arr.ndim <= axis < arr.ndim:
        raise ObserverError(f"axis {axis} is out of range for a weight of shape {arr.shape}")
    axis %= arr.ndim
    if arr.shape[axis] == 0 or arr.size == 0:
        raise ObserverError(f"cannot take per-channel maxima of an empty weight {arr.shape}")
    others = tuple(i for i in range(arr.ndim) if i != axis)
    amax = np.abs(arr).max(axis=others) if others else np.abs(arr)
    bad = np.flatnonzero(~np.isfinite(amax))
    if bad.size:
        raise ObserverError(f"weight has NaN/Inf in {bad.size} of {amax.size} channels along axis "
                            f"{axis} (first: {bad[:8].tolist()})")
    amax = amax.astype(np.float32)
    if guard:
        zero = np.flatnonzero(amax == 0)
        if zero.size:
            warnings.warn(f"{zero.size} of {amax.size} weight channels are all zero (first: "
                          f"{zero[:8].tolist()}); they get the guard threshold "
                          f"{ZERO_DATA_THRESHOLD:g}", ObserverWarning, stacklevel=2)
            amax[zero] = np.float32(ZERO_DATA_THRESHOLD)
    return amax
