"""A QuantizeLinear/DequantizeLinear node's parameters, as a calibration node holds them
(:mod:`qir.io.qdq_import`).

**Modes and the int8 frame.** The zero point's type picks the mode: int8/uint8 → ``int8``,
int16/uint16 → ``int16``. Unsigned quantizers are stored in the signed frame with
``zp - 128`` (uint16: ``zp - 32768``); this is exact, because for every integer ``r``
``clip(r + zp, 0, 255) - zp == clip(r + (zp - 128), -128, 127) - (zp - 128)`` (both sides
add and remove the same offset), so dequantized values are identical. An all-zero zero point
is stored as none (symmetric).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from qir.calibration import along_axis
from qir.errors import ImportError_
from qir.io.qdq_graph import QdqGraph, is_op, label
from qir.kinds import CalibMode
from qir.records import QuantizerState

__all__ = ["QParams", "QMIN", "QMAX", "qparams", "signed_frame", "quantizer_state", "dequantize"]

# zero-point dtype -> (mode, offset into the signed frame)
_FRAME = {np.dtype(np.int8): (CalibMode.INT8, 0), np.dtype(np.uint8): (CalibMode.INT8, -128),
          np.dtype(np.int16): (CalibMode.INT16, 0), np.dtype(np.uint16): (CalibMode.INT16, -32768)}
QMIN = {CalibMode.INT8: -128, CalibMode.INT16: -32768}
QMAX = {CalibMode.INT8: 127, CalibMode.INT16: 32767}


@dataclass
class QParams:
    """One Q or DQ node's quantization parameters."""

    scale: np.ndarray          # float32, 0-d (per tensor) or 1-d (per channel)
    zero_point: np.ndarray     # integer, same shape as scale (zeros when absent)
    dtype: np.dtype            # the quantized integer type
    axis: int | None           # per-channel axis (None per tensor)

    def same(self, other: "QParams") -> bool:
        return (self.dtype == other.dtype and self.axis == other.axis
                and self.scale.shape == other.scale.shape
                and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))


def qparams(node: onnx.NodeProto, g: QdqGraph) -> QParams:
    """Scale/zero point/type/axis of a QuantizeLinear or DequantizeLinear node."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    where = f"{g.where}: {label(node)}"
    if attrs.get("block_size"):
        raise ImportError_(f"{where} uses blocked quantization (block_size={attrs['block_size']}), "
                           "which qir's calibration nodes cannot hold")
    if len(node.input) < 2 or not g.is_const(node.input[1]):
        raise ImportError_(f"{where}: its scale {node.input[1] if len(node.input) > 1 else '(none)'!r} "
                           "is not a constant; qir imports static quantization only")
    scale = np.asarray(g.const(node.input[1]))
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name and not g.is_const(zp_name):
        raise ImportError_(f"{where}: its zero point {zp_name!r} is not a constant")
    zp = g.const(zp_name) if zp_name else None
    if zp is not None:
        dtype = zp.dtype
    elif is_op(node, "DequantizeLinear") and g.is_const(node.input[0]):
        dtype = g.const(node.input[0]).dtype
    elif "output_dtype" in attrs and attrs["output_dtype"]:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["output_dtype"]))
    else:
        dtype = np.dtype(np.uint8)  # QuantizeLinear's default output type
    zp = np.zeros(scale.shape, dtype) if zp is None else np.asarray(zp)
    if scale.size == 1 and zp.size == 1:  # one value (also a [1] vector): per tensor
        scale, zp = scale.reshape(()), zp.reshape(())
    if scale.ndim > 1 or zp.shape != scale.shape:
        raise ImportError_(f"{where}: scale {list(scale.shape)} / zero point {list(zp.shape)} are "
                           "not one scalar or one vector of the same length")
    axis = int(attrs.get("axis", 1)) if scale.ndim == 1 else None
    if scale.dtype != np.float32:
        f32 = scale.astype(np.float32)
        if not np.array_equal(f32.astype(scale.dtype), scale):
            raise ImportError_(f"{where}: scale of type {scale.dtype} is not exactly a float32")
        scale = f32
    return QParams(scale, zp, np.dtype(dtype), axis)


def signed_frame(params: QParams, where: str) -> tuple[CalibMode, np.ndarray]:
    """(mode, zero point in the signed frame as int64) of a quantizer."""
    if params.dtype not in _FRAME:
        raise ImportError_(f"{where}: quantization to {params.dtype} is not supported "
                           "(qir has int8 and int16 modes; 4-bit, 32-bit and float8 are not)")
    mode, offset = _FRAME[params.dtype]
    return mode, params.zero_point.astype(np.int64) + offset


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
               axis: int | None) -> np.ndarray:
    """``(q - zp) * s`` in float32, exactly as ONNX DequantizeLinear computes it."""
    k = q.astype(np.int64)
    if zero_point is not None:
        k = k - along_axis(np.asarray(zero_point, np.int64), axis, q.ndim)
    return k.astype(np.float32) * along_axis(np.asarray(scale, np.float32), axis, q.ndim)


def quantizer_state(params: QParams, rank: int | None, where: str) -> QuantizerState:
    """The quantizer (mode, scale, zero_point, axis) in the signed frame;
    a negative axis is made positive when the ``rank`` is known."""
    mode, zp = signed_frame(params, where)
    axis = params.axis
    if axis is not None and axis < 0 and rank is not None:
        axis += rank
    scale = params.scale if axis is not None else np.float32(params.scale)
    if not np.any(zp):
        zero_point = None
    else:
        zero_point = zp if axis is not None else int(zp)
    # unsigned: kept for kernels whose float arithmetic depends on the frame
    return QuantizerState(mode=mode, scale=scale, zero_point=zero_point, axis=axis, unsigned=_FRAME[params.dtype][1])
