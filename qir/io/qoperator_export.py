"""The QOperator exporter: qir's QDQ model (:mod:`.qdq_export`) with every quantized op that has an
integer ONNX form rewritten into that form (``qir emit --format qoperator``). The rules, one
function each, are in :mod:`.qoperator_rules`; :mod:`.qoperator_import` reads the result back.

:func:`export_qoperator` builds the QDQ model first (:func:`qir.io.qdq_export.export_qdq`: the
opset rules and the calibration metadata are that model's; int8 activation quantizers are
written in the frame they were imported in, uint8 for onnxruntime's uint8 ones, since its
integer kernels compute differently in the two), then rewrites each ``DequantizeLinear → op →
QuantizeLinear`` group its rules match into one integer node. The integer node reads the
quantized tensors themselves (the QuantizeLinear outputs and the integer weight initializers)
and writes the quantized tensor of the op's output quantizer, which its DequantizeLinear keeps
reading; a DequantizeLinear nothing reads any more is dropped. Everything no rule matches stays
as the QDQ model wrote it (QDQ, Cast pairs for fp16, float).

**Operands.** A quantized operand is an op input produced by a DequantizeLinear of an integer
tensor with constant scale and zero point. The integer ONNX ops take 8-bit operands (int8 /
uint8): an int16 operand (and fp16 / float ones, which are not dequantized) leaves its op in
QDQ, with the reason in the report. Activations must be per tensor; weights may be per channel
along the output channel.

**Output quantizer.** The QuantizeLinear that is the only reader of the op's output, possibly
through a chain of Relu/Clip nodes (each the only reader of the value before, none a graph
output), per tensor, 8-bit, of the same type as the op's activation input. A Relu/Clip in the
chain is written on the codes: quantization ``q(v) = sat(rint(v / s) + zp)`` is monotone, so
``q(clip(v, lo, hi)) = clip(q(v), q(lo), q(hi))`` exactly (a Relu is ``clip(v, 0, inf)`` and
``q(0) = zp``). It is written as ``Relu`` on int8 codes when ``zp = 0`` (opset >= 14), else as
``Clip`` with integer bounds (opset >= 12; below that such an op stays QDQ).

**Metadata.** ``qir.qoperator`` (JSON, beside :mod:`.qdq_export`'s ``qir.calibrations``):
``quantized`` maps each quantized tensor to the calibration node whose DequantizeLinear read it,
``activations`` holds the Relu/Clip nodes written on codes (op type, bound names and float
values) and ``attributes`` the float op attributes an integer op lacks (Gemm's alpha and beta),
so that :mod:`.qoperator_import` restores the same names, ops and calibration state.

**onnxruntime.** Its default session fuses a QDQ model's ``DQ → op → Q`` groups into these same
kernels where it can, so both forms compute the same codes there (bit for bit on models with
uint8 activations quantized by its ``quantize_static``). Groups it leaves in float run in
integer here: an op whose output is not quantized (ConvInteger / MatMulInteger / float-output
QGemm: exact integer sums times ``s_x·s_w``, versus a float32 sum of dequantized products), a
Relu/Clip between an op and a symmetric quantizer (onnxruntime fuses Conv + Relu in float), and,
with int8 activations, the groups its int8 → uint8 conversion leaves unfused. There the two
differ by float rounding: a code apart where a value is near a rounding tie. qir's integer level
with march ``ort`` computes the integer kernels, as this model does.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import onnx
from onnx import helper

from qir.errors import QirError
from qir.graph import QIR
from qir.io.qdq_export import export_qdq
from qir.io.qdq_graph import is_op
from qir.io.qdq_metadata import EMIT_METADATA_KEY
from qir.io.qoperator_graph import MS_DOMAIN, QOPERATOR_METADATA_KEY, Quant, Rewriter
from qir.io.qoperator_rules import RULES

__all__ = ["export_qoperator", "to_qoperator", "QOperatorReport", "QOPERATOR_METADATA_KEY"]

METADATA_FORMAT = 1


def _calibration_names(model: onnx.ModelProto) -> dict[str, str]:
    """Quantized tensor → the calibration node (by its DequantizeLinear's name) that read it."""
    known: set[str] = set()
    for p in model.metadata_props:
        if p.key == EMIT_METADATA_KEY:
            known = {e["name"] for e in json.loads(p.value).get("calibrations", [])}
    return {n.input[0]: n.name for n in model.graph.node if is_op(n, "DequantizeLinear") and n.name in known}


def _finish(rw: Rewriter, names: dict[str, str]) -> None:
    graph = rw.model.graph
    nodes = [m for n in graph.node for m in rw.replace.get(id(n), [n])]
    while True:  # a DequantizeLinear (or a constant's) output that nothing reads any more goes
        read = {v for n in nodes for v in n.input} | rw.g.graph_outputs
        unread = [n for n in nodes if is_op(n, "DequantizeLinear") and n.output[0] not in read]
        if not unread:
            break
        nodes = [n for n in nodes if not any(n is u for u in unread)]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rw.inits)
    used = {v for n in graph.node for v in n.input} | rw.g.graph_outputs
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    vis = [v for v in graph.value_info if v.name not in rw.retyped]
    del graph.value_info[:]
    graph.value_info.extend(vis)
    if any(n.domain == MS_DOMAIN for n in nodes) and not any(o.domain == MS_DOMAIN for o in rw.model.opset_import):
        rw.model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    quantized = {t: c for t, c in names.items() if t in used}
    note = {"format": METADATA_FORMAT, "quantized": quantized, "activations": rw.activations,
            "attributes": rw.attributes}
    for p in [p for p in rw.model.metadata_props if p.key == QOPERATOR_METADATA_KEY]:
        rw.model.metadata_props.remove(p)
    rw.model.metadata_props.add(key=QOPERATOR_METADATA_KEY, value=json.dumps(note, separators=(",", ":")))


@dataclass
class QOperatorReport:
    """What :func:`to_qoperator` wrote: ``forms`` (integer op type → how many ops were written as it),
    ``integer_nodes`` (op name → its integer op type), ``kept_qdq`` (op type → how many ops that
    read a quantized value stay QDQ) and ``kept_qdq_nodes`` (each of those: node, op type, reason)."""

    forms: dict[str, int]
    integer_nodes: dict[str, str]
    kept_qdq: dict[str, int]
    kept_qdq_nodes: list[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        """The report's keys as the emit report carries them."""
        return {"forms": self.forms, "integer_nodes": self.integer_nodes, "kept_qdq": self.kept_qdq,
                "kept_qdq_nodes": self.kept_qdq_nodes}


def to_qoperator(model: onnx.ModelProto, where: str = "model") -> QOperatorReport:
    """Rewrite the QDQ ``model`` (changed in place) into the QOperator form (the module docstring)
    and say what was written (:class:`QOperatorReport`)."""
    names = _calibration_names(model)
    rw = Rewriter(model, where)
    for node in list(model.graph.node):
        if id(node) in rw.replace or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        reads_quantized = any(isinstance(rw.operand(v), Quant) for v in node.input if v)
        if not reads_quantized or is_op(node, "DequantizeLinear") or is_op(node, "QuantizeLinear"):
            continue
        rule: Callable | None = RULES.get(node.op_type)
        reason = rule(rw, node) if rule is not None else "no integer ONNX form"
        if reason:
            rw.keep(node, reason)
    _finish(rw, names)
    forms = dict(sorted(rw.forms.items()))
    kept = Counter(k["op_type"] for k in rw.kept)
    return QOperatorReport(forms, dict(rw.written), dict(sorted(kept.items())), rw.kept)


def export_qoperator(ir: QIR, *, opset: int | None = None, check: bool = True) -> tuple[onnx.ModelProto, QOperatorReport]:
    """``ir`` as a QOperator ONNX model (:func:`to_qoperator` over :func:`export_qdq`'s model) and
    the rewrite's report; ``ir`` is not changed."""
    model = export_qdq(ir, opset=opset, keep_unsigned=True, check=check)
    report = to_qoperator(model)
    if check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise QirError(f"emit wrote a QOperator model onnx.checker rejects: {str(exc).splitlines()[0]}") from exc
    return model, report
