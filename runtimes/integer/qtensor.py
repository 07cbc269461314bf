"""A quantized value at the integer level: integer codes plus the parameters that give them a
meaning, ``x ≈ (codes - zero_point) · scale``.

Codes are integer-valued arrays, float32 (the common case: exact below 2^24, and what BLAS and
the float kernels take without a conversion) or int32, that hold int8 / int16 values
(onnxruntime's uint8 activations are stored
in the int8 frame, ``code - 128`` and ``zp - 128``, as the calibration nodes store them: the
arithmetic on ``codes - zp`` is the same). ``scale`` and ``zero_point`` are scalars (per tensor)
or vectors along ``axis`` (per channel, weights).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qir.calibration import QRANGE, along_axis, calib_scale, calib_zero_point
from qir.kinds import CalibMode
from qir.records import CalibRecord

__all__ = ["QTensor", "QParams", "Coded", "params_of", "dequantize", "materialize"]


@dataclass(frozen=True)
class QParams:
    """How codes map to reals: ``(codes - zero_point) · scale`` in ``mode``'s integer range."""

    mode: CalibMode
    scale: np.ndarray          # float32, 0-d (per tensor) or 1-d along ``axis``
    zero_point: np.ndarray     # int64, same shape as scale
    axis: int | None = None
    frame: int = 0             # added to codes and zero point to get the imported ONNX integer
    #                            type (128: uint8), for arithmetic that depends on it

    @property
    def qrange(self) -> tuple[int, int]:
        return QRANGE[self.mode]

    @property
    def per_tensor(self) -> bool:
        return self.scale.ndim == 0

    @property
    def dtype(self) -> str:
        return self.mode.value

    def same_as(self, other: "QParams") -> bool:
        """Whether codes in ``self`` mean the same reals in ``other`` (no requantization needed)."""
        if self is other:
            return True
        if self.mode is not other.mode or self.axis != other.axis:
            return False
        return all(_equal(a, b) for a, b in ((self.scale, other.scale), (self.zero_point, other.zero_point)))

    def broadcast(self, ndim: int) -> tuple[np.ndarray, np.ndarray]:
        """(scale, zero point) shaped to broadcast against an array of rank ``ndim``."""
        return along_axis(self.scale, self.axis, ndim), along_axis(self.zero_point, self.axis, ndim)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal`` of a scale or zero point, by their bytes where dtype and shape agree
    (scales are finite and positive: no NaN, no signed zero)."""
    if a.dtype == b.dtype and a.shape == b.shape and a.dtype.kind in "fi":
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


def params_of(rec: CalibRecord) -> QParams:
    """The quantization parameters of an integer-mode calibration node."""
    scale = np.asarray(calib_scale(rec), np.float32)
    zp = calib_zero_point(rec)
    zp = np.zeros(scale.shape, np.int64) if zp is None else np.broadcast_to(np.asarray(zp, np.int64), scale.shape)
    frame = -QRANGE[rec.mode][0] if rec.meta.get("unsigned") else 0
    return QParams(rec.mode, scale, zp, rec.axis if scale.ndim else None, frame)


@dataclass(frozen=True)
class QTensor:
    """Integer codes (an integer-valued float32 or int32 array, zero point included) and their
    :class:`QParams`; ``weight``
    marks a constant (a quantized weight), for the march's GEMM dtype-pair rules."""

    codes: np.ndarray
    params: QParams
    weight: bool = False
    #: what kernels derive from a weight's codes (its per-channel bound), kept with them
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    def centered(self, dtype=np.float64) -> np.ndarray:
        """``codes - zero_point`` as ``dtype`` (exact: integers below 2^24 in float32)."""
        _, zp = self.params.broadcast(self.codes.ndim)
        if not zp.any():
            return self.codes.astype(dtype, copy=False)
        return (self.codes - zp).astype(dtype, copy=False)

    def dequantize(self) -> np.ndarray:
        """float32 ``(codes - zp) · scale``: exactly what fake quantization outputs for these codes."""
        scale, _ = self.params.broadcast(self.codes.ndim)
        return (self.centered(np.float32) * scale).astype(np.float32, copy=False)


@dataclass(frozen=True)
class Coded:
    """A float tensor equal to ``table[codes - low]``: a value that is a function of one
    per-tensor quantized value's codes alone (``codes``, shared with that QTensor), kept as one
    entry per code of its range from ``low`` (:mod:`.coded`)."""

    codes: np.ndarray
    low: int
    table: np.ndarray

    @classmethod
    def of(cls, q: QTensor) -> "Coded | None":
        """``q``'s dequantized reals as a table: the same arithmetic on every code of the range
        (None: ``q`` is quantized per channel)."""
        if not q.params.per_tensor:
            return None
        low, high = q.params.qrange
        return cls(q.codes, low, QTensor(np.arange(low, high + 1).astype(q.codes.dtype), q.params).dequantize())

    def materialize(self) -> np.ndarray:
        """The tensor itself (one gather)."""
        index = self.codes.astype(np.intp)
        if self.low:
            index -= self.low
        return self.table[index]


def materialize(value):
    """A Coded as its tensor; anything else (a QTensor too) unchanged."""
    return value.materialize() if isinstance(value, Coded) else value


def dequantize(value):
    """A QTensor as its float32 reals, a Coded as its tensor; anything else unchanged."""
    return value.dequantize() if isinstance(value, QTensor) else materialize(value)
