"""The numeric core of calibration nodes: symmetric fake quantization and fp16 round trips.

For an integer mode with ``b`` bits, ``qmax = 2^(b-1) - 1`` (127, 32767) and ``qmin = -qmax - 1``.
The scale is ``threshold / qmax`` unless the node holds an explicit (imported) scale, which is
used as stored. Fake quantization is ``y = clamp(round(x / scale), qmin, qmax) * scale`` with
round-half-to-even (ONNX QuantizeLinear); per-channel scales broadcast along ``axis``.
``fp16`` is the IEEE binary16 round trip (round to nearest even, overflow to ±inf).
"""
from __future__ import annotations

import numpy as np

from qir.errors import QirError
from qir.kinds import CalibMode
from qir.records import CalibRecord

__all__ = ["QRANGE", "calib_scale", "fake_quant", "apply_calibration"]

QRANGE = {CalibMode.INT8: (-128, 127), CalibMode.INT16: (-32768, 32767)}


def calib_scale(rec: CalibRecord) -> np.ndarray:
    """The node's scale (scalar or per-channel vector), float32."""
    if rec.scale is not None:
        return np.asarray(rec.scale, dtype=np.float32)
    if rec.threshold is None:
        raise QirError(f"calibration node {rec.name!r} is {rec.mode.value} but has no threshold; "
                       "calibrate the model first")
    qmax = QRANGE[rec.mode][1]
    th = np.asarray(rec.threshold, dtype=np.float32)
    return np.maximum(th, np.float32(np.finfo(np.float32).tiny)) / np.float32(qmax)


def fake_quant(x: np.ndarray, scale: np.ndarray, qmin: int, qmax: int, axis: int | None) -> np.ndarray:
    """``clamp(rint(x / scale), qmin, qmax) * scale`` in float32."""
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim and axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    q = np.clip(np.rint(x / s), qmin, qmax)
    return (q * s).astype(x.dtype, copy=False)


def apply_calibration(rec: CalibRecord, x: np.ndarray) -> np.ndarray:
    """What the calibration node ``rec`` does to ``x`` in fake-quant execution."""
    if rec.mode is CalibMode.FLOAT:
        return x
    if rec.mode is CalibMode.FP16:
        return x.astype(np.float16).astype(x.dtype)
    qmin, qmax = QRANGE[rec.mode]
    return fake_quant(x, calib_scale(rec), qmin, qmax, rec.axis)
