"""QIR → ONNX ``ModelProto`` that onnx.checker accepts and onnxruntime runs.

Rules:

1. Graph inputs, outputs and every activation with a known dtype get value infos (shapes as
   recorded: ints, symbolic names, or unknown).
2. Weights become initializers (only those some node or output reads).
3. General nodes are written in the IR's deterministic topological order with their names,
   domains and attributes re-encoded with their original ONNX types.
4. Source-framework module paths of general nodes (PyTorch ``layer1.0.conv1``) are kept in the
   metadata entry ``qir.modules`` (``{node: module}``), which the importer reads back.
5. Calibration nodes are lowered by ``lower_calibration``. The default writes them as
   ``qir::Calibration`` nodes (:mod:`qir.io.calib_onnx`): the calibrated-model format, which
   ``import_onnx`` reads back exactly. Runtimes pass their own lowering (fake quantization as
   standard ops); the emit pass writes QuantizeLinear/DequantizeLinear.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from qir.graph import QIR
from qir.io import calib_onnx
from qir.records import CalibRecord, OpRecord

__all__ = ["export_onnx", "export_subgraph", "ExportMemo", "make_attribute", "np_to_onnx_dtype", "CalibLowering", "OpLowering"]

logger = logging.getLogger(__name__)

# ORT 1.17+ reads IR version 10; newer protos are written at the oldest version that fits.
MAX_IR_VERSION = 10

CalibLowering = Callable[[QIR, CalibRecord], list[onnx.NodeProto]]
OpLowering = Callable[[QIR, OpRecord], "list[onnx.NodeProto] | None"]


def np_to_onnx_dtype(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def make_attribute(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    """Encode a decoded attribute back to ONNX, keeping its original type when known."""
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if attr_type == AttributeProto.TENSORS:
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if attr_type in (AttributeProto.FLOAT, AttributeProto.FLOATS, AttributeProto.INT,
                     AttributeProto.INTS, AttributeProto.STRING, AttributeProto.STRINGS):
        return helper.make_attribute(name, value, attr_type=attr_type)
    return helper.make_attribute(name, value)


def _value_info(ir: QIR, name: str) -> onnx.ValueInfoProto:
    """A value's type; with an unknown dtype, an untyped value info (onnxruntime infers it)."""
    rec = ir.value(name)
    if rec.dtype is None:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, np_to_onnx_dtype(rec.dtype), rec.shape)


def _as_calibration_node(ir: QIR, rec: CalibRecord) -> list[onnx.NodeProto]:
    return [calib_onnx.calibration_to_node(rec)]


def op_to_node(rec: OpRecord) -> onnx.NodeProto:
    """A general node as an ONNX NodeProto (name, domain, attributes with their original types)."""
    node = helper.make_node(rec.op_type, list(rec.inputs), list(rec.outputs), name=rec.name,
                            domain=rec.domain or None)
    node.attribute.extend(make_attribute(k, v, rec.attr_types.get(k)) for k, v in sorted(rec.attrs.items()))
    return node


@dataclass
class ExportMemo:
    """What :func:`export_subgraph` converted once for a caller exporting many pieces of an
    unchanging IR: each general node's ONNX nodes, and initializers by (name, array identity)."""

    ops: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    initializers: dict[tuple[str, int], tuple[onnx.TensorProto, np.ndarray]] = field(default_factory=dict)

    def clear(self) -> None:
        self.ops.clear()
        self.initializers.clear()


def _lower_records(ir: QIR, records, lower: CalibLowering, lower_op: OpLowering | None = None,
                   memo: ExportMemo | None = None) -> list[onnx.NodeProto]:
    nodes: list[onnx.NodeProto] = []
    for rec in records:
        if isinstance(rec, CalibRecord):
            nodes.extend(lower(ir, rec))
            continue
        assert isinstance(rec, OpRecord)
        written = memo.ops.get(rec.name) if memo is not None else None
        if written is None:
            written = (lower_op(ir, rec) if lower_op is not None else None) or [op_to_node(rec)]
            if memo is not None:
                memo.ops[rec.name] = written
        nodes.extend(written)
    return nodes


def _initializer(name: str, array: np.ndarray, memo: ExportMemo | None) -> onnx.TensorProto:
    """``array`` as an initializer called ``name`` (converted once per array with a ``memo``)."""
    if memo is None:
        return numpy_helper.from_array(np.asarray(array), name)
    key = (name, id(array))
    if key not in memo.initializers:  # (the entry keeps id(array) alive)
        memo.initializers[key] = (numpy_helper.from_array(np.asarray(array), name), array)
    return memo.initializers[key][0]


def _model(ir: QIR, graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    domains = dict(ir.opset_imports)
    for node in nodes:
        if node.domain == calib_onnx.DOMAIN:
            domains.setdefault(calib_onnx.DOMAIN, calib_onnx.OPSET)
        elif node.domain == "com.microsoft":
            domains.setdefault("com.microsoft", 1)
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(domains.items())]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="qir")
    needed = helper.find_min_ir_version_for(opsets, True)
    model.ir_version = max(min(int(ir.meta.get("ir_version", 8)), MAX_IR_VERSION), needed)
    return model


def export_onnx(ir: QIR, *, lower_calibration: CalibLowering | None = None,
                extra_outputs: list[onnx.ValueInfoProto] | None = None,
                extra_nodes: list[onnx.NodeProto] | None = None,
                lower_op: OpLowering | None = None) -> onnx.ModelProto:
    """Write ``ir`` as an ONNX model (see the module docstring).

    Args:
        lower_calibration: how to write calibration nodes (default: ``qir::Calibration``).
        extra_outputs / extra_nodes: appended as-is (used by runtimes to capture values).
        lower_op: writes a general node another way (a runtime's choice of kernel), or
            returns None for the node as it is.
    """
    nodes = _lower_records(ir, ir.runnables(), lower_calibration or _as_calibration_node, lower_op)
    nodes.extend(extra_nodes or [])
    read = {i for n in nodes for i in n.input} | set(ir.outputs)
    initializers = [numpy_helper.from_array(np.asarray(w.data), w.name)
                    for w in ir.weights() if w.name in read]
    skip = set(ir.inputs) | set(ir.outputs)
    value_info = [_value_info(ir, v.name) for v in ir.activations()
                  if v.name not in skip and v.dtype is not None]
    graph = helper.make_graph(nodes, ir.name, [_value_info(ir, n) for n in ir.inputs],
                              [_value_info(ir, n) for n in ir.outputs] + list(extra_outputs or []),
                              initializer=initializers, value_info=value_info)
    model = _model(ir, graph, nodes)
    for key, value in sorted(ir.metadata_props.items()):
        if key != "producer_name":
            model.metadata_props.add(key=key, value=value)
    modules = {op.name: op.module for op in ir.ops() if op.module}
    if modules:  # read back by the importer, so reports keep naming what the user wrote
        model.metadata_props.add(key="qir.modules", value=json.dumps(modules, sort_keys=True))
    for key in SAVED_META:  # pass results the analyses need after a save/load
        if ir.meta.get(key):
            model.metadata_props.add(key=f"qir.{key}", value=json.dumps(ir.meta[key], sort_keys=True))
    return model


# ``ir.meta`` entries kept in the ONNX metadata (``qir.<key>``, JSON): the fusion groups
# (``fuse``), value aliases (``fold-bn``: the op's output now holds what the folded
# BatchNormalization wrote, under the BN output's name in the source model), the march the
# calibration nodes were inserted for (``insert-calibration``) and how they were calibrated
# (``calibrate``: method, number of samples), which reports state
SAVED_META = ("fusion_groups", "composites", "value_aliases", "march", "calibration")


def export_subgraph(ir: QIR, records, inputs: list[str], outputs: list[str], *,
                    lower_calibration: CalibLowering | None = None,
                    constants: dict[str, np.ndarray] | None = None,
                    lower_op: OpLowering | None = None, memo: ExportMemo | None = None) -> onnx.ModelProto:
    """A piece of ``ir`` as its own ONNX model: ``records`` (runnable nodes, in topological
    order) computing ``outputs`` from the graph inputs ``inputs``. Weights the nodes read
    become initializers; ``constants`` adds or replaces initializers (for example weight
    calibration outputs precomputed for a mode). The caller guarantees that ``inputs`` are
    everything the nodes read from outside (besides weights and constants). ``memo``: an
    :class:`ExportMemo` kept by a caller exporting many pieces of an unchanging ``ir``; general nodes and
    initializers are converted once and reused from it."""
    constants = constants or {}
    nodes = _lower_records(ir, records, lower_calibration or _as_calibration_node, lower_op, memo)
    read = {i for n in nodes for i in n.input}
    initializers = [_initializer(n, a, memo) for n, a in sorted(constants.items()) if n in read]
    weights = [ir.value(v) for v in sorted(read - set(constants)) if ir.has_value(v)]  # (not all of ir.weights())
    initializers += [_initializer(w.name, w.data, memo) for w in weights if w.is_weight]
    boundary = set(inputs) | set(outputs)
    produced = {o for n in nodes for o in n.output}
    value_info = [_value_info(ir, v) for v in sorted(produced - boundary)
                  if ir.has_value(v) and ir.value(v).dtype is not None]
    graph = helper.make_graph(nodes, f"{ir.name}.part", [_value_info(ir, n) for n in inputs],
                              [_value_info(ir, n) for n in outputs], initializer=initializers,
                              value_info=value_info)
    return _model(ir, graph, nodes)
