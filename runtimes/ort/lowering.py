"""How the onnxruntime backend writes what ONNX has no op for: a calibration node as fake-quant
ops (QuantizeLinear/DequantizeLinear where they compute the same, else the arithmetic of
:mod:`qir.runtimes.numerics` op by op, with its implied Relu/Clip in the float and fp16 modes),
and GlobalAveragePool as ReduceMean for ``layout_stable`` runs (onnxruntime picks that op's kernel
by its input's layout, so a part of a model would otherwise average differently from the whole).
The engine's switches (:mod:`.switches`) build on :func:`lower_fake_quant`. Ops whose
onnxruntime kernel departs from ONNX's specification are rewritten in every run (:func:`lower_spec`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qir.calibration import QRANGE, calib_scale, calib_zero_point
from qir.errors import ExecutionError, InputError
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.records import CalibRecord, OpRecord
from qir.runtimes.numerics import ROUNDING, quantized_codes

__all__ = ["lower_fake_quant", "lower_layout_stable", "lower_spec"]

_QDQ_OPSET = {CalibMode.INT8: 10, CalibMode.INT16: 21}  # first opset with QuantizeLinear of the type


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))


def _implied_clip_nodes(rec: CalibRecord, x: str, y: str, name: str) -> list[onnx.NodeProto]:
    """``rec.implied_clip`` as ``Relu`` (``[0, inf)``) or ``Clip`` (bounds as Constants)."""
    lo, hi = (float(v) for v in rec.implied_clip)
    if lo == 0.0 and np.isposinf(hi):
        return [helper.make_node("Relu", [x], [y], name=name)]
    p = name + "::"
    return [_const(p + "lo", np.array(lo, np.float32)), _const(p + "hi", np.array(hi, np.float32)),
            helper.make_node("Clip", [x, p + "lo", p + "hi"], [y], name=name)]


def lower_spec(ir: QIR, op: OpRecord) -> list[onnx.NodeProto] | None:
    """An op whose onnxruntime kernel departs from ONNX's specification, written so that it
    does not (Resize with align_corners and scales: :mod:`.resize_lowering`; ReduceMax/ReduceMin
    of bool tensors; Pow with an unsigned exponent and a Cast to float4e2m1 that is a graph
    output, which it has no kernels for: :func:`qir.runtimes.ort.boundary.float4_cast`), else None."""
    from qir.runtimes.ort.resize_lowering import lower_resize

    if op.op_type in ("ReduceMax", "ReduceMin") and not op.domain and ir.value(op.inputs[0]).dtype == "bool":
        return _bool_reduction(op)
    if op.op_type == "Pow" and not op.domain and (ir.value(op.inputs[1]).dtype or "").startswith("uint"):
        p = f"{op.name}::"  # onnxruntime has no kernel for unsigned exponents; int64 holds them exactly (< 2^63)
        return [helper.make_node("Cast", [op.inputs[1]], [p + "exponent"], name=p + "exponent", to=TensorProto.INT64),
                helper.make_node("Pow", [op.inputs[0], p + "exponent"], list(op.outputs), name=op.name)]
    to_float4 = (op.attrs.get("to") == TensorProto.FLOAT4E2M1 if op.op_type == "Cast"
                 else op.op_type == "CastLike" and ir.value(op.inputs[1]).dtype == "float4_e2m1fn")
    if to_float4 and not op.domain and op.outputs[0] in ir.outputs:
        from qir.runtimes.ort.boundary import float4_cast

        return float4_cast(op.inputs[0], op.outputs[0], op.name)
    return lower_resize(ir, op)


def _bool_reduction(op: OpRecord) -> list[onnx.NodeProto]:
    """ReduceMax/ReduceMin of a bool tensor on uint8 (onnxruntime fails on an empty bool
    tensor): over an empty set uint8's identities 0 and 255 cast back to ONNX's False and True."""
    p = f"{op.name}::"
    node = helper.make_node(op.op_type, [p + "u8", *op.inputs[1:]], [p + "reduced"], name=op.name)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(op.attrs.items()))
    return [helper.make_node("Cast", [op.inputs[0]], [p + "u8"], name=p + "to_u8", to=TensorProto.UINT8), node,
            helper.make_node("Cast", [p + "reduced"], [op.outputs[0]], name=p + "to_bool", to=TensorProto.BOOL)]


def _qdq_nodes(ir: QIR, rec: CalibRecord, scale: np.ndarray, zp: np.ndarray | None, per_channel: bool) -> list[onnx.NodeProto]:
    """An int8/int16 calibration node as QuantizeLinear and DequantizeLinear; on a constant weight,
    its codes and the DequantizeLinear (:func:`lower_fake_quant`)."""
    x, y, p = rec.input, rec.output, rec.name + "::"
    itype = np.int8 if rec.mode is CalibMode.INT8 else np.int16
    shape = scale.shape if per_channel else ()
    z = np.zeros(shape, itype) if zp is None else zp.reshape(shape).astype(itype)
    axis = {"axis": rec.axis} if per_channel else {}
    if ir.has_value(x) and ir.value(x).is_weight:  # a constant: its codes, not the float weight and a quantizer
        qmin, qmax = QRANGE[rec.mode]
        codes = quantized_codes(ir.weight_array(x), scale, qmin, qmax, rec.axis if per_channel else None, zp)
        quantize = _const(p + "q", codes.astype(itype))
    else:
        quantize = helper.make_node("QuantizeLinear", [x, p + "scale", p + "zp"], [p + "q"], name=p + "quantize",
                                    **axis)
    return [_const(p + "scale", scale.reshape(shape)), _const(p + "zp", z), quantize,
            helper.make_node("DequantizeLinear", [p + "q", p + "scale", p + "zp"], [y], name=rec.name, **axis)]


def lower_layout_stable(ir: QIR, op: OpRecord) -> list[onnx.NodeProto] | None:
    """GlobalAveragePool as ``ReduceMean`` over the spatial axes (keepdims), else None (the
    op as it is). At level ``all`` onnxruntime runs GlobalAveragePool with its NCHWc kernel or
    its plain one depending on what produced the input (in PP-OCRv4 det, 2 of 10 pools are
    NCHWc in a whole-model run and none in the analysis engine's one-step sessions), and the
    values differ: the engine's results drifted from a whole-model run by up to 2e-3 relative
    at the outputs. ReduceMean has one kernel whatever the layout, and computes the same mean
    (within 1e-6, tested). Ops :func:`lower_spec` writes are written as it writes them."""
    spec = lower_spec(ir, op)
    if spec is not None:
        return spec
    if op.op_type != "GlobalAveragePool" or op.domain:
        return None
    shape = ir.value(op.inputs[0]).shape
    if shape is None or len(shape) < 3:
        return None
    axes = list(range(2, len(shape)))
    if ir.opset < 18:
        return [helper.make_node("ReduceMean", [op.inputs[0]], list(op.outputs), name=op.name, axes=axes, keepdims=1)]
    name = f"{op.name}::axes"
    return [_const(name, np.array(axes, np.int64)),
            helper.make_node("ReduceMean", [op.inputs[0], name], list(op.outputs), name=op.name, keepdims=1)]


def lower_fake_quant(ir: QIR, rec: CalibRecord, rounding: str = "half_to_even") -> list[onnx.NodeProto]:
    """A calibration node as standard ONNX ops computing exactly what
    :func:`qir.runtimes.numerics.fake_quant` computes: with half-to-even rounding, where the
    model's opset has them (int8 ≥ 10, per-channel ≥ 13, int16 ≥ 21), a
    QuantizeLinear/DequantizeLinear pair (onnxruntime divides, rounds half to even and
    saturates exactly like the numpy core, at a fraction of the memory traffic); otherwise op
    for op in float32: ``Mul(Clip(Round(Div(x, s)) [+ zp], qmin, qmax) [- zp], s)``. fp16 is a
    Cast pair, float an Identity; in those two modes an ``implied_clip`` comes first as a Relu
    or Clip.

    A node on a constant weight, on the QuantizeLinear path, is written as its codes (computed
    here by :func:`qir.runtimes.numerics.quantized_codes`: the same division, rounding and
    saturation) and the DequantizeLinear: the session then holds int8 or int16 codes instead of
    the float weight it would quantize while it loads (on the ViT-S: 25 MB instead of 96 MB, a
    session in 0.25 s instead of 0.94 s, the same outputs bit for bit)."""
    x, y, p = rec.input, rec.output, rec.name + "::"
    if rec.mode is CalibMode.FLOAT:
        if rec.implied_clip is not None:
            return _implied_clip_nodes(rec, x, y, rec.name)
        return [helper.make_node("Identity", [x], [y], name=rec.name)]
    if rec.mode is CalibMode.FP16:
        nodes = []
        if rec.implied_clip is not None:
            nodes, x = _implied_clip_nodes(rec, x, p + "clipped", p + "implied_clip"), p + "clipped"
        return nodes + [
            helper.make_node("Cast", [x], [p + "half"], name=p + "to_half", to=TensorProto.FLOAT16),
            helper.make_node("Cast", [p + "half"], [y], name=rec.name, to=TensorProto.FLOAT)]
    if rounding not in ROUNDING:
        raise InputError(f"unknown rounding {rounding!r}; choose {sorted(ROUNDING)}")
    scale, zp = calib_scale(rec), calib_zero_point(rec)
    opset = ir.opset_imports.get("", ir.opset)
    per_channel = scale.size > 1
    if (rounding == "half_to_even" and opset >= _QDQ_OPSET[rec.mode]
            and (not per_channel or (opset >= 13 and rec.axis is not None))):
        return _qdq_nodes(ir, rec, scale, zp, per_channel)
    if scale.ndim and rec.axis is not None:
        shape = ir.value(x).shape
        if shape is None:
            raise ExecutionError(f"calibration node {rec.name!r} is per-channel but the rank of "
                                 f"{x!r} is unknown")
        bshape = [1] * len(shape)
        bshape[rec.axis] = -1
        scale = scale.reshape(bshape)
        zp = None if zp is None else zp.reshape(bshape)
    qmin, qmax = QRANGE[rec.mode]
    nodes = [_const(p + "scale", scale), _const(p + "qmin", np.array(qmin, np.float32)),
             _const(p + "qmax", np.array(qmax, np.float32)),
             helper.make_node("Div", [x, p + "scale"], [p + "v"], name=p + "div")]
    if rounding == "half_to_even":
        nodes.append(helper.make_node("Round", [p + "v"], [p + "q"], name=p + "round"))
    else:
        nodes += [_const(p + "half", np.array(0.5, np.float32))]
        if rounding == "half_up":
            nodes += [helper.make_node("Add", [p + "v", p + "half"], [p + "vh"], name=p + "add_half"),
                      helper.make_node("Floor", [p + "vh"], [p + "q"], name=p + "floor")]
        else:  # half_away: sign(v) * floor(|v| + 0.5)
            nodes += [helper.make_node("Abs", [p + "v"], [p + "a"], name=p + "abs"),
                      helper.make_node("Add", [p + "a", p + "half"], [p + "ah"], name=p + "add_half"),
                      helper.make_node("Floor", [p + "ah"], [p + "m"], name=p + "floor"),
                      helper.make_node("Sign", [p + "v"], [p + "sg"], name=p + "sign"),
                      helper.make_node("Mul", [p + "m", p + "sg"], [p + "q"], name=p + "signed")]
    q = p + "q"
    if zp is not None:
        nodes += [_const(p + "zp", zp),
                  helper.make_node("Add", [q, p + "zp"], [p + "qz"], name=p + "add_zp"),
                  helper.make_node("Clip", [p + "qz", p + "qmin", p + "qmax"], [p + "cz"], name=p + "clip"),
                  helper.make_node("Sub", [p + "cz", p + "zp"], [p + "c"], name=p + "sub_zp")]
    else:
        nodes.append(helper.make_node("Clip", [q, p + "qmin", p + "qmax"], [p + "c"], name=p + "clip"))
    nodes.append(helper.make_node("Mul", [p + "c", p + "scale"], [y], name=rec.name))
    return nodes
