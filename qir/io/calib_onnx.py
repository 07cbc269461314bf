"""Calibration nodes in ONNX: the ``qir::Calibration`` node of ``calibrated_model.onnx``.

A calibration node is written as one node in the custom domain ``qir`` (opset 1), one input and
one output, with the state as attributes:

================  =======  ===================================================================
attribute         type     meaning
================  =======  ===================================================================
``mode``          string   ``int8`` | ``int16`` | ``fp16`` | ``float``
``role``          string   ``weight`` | ``activation``
``threshold``     floats   per-tensor (1 value, no ``axis``) or per-channel (along ``axis``)
``scale``         floats   an explicit (imported) scale, used as stored; same layout
``zero_point``    ints     imported asymmetric zero point (int8 frame); absent = symmetric
``axis``          int      the channel axis of per-channel state
``fixed``         int      1 = the threshold was set by the user; calibration keeps it
``feeds``         strings  the general nodes this calibration node serves
``implied_clip``  floats   ``[lo, hi]`` of a Relu/Clip the quantizer's range replaced (±inf open)
``unsigned``      int      1 = imported from an unsigned type (uint8/uint16; ``meta["unsigned"]``):
                           codes + 128 (+ 32768) are that type's, for integer kernels whose float
                           arithmetic depends on the frame
================  =======  ===================================================================

Values are stored as float32/int64 lists, so a save/load round trip is exact.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from qir.kinds import CalibMode, CalibRole, read_kind
from qir.records import CalibRecord, QuantizerState

__all__ = ["DOMAIN", "OP_TYPE", "OPSET", "calibration_to_node", "calibration_state"]

DOMAIN = "qir"
OP_TYPE = "Calibration"
OPSET = 1


def _vector(value: Any, per_channel: bool) -> list[float]:
    arr = np.asarray(value, dtype=np.float32)
    return arr.reshape(-1).tolist() if per_channel or arr.ndim else [float(arr)]


def calibration_to_node(rec: CalibRecord) -> onnx.NodeProto:
    """The ``qir::Calibration`` node holding ``rec``'s state."""
    per_channel = rec.axis is not None
    attrs: dict[str, Any] = {"mode": rec.mode.value, "role": rec.role.value, "fixed": int(rec.fixed)}
    if rec.threshold is not None:
        attrs["threshold"] = _vector(rec.threshold, per_channel)
    if rec.scale is not None:
        attrs["scale"] = _vector(rec.scale, per_channel)
    if rec.zero_point is not None:
        attrs["zero_point"] = np.asarray(rec.zero_point, dtype=np.int64).reshape(-1).tolist()
    if per_channel:
        attrs["axis"] = int(rec.axis)
    if rec.feeds:
        attrs["feeds"] = list(rec.feeds)
    if rec.implied_clip is not None:
        attrs["implied_clip"] = [float(v) for v in rec.implied_clip]
    if rec.meta.get("unsigned"):
        attrs["unsigned"] = 1
    return helper.make_node(OP_TYPE, [rec.input], [rec.output], name=rec.name, domain=DOMAIN, **attrs)


def _decoded(value: Any) -> Any:
    """An attribute value with its strings (ONNX stores bytes) as str."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def calibration_state(node: onnx.NodeProto, where: str = "a qir::Calibration node") -> QuantizerState:
    """The quantizer a ``qir::Calibration`` node's attributes describe; a mode or role qir
    does not know is an ImportError_ naming ``where`` (the file and the node)."""
    attrs = {a.name: _decoded(helper.get_attribute_value(a)) for a in node.attribute}
    per_channel = "axis" in attrs

    def values(key: str, dtype) -> Any:
        if key not in attrs:
            return None
        arr = np.asarray(attrs[key], dtype=dtype)
        return arr if per_channel else arr.reshape(-1)[0].item()

    clip = attrs.get("implied_clip")
    return QuantizerState(mode=read_kind(CalibMode, attrs.get("mode", "int8"), where),
                          role=read_kind(CalibRole, attrs.get("role", "activation"), where),
                          threshold=values("threshold", np.float32), scale=values("scale", np.float32),
                          zero_point=values("zero_point", np.int64), axis=attrs.get("axis"),
                          fixed=bool(attrs.get("fixed", 0)), feeds=tuple(attrs.get("feeds", ())),
                          implied_clip=None if clip is None else (float(clip[0]), float(clip[1])),
                          unsigned=bool(attrs.get("unsigned")))
