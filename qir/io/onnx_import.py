"""Float ONNX model → QIR.

Steps:

1. Read the model (path or ``ModelProto``) and check it: default-domain opset ≥ 11; no
   control-flow ops (``If``/``Loop``/``Scan`` and anything with a subgraph attribute, which the
   IR cannot represent); only domains some runtime knows (``""``/``ai.onnx``; ``com.microsoft``
   and ``ai.onnx.ml`` ops are kept as opaque nodes that only the ORT runtime executes).
2. Optionally fix input shapes (``input_shapes``) — NPU deployments are static, and static
   shapes let the next step remove shape-computation chains.
3. Normalize with onnx-graphsurgeon (fold constants, clean up, topologically sort) between two
   rounds of ONNX shape inference, so ``Shape→Gather→Concat→Reshape`` chains become constants.
4. Lower: initializers and ``Constant`` nodes (Paddle exports keep weights there) become WEIGHT
   values; graph inputs become inputs; ``qir::Calibration`` nodes (a saved calibrated model,
   :mod:`qir.io.calib_onnx`) become CALIBRATION nodes; every other node a GENERAL op with its ONNX
   name (``OpType_N`` when it has none, N counting per op type) and attributes decoded to Python.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from qir.errors import ImportError_
from qir.graph import QIR
from qir.io import calib_onnx
from qir.io.onnx_export import SAVED_META
from qir.io.onnx_proto import (
    _infer_shapes,
    check_model,
    constant_value,
    fix_input_shapes,
    name_unnamed_nodes,
    normalize_proto,
    read_onnx,
)
from qir.naming import fresh_name
from qir.records import OpRecord, QuantizerState

__all__ = ["import_onnx", "decode_attribute", "onnx_dtype"]

logger = logging.getLogger(__name__)

def onnx_dtype(elem_type: int) -> str | None:
    """numpy dtype name of an ONNX tensor element type (None when undefined)."""
    if elem_type == 0:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def decode_attribute(attr: AttributeProto) -> Any:
    """An attribute's value as Python: str for strings, numpy arrays for tensors."""
    value = onnx.helper.get_attribute_value(attr)
    if attr.type == AttributeProto.STRING:
        return value.decode("utf-8")
    if attr.type == AttributeProto.STRINGS:
        return [v.decode("utf-8") for v in value]
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(v) for v in value]
    if attr.type in (AttributeProto.INTS, AttributeProto.FLOATS):
        return list(value)
    return value


def _stash_calibrations(proto: onnx.ModelProto, where: str) -> dict[str, QuantizerState]:
    """Turn ``qir::Calibration`` nodes into named Identity nodes (so shape inference and
    folding see through them); returns their quantizers by node name."""
    stashed: dict[str, QuantizerState] = {}
    for node in proto.graph.node:
        if node.domain == calib_onnx.DOMAIN and node.op_type == calib_onnx.OP_TYPE:
            if not node.name or node.name in stashed:
                raise ImportError_(f"{where}: every qir Calibration node needs a unique name "
                                   f"(found {node.name!r} twice or empty)")
            stashed[node.name] = calib_onnx.calibration_state(node, f"{where}: calibration node {node.name!r}")
            node.op_type, node.domain = "Identity", ""
            del node.attribute[:]
    if stashed:
        kept = [o for o in proto.opset_import if o.domain != calib_onnx.DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
    return stashed


def _add_calibration(ir: QIR, node: onnx.NodeProto, q: QuantizerState) -> None:
    """The calibration node of a stashed ``qir::Calibration`` node (an Identity now)."""
    ir.add_calibration(node.name, node.input[0], node.output[0], role=q.role, mode=q.mode,
                       threshold=q.threshold, scale=q.scale, zero_point=q.zero_point, axis=q.axis,
                       fixed=q.fixed, feeds=q.feeds, implied_clip=q.implied_clip,
                       meta={"unsigned": True} if q.unsigned else {})


def _type_of(vi: onnx.ValueInfoProto) -> tuple[str | None, tuple | None]:
    t = vi.type.tensor_type
    dtype = onnx_dtype(t.elem_type) if vi.type.HasField("tensor_type") else None
    if not t.HasField("shape"):
        return dtype, None
    dims = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # some exporters write -1 for "any"
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dtype, tuple(dims)


def import_onnx(model: str | Path | onnx.ModelProto, *,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                normalize: bool = True, name: str | None = None) -> QIR:
    """Lower a float ONNX model into a QIR (see the module docstring for the steps).

    Args:
        model: path to an ``.onnx`` file or a loaded ``ModelProto`` (not modified).
        input_shapes: ``{input name: shape}`` to make dynamic inputs static.
        normalize: run the onnx-graphsurgeon clean-up first (skipped for calibrated models,
            which qir wrote already normalized; their node order is kept exactly).
        name: model name (default: the graph name, else the file stem).

    Raises:
        ImportError_, UnsupportedOpError, InputError: with the file and node named.
    """
    where = str(model) if not isinstance(model, onnx.ModelProto) else "model"
    proto = onnx.ModelProto()
    proto.CopyFrom(read_onnx(model))
    check_model(proto, where)
    from qir.io.qdq_import import convert_qdq  # QDQ model → qir::Calibration nodes (no-op otherwise
    proto = convert_qdq(proto, where, input_shapes=input_shapes, normalize=normalize)
    calibrations = _stash_calibrations(proto, where)
    name_unnamed_nodes(proto)
    if input_shapes:
        fix_input_shapes(proto, input_shapes)
    if calibrations:
        pass  # a calibrated model qir wrote: normalized and fully typed already; keep it exactly
    elif normalize:
        proto = normalize_proto(proto)
    else:
        proto = _infer_shapes(proto)
    graph = proto.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    default_name = graph.name or (Path(model).stem if not isinstance(model, onnx.ModelProto) else "model")
    ir = QIR(name=name or default_name, opset_imports=opsets)
    ir.meta["ir_version"] = proto.ir_version
    ir.metadata_props = {p.key: p.value for p in proto.metadata_props}
    if proto.producer_name:
        ir.metadata_props.setdefault("producer_name", proto.producer_name)

    types: dict[str, tuple[str | None, tuple | None]] = {}
    for vi in list(graph.value_info) + list(graph.output) + list(graph.input):
        types[vi.name] = _type_of(vi)

    for init in graph.initializer:
        ir.add_weight(init.name, numpy_helper.to_array(init))
    for vi in graph.input:
        if not ir.has_value(vi.name):
            ir.add_input(vi.name, *types[vi.name])

    taken: set[str] = set()
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            ir.add_weight(node.output[0], constant_value(node, where))
            continue
        if node.name in calibrations and node.op_type == "Identity":
            _add_calibration(ir, node, calibrations[node.name])
            taken.add(node.name)
            continue
        op_name = fresh_name(node.name, taken)
        taken.add(op_name)
        attrs = {a.name: decode_attribute(a) for a in node.attribute}
        attr_types = {a.name: int(a.type) for a in node.attribute}
        missing = [v for v in node.input if v and not ir.has_value(v)]
        if missing:
            raise ImportError_(f"{where}: node {op_name!r} ({node.op_type}) reads {missing[0]!r}, "
                               "which no earlier node produces (the graph is not topologically "
                               "sorted or is broken)")
        ir.add_op(op_name, node.op_type, list(node.input), list(node.output), attrs=attrs,
                  attr_types=attr_types, domain="" if node.domain == "ai.onnx" else node.domain,
                  output_info={o: types.get(o, (None, None)) for o in node.output if o})
    missing_out = [o.name for o in graph.output if not ir.has_value(o.name)]
    if missing_out:
        raise ImportError_(f"{where}: graph output {missing_out[0]!r} is produced by no node")
    ir.set_outputs([o.name for o in graph.output])
    _restore_modules(ir)
    logger.info("imported %s: %r", where, ir)
    return ir


def _restore_modules(ir: QIR) -> None:
    """What ``export_onnx`` saved in the metadata: source-framework module paths
    (``qir.modules``) and the pass results in :data:`qir.io.onnx_export.SAVED_META`."""
    import json

    for key in SAVED_META:
        text = ir.metadata_props.pop(f"qir.{key}", None)
        try:
            if text:
                ir.meta[key] = json.loads(text)
        except json.JSONDecodeError:
            logger.warning("ignoring unreadable qir.%s metadata", key)
    composites = ir.meta.get("composites", {})
    for head, members in ir.meta.get("fusion_groups", {}).items():
        for m in members:
            if ir.has_node(m) and isinstance(ir.node(m), OpRecord):
                ir.node(m).meta["fusion"] = head
                if head in composites:
                    ir.node(m).meta["composite"] = composites[head]
    text = ir.metadata_props.pop(MODULES_KEY, None)
    if not text:
        return
    try:
        modules = json.loads(text)
    except json.JSONDecodeError:
        logger.warning("ignoring unreadable %s metadata", MODULES_KEY)
        return
    for name, module in modules.items():
        if ir.has_node(name) and isinstance(ir.node(name), OpRecord):
            ir.node(name).module = module


MODULES_KEY = "qir.modules"


def import_qdq(model: str | Path | onnx.ModelProto, *, float_model: str | Path | onnx.ModelProto | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None, normalize: bool = True,
               name: str | None = None):
    """Import a QDQ model, optionally taking implied clips from its ``float_model``.

    ``qir.load`` does the same without ``float_model`` (implied clips then come from the ranges).
    """
    from qir.io.onnx_import import import_onnx
    from qir.io.qdq_import import convert_qdq

    where = str(model) if not isinstance(model, onnx.ModelProto) else "model"
    proto = onnx.ModelProto()
    proto.CopyFrom(read_onnx(model))
    check_model(proto, where)
    proto = convert_qdq(proto, where, input_shapes=input_shapes, normalize=normalize, float_model=float_model)
    if name is None and not isinstance(model, onnx.ModelProto) and not proto.graph.name:
        name = Path(model).stem
    return import_onnx(proto, input_shapes=input_shapes, name=name)
