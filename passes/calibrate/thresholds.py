"""Threshold methods: a symmetric threshold ``T`` from an observer's statistics
(:mod:`qir.passes.calibrate.observers`); the node's scale is ``T / qmax``.

Threshold methods (``METHODS``)
-------------------------------
``max``         the largest finite ``|x|`` seen.
``percentile``  the upper edge of the first bin where the cumulative ``|x|`` mass reaches
                ``percentile`` % (capped at ``abs_max``).
``kl``          TensorRT entropy calibration, vectorized over every candidate.
``mse``         minimum expected squared quantization error, searched over a grid + refinement.

:func:`compute_threshold` picks the method by name and checks its options; :func:`make_observer`
gives the cheapest observer a method needs.

Guards: a tensor that is all zero gets ``ZERO_DATA_THRESHOLD`` (1e-8) and an
:class:`ObserverWarning`; an observer that saw only NaN/Inf, or nothing, raises
:class:`ObserverError` (a ``ValueError``). No method returns NaN, Inf or a value <= 0.
"""
from __future__ import annotations

import inspect
import math
import warnings
from typing import Any, Callable

import numpy as np

from qir.errors import did_you_mean
from qir.passes.calibrate.observers import ZERO_DATA_THRESHOLD, AbsHistogram, AbsMaxObserver, ObserverError, ObserverWarning

__all__ = [
    "METHODS", "compute_threshold", "make_observer",
    "threshold_max", "threshold_percentile", "threshold_kl", "threshold_mse",
    "expected_quant_mse", "kl_divergence_curve",
]

_FLT_MAX = float(np.finfo(np.float32).max)


# --------------------------------------------------------------------------- guards

def _usable_abs_max(h: AbsMaxObserver, method: str) -> float | None:
    """``h.abs_max``, or None for all-zero data (after warning); raises when there is no finite data."""
    if not isinstance(h, AbsMaxObserver):
        raise TypeError(f"expected an observer (AbsHistogram / AbsMaxObserver), got {type(h).__name__}")
    if h.count == 0:
        if h.nan_count or h.inf_count:
            raise ObserverError(
                f"cannot compute a {method!r} threshold: the tensor had only non-finite values "
                f"({h.nan_count} NaN, {h.inf_count} Inf, 0 finite); check the model or the "
                "calibration data feeding it")
        raise ObserverError(f"cannot compute a {method!r} threshold: the observer saw no data")
    if h.abs_max == 0.0:
        warnings.warn(f"all {h.count} calibration values are exactly 0; using the guard threshold "
                      f"{ZERO_DATA_THRESHOLD:g} for method {method!r}", ObserverWarning, stacklevel=3)
        return None
    return h.abs_max


def _finish(t: float, method: str) -> float:
    t = float(t)
    if not (math.isfinite(t) and t > 0.0):
        raise ObserverError(f"{method!r} produced an unusable threshold {t!r}")   # a bug if reached
    if t > _FLT_MAX:
        raise ObserverError(f"{method!r} threshold {t:g} exceeds the float32 range")
    return t


def _need_hist(h: AbsMaxObserver, method: str) -> AbsHistogram:
    if not isinstance(h, AbsHistogram):
        raise ObserverError(f"method {method!r} needs an AbsHistogram, got {type(h).__name__} "
                            "(collect with make_observer(method))")
    return h


# --------------------------------------------------------------------------- methods

def threshold_max(h: AbsMaxObserver) -> float:
    """The largest finite ``|x|`` seen."""
    amax = _usable_abs_max(h, "max")
    return ZERO_DATA_THRESHOLD if amax is None else _finish(amax, "max")


def threshold_percentile(h: AbsHistogram, percentile: float = 99.99) -> float:
    """Smallest bin edge with at least ``percentile`` % of the finite ``|x|`` values at or below
    it, capped at ``abs_max`` (so ``percentile=100`` gives exactly the max). Within one bin width
    of ``np.percentile(|x|, percentile)``."""
    percentile = _check_percentile(percentile)
    h = _need_hist(h, "percentile")
    amax = _usable_abs_max(h, "percentile")
    if amax is None:
        return ZERO_DATA_THRESHOLD
    target = h.count * (percentile / 100.0)
    cum = np.cumsum(h.hist)
    i = int(np.searchsorted(cum, target, side="left"))
    i = min(i, h.num_bins - 1)
    return _finish(min((i + 1) * h.bin_width, amax), "percentile")


def _xlogx(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)


def kl_divergence_curve(h: AbsHistogram, qmax: int = 127, *, stride: int = 1
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(candidates, kl)``: KL(P||Q) for each candidate bin count ``i`` (see :func:`threshold_kl`).

    Exact closed form of the TensorRT loop. For a candidate ``i`` with ``L = qmax + 1`` levels of
    ``m = i // L`` bins (the last level takes the remainder), ``T = sum(hist)`` and
    ``I = sum(hist[:i])``::

        P = hist[:i], P[i-1] += T - I                     (normalized by T)
        Q_k = S_j / (nz_j * I)  for P_k > 0 in level j, else 0
        KL  = (sum_k p_k log p_k) / T - log T - (sum_j Pmass_j log(S_j / nz_j)) / T + log I

    with ``S_j`` the level's sum of ``hist[:i]``, ``nz_j`` its count of non-zero ``P`` bins and
    ``Pmass_j`` its ``P`` mass (``S_j``, plus the tail for the last level). Levels ``0..L-2`` only
    depend on ``m``, so their term is computed once per distinct ``m`` (a handful), and each
    candidate costs O(1): the whole curve is O(num_bins).

    A candidate whose last level has ``P`` mass but no ``Q`` mass (tail dumped on an empty last
    level) gets +inf; onnxruntime/MXNet's 1e-4 count smoothing makes those merely huge, and it
    shifts every other value by O(1e-4 * bins / count), which is all we leave out.
    """
    levels = int(qmax) + 1
    n = h.used_bins
    if n < levels:                      # fewer bins than levels: no candidate (see threshold_kl)
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    stride = max(1, int(stride))
    cands = np.arange(levels, n + 1, stride, dtype=np.int64)
    if cands.size == 0 or cands[-1] != n:
        cands = np.append(cands, np.int64(n))
    hh = h.hist[:n].astype(np.float64)
    csum = np.concatenate([[0.0], np.cumsum(hh)])
    cnz = np.concatenate([[0], np.cumsum(hh > 0)])
    chl = np.concatenate([[0.0], np.cumsum(_xlogx(hh))])
    total = csum[n]

    # sum over the full levels 0..L-2 of S_j log(S_j / nz_j), per distinct m
    m = cands // levels
    ms, inverse = np.unique(m, return_inverse=True)
    bounds = ms[:, None] * np.arange(levels, dtype=np.int64)[None, :]      # starts of levels 0..L-1
    s_full = csum[bounds[:, 1:]] - csum[bounds[:, :-1]]
    nz_full = (cnz[bounds[:, 1:]] - cnz[bounds[:, :-1]]).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        full = np.where(s_full > 0, s_full * np.log(s_full / np.maximum(nz_full, 1.0)), 0.0).sum(1)
    full = full[inverse]

    # the last level [(L-1)*m, i) and the tail beyond i
    start = (levels - 1) * m
    inside = csum[cands]
    tail = total - inside
    s_last = inside - csum[start]
    last = hh[cands - 1]
    nz_last = (cnz[cands] - cnz[start]) + ((last == 0) & (tail > 0))
    p_last = s_last + tail
    with np.errstate(divide="ignore", invalid="ignore"):
        last_term = np.where(s_last > 0, p_last * np.log(s_last / np.maximum(nz_last, 1)), 0.0)
        plogp = chl[cands] - _xlogx(last) + _xlogx(last + tail)
        kl = (plogp - full - last_term) / total - math.log(total) + np.log(inside)
    kl[(p_last > 0) & (s_last == 0)] = np.inf
    return cands, kl


def threshold_kl(h: AbsHistogram, qmax: int = 127, *, stride: int = 1) -> float:
    """TensorRT entropy calibration over the ``|x|`` histogram.

    For every candidate ``i`` in ``[qmax+1, used_bins]`` (every ``stride``-th, the last always
    included): the reference ``P`` is ``hist[:i]`` with the mass beyond it added to its last bin;
    ``Q`` is ``hist[:i]`` merged into ``qmax+1`` levels and spread back evenly over the bins where
    ``P`` is non-zero. The threshold is ``i * bin_width`` (the upper edge of bin ``i-1``, as
    onnxruntime/MXNet; descriptions of TensorRT that use ``(i + 0.5) * bin_width`` differ by half
    a bin) for the ``i`` minimizing
    ``KL(P||Q)``, capped at ``abs_max``. Candidates stop at the last non-empty bin (bins past it
    are padding from the power-of-two range, TensorRT's histogram ends at the max).

    When ``qmax + 1 >= used_bins`` (e.g. int16, 32768 levels, with 2048 bins) every candidate
    quantizes losslessly, KL carries no information and the max is returned.
    """
    h = _need_hist(h, "kl")
    _check_qmax(qmax)
    amax = _usable_abs_max(h, "kl")
    if amax is None:
        return ZERO_DATA_THRESHOLD
    if int(qmax) + 1 >= h.used_bins:
        return _finish(amax, "kl")
    cands, kl = kl_divergence_curve(h, qmax, stride=stride)
    if not np.isfinite(kl).any():
        return _finish(amax, "kl")
    best = int(cands[int(np.argmin(kl))])
    return _finish(min(best * h.bin_width, amax), "kl")


def _edge_cost(e: np.ndarray, t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Antiderivative of the squared error at edges ``e`` for thresholds ``t`` (column), step ``s``.

    Below ``t`` the error of rounding ``x`` to the grid ``s`` is the sawtooth ``r = x - s*rint(x/s)``;
    ``integral_0^x r^2 = rint(x/s) * s^3/12 + r^3/3`` (each full period contributes ``s^3/12``; the
    formula is continuous at the half-way points, so the rounding direction of ties does not
    matter). Beyond ``t`` the clipping error ``(x - t)^2`` integrates to ``(x - t)^3 / 3``.
    """
    x = np.minimum(e, t)
    n = np.rint(x / s)
    r = x - n * s
    over = np.maximum(e - t, 0.0)
    return n * (s * s * s / 12.0) + (r * r * r + over * over * over) / 3.0


def expected_quant_mse(h: AbsHistogram, qmax: int, thresholds: Any) -> np.ndarray:
    """Expected squared error per finite value of symmetric fake quantization with each threshold.

    Values are taken uniform inside their bin (the exact zeros, ``zero_count``, exactly 0); a
    value ``|x| <= T`` costs its rounding error to the grid ``s = T/qmax`` (integrated exactly,
    not the ``s^2/12`` approximation, so sparse or mostly-small data is costed right), a value
    beyond ``T`` costs ``(|x| - T)^2``. Both signs clip at ``T`` (the extra negative level
    ``-qmax-1`` of the integer range is ignored).
    """
    t = np.asarray(thresholds, dtype=np.float64).reshape(-1, 1)
    n = h.used_bins
    if n == 0 or h.count == 0:
        return np.zeros(t.shape[0])
    mass = h.hist[:n].astype(np.float64)
    mass[0] -= h.zero_count
    w = h.bin_width
    edges = (np.arange(n + 1, dtype=np.float64) * w)[None, :]
    cost = _edge_cost(edges, t, t / float(qmax))
    return (np.diff(cost, axis=1) @ mass) / (w * h.count)


def threshold_mse(h: AbsHistogram, qmax: int = 127, *, num_candidates: int = 48,
                  refine_rounds: int = 2) -> float:
    """The threshold minimizing :func:`expected_quant_mse`.

    Candidates: ``num_candidates`` evenly spaced in ``(0, abs_max]`` plus a geometric ladder
    ``abs_max * 2**(-k/4)``, k = 1..40 (down to ``abs_max/1024``, for heavy tails whose optimum
    sits far below the max); then ``refine_rounds`` times, ``num_candidates // 2`` points between
    the best candidate's neighbours. Each round is one vectorized evaluation.
    """
    h = _need_hist(h, "mse")
    _check_qmax(qmax)
    amax = _usable_abs_max(h, "mse")
    if amax is None:
        return ZERO_DATA_THRESHOLD
    num_candidates = max(8, int(num_candidates))
    cands = np.unique(np.concatenate([
        amax * np.arange(1, num_candidates + 1) / num_candidates,
        amax * 2.0 ** (-np.arange(1, 41) / 4.0),
    ]))
    best = amax
    for round_ in range(int(refine_rounds) + 1):
        err = _blocked_mse(h, qmax, cands)
        i = int(np.argmin(err))
        best = float(cands[i])
        if round_ == refine_rounds:
            break
        lo = float(cands[i - 1]) if i > 0 else 0.0
        hi = float(cands[i + 1]) if i + 1 < cands.size else amax
        fine = np.linspace(lo, hi, num_candidates // 2 + 2)[1:-1]
        cands = np.unique(np.concatenate([fine[fine > 0], [best]]))
    return _finish(min(best, amax), "mse")


def _blocked_mse(h: AbsHistogram, qmax: int, cands: np.ndarray) -> np.ndarray:
    block = max(1, (1 << 18) // max(1, h.used_bins))   # bound the (candidates x bins) temporaries
    return np.concatenate([expected_quant_mse(h, qmax, cands[i:i + block])
                           for i in range(0, cands.size, block)])


# --------------------------------------------------------------------------- entry point

METHODS: dict[str, Callable[..., float]] = {
    "max": threshold_max,
    "percentile": threshold_percentile,
    "kl": threshold_kl,
    "mse": threshold_mse,
}


def _check_qmax(qmax: Any) -> int:
    if isinstance(qmax, bool) or not isinstance(qmax, (int, np.integer)) or qmax < 1:
        raise ObserverError(f"qmax must be a positive int (127 for int8, 32767 for int16), got {qmax!r}")
    return int(qmax)


def _check_percentile(p: Any) -> float:
    try:
        if isinstance(p, bool):
            raise TypeError
        val = float(p)
    except (TypeError, ValueError):
        raise ObserverError(f"percentile must be a number in (0, 100], got {p!r}") from None
    if not (0.0 < val <= 100.0):
        raise ObserverError(f"percentile must be in (0, 100], got {p!r}")
    return val


def _check_int(name: str, v: Any, minimum: int) -> int:
    try:
        if isinstance(v, bool) or float(v) != int(float(v)):
            raise ValueError
        iv = int(float(v))
    except (TypeError, ValueError, OverflowError):
        raise ObserverError(f"{name} must be an integer >= {minimum}, got {v!r}") from None
    if iv < minimum:
        raise ObserverError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return iv


_OPTION_CHECKS: dict[str, Callable[[Any], Any]] = {
    "percentile": _check_percentile,
    "stride": lambda v: _check_int("stride", v, 1),
    "num_candidates": lambda v: _check_int("num_candidates", v, 8),
    "refine_rounds": lambda v: _check_int("refine_rounds", v, 0),
}


def _lookup(method: Any) -> Callable[..., float]:
    if not isinstance(method, str) or method not in METHODS:
        msg = did_you_mean(str(method), METHODS, what="calibration method")
        raise ObserverError(f"{msg} (available: {', '.join(METHODS)})")
    return METHODS[method]


def compute_threshold(h: AbsMaxObserver, method: str, qmax: int = 127, **options: Any) -> float:
    """Threshold (> 0, finite) of ``method`` for the statistics in ``h``.

    ``options`` are the method's own keywords (``percentile`` for percentile, ``stride`` for kl,
    ``num_candidates``/``refine_rounds`` for mse); strings such as ``"99.9"`` from a pipeline
    string are accepted. Unknown methods/options and out-of-range values raise ObserverError.
    """
    fn = _lookup(method)
    _check_qmax(qmax)
    params = inspect.signature(fn).parameters
    accepted = [p for p in params if p not in ("h", "qmax")]
    for key in options:
        if key not in accepted:
            hint = did_you_mean(key, accepted, what=f"option of method {method!r}")
            raise ObserverError(f"{hint} (accepted: {', '.join(accepted) or 'none'})")
    kwargs = {k: _OPTION_CHECKS[k](v) if k in _OPTION_CHECKS else v for k, v in options.items()}
    if "qmax" in params:
        kwargs["qmax"] = int(qmax)
    return fn(h, **kwargs)


def make_observer(method: str, num_bins: int = 2048) -> AbsMaxObserver:
    """The cheapest observer that serves ``method``: ``AbsMaxObserver`` for ``max`` (two
    reductions per tensor), an ``AbsHistogram`` for the others and for ``mix`` (which compares
    every method's threshold)."""
    if method != "mix":
        _lookup(method)
    return AbsMaxObserver() if method == "max" else AbsHistogram(num_bins)
