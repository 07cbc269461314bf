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
   :mod:`qir.calib_onnx`) become CALIBRATION nodes; every other node a GENERAL op with its ONNX
   name (``OpType_N`` when it has none, N counting per op type) and attributes decoded to Python.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from . import calib_onnx
from .errors import ImportError_, InputError, UnsupportedOpError, did_you_mean
from .graph import QIR
from .naming import fresh_name
from .onnx_export import SAVED_META
from .records import OpRecord

__all__ = ["import_onnx", "read_onnx", "decode_attribute", "onnx_dtype", "KNOWN_DOMAINS"]

logger = logging.getLogger(__name__)

MIN_OPSET = 11
KNOWN_DOMAINS = {"", "ai.onnx", "com.microsoft", "ai.onnx.ml", "qir"}
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}


def read_onnx(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Load a model file with a clear error for missing or corrupt files."""
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.exists():
        raise ImportError_(f"model file not found: {path}")
    if path.is_dir():
        raise ImportError_(f"{path} is a directory; give the path of an .onnx file")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ImportError_(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc}); "
                           "check that the file is complete and really ONNX") from exc
    if not proto.graph.node and not proto.graph.output:
        raise ImportError_(f"{path} holds no ONNX graph (empty or not an ONNX model)")
    return proto


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


def _check_model(proto: onnx.ModelProto, where: str) -> None:
    opsets = {o.domain: o.version for o in proto.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None:
        raise ImportError_(f"{where}: the model imports no default ONNX opset")
    if default < MIN_OPSET:
        raise ImportError_(
            f"{where}: opset {default} is older than the supported {MIN_OPSET}; convert it first: "
            "onnx.version_converter.convert_version(model, 13)")
    for node in proto.graph.node:
        label = f"node {node.name or '(unnamed)'!r} ({node.op_type})"
        if node.op_type in CONTROL_FLOW or any(
                a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            raise UnsupportedOpError(
                f"{where}: {label} is control flow with a subgraph, which qir cannot represent; "
                "export the model with static control flow (unrolled loops, no If)")
        if node.domain not in KNOWN_DOMAINS:
            raise UnsupportedOpError(
                f"{where}: {label} is in the unknown domain {node.domain!r}; "
                f"qir knows {sorted(d or 'ai.onnx' for d in KNOWN_DOMAINS)}")


def _fix_input_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    inits = {i.name for i in proto.graph.initializer}
    graph_inputs = {i.name: i for i in proto.graph.input if i.name not in inits}
    for name, shape in shapes.items():
        if name not in graph_inputs:
            raise InputError(did_you_mean(name, graph_inputs, "model input"))
        dims = graph_inputs[name].type.tensor_type.shape.dim
        if len(dims) and len(dims) != len(shape):
            raise InputError(f"input {name!r} has rank {len(dims)}, but the shape given is {list(shape)}")
        del dims[:]
        for d in shape:
            dims.add().dim_value = int(d)


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as exc:  # inference is an aid, never a requirement
        logger.warning("ONNX shape inference failed (%s); continuing without it", exc)
        return proto


def _stash_calibrations(proto: onnx.ModelProto, where: str) -> dict[str, dict[str, Any]]:
    """Turn ``qir::Calibration`` nodes into named Identity nodes (so shape inference and
    folding see through them); returns their decoded attributes by node name."""
    stashed: dict[str, dict[str, Any]] = {}
    for node in proto.graph.node:
        if node.domain == calib_onnx.DOMAIN and node.op_type == calib_onnx.OP_TYPE:
            if not node.name or node.name in stashed:
                raise ImportError_(f"{where}: every qir Calibration node needs a unique name "
                                   f"(found {node.name!r} twice or empty)")
            stashed[node.name] = {a.name: decode_attribute(a) for a in node.attribute}
            node.op_type, node.domain = "Identity", ""
            del node.attribute[:]
    if stashed:
        kept = [o for o in proto.opset_import if o.domain != calib_onnx.DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
    return stashed


def _normalize(proto: onnx.ModelProto, keep_ops: tuple[str, ...] = ()) -> onnx.ModelProto:
    """Fold constants, remove dead nodes and toposort with onnx-graphsurgeon; ops whose type is
    in ``keep_ops`` are never folded (QuantizeLinear/DequantizeLinear of a QDQ model)."""
    import onnx_graphsurgeon as gs
    import onnxruntime as ort

    proto = _infer_shapes(proto)
    _typed_constants(proto)
    ir_version = proto.ir_version
    # graphsurgeon folds with onnxruntime, which reads IR versions up to 10 only
    proto.ir_version = min(proto.ir_version, 10)
    ort.set_default_logger_severity(3)  # ORT warns about fusions while folding
    gs_severity = gs.logger.G_LOGGER.severity
    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR  # graphsurgeon prints to stdout
    try:
        graph = gs.import_onnx(proto)
        try:
            graph.fold_constants(error_ok=True, should_exclude_node=lambda n: n.op in keep_ops)
        except Exception as exc:
            logger.warning("constant folding failed (%s); the model is imported unfolded", exc)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        folded = gs.export_onnx(graph, do_type_check=False)
    except Exception as exc:
        logger.warning("onnx-graphsurgeon could not normalize the model (%s); importing as is", exc)
        proto.ir_version = ir_version
        return proto
    finally:
        ort.set_default_logger_severity(2)
        gs.logger.G_LOGGER.severity = gs_severity
    folded.ir_version = ir_version
    del folded.opset_import[:]
    folded.opset_import.extend(proto.opset_import)
    del folded.metadata_props[:]
    folded.metadata_props.extend(proto.metadata_props)
    return _infer_shapes(folded)


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
    _check_model(proto, where)
    from .qdq_import import convert_qdq  # QDQ model → qir::Calibration nodes (no-op otherwise)
    proto = convert_qdq(proto, where, input_shapes=input_shapes, normalize=normalize)
    calibrations = _stash_calibrations(proto, where)
    _name_unnamed_nodes(proto)
    if input_shapes:
        _fix_input_shapes(proto, input_shapes)
    if calibrations:
        pass  # a calibrated model qir wrote: normalized and fully typed already; keep it exactly
    elif normalize:
        proto = _normalize(proto)
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
            ir.add_weight(node.output[0], _constant_value(node, where))
            continue
        if node.name in calibrations and node.op_type == "Identity":
            ir.add_calibration(node.name, node.input[0], node.output[0],
                               **calib_onnx.calibration_state(calibrations[node.name]))
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
    (``qir.modules``) and the pass results in :data:`qir.onnx_export.SAVED_META`."""
    import json

    for key in SAVED_META:
        text = ir.metadata_props.pop(f"qir.{key}", None)
        try:
            if text:
                ir.meta[key] = json.loads(text)
        except json.JSONDecodeError:
            logger.warning("ignoring unreadable qir.%s metadata", key)
    for head, members in ir.meta.get("fusion_groups", {}).items():
        for m in members:
            if ir.has_node(m) and isinstance(ir.node(m), OpRecord):
                ir.node(m).meta["fusion"] = head
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


def _name_unnamed_nodes(proto: onnx.ModelProto) -> None:
    """Name every unnamed node ``OpType_N`` (N counting per op type in model order, skipping
    names in use) on the model as written, so names do not depend on what folding removes."""
    used = {n.name for n in proto.graph.node if n.name}
    counters: dict[str, int] = {}
    for node in proto.graph.node:
        if node.name:
            continue
        while True:
            n = counters.get(node.op_type, 0)
            counters[node.op_type] = n + 1
            candidate = f"{node.op_type}_{n}"
            if candidate not in used:
                break
        node.name = candidate
        used.add(candidate)


MODULES_KEY = "qir.modules"


def _typed_constants(proto: onnx.ModelProto) -> None:
    """Rewrite ``Constant`` nodes written with ``value_float(s)``/``value_int(s)`` to a typed
    ``value`` tensor (graphsurgeon would read ``value_float`` as a float64 array)."""
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and any(
                a.name in ("value_float", "value_int", "value_floats", "value_ints") for a in node.attribute):
            value = _constant_value(node, "model")
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))


def _constant_value(node: onnx.NodeProto, where: str) -> np.ndarray:
    attr = {a.name: a for a in node.attribute}
    if "value" in attr:
        return numpy_helper.to_array(attr["value"].t)
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64)):
        if key in attr:
            return np.array(onnx.helper.get_attribute_value(attr[key]), dtype=dtype)
    for key, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attr:
            return np.array(list(onnx.helper.get_attribute_value(attr[key])), dtype=dtype)
    raise UnsupportedOpError(f"{where}: Constant node {node.name!r} uses an unsupported attribute "
                             f"{sorted(attr)}")
