"""Error metrics between a reference tensor ``a`` (float, or whatever the analysis compares
against) and a tensor ``d`` under test, both flattened to float64.

hmct names and definitions (as hmct's debugger computes them; note ``mre`` and ``sqnr``):

==================== ============================================== ====== ========================
name                 formula                                        better edge cases
==================== ============================================== ====== ========================
cosine-similarity    dot(a, d) / (‖a‖·‖d‖)                          max    both zero-norm → 1; one → 0
mse                  mean((a − d)²)                                 min    empty → 0
mre                  mean(|a − d|)  (hmct: a mean *absolute* error) min    empty → 0
sqnr                 10·log10(‖a‖ / ‖a − d‖)  (hmct: half the dB)   max    both 0 → 0; a = 0 → −inf;
                                                                           noise 0 → +inf
chebyshev            max |a − d|                                    min    empty → 0
==================== ============================================== ====== ========================

Standard names: ``sqnr-db`` = 20·log10(‖a‖ / ‖a − d‖) (same edge cases), ``l1`` = mean |a − d|,
``atol`` = max |a − d|, ``kl`` = mean over elements of softmax(a)·(log softmax(a) − log softmax(d))
(PyTorch ``KLDivLoss(log_softmax(d), softmax(a))``, float64; softmax over axis 1 of tensors with
more than two dimensions, else the last axis; needs the unflattened shapes).

Non-finite elements: positions where ``a`` or ``d`` is NaN or ±Inf are left out (and counted by
:func:`nonfinite_count`), so one overflow does not turn a whole table into NaN. A *reference* that
holds NaN or ±Inf is another matter: every metric would score only what is left of it (nothing,
for an all-NaN output: cosine 1, mse 0), so the analyses leave such a sample out with a warning
(:func:`nonfinite_note` says why) and stop with an error when no sample is left.

Ill-conditioned references (:func:`ill_conditioned`): cosine similarity and SQNR (``RELATIVE``)
measure the error relative to the reference, so on a reference that is near zero everywhere (a
text detector on a photo without text) or constant they measure noise. The analyses flag such
samples with a warning, leave them out of those metrics' means and choices (unless every sample
is one), and point to an absolute metric (mse, l1) instead.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from qir.errors import InputError, did_you_mean
from qir.records import CalibRecord, OpRecord

__all__ = ["METRICS", "BETTER", "RELATIVE", "compute", "check_metrics", "worst_first", "nonfinite_count",
           "nonfinite_note", "ill_conditioned", "collapsed", "output_bound", "final_activation"]


def _pair(a: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, np.float64).ravel()
    d = np.asarray(d, np.float64).ravel()
    if a.shape != d.shape:
        raise InputError(f"cannot compare tensors of {a.size} and {d.size} elements")
    keep = np.isfinite(a) & np.isfinite(d)
    return (a, d) if keep.all() else (a[keep], d[keep])


def _sum_sq(x: np.ndarray) -> float:
    # sums, not BLAS dot/norm: a BLAS thread pool would fight the runtime's threads
    return float(np.sum(x * x))


def _norm(x: np.ndarray) -> float:
    return math.sqrt(_sum_sq(x))


class _Pair:
    """``a`` and ``d`` flattened to float64 without non-finite positions, with the pieces the
    metrics share (difference, norms) computed once, on first use."""

    def __init__(self, a, d) -> None:
        self.a, self.d = _pair(a, d)
        self.size = self.a.size
        self._diff = self._saa = None

    @property
    def diff(self) -> np.ndarray:
        if self._diff is None:
            self._diff = self.a - self.d
        return self._diff

    @property
    def sum_sq_a(self) -> float:
        if self._saa is None:
            self._saa = _sum_sq(self.a)
        return self._saa

    @property
    def norm_a(self) -> float:
        return math.sqrt(self.sum_sq_a)


def _cosine(p: _Pair) -> float:
    """``Σ a·d / sqrt(Σ a² · Σ d²)``: one square root of the product, so identical tensors give
    exactly 1 (``sqrt(S·S) == S`` in IEEE arithmetic; ``Σ a·d / (|a|·|d|)`` can give 1 - 2e-16)."""
    saa, sdd = p.sum_sq_a, _sum_sq(p.d)
    if saa == 0.0 and sdd == 0.0:
        return 1.0
    if saa == 0.0 or sdd == 0.0:
        return 0.0
    return float(np.sum(p.a * p.d)) / math.sqrt(saa * sdd)


def _mse(p: _Pair) -> float:
    return float(np.mean(p.diff ** 2)) if p.size else 0.0


def _mean_abs(p: _Pair) -> float:
    return float(np.mean(np.abs(p.diff))) if p.size else 0.0


def _max_abs(p: _Pair) -> float:
    return float(np.max(np.abs(p.diff))) if p.size else 0.0


def _log_ratio(p: _Pair, factor: float) -> float:
    if not p.size:
        return math.inf
    signal, noise = p.norm_a, _norm(p.diff)
    if signal == 0.0 and noise == 0.0:
        return 0.0
    if signal == 0.0:
        return -math.inf
    if noise == 0.0:
        return math.inf
    return factor * math.log10(signal / noise)


_PAIRED: dict[str, Callable[[_Pair], float]] = {
    "cosine-similarity": _cosine,
    "mse": _mse,
    "mre": _mean_abs,
    "sqnr": lambda p: _log_ratio(p, 10.0),
    "chebyshev": _max_abs,
    "sqnr-db": lambda p: _log_ratio(p, 20.0),
    "l1": _mean_abs,
    "atol": _max_abs,
}


def cosine_similarity(a, d) -> float:
    return _cosine(_Pair(a, d))


def mse(a, d) -> float:
    return _mse(_Pair(a, d))


def mean_abs(a, d) -> float:
    return _mean_abs(_Pair(a, d))


def max_abs(a, d) -> float:
    return _max_abs(_Pair(a, d))


def sqnr_hmct(a, d) -> float:
    return _log_ratio(_Pair(a, d), 10.0)


def sqnr_db(a, d) -> float:
    return _log_ratio(_Pair(a, d), 20.0)


def kl_divergence(a, d) -> float:
    a, d = np.asarray(a, np.float64), np.asarray(d, np.float64)
    if a.shape != d.shape:
        raise InputError(f"cannot compare tensors of shapes {list(a.shape)} and {list(d.shape)}")
    if not a.size:
        return 0.0
    axis = 1 if a.ndim > 2 else -1

    def log_softmax(x):
        m = np.max(x, axis=axis, keepdims=True)
        return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))

    la, ld = log_softmax(a), log_softmax(d)
    return float(np.mean(np.exp(la) * (la - ld)))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "cosine-similarity": cosine_similarity,
    "mse": mse,
    "mre": mean_abs,
    "sqnr": sqnr_hmct,
    "chebyshev": max_abs,
    "sqnr-db": sqnr_db,
    "l1": mean_abs,
    "atol": max_abs,
    "kl": kl_divergence,
}

BETTER = {"cosine-similarity": "max", "mse": "min", "mre": "min", "sqnr": "max", "chebyshev": "min",
          "sqnr-db": "max", "l1": "min", "atol": "min", "kl": "min"}


def check_metrics(names) -> tuple[str, ...]:
    """``names`` (one name or several) validated; an unknown name is an InputError with a suggestion."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise InputError(f"no metric given; choose from {', '.join(METRICS)}")
    for n in names:
        if n not in METRICS:
            raise InputError(did_you_mean(n, METRICS, "metric") + f" (metrics: {', '.join(METRICS)})")
    return names


def compute(names, a: np.ndarray, d: np.ndarray) -> dict[str, float]:
    """``{metric: value}`` for every name in ``names`` (the flattened pair and its difference
    are computed once for all of them)."""
    names = check_metrics(names)
    pair = _Pair(a, d) if any(n in _PAIRED for n in names) else None
    return {n: _PAIRED[n](pair) if n in _PAIRED else METRICS[n](a, d) for n in names}


def worst_first(metric: str, value: float) -> float:
    """A sort key putting the worst value of ``metric`` first (NaN last)."""
    if value != value:
        return math.inf
    return value if BETTER[metric] == "max" else -value


def nonfinite_count(*arrays: np.ndarray) -> int:
    """Positions where any of the arrays is NaN or ±Inf."""
    bad = np.zeros(np.asarray(arrays[0]).size, bool)
    for x in arrays:
        bad |= ~np.isfinite(np.asarray(x, np.float64).ravel())
    return int(bad.sum())


def nonfinite_note(values: Mapping[str, np.ndarray]) -> str | None:
    """None when every floating-point array of ``values`` is finite; else which ones hold NaN or
    ±Inf and how many of their elements, for a message (``"'out' 10 of 10 values"``)."""
    notes = []
    for name, x in values.items():
        x = np.asarray(x)
        if x.dtype.kind in "fc":
            bad = x.size - int(np.count_nonzero(np.isfinite(x)))
            if bad:
                notes.append(f"{name!r} {bad} of {x.size} values")
    return ", ".join(notes) or None


RELATIVE = ("cosine-similarity", "sqnr", "sqnr-db")  # relative to the reference: noise on an ill-conditioned one
NEAR_ZERO = 1e-3  # RMS below this fraction of the reference's range: "near zero"
CONSTANT = 1e-6  # peak-to-peak below this fraction of max |x|: "constant" (float32 rounding, a few ulps)

_BOUNDED = {"Sigmoid": 1.0, "HardSigmoid": 1.0, "Softmax": 1.0, "Tanh": 1.0}  # op type -> largest |output|
_PASS_THROUGH = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")


def ill_conditioned(a: np.ndarray, bound: float | None = None) -> str | None:
    """Why :data:`RELATIVE` metrics against the reference ``a`` are noise, or None when they are
    not. A scale-free rule on the finite elements of ``a`` (multiplying ``a`` and ``bound`` by
    any factor changes nothing):

    - *constant*: ``max(a) - min(a) <= 1e-6 · max|a|`` (all zero included): cosine is 1 for
      any output proportional to it and 0 for anything else;
    - *near zero*: ``RMS(a) < 1e-3 · R`` with ``R = max(max|a|, bound)``; ``bound`` is the
      value's range when a bounded activation produces it (:func:`output_bound`: 1 for a
      Sigmoid or Softmax output). Then the reference holds less energy than one element at
      full range in a million: a probability map with nothing detected (PP-OCRv4 det on a
      photo without text: RMS ~1e-5 of 1), or a lone spike; the quantization error elsewhere
      dominates cosine and SQNR. Without a bound, ``R`` is the sample's own peak.
    """
    x = np.asarray(a, np.float64).ravel()
    x = x[np.isfinite(x)]
    if not x.size:
        return None
    peak = float(np.max(np.abs(x)))
    spread = float(np.max(x) - np.min(x))
    if spread <= CONSTANT * peak:
        return "constant (every value 0)" if peak == 0.0 else f"constant (every value {float(x[0]):.6g})"
    scale = max(peak, bound or 0.0)
    rms = math.sqrt(_sum_sq(x) / x.size)
    if rms < NEAR_ZERO * scale:
        of = f"its range {scale:.6g}" if bound and bound >= peak else f"its peak {peak:.6g}"
        return f"near zero (RMS {rms:.3g}, below {NEAR_ZERO:g} of {of})"
    return None


SATURATED = 0.9  # share of values at the analysis output's own extreme that makes it saturated


def collapsed(a: np.ndarray, b: np.ndarray, bound: float | None = None) -> str | None:
    """How the analysis output ``b`` is degenerate where the reference ``a`` is not, or None: the
    model's quantization destroyed this output on this sample, which no similarity metric says
    plainly (a cosine of 0 or of 0.3 reads alike in a table). In order:

    - *not finite*: ``b`` holds NaN or Inf where ``a`` is finite;
    - *constant* (all zeros included) or *near zero*: :func:`ill_conditioned` holds for ``b`` (with
      ``bound``) and not for ``a``;
    - *saturated*: at least :data:`SATURATED` of ``b``'s values sit at its own maximum or minimum
      while fewer than half of ``a``'s sit at ``a``'s (a quantizer whose range clips everything).
    """
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape or not y.size or not np.isfinite(x).all():
        return None
    bad = int(np.size(y) - np.count_nonzero(np.isfinite(y)))
    if bad:
        return f"not finite: NaN or Inf in {bad} of {y.size} values"
    if ill_conditioned(x, bound) is not None:
        return None
    why = ill_conditioned(y, bound)
    if why is not None:
        rms = math.sqrt(_sum_sq(x.ravel()) / x.size)
        what = "all zeros" if why.startswith("constant (every value 0)") else why
        return f"{what}, where the reference's RMS is {rms:.3g}"
    for end, name in ((np.max(y), "maximum"), (np.min(y), "minimum")):
        share = float(np.mean(y == end))
        ref_end = np.max(x) if name == "maximum" else np.min(x)
        if share >= SATURATED and float(np.mean(x == ref_end)) < 0.5:
            return f"saturated: {share:.0%} of its values at its {name} {float(end):.6g}"
    return None


def final_activation(ir, value: str) -> OpRecord | None:
    """The op producing ``value`` through shape-only ops (Identity, Reshape, Flatten, Squeeze,
    Unsqueeze, Transpose) and calibration nodes: the model's last real op for an output."""
    rec = ir.producer(value)
    while rec is not None and (isinstance(rec, CalibRecord) or rec.op_type in _PASS_THROUGH):
        rec = ir.producer(rec.inputs[0])
    return rec if isinstance(rec, OpRecord) else None


def output_bound(ir, value: str) -> float | None:
    """The largest |x| ``value`` can take when its :func:`final_activation` is bounded (Sigmoid,
    HardSigmoid, Softmax, Tanh: 1), else None."""
    op = final_activation(ir, value) if ir.has_value(value) else None
    return _BOUNDED.get(op.op_type) if op is not None else None
