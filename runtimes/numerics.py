"""The numeric core of calibration nodes: fake quantization and fp16 round trips.

For an integer mode with ``b`` bits, ``qmax = 2^(b-1) - 1`` (127, 32767) and ``qmin = -qmax - 1``.
The scale is ``threshold / qmax`` unless the node holds an explicit (imported) scale, which is
used as stored. Fake quantization, in float32 and in exactly this order (the onnxruntime
lowering computes the same ops, so both runtimes agree bit for bit)::

    q = round(x / scale)            # rounding from the profile (default half to even)
    q = clip(q + zp, qmin, qmax)    # zp = 0 unless an asymmetric quantizer was imported
    y = (q - zp) * scale

Per-channel scales/zero points broadcast along ``axis``. ``fp16`` is the IEEE binary16 round
trip (round to nearest even, overflow to ±inf). Thresholds must be finite and > 0 to quantize.
A node's ``implied_clip`` ``(lo, hi)`` (a Relu/Clip an imported quantizer's range replaced) is
applied in the ``float`` and ``fp16`` modes, before the fp16 cast: ``max(x, lo)`` when ``hi`` is
``+inf`` (Relu), else ``min(max(x, lo), hi)`` (Clip); integer modes clip through their range.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from qir.calibration import QRANGE, along_axis, calib_scale, calib_zero_point, representable_range
from qir.kinds import CalibMode
from qir.records import CalibRecord

__all__ = ["ROUNDING", "fake_quant", "quantized_codes", "apply_calibration", "clip_only", "apply_implied_clip",
           "batchnorm_affine", "fold_affine", "fold_batchnorm"]

def _half_up(v: np.ndarray) -> np.ndarray:
    return np.floor(v + np.asarray(0.5, v.dtype))


def _half_away(v: np.ndarray) -> np.ndarray:
    return np.copysign(np.floor(np.abs(v) + np.asarray(0.5, v.dtype)), v)


ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "half_to_even": np.rint,   # ONNX QuantizeLinear, PyTorch quantize_per_tensor
    "half_up": _half_up,       # floor(x + 0.5)
    "half_away": _half_away,   # C round()
}


def fake_quant(x: np.ndarray, scale: np.ndarray, qmin: int, qmax: int, axis: int | None,
               zero_point: np.ndarray | None = None, rounding: str = "half_to_even") -> np.ndarray:
    """Quantize-dequantize ``x`` (see the module docstring for the exact op order): the codes of
    :func:`_codes`, less the zero point, times the scale, in place on the codes where they are an
    array (the same operations on the same dtype, so the same bits, without a new array per step:
    a third faster on a feature map)."""
    s = along_axis(np.asarray(scale, dtype=x.dtype), axis, x.ndim)
    zp = None if zero_point is None else along_axis(np.asarray(zero_point, dtype=x.dtype), axis, x.ndim)
    q = _codes(x, s, zp, qmin, qmax, rounding)
    if not isinstance(q, np.ndarray):  # (a scalar)
        return ((q if zp is None else q - zp) * s).astype(x.dtype, copy=False)
    if zp is not None:
        q -= zp
    q *= s
    return q.astype(x.dtype, copy=False)


def quantized_codes(x: np.ndarray, scale: np.ndarray, qmin: int, qmax: int, axis: int | None,
                    zero_point: np.ndarray | None = None) -> np.ndarray:
    """The codes :func:`fake_quant` dequantizes (rounding half to even): ``clip(rint(x / s) + zp,
    qmin, qmax)``, in ``x``'s float dtype (what QuantizeLinear stores)."""
    s = along_axis(np.asarray(scale, dtype=x.dtype), axis, x.ndim)
    zp = None if zero_point is None else along_axis(np.asarray(zero_point, dtype=x.dtype), axis, x.ndim)
    return np.asarray(_codes(x, s, zp, qmin, qmax, "half_to_even"))


def _codes(x: np.ndarray, s: np.ndarray, zp: np.ndarray | None, qmin: int, qmax: int, rounding: str):
    """``clip(round(x / s) + zp, qmin, qmax)`` (``s`` and ``zp`` already shaped to broadcast
    over ``x``), a new array of their broadcast shape; after the division every step runs in
    place, except for a scalar or a zero point that broadcasts the result up (new arrays then)."""
    q = x / s
    if not isinstance(q, np.ndarray) or (zp is not None and np.broadcast_shapes(q.shape, zp.shape) != q.shape):
        q = ROUNDING[rounding](q)
        return np.clip(q, qmin, qmax) if zp is None else np.clip(q + zp, qmin, qmax)
    if rounding == "half_to_even":
        np.rint(q, out=q)
    else:
        q = ROUNDING[rounding](q)
    if zp is not None:
        q += zp
    np.clip(q, qmin, qmax, out=q)
    return q


def apply_implied_clip(rec: CalibRecord, x: np.ndarray) -> np.ndarray:
    """``x`` clipped to ``rec.implied_clip`` (unchanged when the node has none)."""
    if rec.implied_clip is None:
        return x
    lo, hi = (np.asarray(v, dtype=x.dtype) for v in rec.implied_clip)
    y = np.maximum(x, lo) if np.isposinf(hi) else np.minimum(np.maximum(x, lo), hi)
    return np.asarray(y, dtype=x.dtype)


def clip_only(rec: CalibRecord, x: np.ndarray) -> np.ndarray:
    """What ``rec`` does to ``x`` without rounding: an integer mode clips ``x`` to the range it
    represents, ``[(qmin - zp)·s, (qmax - zp)·s]`` per channel along ``axis``; the float and fp16
    modes apply only their implied clip. ``apply_calibration(x) - clip_only(x)`` is then the
    rounding error alone, ``clip_only(x) - x`` the clipping error alone."""
    if rec.mode not in QRANGE:
        return apply_implied_clip(rec, x)
    return np.clip(x, *representable_range(rec, x.ndim)).astype(x.dtype, copy=False)


def apply_calibration(rec: CalibRecord, x: np.ndarray, rounding: str = "half_to_even") -> np.ndarray:
    """What the calibration node ``rec`` does to ``x`` in fake-quant execution."""
    if rec.mode is CalibMode.FLOAT:
        return apply_implied_clip(rec, x)
    if rec.mode is CalibMode.FP16:
        x = apply_implied_clip(rec, x)
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(x.dtype)
    qmin, qmax = QRANGE[rec.mode]
    return fake_quant(x, calib_scale(rec), qmin, qmax, rec.axis, calib_zero_point(rec), rounding)


def fold_batchnorm(weight: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, beta: np.ndarray,
                   mean: np.ndarray, var: np.ndarray, epsilon: float, axis: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Weights and bias of a Conv/Gemm with the BatchNormalization after it folded in.

    BN(y) = a * (y - mean) + beta with a = scale / sqrt(var + eps), and y is linear in the
    weights along the output-channel ``axis``, so W' = W * a (along ``axis``) and
    B' = (B - mean) * a + beta (B = 0 when absent). Computed in float64, returned in W's dtype.
    """
    return fold_affine(weight, bias, *batchnorm_affine(scale, beta, mean, var, epsilon), axis)


def batchnorm_affine(scale: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization as a per-channel affine ``y * a + shift`` (float64): a = scale /
    sqrt(var + eps), shift = beta - mean * a."""
    a = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + float(epsilon))
    return a, np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * a


def fold_affine(weight: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, shift: np.ndarray, axis: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Weights and bias of a Conv/Gemm/MatMul followed by ``y * scale + shift`` per output channel:
    W' = W * scale (along ``axis``), B' = B * scale + shift (B = 0 when absent). Computed in
    float64, returned in W's dtype."""
    a = np.asarray(scale, np.float64)
    b = np.zeros_like(a) if bias is None else np.asarray(bias, np.float64)
    shape = [1] * weight.ndim
    shape[axis] = -1
    w = (np.asarray(weight, np.float64) * a.reshape(shape)).astype(weight.dtype)
    return w, (b * a + np.asarray(shift, np.float64)).astype(weight.dtype)
