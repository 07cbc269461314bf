"""``emit``: the calibrated IR as a standard ONNX model with the chosen per-node precision (QDQ,
Cast pairs, float), returned in the report and never written.

The model is built by :func:`qir.io.qdq_export.export_qdq` (the format, the opset rules and the
round trip are described there); with ``format="qoperator"`` its quantized ops that have an
integer ONNX form are then written in that form (:func:`qir.io.qoperator_export.export_qoperator`:
QLinearConv, QGemm, ConvInteger, ...), and the report counts the ops per form. The pass adds
what a user deploying it should know: the number of calibration nodes per mode and role, the
Q/DQ node counts, and the ops onnxruntime's default session computes differently
(:func:`onnxruntime_caveats`, each also logged as a warning).
Writing the model to a file (and refusing to overwrite one) is :mod:`qir.tools.emit`'s job.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qir.calibration import calib_scale
from qir.errors import InputError
from qir.graph import QIR
from qir.io.qdq_export import INTEGER_MODES, export_qdq
from qir.io.qoperator_export import export_qoperator
from qir.kinds import CalibMode, CalibRole
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.records import CalibRecord

__all__ = ["EmitPass", "EmitReport", "onnxruntime_caveats", "FORMATS"]


@dataclass(kw_only=True)
class EmitReport(Report):
    """What :class:`EmitPass` built (see its docstring): the ONNX ``model`` (None once a writer
    wrote it to ``path``), the ``format`` and ``opset`` (the IR's: ``source_opset``), calibration
    nodes per mode (``modes``) and per role and mode (``roles``), the QuantizeLinear /
    DequantizeLinear counts, the implied clips written as Relu/Clip and the
    ``onnxruntime_caveats``; a ``qoperator`` model also ``forms``, ``integer_nodes``, ``kept_qdq``
    and ``kept_qdq_nodes`` (:class:`qir.io.qoperator_export.QOperatorReport`); ``emit_model``
    adds the nodes ``selected`` per mode."""

    model: onnx.ModelProto | None = None
    path: str | None
    overwrite: bool | None = None
    format: str
    opset: int
    source_opset: int
    modes: dict[str, int]
    roles: dict[str, dict[str, int]]
    quantize_linear: int
    dequantize_linear: int
    implied_clips: int
    onnxruntime_caveats: list[dict[str, str]]
    forms: dict[str, int] | None = None
    integer_nodes: dict[str, str] | None = None
    kept_qdq: dict[str, int] | None = None
    kept_qdq_nodes: list[dict[str, str]] | None = None
    selected: dict[str, list[str]] | None = None

    optional = ("model", "overwrite", "forms", "integer_nodes", "kept_qdq", "kept_qdq_nodes", "selected")

FORMATS = ("qdq", "qoperator")

logger = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1


def _int_calibration(ir: QIR, value: str) -> CalibRecord | None:
    rec = ir.producer(value)
    return rec if isinstance(rec, CalibRecord) and rec.mode in INTEGER_MODES else None


def _leads_to_quantizer(ir: QIR, value: str) -> bool:
    """``value`` flows, without branching, through Relu/Clip only, into an integer quantizer."""
    while True:
        readers = ir.uses(value)
        if len(readers) != 1 or value in ir.outputs:
            return False
        rec = readers[0][0]
        if isinstance(rec, CalibRecord):
            return rec.mode in INTEGER_MODES
        if rec.op_type not in ("Relu", "Clip") or len(rec.outputs) != 1:
            return False
        value = rec.outputs[0]


def onnxruntime_caveats(ir: QIR) -> list[dict[str, str]]:
    """Ops whose emitted form onnxruntime's *default* session computes differently.

    onnxruntime (>= 1.20, transformer ``WeightBiasQuantization``) re-quantizes a Conv /
    ConvTranspose / Gemm whose input is dequantized per tensor and whose output goes (through
    Relu/Clip only) into a QuantizeLinear: a float weight becomes int8 per tensor, a float bias
    int32 with scale ``s_x * s_w``. The first changes a ``float``/``fp16`` weight of such an op;
    the second overflows int32 when ``|bias| / (s_x * s_w)`` exceeds 2^31 - 1 (int16 × int16).
    ``session.disable_quant_qdq`` (or ``disabled_optimizers=["WeightBiasQuantization"]``) runs
    the model as written.
    """
    found: list[dict[str, str]] = []
    for op in ir.ops():
        if op.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(op.inputs) < 2:
            continue
        x_cal = _int_calibration(ir, op.inputs[0])
        if x_cal is None or np.ndim(calib_scale(x_cal)) or not _leads_to_quantizer(ir, op.outputs[0]):
            continue
        w_cal = _int_calibration(ir, op.inputs[1])
        if w_cal is None:
            found.append({"node": op.name, "issue": "float weight: onnxruntime's default session quantizes it "
                                                    "to int8 per tensor"})
            continue
        if len(op.inputs) > 2 and op.inputs[2]:
            bias = ir.value(op.inputs[2]).data
            if bias is None or bias.ndim != 1:
                continue
            s = np.float32(calib_scale(x_cal)) * calib_scale(w_cal).astype(np.float32)
            with np.errstate(divide="ignore", over="ignore"):
                ratio = np.abs(bias.astype(np.float64)) / np.asarray(s, np.float64)
            if np.any(ratio > _INT32_MAX):
                found.append({"node": op.name, "issue": f"float bias: onnxruntime's default session makes it int32 "
                                                        f"at scale s_x*s_w, which overflows ({float(ratio.max()):.3g} "
                                                        "> 2^31)"})
    return found


def _counts(ir: QIR) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    modes = {m.value: 0 for m in CalibMode}
    roles: dict[str, dict[str, int]] = {r.value: {m.value: 0 for m in CalibMode} for r in CalibRole}
    for rec in ir.calibrations():
        modes[rec.mode.value] += 1
        roles[rec.role.value][rec.mode.value] += 1
    return modes, roles


@register_pass
class EmitPass(AnalysisPass):
    """The calibrated IR as a standard ONNX model with QDQ / Cast pairs / float per node.

    Options: ``opset`` (at least what the content needs); ``path`` and ``overwrite``, where the
    model is to be written (a pass writes nothing itself: ``qir pipeline`` writes it, and so does
    :func:`qir.tools.emit.write_reports` for Python pipelines); ``format``: ``qdq`` (default) or
    ``qoperator`` (integer ONNX ops where they exist, the rest QDQ). The IR is not changed. The
    report holds the ONNX ``model`` (a ``ModelProto``), ``path``/``overwrite``, ``format``, its
    ``opset`` and the IR's ``source_opset``, the calibration nodes per mode (``modes``) and per
    role and mode (``roles``), the QuantizeLinear / DequantizeLinear counts, the implied clips
    written as Relu/Clip, and ``onnxruntime_caveats`` (of the ops left in QDQ form). With
    ``qoperator`` also ``forms`` (integer op type -> ops written so), ``integer_nodes``,
    ``kept_qdq`` (op type -> ops that read a quantized value but stay QDQ) and ``kept_qdq_nodes``
    (each with the reason).
    """

    name = "emit"

    def __init__(self, opset: int | None = None, path: str | None = None, *, overwrite: bool = False,
                 format: str = "qdq") -> None:  # noqa: A002
        if format not in FORMATS:
            raise InputError(f"emit: format {format!r} is not one of {', '.join(FORMATS)}")
        self.opset = int(opset) if opset is not None else None
        self.path, self.overwrite = (str(path) if path is not None else None), bool(overwrite)
        self.format = format
        self.options = {k: v for k, v in (("opset", opset), ("path", path)) if v is not None}
        if format != "qdq":
            self.options["format"] = format

    def run(self, ir: QIR) -> PassResult:
        forms: dict[str, Any] = {}
        if self.format == "qoperator":
            model, written = export_qoperator(ir, opset=self.opset)
            forms = written.to_json()
        else:
            model = export_qdq(ir, opset=self.opset)
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        integer = forms.get("integer_nodes", {})
        modes, roles = _counts(ir)
        report = EmitReport(model=model, path=self.path, overwrite=self.overwrite, format=self.format, opset=opset,
                            source_opset=ir.opset, modes=modes, roles=roles,
                            quantize_linear=sum(n.op_type == "QuantizeLinear" for n in model.graph.node),
                            dequantize_linear=sum(n.op_type == "DequantizeLinear" for n in model.graph.node),
                            implied_clips=sum(r.implied_clip is not None and r.mode in (CalibMode.FLOAT, CalibMode.FP16)
                                              for r in ir.calibrations()),
                            onnxruntime_caveats=[c for c in onnxruntime_caveats(ir) if c["node"] not in integer], **forms)
        for caveat in report.onnxruntime_caveats:
            logger.warning("emit: %s: %s", caveat["node"], caveat["issue"])
        return PassResult(ir, False, report)
