"""Reading and cleaning an ONNX ``ModelProto`` before any importer sees it: load, check (opset,
control flow, domains), make inputs static, name unnamed nodes, fold constants and infer shapes."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from qir.errors import ImportError_, InputError, UnsupportedOpError, did_you_mean

__all__ = ["read_onnx", "check_model", "fix_input_shapes", "normalize_proto", "name_unnamed_nodes",
           "constant_value", "MIN_OPSET", "KNOWN_DOMAINS"]

logger = logging.getLogger(__name__)

MIN_OPSET = 11
KNOWN_DOMAINS = {"", "ai.onnx", "com.microsoft", "ai.onnx.ml", "qir"}
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
# ops whose inputs or outputs are sequences or optionals: the IR's values are tensors only
NON_TENSOR_OPS = {"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                  "SequenceLength", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement",
                  "OptionalHasElement"}


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


def check_model(proto: onnx.ModelProto, where: str) -> None:
    opsets = {o.domain: o.version for o in proto.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None:
        raise ImportError_(f"{where}: the model imports no default ONNX opset")
    if default < MIN_OPSET:
        raise ImportError_(
            f"{where}: opset {default} is older than the supported {MIN_OPSET}; convert it first: "
            "onnx.version_converter.convert_version(model, 13)")
    _check_tensor_types(proto, where)
    for node in proto.graph.node:
        label = f"node {node.name or '(unnamed)'!r} ({node.op_type})"
        if node.op_type in NON_TENSOR_OPS and node.domain in ("", "ai.onnx"):
            raise UnsupportedOpError(
                f"{where}: {label} works on sequences or optional values, which the IR cannot represent (its "
                "values are tensors); export the model with tensors only (e.g. Split instead of SplitToSequence)")
        if node.op_type in CONTROL_FLOW or any(
                a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            raise UnsupportedOpError(
                f"{where}: {label} is control flow with a subgraph, which qir cannot represent; "
                "export the model with static control flow (unrolled loops, no If)")
        if node.domain not in KNOWN_DOMAINS:
            raise UnsupportedOpError(
                f"{where}: {label} is in the unknown domain {node.domain!r}; "
                f"qir knows {sorted(d or 'ai.onnx' for d in KNOWN_DOMAINS)}")


def _check_tensor_types(proto: onnx.ModelProto, where: str) -> None:
    """Graph inputs and outputs must be tensors (or untyped): a sequence, map, optional or
    sparse tensor is refused, naming the value."""
    for kind, values in (("input", proto.graph.input), ("output", proto.graph.output)):
        for vi in values:
            which = vi.type.WhichOneof("value")
            if which not in (None, "tensor_type"):
                what = which.replace("_type", "").replace("_", " ")
                raise UnsupportedOpError(
                    f"{where}: graph {kind} {vi.name!r} is {'an' if what[0] in 'aeiou' else 'a'} {what}, which the "
                    "IR cannot represent (its values are tensors); give the model tensor inputs and outputs")


def fix_input_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Make the named graph inputs static: each shape has the input's rank and only whole
    dimensions of at least 1 (0, -1 or a symbol would leave the model dynamic or empty); else an
    InputError naming the input."""
    inits = {i.name for i in proto.graph.initializer}
    graph_inputs = {i.name: i for i in proto.graph.input if i.name not in inits}
    for name, shape in shapes.items():
        if name not in graph_inputs:
            raise InputError(did_you_mean(name, graph_inputs, "model input"))
        dims = graph_inputs[name].type.tensor_type.shape.dim
        if any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1 for d in shape):
            raise InputError(f"the shape given for input {name!r}, {list(shape)}, needs every dimension a whole "
                             "number of at least 1 (a static shape, e.g. 1,3,224,224)")
        if len(dims) and len(dims) != len(shape):
            raise InputError(f"input {name!r} has rank {len(dims)}, but the shape given is {list(shape)}")
        del dims[:]
        for d in shape:
            dims.add().dim_value = int(d)


def normalize_proto(proto: onnx.ModelProto, keep_ops: tuple[str, ...] = ()) -> onnx.ModelProto:
    """Fold constants, remove dead nodes and toposort with onnx-graphsurgeon; ops whose type is
    in ``keep_ops`` are never folded (QuantizeLinear/DequantizeLinear of a QDQ model)."""
    import onnx_graphsurgeon as gs
    import onnxruntime as ort

    proto = _infer_shapes(proto)
    _typed_constants(proto)
    hidden = _fold_sliced_shapes(proto)
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
        _restore_sliced_shapes(proto, hidden)
        return proto
    finally:
        ort.set_default_logger_severity(2)
        gs.logger.G_LOGGER.severity = gs_severity
    _restore_sliced_shapes(folded, hidden)
    folded.ir_version = ir_version
    del folded.opset_import[:]
    folded.opset_import.extend(proto.opset_import)
    del folded.metadata_props[:]
    folded.metadata_props.extend(proto.metadata_props)
    return _infer_shapes(folded)


def name_unnamed_nodes(proto: onnx.ModelProto) -> None:
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


def constant_value(node: onnx.NodeProto, where: str) -> np.ndarray:
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


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as exc:  # inference is an aid, never a requirement
        logger.warning("ONNX shape inference failed (%s); continuing without it", exc)
        return proto


def _typed_constants(proto: onnx.ModelProto) -> None:
    """Rewrite ``Constant`` nodes written with ``value_float(s)``/``value_int(s)`` to a typed
    ``value`` tensor (graphsurgeon would read ``value_float`` as a float64 array)."""
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and any(
                a.name in ("value_float", "value_int", "value_floats", "value_ints") for a in node.attribute):
            value = constant_value(node, "model")
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))


_HIDDEN_SHAPE = "QirSlicedShape"  # a Shape with start/end while graphsurgeon folds (it ignores them)


def _static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Every value whose shape shape inference knows in full (all dimensions whole numbers)."""
    shapes: dict[str, list[int]] = {i.name: list(i.dims) for i in proto.graph.initializer}
    for vi in list(proto.graph.value_info) + list(proto.graph.input) + list(proto.graph.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes.setdefault(vi.name, [int(d.dim_value) for d in t.shape.dim])
    return shapes


def _fold_sliced_shapes(proto: onnx.ModelProto) -> set[str]:
    """Shape nodes with a ``start`` or ``end`` attribute (opset 15): onnx-graphsurgeon's shape
    folding returns the whole shape for them. One whose input shape is static becomes a
    ``Constant`` of the sliced shape here; any other is hidden under another op type while
    graphsurgeon folds (:func:`_restore_sliced_shapes` puts it back). Returns the hidden
    nodes' names."""
    shapes = _static_shapes(proto)
    hidden: set[str] = set()
    for node in proto.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or not ({"start", "end"} & set(attrs)):
            continue
        dims = shapes.get(node.input[0])
        if dims is None:
            node.op_type = _HIDDEN_SHAPE
            hidden.add(node.name)
            continue
        start, end = attrs.get("start", 0), attrs.get("end", len(dims))
        value = np.array(dims[slice(start, end)], np.int64)  # ONNX clamps start/end like a slice
        node.op_type = "Constant"
        del node.input[:]
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
    return hidden


def _restore_sliced_shapes(proto: onnx.ModelProto, hidden: set[str]) -> None:
    for node in proto.graph.node:
        if node.op_type == _HIDDEN_SHAPE and node.name in hidden:
            node.op_type = "Shape"
