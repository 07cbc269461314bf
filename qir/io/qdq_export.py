"""The QDQ exporter: a calibrated IR → a standard ONNX model with the chosen per-node precision,
beside its importer (:mod:`.qdq_import` reads it back). It returns the ``ModelProto`` and writes
nothing: the ``emit`` pass (:mod:`qir.passes.emit`) reports it, ``qir emit``
(:mod:`qir.tools.emit`) writes it. Like all of ``qir/io`` it imports nothing above ``qir``.

Every calibration node is written by its mode (nothing else in the model changes):

* ``int8`` / ``int16``: ``QuantizeLinear → DequantizeLinear`` with scale = ``threshold / qmax``
  or the stored (imported) scale, and the zero point as stored (else 0) in the mode's type
  (int8 / int16; imported uint8/uint16 quantizers are kept in that signed frame, which computes
  the same values — :mod:`qir.io.qdq_import`; at opset >= 21 int8 activations are written as
  uint8, see onnxruntime below). A constant weight is stored quantized instead: an
  int8/int16 initializer ``<weight>_quantized`` (``clip(round_half_even(W / s) + zp)``, the
  same float32 steps as qir's fake quantization) read by one DequantizeLinear, so the model
  computes exactly qir's fake-quantized weight.
* ``fp16``: ``Cast(to float16) → Cast(back)``.
* ``float``: nothing — readers read the float value directly (an Identity only where the
  node's output is a graph output). A node's ``implied_clip`` (a Relu/Clip that an imported
  quantizer's range stood in for) is written as that Relu/Clip in ``float`` mode, and before
  the Cast pair in ``fp16`` mode; integer modes clip through their range.

Node names: the DequantizeLinear (or the last Cast, the Relu/Clip, the Identity) carries the
calibration node's name; the QuantizeLinear is ``<name>/quantize``, the first Cast
``<name>/to_fp16``, a clip before a Cast ``<name>/clip``.

**Opset.** Per-channel QuantizeLinear/DequantizeLinear (``axis``) need opset 13, int16 ones
opset 21. When the IR's opset is lower the model is converted properly: it is written with every
calibration node as a named Identity, converted with ``onnx.version_converter``, and only then
are the Identity nodes replaced — so no attribute is ever written that the declared opset lacks.

**Round trip.** The model's metadata ``qir.calibrations`` holds every calibration node's state
as JSON (name, mode, role, threshold/scale/zero point/axis, fixed, feeds, implied clip, the
uint8 frame of a quantizer imported from one, and for float nodes the reads to restore).
``qir.load`` of the emitted model gives back the same calibration nodes
(:mod:`qir.io.qdq_import`), except that an int weight comes back as its dequantized values (the
model stores only the integers), which fake-quantize to the same result.

**onnxruntime.** The model means exactly qir's fake quantization when its ops run as written
(``session.disable_quant_qdq``: bit for bit against qir's ort runtime). onnxruntime's default
session rewrites QDQ groups, which changes some results:

* it fuses Q/DQ groups into integer kernels: requantization rounds differently at ties, and on
  x86 without AVX-VNNI its uint8×int8 kernels saturate 16-bit pair sums (VPMADDUBSW) unless
  ``session.x64quantprecision=1`` is set;
* ``WeightBiasQuantization`` quantizes a float weight (int8 per tensor) or float bias (int32 at
  ``s_x * s_w``) of a Conv/ConvTranspose/Gemm sitting between a DequantizeLinear and a
  QuantizeLinear; the bias overflows int32 for int16 × int16. :func:`qir.passes.emit.onnxruntime_caveats`
  lists such ops; the ``emit`` pass reports them and logs a warning;
* at opset 21 its QDQ propagation plus int8→uint8 conversion of activations writes an invalid
  QuantizeLinear (``output_dtype`` INT8 with a uint8 zero point) and the session fails to load;
  so at opset >= 21 int8 *activation* quantizers are written as uint8 with zero point + 128 (the
  same values; :mod:`qir.io.qdq_import` reads them back into the int8 frame). Weights stay int8.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qir.calibration import QRANGE, along_axis, calib_scale
from qir.errors import InputError, QirError
from qir.graph import QIR
from qir.io.onnx_export import export_onnx
from qir.io.qdq_metadata import EMIT_METADATA_KEY
from qir.kinds import CalibMode
from qir.naming import fresh_name
from qir.records import CalibRecord, OpRecord

__all__ = ["export_qdq", "required_opset", "quantize_weight", "OPSET_PER_CHANNEL", "OPSET_INT16", "INTEGER_MODES"]

OPSET_PER_CHANNEL = 13  # QuantizeLinear/DequantizeLinear gain ``axis``
OPSET_INT16 = 21        # QuantizeLinear/DequantizeLinear accept int16
METADATA_FORMAT = 1
_INT_DTYPE = {CalibMode.INT8: np.int8, CalibMode.INT16: np.int16}
INTEGER_MODES = (CalibMode.INT8, CalibMode.INT16)  # the modes written as QuantizeLinear/DequantizeLinear


def _per_channel(ir: QIR, rec: CalibRecord) -> bool:
    return rec.axis is not None and np.ndim(calib_scale(rec)) == 1


def required_opset(ir: QIR) -> int:
    """The lowest default-domain opset that holds ``ir`` emitted: its own, 13 with per-channel
    integer nodes, 21 with int16 nodes."""
    need = ir.opset
    for rec in ir.calibrations():
        if rec.mode is CalibMode.INT16:
            need = max(need, OPSET_INT16)
        if rec.mode in INTEGER_MODES and _per_channel(ir, rec):
            need = max(need, OPSET_PER_CHANNEL)
    return need


def _zero_point(rec: CalibRecord, scale: np.ndarray) -> np.ndarray:
    """The node's zero point in its mode's integer type, shaped like ``scale``."""
    dtype = _INT_DTYPE[rec.mode]
    if rec.zero_point is None:
        return np.zeros(np.shape(scale), dtype)
    zp = np.asarray(rec.zero_point, np.int64)
    qmin, qmax = QRANGE[rec.mode]
    if np.any(zp < qmin) or np.any(zp > qmax):
        raise QirError(f"calibration node {rec.name!r}: zero point {zp.reshape(-1)[:4].tolist()} is outside "
                       f"the {rec.mode.value} range")
    return np.broadcast_to(zp, np.shape(scale)).astype(dtype)


def quantize_weight(rec: CalibRecord, w: np.ndarray) -> np.ndarray:
    """``w`` as the integers a DequantizeLinear turns into qir's fake-quantized ``w``:
    ``clip(rint(w / s) + zp, qmin, qmax)`` in float32 (half to even, like QuantizeLinear)."""
    scale = calib_scale(rec)
    zp = _zero_point(rec, scale)
    qmin, qmax = QRANGE[rec.mode]
    s = along_axis(scale.astype(w.dtype), rec.axis, w.ndim)
    q = np.rint(w / s) + along_axis(zp.astype(w.dtype), rec.axis, w.ndim)
    return np.clip(q, qmin, qmax).astype(_INT_DTYPE[rec.mode])


def _json_values(v: Any) -> Any:
    if v is None:
        return None
    a = np.asarray(v)
    if a.dtype.kind == "f":
        a = a.astype(np.float32)
        return a.tolist() if a.ndim else float(a)
    return a.astype(np.int64).tolist() if a.ndim else int(a)


class _Names:
    """Every tensor and node name of a model, to make fresh ones."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.tensors = ({i.name for i in g.input} | {i.name for i in g.initializer}
                        | {o for n in g.node for o in n.output} | {o.name for o in g.output})
        self.nodes = {n.name for n in g.node}

    def tensor(self, base: str) -> str:
        name = fresh_name(base, self.tensors)
        self.tensors.add(name)
        return name

    def node(self, base: str) -> str:
        name = fresh_name(base, self.nodes)
        self.nodes.add(name)
        return name


class _Lowering:
    """Writes each calibration node of ``ir`` into a model that holds it as a named Identity."""

    def __init__(self, ir: QIR, model: onnx.ModelProto, uint8_activations: bool, keep_unsigned: bool) -> None:
        self.ir, self.model = ir, model
        self.uint8_activations, self.keep_unsigned = uint8_activations, keep_unsigned
        self.names = _Names(model)
        self.inits: list[onnx.TensorProto] = []
        self.alias: dict[str, str] = {}       # bypassed float outputs -> the value read instead
        self.outputs = set(ir.outputs)
        self.calib_readers = {rec.input for rec in ir.calibrations()}

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.names.tensor(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def lower(self, rec: CalibRecord) -> list[onnx.NodeProto]:
        x, y = rec.input, rec.output
        if rec.mode in INTEGER_MODES:
            return self._integer(rec)
        nodes: list[onnx.NodeProto] = []
        if rec.implied_clip is not None:
            target = y if rec.mode is CalibMode.FLOAT else self.names.tensor(f"{rec.name}.clipped")
            name = rec.name if rec.mode is CalibMode.FLOAT else self.names.node(f"{rec.name}/clip")
            nodes.append(self._clip(rec, x, target, name))
            x = target
        if rec.mode is CalibMode.FP16:
            half = self.names.tensor(f"{rec.name}.fp16")
            back = helper.np_dtype_to_tensor_dtype(np.dtype(self.ir.value(rec.input).dtype or "float32"))
            return nodes + [
                helper.make_node("Cast", [x], [half], name=self.names.node(f"{rec.name}/to_fp16"),
                                 to=TensorProto.FLOAT16),
                helper.make_node("Cast", [half], [y], name=rec.name, to=back)]
        if nodes:
            return nodes
        if y in self.outputs or y in self.calib_readers:
            return [helper.make_node("Identity", [x], [y], name=rec.name)]
        self.alias[y] = x  # float: readers read the float value itself
        return []

    def _clip(self, rec: CalibRecord, x: str, y: str, name: str) -> onnx.NodeProto:
        lo, hi = (float(v) for v in rec.implied_clip)
        if lo == 0.0 and np.isposinf(hi):
            return helper.make_node("Relu", [x], [y], name=name)
        lo_name = self.const(f"{rec.name}.clip_min", np.array(lo, np.float32))
        hi_name = self.const(f"{rec.name}.clip_max", np.array(hi, np.float32))
        return helper.make_node("Clip", [x, lo_name, hi_name], [y], name=name)

    def _integer(self, rec: CalibRecord) -> list[onnx.NodeProto]:
        scale = calib_scale(rec)
        if scale.ndim and rec.axis is None:
            raise QirError(f"calibration node {rec.name!r} has per-channel values but no axis")
        zp = _zero_point(rec, scale)
        attrs = {"axis": int(rec.axis)} if scale.ndim else {}
        s_name = self.const(f"{rec.name}.scale", scale.astype(np.float32))
        src = self.ir.value(rec.input)
        unsigned = self.uint8_activations or (self.keep_unsigned and rec.meta.get("unsigned"))
        if src.data is None and rec.mode is CalibMode.INT8 and unsigned:
            zp = (zp.astype(np.int16) + 128).astype(np.uint8)  # the same values in the uint8 frame
        zp_name = self.const(f"{rec.name}.zero_point", zp)
        if src.data is not None:  # a constant: store it quantized
            if src.data.dtype != np.float32:
                raise QirError(f"calibration node {rec.name!r}: weight {rec.input!r} is {src.data.dtype}; "
                               "emit quantizes float32 weights")
            q_name = self.const(f"{rec.input}_quantized", quantize_weight(rec, src.data))
            return [helper.make_node("DequantizeLinear", [q_name, s_name, zp_name], [rec.output],
                                     name=rec.name, **attrs)]
        q = self.names.tensor(f"{rec.name}.quantized")
        return [helper.make_node("QuantizeLinear", [rec.input, s_name, zp_name], [q],
                                 name=self.names.node(f"{rec.name}/quantize"), **attrs),
                helper.make_node("DequantizeLinear", [q, s_name, zp_name], [rec.output], name=rec.name, **attrs)]


def _placeholder(ir: QIR, rec: CalibRecord) -> list[onnx.NodeProto]:
    return [helper.make_node("Identity", [rec.input], [rec.output], name=rec.name)]


def _entry(ir: QIR, rec: CalibRecord, bypassed: bool) -> dict[str, Any]:
    clip = None
    if rec.implied_clip is not None:
        clip = [None if np.isinf(v) else float(v) for v in rec.implied_clip]
    entry = {"name": rec.name, "mode": rec.mode.value, "role": rec.role.value, "input": rec.input,
             "output": rec.output, "threshold": _json_values(rec.threshold), "scale": _json_values(rec.scale),
             "zero_point": _json_values(rec.zero_point), "axis": rec.axis, "fixed": bool(rec.fixed),
             "feeds": list(rec.feeds), "implied_clip": clip}
    if rec.meta.get("unsigned"):
        entry["unsigned"] = True
    if bypassed:
        entry["uses"] = [[r.name, slot] for r, slot in ir.uses(rec.output) if isinstance(r, OpRecord)]
    return entry


def export_qdq(ir: QIR, *, opset: int | None = None, uint8_activations: bool | None = None,
               keep_unsigned: bool = False, check: bool = True) -> onnx.ModelProto:
    """``ir`` as a standard ONNX model (see the module docstring); ``ir`` is not changed.

    Args:
        opset: the default-domain opset to write (at least what the content needs).
        uint8_activations: write int8 activation quantizers as uint8 with zero point + 128
            (the same values). Default: only at opset >= 21, where onnxruntime 1.31's
            optimizer breaks int8 activation QDQ (see the module docstring).
        keep_unsigned: also write, at any opset, the int8 activation quantizers imported from
            uint8 ones (``meta["unsigned"]``) as uint8: the frame onnxruntime's integer kernels
            compute in (:mod:`qir.io.qoperator_export` uses it).
        check: run ``onnx.checker`` on the result.

    Raises:
        QirError: a quantized node without a usable threshold/scale, an opset too low for the
            content, or a model the ONNX version converter cannot raise.
    """
    need = required_opset(ir)
    if opset is not None and opset < need:
        raise InputError(f"opset {opset} is too low for this model's calibration nodes; it needs {need} "
                         f"(per-channel QDQ needs {OPSET_PER_CHANNEL}, int16 QDQ {OPSET_INT16})")
    target = max(need, opset or 0)
    model = export_onnx(ir, lower_calibration=_placeholder)
    if target > ir.opset:
        model = _convert(model, target, ir.opset)
    cals = {rec.name: rec for rec in ir.calibrations()}
    if uint8_activations is None:
        uint8_activations = target >= OPSET_INT16
    low = _Lowering(ir, model, uint8_activations, keep_unsigned)
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        rec = cals.get(node.name) if node.op_type == "Identity" else None
        nodes.extend(low.lower(rec) if rec is not None else [node])
    missing = set(cals) - {n.name for n in nodes} - {r.name for r in cals.values()
                                                       if r.output in low.alias}
    if missing:
        raise QirError(f"emit lost calibration node(s) {sorted(missing)[:3]} while converting the opset")
    alias = low.alias

    def resolve(v: str) -> str:
        while v in alias:
            v = alias[v]
        return v

    for node in nodes:
        for i, v in enumerate(node.input):
            if v in alias:
                node.input[i] = resolve(v)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(low.inits)
    used = {v for n in graph.node for v in n.input} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    vis = [v for v in graph.value_info if v.name not in alias]
    del graph.value_info[:]
    graph.value_info.extend(vis)
    entries = [_entry(ir, rec, rec.output in alias) for rec in cals.values()]
    for p in [p for p in model.metadata_props if p.key == EMIT_METADATA_KEY]:
        model.metadata_props.remove(p)
    model.metadata_props.add(key=EMIT_METADATA_KEY,
                             value=json.dumps({"format": METADATA_FORMAT, "calibrations": entries},
                                              separators=(",", ":")))
    model.ir_version = max(model.ir_version, helper.find_min_ir_version_for(list(model.opset_import), True))
    if check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise QirError(f"emit wrote a model onnx.checker rejects: {str(exc).splitlines()[0]}") from exc
    return model


def _convert(model: onnx.ModelProto, target: int, current: int) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QirError(f"cannot raise the model's opset from {current} to {target}, which its "
                       f"calibration nodes need (onnx version converter: {first})") from exc
    return converted

