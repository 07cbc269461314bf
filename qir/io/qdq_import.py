"""ONNX QDQ models (e.g. onnxruntime's ``quantize_static``, ``QuantFormat.QDQ``) → calibration nodes.

:func:`convert_qdq` rewrites the ``ModelProto`` before the normal import
(:func:`qir.io.onnx_import.import_onnx` calls it first), so the importer only ever sees float ops
and ``qir::Calibration`` nodes (:mod:`qir.io.calib_onnx`). The parts, each with its rules:

- :mod:`qir.io.qdq_rewrite`: activation Q→DQ pairs, weights and biases, and the errors;
- :mod:`qir.io.qdq_params`: a quantizer's scale / zero point / axis, the modes and the int8 frame;
- :mod:`qir.io.qdq_clips`: the Relu/Clip that onnxruntime's quantizer removed (implied clips);
- :mod:`qir.io.qdq_metadata`: the calibration state of models written by qir's emit pass;
- :mod:`qir.io.qdq_graph`: the index of the graph they all read.

A QOperator model (QLinear* / ConvInteger / MatMulInteger nodes, e.g. ``qir emit --format
qoperator``) is first rewritten into this QDQ form by :mod:`qir.io.qoperator_import`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import onnx

from qir.io.qdq_clips import float_clips
from qir.io.qdq_graph import is_op
from qir.io.qdq_metadata import EMIT_METADATA_KEY
from qir.io.qdq_rewrite import QdqRewrite
from qir.io.qoperator_import import has_qoperator, to_qdq

__all__ = ["convert_qdq", "is_qdq_model"]

logger = logging.getLogger(__name__)


def is_qdq_model(proto: onnx.ModelProto) -> bool:
    """True when the model holds QuantizeLinear/DequantizeLinear nodes, qir emit metadata or
    QOperator nodes (:func:`qir.io.qoperator_import.has_qoperator`)."""
    return (any(is_op(n, "QuantizeLinear") or is_op(n, "DequantizeLinear") for n in proto.graph.node)
            or any(p.key == EMIT_METADATA_KEY for p in proto.metadata_props) or has_qoperator(proto))


def convert_qdq(proto: onnx.ModelProto, where: str = "model", *,
                input_shapes: Mapping[str, Sequence[int]] | None = None, normalize: bool = True,
                float_model: str | Path | onnx.ModelProto | None = None,
                report: dict[str, int] | None = None) -> onnx.ModelProto:
    """Rewrite a QDQ model into float ops + ``qir::Calibration`` nodes (the module docstring).

    A model without QuantizeLinear/DequantizeLinear (and without emit metadata) comes back
    untouched (the same object). Otherwise ``proto`` is changed in place and returned (or a
    normalized copy when ``normalize``).

    Args:
        input_shapes: fix input shapes first (as the importer does), so the clean-up folds
            shape computations.
        normalize: fold constants / clean up / toposort with onnx-graphsurgeon first, keeping
            every Q/DQ node and its constants (not for models qir emitted, whose order is kept).
        float_model: the float model the QDQ model was quantized from; when given, implied
            clips come from its Relu/Clip nodes instead of being read from the ranges.
        report: filled with counts (activation, weight, bias, implied_clip, restored).
    """
    if not is_qdq_model(proto):
        return proto
    from qir.io.onnx_proto import fix_input_shapes, name_unnamed_nodes

    name_unnamed_nodes(proto)
    to_qdq(proto, where)  # QOperator nodes -> DequantizeLinear -> float op -> QuantizeLinear
    if input_shapes:
        fix_input_shapes(proto, input_shapes)
    emitted = any(p.key == EMIT_METADATA_KEY for p in proto.metadata_props)
    if normalize and not emitted:  # qir wrote emitted models from a normalized IR: keep their order
        from qir.io.onnx_proto import normalize_proto

        proto = normalize_proto(proto, keep_ops=("QuantizeLinear", "DequantizeLinear"))
    clips = float_clips(float_model) if float_model is not None else None
    rewrite = QdqRewrite(proto, where, clips)
    result = rewrite.run()
    if report is not None:
        report.update(rewrite.report)
    logger.info("%s: QDQ import: %s", where, rewrite.report)
    return result
