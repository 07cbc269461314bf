"""The int16 segmented LUT (the plugin's SegmentLUT) of the integer level, for ``lut_mode =
"segment"``; its parameters are marked assumed in the march profiles (``qir profiles``).

A unary function ``f`` on int16 codes ``x`` (output int8 or int16 codes ``y``) becomes ``S = N + 2``
segments (``N = table_segments``, 6): a linear segment 0 at the low end, ``N`` segments of
``E = entries_per_segment`` (64) int16 table entries, and a linear segment ``S - 1`` at the high
end. Each segment ``k`` has a boundary ``segment_max[k]`` (an int16 code; the last is ``qmax``)
and four integers ``alpha`` (int16), ``beta`` (int16), ``left_shift``, ``right_shift``.

Generation (:func:`segment_params`; the plugin's generator as far as public material describes it,
the details it leaves open marked *assumed*):

1. Input range: ``[qmin, qmax]`` codes, i.e. ``[(qmin - zp)·s_in, (qmax - zp)·s_in]``, narrowed to
   ``[lo, hi]``: ``lo`` is the last code of the leading run of codes on which the reference
   ``quantize(f(x))`` is constant, ``hi`` the first code of the trailing one (the whole range
   when the reference changes at both ends). *Assumed*: the plugin narrows with the inverse
   function at the output's saturation (``f⁻¹(qmin|qmax·s_out)``, ``log(qmax·s_out)`` for exp);
   this rule finds the same place from the codes, for any ``f`` and without an inverse, and the
   flat end segments then reproduce the constant.
2. Centrosymmetric functions (*assumed* detection: zero points 0 and the reference table odd,
   ``ref(-x) = -ref(x)``, ``ref(0) = 0``) set ``lo = 0`` and are evaluated on ``|x|`` (``-qmin``
   clamped to ``qmax``), the result negated for ``x < 0``.
3. Dividing points (reals): ``evenly``: ``lo + k·step``, ``step = (hi - lo)/N``, ``k = 0..N``, and
   one more a step past ``hi``. ``curvature``: ``[lo, hi]`` in 256 sub-steps ``z_m``;
   ``|f''|`` at the interior points as ``|g(z_{m-1}) - 2g(z_m) + g(z_{m+1})|`` with ``g = f``
   clipped to the output's real range, NaN as 0 (*assumed* discretization: what the table can
   represent); the inner point ``k`` is the first ``z_m`` where the running sum reaches ``k/N``
   of the total (evenly when the total is 0). Snapped: ``segment_max = clamp(rint(dp/s_in) + zp)``, the last
   forced to ``qmax``, then made non-decreasing (*assumed*; an empty segment is never chosen).
4. Table ``k`` (segments ``1..N``): entry ``j = quantize_out(f(x_j))`` with ``x_j`` the ``E``
   equally spaced points from ``segment_max[k-1]`` to ``segment_max[k]`` - the snapped codes
   (*assumed*: so the entries and the index agree), ``quantize_out`` rounds half to even (the
   nash default ``quant_round``; the profile's own is not consulted). Its linear form maps ``x`` to the Q``F`` table index
   ``t = (x - segment_max[k-1])·(E - 1)·2^F / width`` (``F = index_frac_bits``).
5. End segments: the chord of ``f`` (clipped to the output's real range), in output codes, over
   ``[qmin (0 if centrosymmetric), segment_max[0]]`` and ``[segment_max[N], qmax]`` (*assumed*:
   the plugin's default end slopes are not known); after step 1 both are flat runs.
6. A real line ``K·x + B`` becomes integers by :func:`fixed_linear`: the largest ``right_shift``
   in ``[0, 31]`` with ``|rint(K·2^rs)| <= 32767`` and ``|B|·2^rs`` inside int31, ``alpha =
   rint(K·2^rs)``; ``beta`` is fitted after ``alpha`` so the integer line is exact at the middle
   of the segment (*assumed*), with the smallest ``left_shift`` that fits it in int16, and
   ``beta << left_shift`` clamped to int31.

Evaluation (:func:`evaluate`; the kernel ``bpu_segment_lut`` is closed, so all of it is the
reference's *assumption* §5.2, in int64 numpy):

1. segment ``k`` = the first with ``x <= segment_max[k]``;
2. ``t = (x·alpha + (beta << ls)) >> rs``, ``>>`` rounding half up;
3. end segments: ``y = t``; table segments: ``i = t >> F`` clamped to ``[0, E - 2]``, ``f = t - i·2^F``
   clamped to ``[0, 2^F]`` (``= t & (2^F - 1)`` inside the table; *assumed* at its two edges so
   that the last code of a segment reads entry ``E - 1``), ``y = T[i] + (((T[i+1] - T[i])·f +
   2^(F-1)) >> F)``;
4. ``y`` saturated to the output range; 5. centrosymmetric: ``y(-x) = -y(x)``.

Accuracy against ``quantize(f(x))``, in output steps: 1.5 (rounding of the entries, of the
interpolation, of the reference) + ``h²/8·max|f''|/s_out`` (interpolation, ``h`` the entry
spacing) + the Q8 index error (its rounding, and ``beta``'s int16 precision: up to one input code
near ``|x| = 32768``) times the entries' slope; a table's end entry at a saturated code holds the
clipped value, which can cost up to one input code's change of ``f`` beside it.
``tests/runtimes/integer/test_segment_lut.py`` derives this bound and checks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from qir.errors import InputError
from qir.runtimes.integer.qtensor import QParams, QTensor
from qir.runtimes.integer.requant import round_shift
from qir.runtimes.march import LutInt16

__all__ = ["SegmentLut", "segment_params", "dividing_points", "fixed_linear", "evaluate", "segment_table"]

_INT16_MAX = 2 ** 15 - 1
_INT31_MAX = 2 ** 31 - 1
_MAX_RIGHT_SHIFT = 31
_CURVATURE_STEPS = 256


@dataclass(frozen=True, eq=False)
class SegmentLut:
    """The generated parameters of one segmented LUT (see the module docstring); integer arrays
    are int64 holding int16 values (shifts: small non-negative integers)."""

    dividing_points: np.ndarray   # float64 [S]: the real dividing points before snapping
    boundaries: np.ndarray        # int64 [S]: segment_max codes, non-decreasing, last = qmax
    alpha: np.ndarray             # int64 [S]
    beta: np.ndarray              # int64 [S]
    left_shift: np.ndarray        # int64 [S]
    right_shift: np.ndarray       # int64 [S]
    tables: np.ndarray            # int64 [N, E]: output codes
    index_frac_bits: int
    in_range: tuple[int, int]
    out_range: tuple[int, int]
    centrosymmetric: bool

    @property
    def table_segments(self) -> int:
        return int(self.tables.shape[0])


# ----------------------------------------------------------------------------------- helpers
def _reals(codes, params: QParams) -> np.ndarray:
    """float32 reals of (possibly fractional) codes: ``(c - zp)·s`` rounded once to float32, which
    equals :meth:`QTensor.dequantize` on integer codes."""
    scale = np.float64(np.float32(params.scale))
    return ((np.asarray(codes, np.float64) - float(params.zero_point)) * scale).astype(np.float32)


def _quantize(y: np.ndarray, params: QParams) -> np.ndarray:
    """Output codes (int64) of float values: ``clip(rint(y / s) + zp)`` in float32, NaN as 0 (the
    integer level's float LUT with ``quant_round = half_to_even``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint(np.asarray(y, np.float32) / np.float32(params.scale))
        return np.clip(np.nan_to_num(q, nan=0.0) + float(params.zero_point), *params.qrange).astype(np.int64)


def _out_reals(y: np.ndarray, params: QParams) -> np.ndarray:
    """``f`` values (float64) clipped to the output's real range; NaN as 0."""
    qmin, qmax = params.qrange
    s, zp = float(np.float32(params.scale)), float(params.zero_point)
    return np.clip(np.nan_to_num(np.asarray(y, np.float64), nan=0.0), (qmin - zp) * s, (qmax - zp) * s)


def _check(lut16: LutInt16, in_params: QParams, out_params: QParams) -> None:
    where = "the int16 segment LUT (lut_mode='segment')"
    if in_params.dtype != "int16" or not in_params.per_tensor or not out_params.per_tensor:
        raise InputError(f"{where} takes a per-tensor int16 input and a per-tensor output; got "
                         f"{in_params.dtype} -> {out_params.dtype}")
    if lut16.linear_end_segments != 2 or lut16.boundaries != lut16.table_segments + 2 or lut16.table_segments < 1:
        raise InputError(f"{where}: boundaries ({lut16.boundaries}) must be table_segments ({lut16.table_segments}) "
                         f"+ 2 linear end segments ({lut16.linear_end_segments}); fix the profile's lut_int16")
    if lut16.entries_per_segment < 2 or not 1 <= lut16.index_frac_bits <= 16 or lut16.interp != "linear":
        raise InputError(f"{where}: needs entries_per_segment >= 2, index_frac_bits in 1..16 and interp 'linear' "
                         f"(got {lut16.entries_per_segment}, {lut16.index_frac_bits}, {lut16.interp!r}); "
                         "fix the profile's lut_int16")
    if lut16.divide_strategy not in ("evenly", "curvature"):
        raise InputError(f"{where}: divide_strategy {lut16.divide_strategy!r} is not 'evenly' or 'curvature'")


# ------------------------------------------------------------------------------- generation
def _centrosymmetric(ref: np.ndarray, in_params: QParams, out_params: QParams) -> bool:
    """Whether the reference table over every code is odd (zero points 0)."""
    if int(in_params.zero_point) or int(out_params.zero_point):
        return False
    qmin, qmax = in_params.qrange
    c = np.arange(1, qmax + 1)
    return bool(ref[-qmin] == 0 and np.array_equal(ref[c - qmin], -ref[-c - qmin]))


def _table_range(ref: np.ndarray, qmin: int, centrosymmetric: bool) -> tuple[int, int]:
    """``(lo, hi)`` codes: the last code of the leading constant run of ``ref`` and the first of
    the trailing one (``lo = 0`` for a centrosymmetric function)."""
    changes = np.flatnonzero(ref[1:] != ref[:-1])
    lo, hi = (qmin, qmin) if not changes.size else (qmin + int(changes[0]), qmin + int(changes[-1]) + 1)
    if centrosymmetric:
        lo, hi = 0, max(hi, 0)
    return lo, hi


def dividing_points(f: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, segments: int,
                    strategy: str) -> np.ndarray:
    """The ``segments + 2`` real dividing points of ``[lo, hi]`` (module docstring, step 3);
    ``f`` maps float64 reals to float64 values (finite)."""
    step = (hi - lo) / segments
    inner = lo + step * np.arange(1, segments)
    if strategy == "curvature" and hi > lo:
        z = lo + (hi - lo) * np.arange(_CURVATURE_STEPS + 1) / _CURVATURE_STEPS
        y = np.asarray(f(z), np.float64)
        cumulative = np.concatenate([[0.0], np.cumsum(np.abs(y[2:] - 2.0 * y[1:-1] + y[:-2]))])
        total = cumulative[-1]
        if total > 0 and np.isfinite(total):
            inner = z[np.searchsorted(cumulative, total * np.arange(1, segments) / segments, side="left")]
    return np.concatenate([[lo], inner, [hi, hi + step]]).astype(np.float64)


def _snap(points: np.ndarray, params: QParams) -> np.ndarray:
    """Dividing points as codes: ``clamp(rint(dp / s) + zp)``, the last ``qmax``, non-decreasing."""
    qmin, qmax = params.qrange
    codes = np.clip(np.rint(points / np.float64(np.float32(params.scale))) + int(params.zero_point), qmin, qmax)
    codes[-1] = qmax
    return np.maximum.accumulate(codes.astype(np.int64))


def fixed_linear(slope: float, intercept: float, center: float = 0.0) -> tuple[int, int, int, int]:
    """``(alpha, beta, left_shift, right_shift)`` with ``(x·alpha + (beta << ls)) / 2^rs ≈ slope·x +
    intercept`` (module docstring, step 6); ``beta`` makes the line exact at ``x = center``."""
    if not (np.isfinite(slope) and np.isfinite(intercept)):
        raise ValueError(f"a segment's line is not finite (slope {slope}, intercept {intercept})")
    rs = 0
    while rs < _MAX_RIGHT_SHIFT and abs(np.rint(slope * 2.0 ** (rs + 1))) <= _INT16_MAX \
            and abs(intercept) * 2.0 ** (rs + 1) + abs(center) <= _INT31_MAX:
        rs += 1
    alpha = int(np.clip(np.rint(slope * 2.0 ** rs), -_INT16_MAX, _INT16_MAX))
    value = (slope * center + intercept) * 2.0 ** rs - alpha * center  # beta << ls, exact at the center
    value = float(np.clip(value, -_INT31_MAX, _INT31_MAX))
    ls = 0
    while abs(np.rint(value / 2.0 ** ls)) > _INT16_MAX:
        ls += 1
    return alpha, int(np.rint(value / 2.0 ** ls)), ls, rs


def _end_line(f, lo: int, hi: int, in_params: QParams, out_params: QParams) -> tuple[float, float]:
    """The chord of ``f`` over codes ``[lo, hi]`` as ``(K, B)`` in output codes per input code."""
    u0, u1 = _out_reals(f(_reals([lo, hi], in_params)), out_params) / float(np.float32(out_params.scale)) \
        + float(out_params.zero_point)
    slope = (u1 - u0) / (hi - lo) if hi > lo else 0.0
    return slope, u0 - slope * lo


def _index_line(start: int, end: int, entries: int, frac_bits: int) -> tuple[float, float]:
    """The table index ``(x - start)·(E - 1)·2^F / (end - start)`` as ``(K, B)``."""
    if end <= start:
        return 0.0, 0.0
    slope = (entries - 1) * 2.0 ** frac_bits / (end - start)
    return slope, -start * slope


def segment_params(fn: Callable[[np.ndarray], np.ndarray], in_params: QParams, out_params: QParams,
                   lut16: LutInt16) -> SegmentLut:
    """The segmented LUT of ``fn(x_float32)`` (a unary op, its attributes bound) from int16 ``in_params`` to
    ``out_params`` with the profile's ``lut16`` settings (module docstring, generation)."""
    _check(lut16, in_params, out_params)
    qmin, qmax = in_params.qrange
    segments, entries, bits = lut16.table_segments, lut16.entries_per_segment, lut16.index_frac_bits

    def f(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return np.asarray(fn(np.asarray(x, np.float32)), np.float32)

    ref = _quantize(f(QTensor(np.arange(qmin, qmax + 1, dtype=np.int32), in_params).dequantize()), out_params)
    centro = _centrosymmetric(ref, in_params, out_params)
    lo, hi = _table_range(ref, qmin, centro)
    scale, zp = np.float64(np.float32(in_params.scale)), int(in_params.zero_point)
    points = dividing_points(lambda z: _out_reals(f(z), out_params), (lo - zp) * scale, (hi - zp) * scale,
                             segments, lut16.divide_strategy)
    bounds = _snap(points, in_params)
    starts = np.concatenate([[0 if centro else qmin], bounds[:-1]])
    lines = []
    for k in range(segments + 2):
        a, b = int(starts[k]), int(bounds[k])
        if k in (0, segments + 1):
            slope, intercept = _end_line(f, a, b, in_params, out_params)
        else:
            slope, intercept = _index_line(a, b, entries, bits)
        lines.append(fixed_linear(slope, intercept, center=(a + b) / 2))
    alpha, beta, ls, rs = (np.array(v, np.int64) for v in zip(*lines))
    grid = bounds[:segments, None] + np.arange(entries) * (bounds[1:segments + 1, None] - bounds[:segments, None]) \
        / (entries - 1)
    tables = _quantize(f(_reals(grid, in_params)), out_params)
    return SegmentLut(points, bounds, alpha, beta, ls, rs, tables, bits, (qmin, qmax), out_params.qrange, centro)


# ------------------------------------------------------------------------------- evaluation
def _interpolate(lut: SegmentLut, table: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``T[i] + (((T[i+1] - T[i])·f + 2^(F-1)) >> F)`` for Q``F`` indices ``t`` into ``table``."""
    bits, last = lut.index_frac_bits, lut.tables.shape[1] - 2
    i = np.clip(np.right_shift(t, bits), 0, last)
    frac = np.clip(t - np.left_shift(i, bits), 0, 1 << bits)
    low, high = lut.tables[table, i], lut.tables[table, i + 1]
    return low + np.right_shift((high - low) * frac + (1 << (bits - 1)), bits)


def evaluate(lut: SegmentLut, codes: np.ndarray) -> np.ndarray:
    """The output codes (int32) of the segmented LUT on int16 input ``codes`` (module docstring,
    evaluation)."""
    x = np.asarray(codes, np.int64)
    negative = None
    if lut.centrosymmetric:
        negative = x < 0
        x = np.where(negative, np.minimum(-x, lut.in_range[1]), x)
    seg = np.minimum(np.searchsorted(lut.boundaries, x, side="left"), len(lut.boundaries) - 1)
    shifted = np.left_shift(lut.beta[seg], lut.left_shift[seg])
    t = round_shift(x * lut.alpha[seg] + shifted, lut.right_shift[seg], "half_up")
    in_table = (seg >= 1) & (seg <= lut.table_segments)
    y = np.where(in_table, _interpolate(lut, np.clip(seg - 1, 0, lut.table_segments - 1), t), t)
    y = np.clip(y, *lut.out_range)
    if negative is not None:
        y = np.where(negative, np.clip(-y, *lut.out_range), y)
    return y.astype(np.int32)


def segment_table(domain: QTensor, fn: Callable[[np.ndarray], np.ndarray], params: QParams, lut16: LutInt16) -> np.ndarray:
    """The output codes (int32, in ``params``) of ``fn`` through the segmented LUT for every code
    of ``domain`` (int16 codes and their parameters): what :meth:`Arithmetic.lut` asks for."""
    return evaluate(segment_params(fn, domain.params, params, lut16), domain.codes)
