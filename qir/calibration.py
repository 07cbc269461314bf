"""The state of a calibration node and the rules that read it: ranges, scale, zero point, mode.

For an integer mode with ``b`` bits, ``qmax = 2^(b-1) - 1`` (127, 32767) and ``qmin = -qmax - 1``.
The scale is ``threshold / qmax`` unless the node holds an explicit (imported) scale, which is
used as stored; thresholds and scales must be finite and > 0 to quantize. Per-channel scales and
zero points broadcast along ``axis``. These are rules of the IR (importers, exporters, passes and
runtimes all read them); the arithmetic that applies them lives in :mod:`qir.runtimes.numerics`.
"""
from __future__ import annotations

import math

import numpy as np

from qir.errors import QirError
from qir.kinds import CalibMode
from qir.records import CalibRecord

__all__ = ["QRANGE", "calib_scale", "calib_zero_point", "max_threshold", "along_axis", "representable_range",
           "set_mode", "covering_threshold"]


QRANGE = {CalibMode.INT8: (-128, 127), CalibMode.INT16: (-32768, 32767)}
"""``(qmin, qmax)`` of each integer mode: ``qmax = 2^(b-1) - 1``, ``qmin = -qmax - 1``."""


def calib_scale(rec: CalibRecord) -> np.ndarray:
    """The node's scale (scalar or per-channel vector), float32, checked finite and > 0."""
    if rec.scale is not None:
        scale = np.asarray(rec.scale, dtype=np.float32)
    else:
        if rec.threshold is None:
            raise QirError(f"calibration node {rec.name!r} is {rec.mode.value} but has no threshold; "
                           "calibrate the model first")
        th = np.asarray(rec.threshold, dtype=np.float32)
        scale = th / np.float32(QRANGE[rec.mode][1])
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        bad = scale[~(np.isfinite(scale) & (scale > 0))] if scale.ndim else scale
        raise QirError(f"calibration node {rec.name!r} has an unusable scale {np.ravel(bad)[:4].tolist()} "
                       "(it must be finite and > 0); recalibrate or set a positive threshold")
    return scale


def max_threshold(rec: CalibRecord) -> float | None:
    """The largest |x| an integer-mode node represents, ``max(scale) · qmax`` (its threshold,
    or the range of an imported scale); None in the float and fp16 modes."""
    if rec.mode not in QRANGE:
        return None
    return float(np.max(calib_scale(rec))) * QRANGE[rec.mode][1]


def covering_threshold(abs_max: float, digits: int = 4) -> float:
    """``abs_max`` rounded up to ``digits`` significant digits: a short fixed threshold (as
    ``qir set-mode --threshold`` takes it) that clips nothing of data reaching ``abs_max``."""
    if not (math.isfinite(abs_max) and abs_max > 0):
        raise QirError(f"no covering threshold for max |x| = {abs_max!r}: it must be finite and > 0")
    step = 10.0 ** (math.floor(math.log10(abs_max)) - digits + 1)
    n = math.ceil(abs_max / step - 1e-9)  # (the tolerance keeps 2.5 at 2.5 despite float division)
    threshold = float(f"{n * step:.{digits}g}")
    return threshold if threshold >= abs_max else float(f"{(n + 1) * step:.{digits}g}")


def calib_zero_point(rec: CalibRecord) -> np.ndarray | None:
    """The node's zero point as float32 (None when symmetric)."""
    if rec.zero_point is None or not np.any(np.asarray(rec.zero_point)):
        return None
    return np.asarray(rec.zero_point, dtype=np.float32)


def along_axis(v: np.ndarray, axis: int | None, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along ``axis`` of an ``ndim`` array (scalars as is)."""
    if v.ndim and axis is not None:
        shape = [1] * ndim
        shape[axis] = -1
        return v.reshape(shape)
    return v


def representable_range(rec: CalibRecord, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi) = ((qmin - zp)·s, (qmax - zp)·s)`` of an integer-mode node, in float64,
    shaped to broadcast along ``axis`` of an ``ndim`` array."""
    qmin, qmax = QRANGE[rec.mode]
    s = np.asarray(calib_scale(rec), np.float64)
    zp = calib_zero_point(rec)
    zp = np.zeros_like(s) if zp is None else np.asarray(zp, np.float64)
    return tuple(along_axis((q - zp) * s, rec.axis, ndim) for q in (qmin, qmax))


def set_mode(rec: CalibRecord, mode: CalibMode | str) -> None:
    """Give ``rec`` a new mode. A node holding an explicit (imported) scale is converted between
    int8 and int16 so that it keeps its real range with the new type's finer step: symmetric
    ``s' = s·qmax/qmax'``; asymmetric, the range [(qmin - zp)·s, (qmax - zp)·s] is kept and
    ``s'``, ``zp'`` recomputed. Threshold-based nodes need nothing (their scale is derived)."""
    old, rec.mode = rec.mode, CalibMode(mode)
    if rec.scale is None or old is rec.mode or old not in QRANGE or rec.mode not in QRANGE:
        return
    (qmin0, qmax0), (qmin1, qmax1) = QRANGE[old], QRANGE[rec.mode]
    s = np.asarray(rec.scale, np.float64)
    if calib_zero_point(rec) is None:
        rec.scale = _like(s * qmax0 / qmax1, np.float32)
        return
    zp = np.asarray(rec.zero_point, np.float64)
    lo, hi = (qmin0 - zp) * s, (qmax0 - zp) * s
    new_s = (hi - lo) / (qmax1 - qmin1)
    rec.scale = _like(new_s, np.float32)
    rec.zero_point = _like(np.round(qmin1 - lo / new_s), np.int64)


def _like(v: np.ndarray, dtype) -> np.ndarray | float | int:
    """A vector stays a vector; a 0-d value becomes a numpy scalar of ``dtype``."""
    return v.astype(dtype) if v.ndim else dtype(v)
