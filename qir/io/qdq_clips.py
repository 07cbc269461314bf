"""Implied clips: the Relu/Clip that onnxruntime's quantizer removed, read back from a QDQ model
(:mod:`qir.io.qdq_import`).

**Removed activations.** onnxruntime's quantizer deletes a Relu/Clip whose input it quantizes
(when that input has no other reader and asymmetric activations are used) and gives the op
before it the Relu/Clip output's range; only the range then clips. The QDQ file keeps no trace
of the deleted op but that range, so the rule is: an activation quantizer whose zero point is
``qmin`` (range starting at exactly 0), on a value computed by an op that is not itself
non-negative (``NONNEGATIVE_OPS``; nor a pooling/reshaping op of a non-negative value, nor a
Mul/Add/Concat/... of non-negative values) and not a graph input, gets ``implied_clip = (0, inf)``
— a Relu. If the top of the range, ``(qmax - zp) * s``, is ``6`` (``CLIP_TOPS``, within 1e-6
relative: Relu6 / hard-swish's ``Clip(0, 6)`` on data that reached 6), the clip is ``(0, 6)``.
The ``float``/``fp16`` modes apply it (:func:`qir.runtimes.numerics.apply_calibration`), the
emit pass writes it back as a Relu/Clip. This is a reading of the range: a value computed by a
Conv that was non-negative on all calibration data reads as Relu too, and a ``Clip(0, 6)``
whose data stayed below 6 reads as Relu. Give the float model (``float_model=``, see
:func:`qir.io.onnx_import.import_qdq`) to take the bounds from the deleted ops themselves instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import helper

from qir.io.qdq_graph import QdqGraph, is_op, label
from qir.io.qdq_params import QMAX, QMIN, dequantize, qparams, signed_frame
from qir.kinds import CalibRole
from qir.records import QuantizerState

__all__ = ["NONNEGATIVE_OPS", "SIGN_PRESERVING_OPS", "NONNEGATIVE_IF_INPUTS", "CLIP_TOPS",
           "implied_clip", "range_clip", "float_clips"]

# ops whose output is never negative: a quantizer range starting at 0 after them is no Relu
NONNEGATIVE_OPS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp",
                             "Sqrt", "Softplus", "ReduceL2", "ReduceL1", "ReduceSumSquare"})
# ops whose output is non-negative when their data input is (the other inputs are shapes/indices)
SIGN_PRESERVING_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten",
                                 "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Resize", "Upsample",
                                 "Identity", "Slice", "Split", "Gather", "DepthToSpace", "SpaceToDepth",
                                 "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "Tile", "Expand"})
# ops whose output is non-negative when every input is
NONNEGATIVE_IF_INPUTS = frozenset({"Concat", "Mul", "Add", "Div", "Max", "Min", "Sum", "Mean"})
CLIP_TOPS = (6.0,)  # range tops read as Clip(0, top): Relu6 and hard-swish's Clip(0, 6)
_TOP_RTOL = 1e-6


def implied_clip(g: QdqGraph, x: str, state: QuantizerState, role: CalibRole,
                 float_clips: Mapping[str, tuple[float, float]] | None) -> tuple[float, float] | None:
    """The implied clip of the activation quantizer of ``x`` with ``state`` (module docstring);
    with ``float_clips`` (:func:`float_clips` of the float model) taken from those instead."""
    if role is not CalibRole.ACTIVATION:
        return None
    producer = g.producer.get(x)
    if float_clips is not None:
        clip = float_clips.get(x)
        if clip is None or (producer is not None and producer.op_type in ("Relu", "Clip")):
            return None  # no Relu/Clip there in the float model, or it is still in place
        return clip
    if producer is None or producer.op_type in NONNEGATIVE_OPS or x in g.graph_inputs \
            or is_op(producer, "DequantizeLinear") or is_op(producer, "QuantizeLinear"):
        return None
    if producer.op_type in SIGN_PRESERVING_OPS:
        inputs = list(producer.input[:1])
    elif producer.op_type in NONNEGATIVE_IF_INPUTS:
        inputs = [v for v in producer.input if v]
    else:
        inputs = []
    if inputs and all(_nonnegative(g, v) for v in inputs):
        return None  # e.g. MaxPool of a clipped value: nothing was removed here
    return range_clip(state)


def _nonnegative(g: QdqGraph, v: str) -> bool:
    """Is ``v`` non-negative by construction: a constant >= 0, or dequantized from a range
    starting at 0 or from non-negative integers?"""
    if g.is_const(v):
        return bool(np.all(np.asarray(g.const(v)) >= 0))
    dq = g.producer.get(v)
    if dq is None or not is_op(dq, "DequantizeLinear"):
        return False
    params = qparams(dq, g)
    if g.is_const(dq.input[0]):
        q = np.asarray(g.const(dq.input[0]))
        return bool(np.all(dequantize(q, params.scale, params.zero_point, params.axis) >= 0))
    mode, zp = signed_frame(params, f"{g.where}: {label(dq)}")
    return bool(np.all(zp == QMIN[mode]))


def range_clip(state: QuantizerState) -> tuple[float, float] | None:
    """The implied clip read from an asymmetric range starting at 0 (see the module docstring)."""
    zp, mode = state.zero_point, state.mode
    if zp is None or not np.all(np.asarray(zp) == QMIN[mode]):
        return None
    top = (np.float32(QMAX[mode]) - np.asarray(zp, np.float32)) * np.asarray(state.scale, np.float32)
    for t in CLIP_TOPS:
        if np.all(np.abs(top - t) <= _TOP_RTOL * t):
            return (0.0, float(t))
    return (0.0, float("inf"))


def float_clips(float_model: str | Path | onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """``{output: (lo, hi)}`` of every Relu/Clip in the float model."""
    from qir.io.onnx_proto import read_onnx
    proto = read_onnx(float_model)
    opset = {o.domain: o.version for o in proto.opset_import}.get("", 13)
    g = QdqGraph(proto, str(float_model) if not isinstance(float_model, onnx.ModelProto) else "float model")
    clips: dict[str, tuple[float, float]] = {}
    for n in proto.graph.node:
        if n.op_type == "Relu" and n.domain in ("", "ai.onnx"):
            clips[n.output[0]] = (0.0, float("inf"))
        elif n.op_type == "Clip" and n.domain in ("", "ai.onnx"):
            if opset < 11:
                attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
                lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
            else:
                bounds = [g.const(n.input[i]) if len(n.input) > i and n.input[i] else None for i in (1, 2)]
                if any(b is None and len(n.input) > i + 1 and n.input[i + 1] for i, b in enumerate(bounds)):
                    continue  # a computed bound: not a static clip
                lo = -np.inf if bounds[0] is None else bounds[0]
                hi = np.inf if bounds[1] is None else bounds[1]
            clips[n.output[0]] = (float(lo), float(hi))
    return clips
